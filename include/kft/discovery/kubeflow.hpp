// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/kubeflow.hpp
/// @brief Kubeflow Trainer (TrainJob with the torch runtime): the `PET_*` variables.
#pragma once

#include <optional>

#include <kft/discovery/backend.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Reads `PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT`.
///
/// These are torchrun's command-line flags in environment form and describe the *pod*, not
/// the process. With one process per pod they give the rank directly (rank = node rank).
/// With several (`PET_NPROC_PER_NODE` > 1 or `auto`) a launcher in the pod — `kftrun` or
/// torchrun — must start the processes and give each its own rank; a process that sees
/// only `PET_*` in that case was started wrongly, and discovery says so.
struct kubeflow_env {
  static constexpr std::string_view name = "kubeflow";
  static constexpr std::string_view source = "Kubeflow Trainer environment (PET_*)";

  static std::optional<world_info> detect(const environment& env) {
    if (!env.has("PET_NNODES") && !env.has("PET_NODE_RANK") && !env.has("PET_NPROC_PER_NODE"))
      return std::nullopt;
    constexpr std::string_view ctx = "Kubeflow Trainer environment";
    constexpr int max_nodes = 1 << 20;
    auto w = detail::start_world<kubeflow_env>(env);
    w.node_name = env.hostname();
    const int nnodes = env_int_required(env, "PET_NNODES", 1, max_nodes, ctx);
    const int node_rank = env_int_required(env, "PET_NODE_RANK", 0, max_nodes, ctx);
    detail::require_below("PET_NODE_RANK", node_rank, "PET_NNODES", nnodes, ctx);
    if (auto nproc = env.get("PET_NPROC_PER_NODE")) {
      if (*nproc == "auto")
        throw config_error("PET_NPROC_PER_NODE", *nproc,
                           "leaves the number of processes per pod to a launcher: start the program "
                           "with `kftrun -- program` (or torchrun), which gives each process its rank");
      const int n = env_int_required(env, "PET_NPROC_PER_NODE", 1, 1 << 16, ctx);
      if (n > 1)
        throw config_error("PET_NPROC_PER_NODE", *nproc,
                           "asks for " + std::to_string(n) +
                               " processes per pod, but this process has no per-process rank: start "
                               "the program with `kftrun -- program` (or torchrun) inside the pod");
    } else {
      w.notes.push_back("PET_NPROC_PER_NODE not set: assuming one process per pod");
    }
    w.rank = node_rank;
    w.world_size = nnodes;
    w.local_rank = 0;
    w.local_size = 1;
    w.node_rank = node_rank;
    w.node_count = nnodes;
    w.master_addr = env.get("PET_MASTER_ADDR");
    w.master_port = env_int(env, "PET_MASTER_PORT", 1, 65535, ctx);
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
