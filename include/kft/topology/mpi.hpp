// SPDX-License-Identifier: Apache-2.0
/// @file kft/topology/mpi.hpp
/// @brief Node grouping through MPI (component `kft::mpi`): every rank's host identity by one
/// `MPI_Allgather`.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/topology/mpi.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <string>
#include <vector>

#include <kft/core/mpi_error.hpp>
#include <kft/topology/layout.hpp>

KFT_NAMESPACE_BEGIN
namespace topology {

/// @brief Collective over `comm`: the layout of its ranks by host identity (`host_id()` unless
/// given; at most 255 bytes).
/// @throws transport_error when MPI fails
inline layout exchange(MPI_Comm comm, const std::string& host = host_id()) {
  auto check = [](int rc, const char* call) { mpi_check(rc, call, error_site::of("topology")); };
  int rank = 0, size = 1;
  check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  constexpr int width = 256;  // fixed width: one MPI_Allgather carries every identity
  std::vector<char> all(static_cast<std::size_t>(width) * static_cast<std::size_t>(size));
  char mine[width] = {};
  host.copy(mine, width - 1);
  check(MPI_Allgather(mine, width, MPI_CHAR, all.data(), width, MPI_CHAR, comm), "MPI_Allgather");
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) hosts.emplace_back(&all[static_cast<std::size_t>(width) * static_cast<std::size_t>(r)]);
  return layout(rank, std::move(hosts));
}

}  // namespace topology
KFT_NAMESPACE_END
