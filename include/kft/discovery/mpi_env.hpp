// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/mpi_env.hpp
/// @brief What MPI launchers put in the environment: Open MPI's `OMPI_COMM_WORLD_*` and
/// the PMI-1/2 `PMI_RANK`/`PMI_SIZE` (MPICH/Hydra, Intel MPI, `srun --mpi=pmi2`).
///
/// These work without linking MPI. With the MPI component, `discovery::mpi_comm`
/// (kft/discovery/mpi.hpp) asks MPI_COMM_WORLD instead and also learns the node index.
#pragma once

#include <optional>

#include <kft/discovery/backend.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Open MPI's `mpirun` (and `prterun`) environment.
///
/// `OMPI_COMM_WORLD_NODE_RANK` is deliberately not used: it is a per-node ordinal of the
/// process, not the index of the node. The node count comes from
/// `OMPI_MCA_orte_num_nodes`; the node index is only known when all ranks share one node.
struct ompi_env {
  static constexpr std::string_view name = "mpi";
  static constexpr std::string_view source = "Open MPI environment (OMPI_COMM_WORLD_*)";

  static std::optional<world_info> detect(const environment& env) {
    if (!env.has("OMPI_COMM_WORLD_RANK") && !env.has("OMPI_COMM_WORLD_SIZE")) return std::nullopt;
    constexpr std::string_view ctx = "Open MPI environment";
    auto w = detail::start_world<ompi_env>(env);
    detail::read_ranks(w, env,
                       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE"},
                       ctx);
    w.node_count = env_int(env, "OMPI_MCA_orte_num_nodes", 1, detail::max_ranks, ctx);
    if (w.node_count)
      detail::require_at_most("OMPI_MCA_orte_num_nodes", *w.node_count, "OMPI_COMM_WORLD_SIZE",
                              w.world_size, ctx);
    detail::one_node_if_all_local(w, "OMPI_MCA_orte_num_nodes", ctx);
    if (!w.node_rank && w.node_count == 1) w.node_rank = 0;
    if (!w.node_rank) {
      w.notes.push_back(
          "node index unknown: Open MPI's environment has none (OMPI_COMM_WORLD_NODE_RANK is a "
          "per-node process ordinal); the MPI component's MPI_COMM_WORLD backend finds it");
    }
    return w;
  }
};

/// @brief PMI-1/PMI-2 environment (`PMI_RANK`, `PMI_SIZE`), with Hydra's
/// `MPI_LOCALRANKID`/`MPI_LOCALNRANKS` for the local view when present.
struct pmi_env {
  static constexpr std::string_view name = "mpi";
  static constexpr std::string_view source = "PMI environment (PMI_RANK, PMI_SIZE)";

  static std::optional<world_info> detect(const environment& env) {
    if (!env.has("PMI_RANK") && !env.has("PMI_SIZE")) return std::nullopt;
    constexpr std::string_view ctx = "PMI environment";
    auto w = detail::start_world<pmi_env>(env);
    detail::read_ranks(w, env, {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}, ctx);
    detail::one_node_if_all_local(w, "PMI_SIZE", ctx);
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
