// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/torchrun.hpp
/// @brief torchrun / kftrun worker environment (torch.distributed's `env://` contract).
#pragma once

#include <optional>

#include <kft/discovery/backend.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Reads `RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
/// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT`.
///
/// Applies when a torchrun-style launcher marked the process (`TORCHELASTIC_RUN_ID`, which
/// torchrun and kftrun both set) or when `RANK` and `WORLD_SIZE` are both present (the plain
/// `env://` contract). A marker without `RANK` is an error: the worker was started by a
/// launcher that did not finish its job.
struct torchrun_env {
  static constexpr std::string_view name = "torchrun";
  static constexpr std::string_view source = "torchrun/kftrun environment (RANK, WORLD_SIZE, ...)";

  static std::optional<world_info> detect(const environment& env) {
    const bool marked = env.has("TORCHELASTIC_RUN_ID");
    if (!marked && !(env.has("RANK") && env.has("WORLD_SIZE"))) return std::nullopt;
    constexpr std::string_view ctx = "torchrun/kftrun environment";

    auto w = detail::start_world<torchrun_env>(env);
    detail::read_ranks(w, env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}, ctx);
    w.node_count = env_int(env, "GROUP_WORLD_SIZE", 1, detail::max_ranks, ctx);
    w.node_rank = env_int(env, "GROUP_RANK", 0, detail::max_ranks, ctx);
    if (w.node_count) detail::require_at_most("GROUP_WORLD_SIZE", *w.node_count, "WORLD_SIZE", w.world_size, ctx);
    if (w.node_rank && w.node_count)
      detail::require_below("GROUP_RANK", *w.node_rank, "GROUP_WORLD_SIZE", *w.node_count, ctx);
    if (w.node_rank && !w.node_count) w.node_rank.reset();  // an index without a count says little
    detail::one_node_if_all_local(w, "GROUP_WORLD_SIZE", ctx);
    if (!w.local_rank) w.notes.push_back("LOCAL_RANK not set: local view unknown");

    w.master_addr = env.get("MASTER_ADDR");
    w.master_port = env_int(env, "MASTER_PORT", 1, 65535, ctx);
    if (!marked) w.notes.push_back("no TORCHELASTIC_RUN_ID: plain env:// variables (RANK, WORLD_SIZE)");
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
