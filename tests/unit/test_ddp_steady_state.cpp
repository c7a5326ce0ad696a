// SPDX-License-Identifier: Apache-2.0
// Steady state of the DDP reducer over the shared-memory group: after warm-up (the first step
// rebuilds the buckets), a training step allocates nothing on the heap (in any thread: the
// ranks' and the progress engines') and copies no gradient byte (the buckets are the
// gradients, in the shared pool, and the allreduce reads them in place). Both counters are
// shown to be live: the same steps with bucket storage outside the pool copy bytes, and an
// allocation inside the window is counted.
#define BOOST_TEST_MODULE kft_ddp_steady_state
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <barrier>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <kft/ddp/reducer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

// Counts every heap allocation of the process (all threads: kft_test::allocations).
#include "../common/alloc_counter.hpp"

namespace ddp = kft::ddp;

namespace {

struct counts {
  long allocations = -1;
  std::uint64_t staged = 0;  // gradient bytes copied to or from staging, summed over the ranks
  std::size_t buckets = 0;
  bool shared = false;
};

// 2 rank threads, 24 parameters (16 KiB - 2 MiB each: several buckets, all above the one-shot
// mailbox), `warm` steps, then `steps` measured steps between two barriers. `extra` runs once
// inside the window on rank 0 (the live-counter control).
template <class Hook = ddp::allreduce_avg>
counts measure(ddp::reducer_options o, int steps, void (*extra)() = nullptr) {
  constexpr int p = 2;
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::barrier sync(p);
  counts c;
  std::atomic<std::uint64_t> staged{0};
  std::vector<std::string> errors(p);
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r)
    ranks.emplace_back([&, r] {
      try {
        kft::shm::config cfg;
        cfg.name = "ddp-steady";
        cfg.pool_bytes = 64u << 20;
        kft::group::process_group g(kft::shm::communicator(store, r, p, cfg), "shm");
        std::vector<ddp::parameter> params;
        for (std::size_t i = 0; i < 24; ++i)
          params.push_back({(4096u << (i % 6)) + 16 * i, kft::dtype::f32, "layer" + std::to_string(i)});
        ddp::reducer<kft::group::process_group, Hook> red(g, params, o);
        auto step = [&](std::uint64_t s) {
          for (std::size_t k = params.size(); k-- > 0;) {  // backward: last layer first
            auto grad = red.template gradient<float>(k);
            for (std::size_t j = 0; j < grad.size(); j += 1024) grad[j] = static_cast<float>(r + j + s);
            if (o.find_unused_parameters && k == 3 && r == 1) continue;  // rank 1 never uses layer 3
            red.mark_ready(k);
          }
          red.finish();
        };
        for (std::uint64_t s = 0; s < 3; ++s) step(s);  // warm-up: step 1 rebuilds the buckets
        auto* shm = g.get<kft::shm::communicator>();
        g.barrier();
        sync.arrive_and_wait();
        const long a0 = kft_test::allocations.load();
        const std::uint64_t s0 = shm->staged_bytes();
        sync.arrive_and_wait();
        if (extra && r == 0) extra();
        for (int s = 0; s < steps; ++s) step(3 + static_cast<std::uint64_t>(s));
        g.barrier();
        sync.arrive_and_wait();
        const long a1 = kft_test::allocations.load();
        staged += shm->staged_bytes() - s0;
        if (r == 0) {
          c.allocations = a1 - a0;
          c.buckets = red.buckets().size();
          c.shared = red.shared_storage();
        }
        sync.arrive_and_wait();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        sync.arrive_and_drop();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  c.staged = staged.load();
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_step_allocates_nothing_and_copies_no_gradient) {
  const auto c = measure({.limits = {.first_bucket_bytes = 256u << 10, .bucket_bytes_cap = 1u << 20}}, 20);
  BOOST_TEST(c.shared, "bucket storage is in the shared pool");
  BOOST_TEST(c.buckets >= 3u);
  BOOST_TEST(c.allocations == 0, "heap allocations in 20 steps: " << c.allocations);
  BOOST_TEST(c.staged == 0u, "gradient bytes copied in 20 steps: " << c.staged);
}

BOOST_AUTO_TEST_CASE(unused_parameters_mode_and_compression_allocate_nothing_either) {
  const auto unused = measure({.limits = {.first_bucket_bytes = 256u << 10, .bucket_bytes_cap = 1u << 20},
                               .find_unused_parameters = true},
                              10);
  BOOST_TEST(unused.allocations == 0, "find_unused_parameters: " << unused.allocations << " allocations in 10 steps");
  const auto bf16 =
      measure<ddp::bf16_compress>({.limits = {.first_bucket_bytes = 256u << 10, .bucket_bytes_cap = 1u << 20}}, 10);
  BOOST_TEST(bf16.allocations == 0, "bf16_compress: " << bf16.allocations << " allocations in 10 steps");
}

BOOST_AUTO_TEST_CASE(the_counters_are_live) {
  // Bucket storage outside the pool: the allreduce stages every byte in and out.
  const auto heap = measure({.limits = {.first_bucket_bytes = 256u << 10, .bucket_bytes_cap = 1u << 20},
                             .shared_storage = false},
                            2);
  BOOST_TEST(!heap.shared);
  BOOST_TEST(heap.staged > 0u, "staged bytes with heap buckets: " << heap.staged);
  // One allocation inside the window is seen.
  const auto one = measure({.limits = {.first_bucket_bytes = 256u << 10, .bucket_bytes_cap = 1u << 20}}, 2, [] {
    auto* volatile q = new int(7);
    delete q;
  });
  BOOST_TEST(one.allocations == 1, "allocations with one new inside the window: " << one.allocations);
}
