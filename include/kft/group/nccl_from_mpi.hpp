// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/nccl_from_mpi.hpp
/// @brief A NCCL communicator over the ranks of an MPI communicator (components `kft::nccl` and
/// `kft::mpi`): MPI carries NCCL's unique id, so no rendezvous store is needed.
///
///     kft::mpi::communicator world;                                  // MPI_COMM_WORLD's ranks
///     auto gpus = kft::nccl::from_mpi(world, local_rank);            // same ranks, NCCL
///
/// The broadcast of the id runs through `kft::mpi::communicator` (MPI_Ibcast polled with a
/// deadline), so a rank that never calls gives a `timeout_error` rather than a hang.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/group/nccl_from_mpi.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif
#if !KFT_WITH_MPI
#error "kft/group/nccl_from_mpi.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include <kft/core/environment.hpp>
#include <kft/core/timeout.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/nccl/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

/// @brief Collective over `comm`: rank 0 makes a NCCL unique id and MPI broadcasts it (within
/// `cfg.timeout`); every rank then creates its NCCL communicator on CUDA `device`, with the
/// same rank and size as in `comm`. `KFT_TIMEOUT` in `env` applies to `cfg.timeout` and
/// `cfg.destroy_timeout` where they hold their defaults (`apply_timeout`).
/// @throws timeout_error when a rank does not arrive, transport_error when MPI, NCCL or CUDA fail,
/// config_error naming a malformed KFT_TIMEOUT
inline communicator from_mpi(mpi::communicator& comm, int device, config cfg = {},
                             const environment& env = environment::process()) {
  const derived_timeouts job = timeouts(env);
  apply_timeout(cfg.timeout, job);
  apply_timeout(cfg.destroy_timeout, job, &derived_timeouts::teardown);
  std::uint8_t bytes[sizeof(ncclUniqueId)] = {};
  if (comm.rank() == 0) {
    const ncclUniqueId id = unique_id();
    std::memcpy(bytes, &id, sizeof id);
  }
  kft::options o;
  o.timeout = cfg.timeout;
  comm.broadcast(std::span<std::uint8_t>(bytes), 0, o);
  ncclUniqueId id{};
  std::memcpy(&id, bytes, sizeof id);
  return communicator(id, comm.rank(), comm.size(), device, std::move(cfg));
}

/// @brief As above over a plain `MPI_Comm` (duplicated for the broadcast, then freed).
inline communicator from_mpi(MPI_Comm comm, int device, config cfg = {},
                             const environment& env = environment::process()) {
  const derived_timeouts job = timeouts(env);
  apply_timeout(cfg.timeout, job);
  apply_timeout(cfg.destroy_timeout, job, &derived_timeouts::teardown);
  mpi::config mc;
  mc.timeout = cfg.timeout;
  mpi::communicator c(comm, mc);
  return from_mpi(c, device, std::move(cfg), env);
}

}  // namespace nccl
KFT_NAMESPACE_END
