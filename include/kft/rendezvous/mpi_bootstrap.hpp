// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/mpi_bootstrap.hpp
/// @brief A TCP store set up through MPI (component `kft::mpi`): no address, port or token
/// to configure.
///
/// Rank 0 starts a store server on a free port with a fresh random token and broadcasts
/// "host port token" over the communicator; every rank connects. The host is 127.0.0.1 when
/// all ranks share rank 0's node, else `advertise` when rank 0 gives one (an address of its
/// own that the others reach, e.g. where host names do not resolve), else rank 0's host name.
#pragma once

#include <kft/config.hpp>
#include <kft/core/timeout.hpp>
#if !KFT_WITH_MPI
#error "kft/rendezvous/mpi_bootstrap.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <sstream>

#include <kft/core/mpi_error.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/connect.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief Collective over `comm`: returns every rank's connection to one store (hosted by rank 0).
/// `timeout` is the job's (`kft::init` and the MPI group pass `KFT_TIMEOUT`'s): reaching the
/// store, and what derives from it (a request that is not a wait, the host's drain at exit).
/// @throws transport_error when an MPI call fails (the same on every rank)
inline store_handle mpi_bootstrap(MPI_Comm comm, std::chrono::milliseconds timeout = default_job_timeout,
                                  const std::string& advertise = {}) {
  auto check = [](int rc, const char* call) { mpi_check(rc, call, error_site::of("store bootstrap")); };
  int rank = 0, size = 1, local_size = 1;
  check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  MPI_Comm local = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int all_local = local_size == size ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &all_local, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");

  const derived_timeouts job = derived_timeouts::from(timeout);
  store_handle h;
  h.drain_timeout = job.job;
  std::string card;  // "host port token"
  if (rank == 0) {
    std::string host = "127.0.0.1";
    if (!all_local && !advertise.empty()) {
      host = advertise;
    } else if (!all_local) {
      char name[HOST_NAME_MAX + 1] = {};
      ::gethostname(name, sizeof name);
      host = name;
    }
    const std::string token = random_token();
    h.server = std::make_unique<tcp_store_server>(tcp_store_server::options{all_local ? host : "", 0, token, {}});
    card = host + " " + std::to_string(h.server->port()) + " " + token;
  }
  int len = static_cast<int>(card.size());
  check(MPI_Bcast(&len, 1, MPI_INT, 0, comm), "MPI_Bcast");
  card.resize(static_cast<std::size_t>(len));
  check(MPI_Bcast(card.data(), len, MPI_CHAR, 0, comm), "MPI_Bcast");

  std::istringstream in(card);
  tcp_store::options o;
  in >> o.host >> o.port >> o.token;
  o.connect_timeout = job.job;
  o.io_timeout = job.store_request;
  o.name = "rank " + std::to_string(rank);
  h.client = std::make_shared<tcp_store>(std::move(o));
  return h;
}

}  // namespace rendezvous
KFT_NAMESPACE_END
