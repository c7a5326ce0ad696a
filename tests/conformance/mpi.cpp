// SPDX-License-Identifier: Apache-2.0
// Conformance under mpirun, one rank per process: kft's MPI communicator, the shared-memory
// transport across processes (when every rank is on one node), and the CPU process group
// (shared memory per node + MPI between nodes; KFT_HOST_ID splits one machine into nodes). Every rank registers the same cases in the same order and runs each collectively;
// outcomes are compared over MPI_COMM_WORLD, outside the communicator under test.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <mpi.h>

#include <cstdlib>
#include <memory>

#include <kft/group/mpi_group.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#include <kft/transport/shm/communicator.hpp>
#include <kft/transport/mpi/communicator.hpp>

#include "registry.hpp"

namespace conf = kft_test::conformance;

namespace {

struct mpi_session {
  mpi_session() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  ~mpi_session() { MPI_Finalize(); }
};

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// This rank's outcome next to everyone's (counts and hashes; the message is this rank's own).
std::vector<conf::outcome> everyone(const conf::outcome& mine) {
  const int p = world_size();
  std::uint64_t pair[2] = {mine.wrong, mine.output_hash};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(p));
  MPI_Allgather(pair, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD);
  std::vector<conf::outcome> out(static_cast<std::size_t>(p));
  for (std::size_t r = 0; r < out.size(); ++r) {
    out[r].wrong = all[2 * r];
    out[r].output_hash = all[2 * r + 1];
  }
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  out[static_cast<std::size_t>(me)].first = mine.first;
  return out;
}

template <class Comm>
conf::runner over(std::shared_ptr<Comm> comm) {
  return [comm](const conf::spec& s) {
    conf::outcome o;
    try {
      o = conf::run_case(*comm, s);
    } catch (const std::exception& e) {
      o.wrong = 1;
      o.first = std::string("threw: ") + e.what();
    }
    return everyone(o);
  };
}

}  // namespace

bool init_unit_test() {
  const int p = world_size();
  const char* which = std::getenv("KFT_CONFORMANCE");  // mpi, shm, group, or all (default)
  const std::string w = which ? which : "all";
  if (w == "mpi" || w == "all") {
    auto comm = std::make_shared<kft::mpi::communicator>();
    conf::register_suite("mpi", p, conf::cases(p, [](kft::collective c) {
                           if (c == kft::collective::allreduce) return std::vector{kft::algo::automatic, kft::algo::ring};
                           return std::vector{kft::algo::automatic};
                         }),
                         over(comm));
  }
  int local = 1;
  {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  if ((w == "shm" || w == "all") && local == p && std::getenv("KFT_HOST_ID") == nullptr) {
    // Processes of one node through one segment (the store: bootstrapped over MPI).
    auto handle = std::make_shared<kft::rendezvous::store_handle>(kft::rendezvous::mpi_bootstrap(MPI_COMM_WORLD));
    kft::shm::config c;
    c.staging_bytes = 16u << 10;
    c.small_bytes = 4u << 10;
    c.name = "conformance";
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    auto comm = std::shared_ptr<kft::shm::communicator>(new kft::shm::communicator(handle->client, me, p, c),
                                                        [handle](kft::shm::communicator* x) { delete x; });
    conf::register_suite("shm_processes", p, conf::cases(p, [](kft::collective) {
                           return std::vector{kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot};
                         }),
                         over(comm));
  }
  if (w == "group" || w == "all") {
    auto cfg = kft::group::mpi_group_config_from(kft::environment::process());
    cfg.group.warn = false;
    cfg.group.hierarchical.chunk_bytes = 64u << 10;  // many pipeline chunks
    cfg.group.hierarchical.small_bytes = 1u << 10;   // the pipelined path from small messages
    auto pg = std::make_shared<kft::group::process_group>(
        kft::group::mpi_group(MPI_COMM_WORLD, kft::environment::process(), cfg), "cpu group");
    conf::register_suite("group", p, conf::cases(p, [](kft::collective c) {
                           if (c == kft::collective::allreduce)
                             return std::vector{kft::algo::automatic, kft::algo::flat, kft::algo::hierarchical};
                           return std::vector{kft::algo::automatic};
                         }),
                         over(pg));
  }
  return true;
}

int main(int argc, char* argv[]) {
  mpi_session session;  // the test tree (and its communicators) is gone when unit_test_main returns
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
