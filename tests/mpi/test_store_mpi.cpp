// SPDX-License-Identifier: Apache-2.0
// A TCP store set up through MPI: every rank publishes, every rank sees everyone.
#define BOOST_TEST_MODULE kft_store_mpi
#include <boost/test/unit_test.hpp>

#include "mpi_session.hpp"

#include <mpi.h>

#include <string>
#include <vector>

#include <kft/rendezvous/mpi_bootstrap.hpp>

using namespace std::chrono_literals;


BOOST_AUTO_TEST_CASE(every_rank_reaches_one_store) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto h = kft::rendezvous::mpi_bootstrap(MPI_COMM_WORLD);
  BOOST_TEST((rank == 0) == (h.server != nullptr));
  auto& s = *h.client;
  s.set("host/" + std::to_string(rank), "rank-" + std::to_string(rank));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("host/" + std::to_string(r));
  s.wait(keys, 30s);
  for (int r = 0; r < size; ++r) BOOST_TEST(*s.try_get(keys[static_cast<std::size_t>(r)]) == "rank-" + std::to_string(r));
  BOOST_TEST(s.add("count", 1) <= size);
  kft::rendezvous::barrier(s, "done", size, 30s);
  BOOST_TEST(s.add("count", 0) == size);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0's server outlives everyone's last request
}
