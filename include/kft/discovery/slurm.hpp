// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/slurm.hpp
/// @brief Slurm job-step environment (`srun`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>

#include <kft/discovery/backend.hpp>
#include <kft/discovery/slurm_lists.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Reads `SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID`, the step's node
/// list and tasks per node.
///
/// Trusted only inside a job step (`SLURM_STEP_ID` set): an `sbatch` or `salloc` shell also
/// has `SLURM_PROCID=0` and `SLURM_LOCALID=0`, and everything it starts (mpirun's ranks,
/// torchrun's workers) inherits those wrong values. The step-scoped variables
/// (`SLURM_STEP_NUM_TASKS`, `SLURM_STEP_NODELIST`, ...) are preferred over the job-wide
/// ones, because a step may use part of the allocation.
struct slurm_env {
  static constexpr std::string_view name = "slurm";
  static constexpr std::string_view source = "Slurm job step environment (SLURM_PROCID, ...)";

  static std::optional<world_info> detect(const environment& env) {
    if (!env.has("SLURM_PROCID")) return std::nullopt;
    if (!env.has("SLURM_STEP_ID") && !env.has("SLURM_STEPID")) return std::nullopt;
    constexpr std::string_view ctx = "Slurm step environment";
    
    auto first_of = [&](std::initializer_list<std::string_view> names) -> std::string_view {
      for (auto n : names)
        if (env.has(n)) return n;
      return {};
    };

    auto w = detail::start_world<slurm_env>(env);

    const auto size_var = first_of({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
    if (size_var.empty())
      throw config_error("SLURM_NTASKS", "", "is not set (nor SLURM_STEP_NUM_TASKS) inside a Slurm step" +
                                                 kft::detail::context_suffix(ctx));
    w.world_size = env_int_required(env, size_var, 1, detail::max_ranks, ctx);
    w.rank = env_int_required(env, "SLURM_PROCID", 0, detail::max_ranks, ctx);
    detail::require_below("SLURM_PROCID", w.rank, size_var, w.world_size, ctx);

    // Node list and node count.
    const auto list_var = first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    std::vector<std::string> nodes;
    if (!list_var.empty()) nodes = slurm::expand_hostlist(*env.get(list_var), list_var);
    const auto count_var = first_of({"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
    if (!count_var.empty()) w.node_count = env_int_required(env, count_var, 1, detail::max_ranks, ctx);
    if (!nodes.empty()) {
      const int listed = static_cast<int>(nodes.size());
      if (w.node_count && *w.node_count != listed)
        throw config_error(std::string(count_var), std::to_string(*w.node_count),
                           "disagrees with " + std::string(list_var) + "=\"" + *env.get(list_var) +
                               "\", which names " + std::to_string(listed) + " node(s)" +
                               kft::detail::context_suffix(ctx));
      w.node_count = listed;
    }
    if (w.node_count) detail::require_at_most(count_var.empty() ? list_var : count_var, *w.node_count,
                                              size_var, w.world_size, ctx);
    w.node_rank = env_int(env, "SLURM_NODEID", 0, detail::max_ranks, ctx);
    if (w.node_rank && w.node_count)
      detail::require_below("SLURM_NODEID", *w.node_rank, count_var.empty() ? list_var : count_var,
                            *w.node_count, ctx);
    else if (w.node_rank)  // no node count: still, every node of a step runs at least one task
      detail::require_below("SLURM_NODEID", *w.node_rank, size_var, w.world_size, ctx);
    if (w.node_rank && static_cast<std::size_t>(*w.node_rank) < nodes.size())
      w.node_name = nodes[static_cast<std::size_t>(*w.node_rank)];
    // The rendezvous: MASTER_ADDR/MASTER_PORT when the batch script exports them (as PyTorch's
    // Slurm recipes do), else the step's first node and a port every task of the step derives
    // alike from the job and step ids (29500 + (job x 16 + step) mod 2000), so a plain
    // `srun --mpi=none` step can meet through rank 0's store.
    if (auto a = env.get("MASTER_ADDR"); a && !a->empty()) w.master_addr = *a;
    else if (!nodes.empty()) w.master_addr = nodes.front();
    if (auto port = env_int(env, "MASTER_PORT", 1, 65535, ctx)) {
      w.master_port = static_cast<int>(*port);
    } else if (auto job = env_int(env, "SLURM_JOB_ID", 0, INT32_MAX, ctx)) {
      std::optional<int> step;
      try {  // "batch" or "extern" outside srun steps: then 0
        step = env_int(env, env.has("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID", 0, INT32_MAX, ctx);
      } catch (const config_error&) {
      }
      w.master_port = 29500 + static_cast<int>((static_cast<long long>(*job) * 16 + step.value_or(0)) % 2000);
      w.notes.push_back("rendezvous port " + std::to_string(*w.master_port) +
                        " derived from SLURM_JOB_ID and SLURM_STEP_ID (set MASTER_PORT to choose one)");
    }

    // Tasks per node gives this node's local size.
    const auto tpn_var = first_of({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
    if (!tpn_var.empty()) {
      auto tasks = slurm::expand_tasks_per_node(*env.get(tpn_var), tpn_var);
      const long total = std::accumulate(tasks.begin(), tasks.end(), 0L);
      if (total != w.world_size)
        throw config_error(std::string(tpn_var), *env.get(tpn_var),
                           "adds up to " + std::to_string(total) + " tasks, but " + std::string(size_var) +
                               "=" + std::to_string(w.world_size) + kft::detail::context_suffix(ctx));
      if (const auto idle = std::find(tasks.begin(), tasks.end(), 0); idle != tasks.end())
        throw config_error(std::string(tpn_var), *env.get(tpn_var),
                           "gives node " + std::to_string(idle - tasks.begin()) +
                               " no task, but a step runs at least one task on each of its nodes" +
                               kft::detail::context_suffix(ctx));
      if (w.node_count && static_cast<int>(tasks.size()) != *w.node_count)
        throw config_error(std::string(tpn_var), *env.get(tpn_var),
                           "lists " + std::to_string(tasks.size()) + " node(s), but the step has " +
                               std::to_string(*w.node_count) + kft::detail::context_suffix(ctx));
      if (w.node_rank && static_cast<std::size_t>(*w.node_rank) < tasks.size())
        w.local_size = tasks[static_cast<std::size_t>(*w.node_rank)];
    }
    w.local_rank = env_int(env, "SLURM_LOCALID", 0, detail::max_ranks, ctx);
    if (w.local_rank && w.local_size)
      detail::require_below("SLURM_LOCALID", *w.local_rank, tpn_var, *w.local_size, ctx);
    else if (w.local_rank)
      detail::require_below("SLURM_LOCALID", *w.local_rank, size_var, w.world_size, ctx);
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
