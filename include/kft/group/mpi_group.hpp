// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/mpi_group.hpp
/// @brief The CPU job across nodes with MPI between them (component `kft::mpi`).
///
///     MPI_Init(&argc, &argv);
///     auto g = kft::group::mpi_group();    // collective over MPI_COMM_WORLD
///     g->allreduce(std::span<float>(grad), kft::ops::avg);
///
/// Construction checks that MPI formed the job the launcher started (no N silent singletons:
/// `discovery::verify_mpi_world`), exchanges host identities (`topology::host_id()`: host name
/// + boot id, or `KFT_HOST_ID`), groups ranks by node, builds a shm communicator per node
/// (through a store bootstrapped over the node's MPI ranks), one MPI communicator per rail and
/// keeps a duplicate of the whole communicator for flat collectives.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/group/mpi_group.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>

#include <kft/core/environment.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/mpi.hpp>
#include <kft/group/cpu_group.hpp>
#include <kft/group/node.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#include <kft/topology/mpi.hpp>
#include <kft/transport/mpi/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief A CPU group with MPI between nodes.
using mpi_cpu_group = cpu_group<mpi::communicator>;

/// @brief Settings of `mpi_group` (the environment's, applied by `mpi_group_config_from`).
struct mpi_group_config {
  cpu_group_config group{.flat_large = algo::ring};  ///< flat = kft's ring for large messages
  shm::config shm;                                   ///< the per-node shared-memory communicator
  mpi::config mpi;                                   ///< the flat and rail MPI communicators
  std::optional<std::string> host;                   ///< this rank's host identity (default: topology::host_id())
};

/// @brief `base` with the environment's settings: `KFT_ALGO`, `KFT_MPI_CHECK=1`, `KFT_SHM_*`,
/// and `KFT_TIMEOUT` where a timeout holds its default (`apply_timeout`).
inline mpi_group_config mpi_group_config_from(const environment& env, mpi_group_config base = {}) {
  base.group.strategy = strategy_from(env);
  if (env.get("KFT_MPI_CHECK") == "1") base.mpi.check_signatures = true;
  base.shm = shm_config(env, std::move(base.shm));
  apply_timeout(base.mpi.timeout, timeouts(env));
  return base;
}

/// @brief Collective over `comm`: the group of its ranks, by node. `env` gives the launcher's
/// world (to refuse N singletons), `KFT_HOST_ID` and the settings above (`KFT_TIMEOUT` also to
/// `settings` given, where a timeout holds its default).
/// @throws config_error when MPI did not form the launcher's job, or a setting is malformed
inline std::unique_ptr<mpi_cpu_group> mpi_group(MPI_Comm comm = MPI_COMM_WORLD,
                                                const environment& env = environment::process(),
                                                std::optional<mpi_group_config> settings = std::nullopt) {
  // N processes that each initialised MPI alone (kftrun, or another MPI's launcher) would
  // otherwise run as N silent one-rank jobs.
  discovery::verify_mpi_world(env);
  mpi_group_config cfg = settings ? *settings : mpi_group_config_from(env);
  const derived_timeouts job = timeouts(env);
  apply_timeout(cfg.mpi.timeout, job);
  apply_timeout(cfg.shm.timeout, job);
  cpu_group_parts<mpi::communicator> parts{.layout = topology::layout(0, {""}),
                                           .node_store = {},
                                           .intra = {},
                                           .flat = mpi::communicator(comm, cfg.mpi),
                                           .rail = mpi::communicator(MPI_COMM_SELF, cfg.mpi)};
  parts.layout = topology::exchange(parts.flat.native(), cfg.host ? *cfg.host : topology::host_id(env));
  const auto& lay = parts.layout;
  const std::string node_label = "node " + std::to_string(lay.node());
  // The node's ranks meet through a store of their own (127.0.0.1 when MPI sees them on one
  // machine), then map one shared segment.
  {
    auto node = parts.flat.split(lay.node(), lay.local_rank(), node_label);
    parts.node_store = rendezvous::mpi_bootstrap(node.native(), job.job);
  }
  shm::config sc = cfg.shm;
  if (sc.name == "kft") sc.name = "kft-node" + std::to_string(lay.node());
  sc.identity = {parts.flat.rank(), parts.flat.size(), node_label};
  parts.intra = std::make_unique<shm::communicator>(parts.node_store.client, lay.local_rank(), lay.local_size(), sc);
  parts.rail = parts.flat.split(lay.local_rank(), lay.node(), "rail " + std::to_string(lay.local_rank()));
  return std::make_unique<mpi_cpu_group>(std::move(parts), cfg.group);
}

}  // namespace group
KFT_NAMESPACE_END
