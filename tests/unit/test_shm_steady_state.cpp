// SPDX-License-Identifier: Apache-2.0
// Steady state of the shared-memory collectives: after warm-up, calls allocate nothing and take
// no page fault (all staging is pre-allocated and pre-faulted at construction).
#define BOOST_TEST_MODULE kft_shm_steady_state
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

// Counts this thread's heap allocations (kft_test::thread_allocations).
#include "../common/alloc_counter.hpp"

namespace {
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}
}  // namespace

BOOST_AUTO_TEST_CASE(no_allocation_and_no_page_fault_per_call) {
  constexpr int p = 2;
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::vector<long> faults(p, -1), allocs(p, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r)
    ranks.emplace_back([&, r] {
      kft::shm::communicator comm(store, r, p, {.pool_bytes = 8u << 20, .name = "steady"});
      std::vector<float> small(64), mid(4096), big(1u << 20);  // one-shot, one-shot, two-shot
      auto zc = comm.allocate<float>(1u << 20);
      auto round = [&] {
        comm.allreduce(std::span<float>(small), kft::ops::sum);
        comm.allreduce(std::span<float>(mid), kft::ops::max);
        comm.allreduce(std::span<float>(big), kft::ops::sum, {.algorithm = kft::algo::two_shot});
        comm.allreduce(std::span<float>(big), kft::ops::avg, {.algorithm = kft::algo::one_shot});
        comm.allreduce(zc, kft::ops::sum);
        comm.broadcast(std::span<float>(big), 1);
        comm.barrier();
      };
      for (int i = 0; i < 3; ++i) round();  // warm-up
      const long f0 = minor_faults(), a0 = kft_test::thread_allocations;
      for (int i = 0; i < 100; ++i) round();
      faults[static_cast<std::size_t>(r)] = minor_faults() - f0;
      allocs[static_cast<std::size_t>(r)] = kft_test::thread_allocations - a0;
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < p; ++r) {
    BOOST_TEST_INFO("rank " << r);
    BOOST_TEST(faults[static_cast<std::size_t>(r)] == 0);
    BOOST_TEST(allocs[static_cast<std::size_t>(r)] == 0);
  }
}
