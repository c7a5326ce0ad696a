// SPDX-License-Identifier: Apache-2.0
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

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <system_error>

#include <kft/core/mpi_error.hpp>
#include <kft/discovery/discover.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

namespace detail {
inline void mpi_check(int rc, const char* call) { kft::mpi_check(rc, call, error_site::of("discover")); }
}  // namespace detail

/// @brief The MPI library's own name, e.g. "Open MPI v4.1.4" or "MPICH Version: 4.0.2".
inline std::string mpi_library_name() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown MPI";
  std::string s(text, static_cast<std::size_t>(std::max(len, 0)));
  s = s.substr(0, std::min(s.find(','), s.find('\n')));
  for (char& c : s)
    if (c == '\t') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.empty() ? "unknown MPI" : s;
}

/// @brief Refuses to run as N silent singletons: compares `MPI_COMM_WORLD`'s size with the
/// world the launcher's own variables describe (torchrun/kftrun `WORLD_SIZE`, Open MPI's
/// `OMPI_COMM_WORLD_SIZE`, PMI's `PMI_SIZE`, a Slurm step's task count), in discovery's
/// precedence. MPI must be initialised. Every rank of such a job sees the same mismatch, so
/// each one throws on its own (no communication).
/// @throws config_error naming the variable, its value, MPI's size and the actual mix-up
inline void verify_mpi_world(const environment& env) {
  int size = 1;
  detail::mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  struct claim {
    const char* var;
    std::string launcher;
  };
  std::optional<claim> c;
  if (env.has("TORCHELASTIC_RUN_ID") || (env.has("RANK") && env.has("WORLD_SIZE")))
    c = claim{"WORLD_SIZE", env.get("KFT_LAUNCHER") == "kftrun" ? "kftrun" : "torchrun"};
  else if (env.has("OMPI_COMM_WORLD_SIZE"))
    c = claim{"OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"};
  else if (env.has("PMI_SIZE"))
    c = claim{"PMI_SIZE", env.has("SLURM_STEP_ID") ? "srun with a PMI plugin" : "a PMI launcher (MPICH's mpiexec/mpirun.mpich, Hydra)"};
  else if (env.has("SLURM_STEP_ID") && env.has("SLURM_PROCID"))
    c = claim{env.has("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", "srun"};
  if (!c) return;
  const auto v = env.get(c->var);
  if (!v) return;
  int launched = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), launched);
  if (ec != std::errc() || p != v->data() + v->size() || launched == size) return;
  const std::string lib = mpi_library_name();
  const std::string ranks = std::to_string(size) + (size == 1 ? " rank" : " ranks");
  std::string why;
  if (c->launcher == "kftrun" || c->launcher == "torchrun")
    why = c->launcher + " started the processes, and each initialised MPI on its own (" + lib +
          " singletons): " + c->launcher + " does not start MPI jobs; start an MPI program with mpirun or srun --mpi=pmix";
  else if (c->launcher == "srun")
    why = "srun started the tasks, but the program's MPI (" + lib +
          ") did not get the job from Slurm: give srun the PMI plugin this MPI needs (Open MPI: srun --mpi=pmix; "
          "srun --mpi=list shows them)";
  else {
    const std::string own = lib.starts_with("Open MPI") ? "Open MPI's mpirun (mpirun.openmpi on Debian)"
                            : lib.starts_with("MPICH")  ? "MPICH's mpirun (mpirun.mpich on Debian)"
                                                        : "the launcher of that MPI";
    why = c->launcher + " started the job, but the program is linked with " + lib +
          ", which is not that launcher's MPI: start it with " + own + ", or rebuild it against the launcher's MPI";
  }
  throw config_error(c->var, *v, "but MPI_COMM_WORLD has " + ranks + ": " + why, error_site::of("discover (mpi)"));
}

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
    verify_mpi_world(env);

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
