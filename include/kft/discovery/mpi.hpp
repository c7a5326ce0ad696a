/// @file kft/discovery/mpi.hpp
/// @brief Discovery from MPI itself (component `kft::mpi`).
///
/// Asks `MPI_COMM_WORLD` for rank and size and `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`
/// for the ranks sharing this node; node index and count come from one more split over
/// the node leaders. This is right under every MPI launcher, including `srun --mpi=pmix`,
/// where no `OMPI_COMM_WORLD_*` variable exists.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/discovery/mpi.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <charconv>
#include <optional>
#include <string>
#include <system_error>

#include <kft/discovery/discover.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

namespace detail {
// The one place where MPI return codes become kft exceptions (for discovery).
inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw transport_error(std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(len)),
                        error_site::of("discover"), rc);
}
}  // namespace detail

/// @brief `MPI_COMM_WORLD`, when MPI is initialised.
///
/// Applies only when MPI has been initialised (and not finalised) by the program, and the
/// world has more than one rank or an MPI launcher's variables are present: a singleton
/// `MPI_Init` inside a torchrun worker says nothing about the job. It is collective over
/// MPI_COMM_WORLD, so every rank must call discovery.
struct mpi_comm {
  static constexpr std::string_view name = "mpi";
  static constexpr std::string_view source = "MPI_COMM_WORLD + MPI_Comm_split_type(SHARED)";

  static std::optional<world_info> detect(const environment& env) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return std::nullopt;
    int rank = 0, size = 1;
    detail::mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
    const bool launched = env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMI_SIZE") || env.has("PMIX_RANK");
    if (size == 1 && !launched) return std::nullopt;
    // The classic mix-up: a program built against one MPI started by another MPI's launcher
    // initialises as N singletons, each "rank 0 of 1". The launcher's own count gives it away.
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
      auto v = env.get(var);
      if (!v) continue;
      int launched_size = 0;
      auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), launched_size);
      if (ec == std::errc() && p == v->data() + v->size() && launched_size != size)
        throw config_error(var, *v,
                           "but MPI_COMM_WORLD has " + std::to_string(size) +
                               " rank(s): the program's MPI library does not belong to the launcher that "
                               "started it (e.g. an MPICH build under Open MPI's mpirun)");
    }

    MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
                      "MPI_Comm_split_type");
    int local_rank = 0, local_size = 1;
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    // Node leaders (local rank 0) number the nodes in order of their lowest global rank.
    detail::mpi_check(MPI_Comm_split(MPI_COMM_WORLD, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders),
                      "MPI_Comm_split");
    int node[2] = {0, 0};  // node rank, node count
    if (leaders != MPI_COMM_NULL) {
      MPI_Comm_rank(leaders, &node[0]);
      MPI_Comm_size(leaders, &node[1]);
      MPI_Comm_free(&leaders);
    }
    detail::mpi_check(MPI_Bcast(node, 2, MPI_INT, 0, local), "MPI_Bcast");
    MPI_Comm_free(&local);

    auto w = kft::detail::start_world<mpi_comm>(env);
    w.rank = rank;
    w.world_size = size;
    w.local_rank = local_rank;
    w.local_size = local_size;
    w.node_rank = node[0];
    w.node_count = node[1];
    return w;
  }
};

/// @brief The default precedence with `MPI_COMM_WORLD` ahead of the MPI launchers' variables.
using mpi_precedence = precedence<torchrun_env, mpi_comm, ompi_env, pmi_env, slurm_env, kubeflow_env,
                                  kubernetes_env, single_process>;

}  // namespace discovery

/// @brief `kft::discover()` that also asks MPI (collective over MPI_COMM_WORLD when MPI is
/// initialised).
inline world_info discover_with_mpi(const environment& env = environment::process()) {
  return discover(env, discovery::mpi_precedence{});
}

KFT_NAMESPACE_END
