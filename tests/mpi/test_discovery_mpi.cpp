// SPDX-License-Identifier: Apache-2.0
// The MPI_COMM_WORLD discovery backend, run under mpirun with several rank counts
// (registered as discovery_mpi.<N>ranks). Checks every rank against MPI itself and the
// world as a whole: each rank once, local views that add up, node numbering.
#define BOOST_TEST_MODULE kft_discovery_mpi
#include <boost/test/unit_test.hpp>

#include "mpi_session.hpp"

#include <mpi.h>

#include <vector>

#include <kft/discovery/mpi.hpp>


BOOST_AUTO_TEST_CASE(matches_mpi_comm_world) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto env = kft::environment::process();
  auto w = kft::discover_with_mpi(env);
  BOOST_TEST(w.backend == "mpi");
  BOOST_TEST(w.source.find("MPI_COMM_WORLD") != std::string::npos);
  BOOST_TEST(w.rank == rank);
  BOOST_TEST(w.world_size == size);
  // Open MPI's environment agrees with MPI itself.
  auto from_env = kft::discovery::ompi_env::detect(env);
  BOOST_REQUIRE(from_env.has_value());
  BOOST_TEST(from_env->rank == rank);
  BOOST_TEST(*from_env->local_size == *w.local_size);
}

BOOST_AUTO_TEST_CASE(local_and_node_views_add_up) {
  auto w = kft::discover_with_mpi();
  BOOST_REQUIRE(w.local_rank && w.local_size && w.node_rank && w.node_count);
  // Gather (node, local rank, local size) from everyone and check the whole world.
  int mine[3] = {*w.node_rank, *w.local_rank, *w.local_size};
  std::vector<int> all(3 * static_cast<std::size_t>(w.world_size));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(*w.node_count));
  for (int r = 0; r < w.world_size; ++r) {
    const int node = all[3 * r], local = all[3 * r + 1], local_size = all[3 * r + 2];
    BOOST_REQUIRE(node >= 0 && node < *w.node_count);
    auto& slots = seen[static_cast<std::size_t>(node)];
    if (slots.empty()) slots.assign(static_cast<std::size_t>(local_size), 0);
    BOOST_REQUIRE(static_cast<int>(slots.size()) == local_size);  // one local size per node
    BOOST_REQUIRE(local >= 0 && local < local_size);
    ++slots[static_cast<std::size_t>(local)];
  }
  int total = 0;
  for (const auto& slots : seen) {
    BOOST_TEST(!slots.empty());  // every node index is used
    for (int count : slots) BOOST_TEST(count == 1);  // each local rank exactly once
    total += static_cast<int>(slots.size());
  }
  BOOST_TEST(total == w.world_size);
}

BOOST_AUTO_TEST_CASE(torchrun_variables_still_take_precedence) {
  // A torchrun-launched program that also initialised MPI: torchrun decides.
  auto env = kft::environment::process()
                 .with("RANK", "0")
                 .with("WORLD_SIZE", "1")
                 .with("TORCHELASTIC_RUN_ID", "t");
  auto w = kft::discover_with_mpi(env);
  BOOST_TEST(w.backend == "torchrun");
}
