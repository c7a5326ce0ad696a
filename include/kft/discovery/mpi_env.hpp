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
    constexpr int max_ranks = 1 << 24;
    world_info w;
    w.backend = std::string(name);
    w.source = std::string(source);
    w.hostname = env.hostname();
    w.world_size = env_int_required(env, "OMPI_COMM_WORLD_SIZE", 1, max_ranks, ctx);
    w.rank = env_int_required(env, "OMPI_COMM_WORLD_RANK", 0, max_ranks, ctx);
    detail::require_below("OMPI_COMM_WORLD_RANK", w.rank, "OMPI_COMM_WORLD_SIZE", w.world_size, ctx);
    w.local_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, max_ranks, ctx);
    w.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, max_ranks, ctx);
    if (w.local_size)
      detail::require_at_most("OMPI_COMM_WORLD_LOCAL_SIZE", *w.local_size, "OMPI_COMM_WORLD_SIZE",
                              w.world_size, ctx);
    if (w.local_rank && w.local_size)
      detail::require_below("OMPI_COMM_WORLD_LOCAL_RANK", *w.local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE",
                            *w.local_size, ctx);
    w.node_count = env_int(env, "OMPI_MCA_orte_num_nodes", 1, max_ranks, ctx);
    if (w.node_count)
      detail::require_at_most("OMPI_MCA_orte_num_nodes", *w.node_count, "OMPI_COMM_WORLD_SIZE",
                              w.world_size, ctx);
    if (w.local_size && *w.local_size == w.world_size) {
      if (w.node_count && *w.node_count != 1)
        throw config_error("OMPI_MCA_orte_num_nodes", std::to_string(*w.node_count),
                           "contradicts OMPI_COMM_WORLD_LOCAL_SIZE=OMPI_COMM_WORLD_SIZE (all ranks on one node)" +
                               detail::context_suffix(ctx));
      w.node_rank = 0;
      w.node_count = 1;
    } else if (w.node_count && *w.node_count == 1) {
      w.node_rank = 0;
    } else {
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
    constexpr int max_ranks = 1 << 24;
    world_info w;
    w.backend = std::string(name);
    w.source = std::string(source);
    w.hostname = env.hostname();
    w.world_size = env_int_required(env, "PMI_SIZE", 1, max_ranks, ctx);
    w.rank = env_int_required(env, "PMI_RANK", 0, max_ranks, ctx);
    detail::require_below("PMI_RANK", w.rank, "PMI_SIZE", w.world_size, ctx);
    w.local_size = env_int(env, "MPI_LOCALNRANKS", 1, max_ranks, ctx);
    w.local_rank = env_int(env, "MPI_LOCALRANKID", 0, max_ranks, ctx);
    if (w.local_size)
      detail::require_at_most("MPI_LOCALNRANKS", *w.local_size, "PMI_SIZE", w.world_size, ctx);
    if (w.local_rank && w.local_size)
      detail::require_below("MPI_LOCALRANKID", *w.local_rank, "MPI_LOCALNRANKS", *w.local_size, ctx);
    if (w.local_size && *w.local_size == w.world_size) {
      w.node_rank = 0;
      w.node_count = 1;
    }
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
