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

    world_info w;
    w.backend = std::string(name);
    w.source = std::string(source);
    w.hostname = env.hostname();
    w.world_size = env_int_required(env, "WORLD_SIZE", 1, max_ranks, ctx);
    w.rank = env_int_required(env, "RANK", 0, max_ranks, ctx);
    detail::require_below("RANK", w.rank, "WORLD_SIZE", w.world_size, ctx);

    w.local_size = env_int(env, "LOCAL_WORLD_SIZE", 1, max_ranks, ctx);
    w.local_rank = env_int(env, "LOCAL_RANK", 0, max_ranks, ctx);
    if (w.local_size) detail::require_at_most("LOCAL_WORLD_SIZE", *w.local_size, "WORLD_SIZE", w.world_size, ctx);
    if (w.local_rank && w.local_size)
      detail::require_below("LOCAL_RANK", *w.local_rank, "LOCAL_WORLD_SIZE", *w.local_size, ctx);
    else if (w.local_rank)
      detail::require_below("LOCAL_RANK", *w.local_rank, "WORLD_SIZE", w.world_size, ctx);

    w.node_count = env_int(env, "GROUP_WORLD_SIZE", 1, max_ranks, ctx);
    w.node_rank = env_int(env, "GROUP_RANK", 0, max_ranks, ctx);
    if (w.node_count) detail::require_at_most("GROUP_WORLD_SIZE", *w.node_count, "WORLD_SIZE", w.world_size, ctx);
    if (w.node_rank && w.node_count)
      detail::require_below("GROUP_RANK", *w.node_rank, "GROUP_WORLD_SIZE", *w.node_count, ctx);
    if (w.node_rank && !w.node_count) w.node_rank.reset();  // an index without a count says little

    if (w.local_size && *w.local_size == w.world_size) {
      // Everybody is local: one node, whatever GROUP_* said or did not say.
      if (w.node_count && *w.node_count != 1)
        throw config_error("GROUP_WORLD_SIZE", std::to_string(*w.node_count),
                           "contradicts LOCAL_WORLD_SIZE=WORLD_SIZE=" + std::to_string(w.world_size) +
                               " (all ranks on one node)" + detail::context_suffix(ctx));
      w.node_rank = 0;
      w.node_count = 1;
    }
    if (!w.local_rank) w.notes.push_back("LOCAL_RANK not set: local view unknown");

    w.master_addr = env.get("MASTER_ADDR");
    w.master_port = env_int(env, "MASTER_PORT", 1, 65535, ctx);
    if (!marked) w.notes.push_back("no TORCHELASTIC_RUN_ID: plain env:// variables (RANK, WORLD_SIZE)");
    return w;
  }

  static constexpr int max_ranks = 1 << 24;
};

}  // namespace discovery
KFT_NAMESPACE_END
