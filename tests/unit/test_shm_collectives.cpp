// SPDX-License-Identifier: Apache-2.0
// Shared-memory collectives with ranks as threads, beyond the conformance suite (which checks
// every collective x algorithm x dtype x op x count, tests/conformance/): zero-copy buffers,
// async work, mismatches, timeouts, aborts and bad arguments.
#define BOOST_TEST_MODULE kft_shm_collectives
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kft/core/hash.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

using namespace std::chrono_literals;
namespace shm = kft::shm;

namespace {

// Small buffers so that 4099 elements already take several chunks and the one-shot slot overflows,
// and a low streaming threshold.
shm::config small_config(const std::string& name) {
  shm::config c;
  c.staging_bytes = 16u << 10;
  c.small_bytes = 4u << 10;
  c.streaming_bytes = 64u << 10;  // the streaming-store paths too (copy path, direct zero-copy out of place)
  c.copy_streaming_bytes = 8u << 10;  // the copy path's streamed staging from 8 KiB, plain below
  c.pool_bytes = 16u << 20;
  c.timeout = 60s;
  c.name = name;
  return c;
}

// Runs body(comm) on p threads, each with its own communicator; reports the first failure.
void with_ranks(int p, const std::string& name, const std::function<void(shm::communicator&)>& body,
                shm::config cfg = {}) {
  if (cfg.name == "kft") cfg = small_config(name);
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      try {
        shm::communicator comm(store, r, p, cfg);
        body(comm);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  BOOST_TEST(first_error.empty(), first_error);
}

}  // namespace

BOOST_AUTO_TEST_CASE(typed_api_zero_copy_and_async) {
  for (int p : {2, 3, 4}) {
    with_ranks(p, "zc" + std::to_string(p), [&](shm::communicator& comm) {
      const std::size_t n = 100003;
      auto a = comm.allocate<float>(n);  // symmetric buffers in the segment
      auto b = comm.allocate<float>(n);
      for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 9);
      const float total = static_cast<float>(p * (p + 1) / 2);
      comm.allreduce(std::span<const float>(a), b, kft::ops::sum);  // zero-copy in, zero-copy out
      comm.allreduce(a, kft::ops::sum);                             // zero-copy in place
      std::vector<float> priv(n);
      comm.allreduce(std::span<const float>(b), std::span<float>(priv), kft::ops::max);  // zero-copy in, private out
      for (std::size_t i = 0; i < n; ++i)
        if (a[i] != total * static_cast<float>(i % 9) || b[i] != a[i] || priv[i] != a[i])
          throw std::runtime_error("zero-copy allreduce wrong at " + std::to_string(i));
      // Zero-copy allgather.
      auto piece = comm.allocate<std::int64_t>(1000);
      for (std::size_t i = 0; i < 1000; ++i) piece[i] = comm.rank() * 1000 + static_cast<std::int64_t>(i);
      std::vector<std::int64_t> all(1000 * static_cast<std::size_t>(p));
      comm.allgather(std::span<const std::int64_t>(piece), std::span<std::int64_t>(all), {.algorithm = kft::algo::two_shot});
      for (std::size_t j = 0; j < all.size(); ++j)
        if (all[j] != static_cast<std::int64_t>(j)) throw std::runtime_error("zero-copy allgather wrong");
      // Zero-copy allgather in place: each rank's input is its own piece of the output, at a
      // different offset on every rank.
      auto gathered = comm.allocate<float>(5000 * static_cast<std::size_t>(p));
      for (auto algo_choice : {kft::algo::one_shot, kft::algo::two_shot}) {
        auto mine = gathered.subspan(5000 * static_cast<std::size_t>(comm.rank()), 5000);
        for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(comm.rank() * 10000 + static_cast<int>(i));
        comm.allgather(std::span<const float>(mine), gathered, {.algorithm = algo_choice});
        for (std::size_t j = 0; j < gathered.size(); ++j)
          if (gathered[j] != static_cast<float>((j / 5000) * 10000 + j % 5000))
            throw std::runtime_error("zero-copy in-place allgather wrong at " + std::to_string(j));
      }
      // Async: several in flight, completed in order.
      std::vector<std::vector<double>> bufs(4, std::vector<double>(5000, 1.0));
      std::vector<kft::async::work> pending;
      for (auto& buf : bufs) pending.push_back(comm.allreduce_async(std::span<const double>(buf), std::span<double>(buf), kft::ops::sum));
      comm.barrier();  // a sync call after async ones waits for them first
      for (auto& w : pending) {  // (no BOOST_ macros in rank threads: Boost.Test is not thread-safe)
        if (!w.test()) throw std::runtime_error("async work not complete after a later sync call");
        w.wait();
      }
      for (auto& buf : bufs)
        if (buf[4999] != p) throw std::runtime_error("async allreduce wrong");
      std::vector<kft::bfloat16> h(33, kft::bfloat16(1.5f));
      comm.broadcast_async(std::span<kft::bfloat16>(h), p - 1).wait();
    });
  }
}

// A zero-copy buffer belongs to its owner again the moment the call returns: the DDP reducer's
// next backward pass writes into its bucket right away, while a slower peer may still be
// reading it. Each rank overwrites its buffers with garbage at once and then checks the result
// it got; a peer that read late would see the garbage.
BOOST_AUTO_TEST_CASE(zero_copy_buffers_are_free_when_the_call_returns) {
  for (int p : {2, 3}) {
    with_ranks(p, "zcfree" + std::to_string(p), [&](shm::communicator& comm) {
      const std::size_t n = 200003;  // many staging chunks
      auto a = comm.allocate<float>(n);
      auto b = comm.allocate<float>(n);
      std::vector<float> priv(n), gathered(1000 * static_cast<std::size_t>(p));
      const float total = static_cast<float>(p * (p + 1) / 2);
      for (int iter = 0; iter < 40; ++iter) {
        const auto algo_choice = iter % 2 ? kft::algo::two_shot : kft::algo::one_shot;
        for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 7);
        if (iter % 3 == 0) {  // in place
          comm.allreduce(a, kft::ops::sum, {.algorithm = algo_choice});
          std::vector<float> got(a.begin(), a.end());
          std::fill(a.begin(), a.end(), -1e30f);
          for (std::size_t i = 0; i < n; ++i)
            if (got[i] != total * static_cast<float>(i % 7))
              throw std::runtime_error("in-place zero-copy allreduce read a buffer its owner had rewritten, at " +
                                       std::to_string(i) + " (iteration " + std::to_string(iter) + ")");
        } else if (iter % 3 == 1) {  // pool in, private out
          comm.allreduce(std::span<const float>(a), std::span<float>(priv), kft::ops::sum, {.algorithm = algo_choice});
          std::fill(a.begin(), a.end(), -1e30f);
          for (std::size_t i = 0; i < n; ++i)
            if (priv[i] != total * static_cast<float>(i % 7))
              throw std::runtime_error("zero-copy input read after its owner rewrote it, at " + std::to_string(i));
        } else {  // pool in, pool out
          comm.allreduce(std::span<const float>(a), b, kft::ops::sum, {.algorithm = algo_choice});
          std::vector<float> got(b.begin(), b.end());
          std::fill(b.begin(), b.end(), -1e30f);
          std::fill(a.begin(), a.end(), -1e30f);
          for (std::size_t i = 0; i < n; ++i)
            if (got[i] != total * static_cast<float>(i % 7))
              throw std::runtime_error("zero-copy output read after its owner rewrote it, at " + std::to_string(i));
        }
        auto piece = a.subspan(0, 1000);
        for (std::size_t i = 0; i < 1000; ++i) piece[i] = static_cast<float>(comm.rank() * 1000 + static_cast<int>(i));
        comm.allgather(std::span<const float>(piece), std::span<float>(gathered), {.algorithm = kft::algo::two_shot});
        std::fill(piece.begin(), piece.end(), -1e30f);
        for (std::size_t j = 0; j < gathered.size(); ++j)
          if (gathered[j] != static_cast<float>(j))
            throw std::runtime_error("zero-copy allgather input read after its owner rewrote it, at " + std::to_string(j));
      }
    });
  }
}

// The direct zero-copy allreduce with claimed blocks (what runs by default when the ranks
// outnumber the CPUs, from 16 MiB; forced here with a low threshold): calls of several sizes in
// a row, in place and out of place, streamed and not, below and above the threshold. Every
// output is filled with garbage first, so a block nobody reduced shows; every rank's output must
// be exact and bit-identical; and the blocks must really have been claimed (by someone).
BOOST_AUTO_TEST_CASE(direct_allreduce_with_claimed_blocks) {
  for (int p : {3, 4}) {
    std::vector<std::uint64_t> claimed(static_cast<std::size_t>(p));
    auto cfg = small_config("claim" + std::to_string(p));
    cfg.claim_blocks = 1;
    cfg.claim_from_bytes = 64u << 10;
    with_ranks(
        p, cfg.name,
        [&](shm::communicator& comm) {
          const std::size_t nmax = 300001;
          auto a = comm.allocate<float>(nmax);
          auto b = comm.allocate<float>(nmax);
          const float total = static_cast<float>(p * (p + 1) / 2);
          std::vector<std::int64_t> sums(static_cast<std::size_t>(comm.size()));
          int iter = 0;
          for (std::size_t n : {std::size_t{100003}, std::size_t{16383}, std::size_t{300001}, std::size_t{20000},
                                std::size_t{262147}, std::size_t{100003}}) {
            for (bool in_place : {false, true}) {
              for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 11);
              std::fill(b.begin(), b.end(), -1e30f);
              auto out = in_place ? a.subspan(0, n) : b.subspan(0, n);
              if (in_place)
                comm.allreduce(a.subspan(0, n), kft::ops::sum);
              else
                comm.allreduce(std::span<const float>(a.subspan(0, n)), out, kft::ops::sum);
              std::uint64_t h = kft::detail::fnv1a_basis;
              for (std::size_t i = 0; i < n; ++i) {
                if (out[i] != total * static_cast<float>(i % 11))
                  throw std::runtime_error("claimed-block allreduce wrong at " + std::to_string(i) + " of " +
                                           std::to_string(n) + (in_place ? " (in place)" : " (out of place)") +
                                           ", call " + std::to_string(iter));
                std::uint32_t bits;
                std::memcpy(&bits, &out[i], 4);
                h = kft::detail::fnv1a_u64(bits, h);
              }
              std::vector<std::int64_t> mine{static_cast<std::int64_t>(h)};
              comm.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(sums));
              for (auto x : sums)
                if (x != mine[0]) throw std::runtime_error("claimed-block allreduce: ranks' outputs differ, call " + std::to_string(iter));
              ++iter;
            }
          }
          claimed[static_cast<std::size_t>(comm.rank())] = comm.claimed_blocks();
        },
        cfg);
    std::uint64_t all = 0, want = 0;
    for (auto c : claimed) all += c;
    // Every block of every call above the threshold claimed exactly once (in place and out of
    // place: twice per size); blocks of about a quarter of a rank's share, 32-256 KiB.
    for (std::size_t n : {100003, 16383, 300001, 20000, 262147, 100003}) {
      if (n * 4 < cfg.claim_from_bytes) continue;
      const std::size_t unit = std::clamp<std::size_t>(n * 4 / (4 * static_cast<std::size_t>(p)), 32u << 10, 256u << 10) / 4;
      want += 2 * ((n + unit - 1) / unit);
    }
    BOOST_TEST(all == want, p << " ranks claimed " << all << " blocks in all, not " << want);
  }
  // A value that is none of -1, 0, 1 is refused when the communicator is made.
  auto bad = small_config("claimbad");
  bad.claim_blocks = 2;
  BOOST_CHECK_EXCEPTION(shm::communicator(std::make_shared<kft::rendezvous::memory_store>(), 0, 1, bad),
                        kft::usage_error, [](const kft::usage_error& e) {
                          return std::string(e.what()).find("claim_blocks") != std::string::npos;
                        });
}

// Huge pages (config::huge_pages): whether this kernel can turn shared memory into 2 MiB pages
// is probed here on a memfd of the test's own (fallocate + MADV_COLLAPSE, as the segment does);
// where it can, every rank's whole region must be in 2 MiB pages, where it cannot, the report
// must say why. Either way results are exact, off means no huge pages, and a bad value is refused.
namespace {
bool kernel_collapses_shared_memory(std::string& why) {
  constexpr std::size_t two = std::size_t{2} << 20;
  const int fd = ::memfd_create("kft-test-thp", MFD_CLOEXEC);
  if (fd < 0) return why = "memfd_create failed", false;
  bool ok = false;
  if (::ftruncate(fd, static_cast<off_t>(two)) == 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(two)) == 0) {
    void* r = ::mmap(nullptr, 2 * two, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const auto at = (reinterpret_cast<std::uintptr_t>(r) + two - 1) / two * two;
    void* m = ::mmap(reinterpret_cast<void*>(at), two, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    ok = m != MAP_FAILED && ::madvise(m, two, 25 /* MADV_COLLAPSE */) == 0;
    if (!ok) why = std::string("MADV_COLLAPSE: ") + std::strerror(errno);
    ::munmap(r, 2 * two);
  } else {
    why = std::string("fallocate: ") + std::strerror(errno);
  }
  ::close(fd);
  return ok;
}
}  // namespace

BOOST_AUTO_TEST_CASE(huge_pages_back_every_region_or_say_why) {
  std::string probe_why;
  const bool can = kernel_collapses_shared_memory(probe_why);
  BOOST_TEST_MESSAGE("this kernel " << (can ? "collapses shared memory into 2 MiB pages" : "refuses: " + probe_why));
  for (int huge : {1, 0, -1}) {
    auto cfg = small_config("huge" + std::to_string(huge + 1));
    cfg.huge_pages = huge;
    cfg.pool_bytes = 5u << 20;  // below huge_pages_from_bytes: -1 means none here
    std::vector<shm::communicator::huge_page_report> got(3);
    std::vector<std::size_t> strides(3);
    with_ranks(
        3, cfg.name,
        [&](shm::communicator& comm) {
          got[static_cast<std::size_t>(comm.rank())] = comm.huge_pages();
          strides[static_cast<std::size_t>(comm.rank())] = comm.region_stride();
          const std::size_t n = (2u << 20) / 4 + 3;  // the direct path, streamed, across 2 MiB pages
          auto a = comm.allocate<float>(n);
          auto o = comm.allocate<float>(n);
          for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 7);
          std::fill(o.begin(), o.end(), -1.0f);
          comm.allreduce(std::span<const float>(a), o, kft::ops::sum);
          comm.allreduce(a, kft::ops::sum);
          for (std::size_t i = 0; i < n; ++i)
            if (o[i] != 6.0f * static_cast<float>(i % 7) || a[i] != o[i])
              throw std::runtime_error("huge_pages=" + std::to_string(huge) + ": wrong at " + std::to_string(i));
        },
        cfg);
    for (std::size_t r = 0; r < got.size(); ++r) {
      const auto& h = got[r];
      BOOST_TEST_CONTEXT("huge_pages=" << huge << " rank " << r) {
        BOOST_TEST(strides[r] == strides[0]);
        BOOST_TEST(strides[r] % 4096u == 0u);
        if (huge == 1) {
          BOOST_TEST(h.region_bytes > 0u);
          BOOST_TEST(h.region_bytes % (2u << 20) == 0u);
          // Regions on 2 MiB pages start a multiple of 8 MiB apart (config::region_align_bytes):
          // here 5 MiB of pool makes a region of less than 8 MiB, so the allreduces above ran
          // across a gap.
          BOOST_TEST(strides[r] % (8u << 20) == 0u);
          BOOST_TEST(strides[r] >= h.region_bytes);
          BOOST_TEST(strides[r] - h.region_bytes < (8u << 20));
          BOOST_TEST(strides[r] > h.region_bytes);
          if (can) BOOST_TEST(h.bytes == h.region_bytes, h.why);
          else BOOST_TEST(!h.why.empty());
        } else {
          BOOST_TEST(h.bytes == 0u);
          BOOST_TEST(h.region_bytes == 0u);
        }
      }
    }
  }
  auto bad = small_config("hugebad");
  bad.huge_pages = 2;
  BOOST_CHECK_EXCEPTION(shm::communicator(std::make_shared<kft::rendezvous::memory_store>(), 0, 1, bad),
                        kft::usage_error, [](const kft::usage_error& e) {
                          return std::string(e.what()).find("huge_pages") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(region_align_bytes_sets_the_distance_between_ranks_regions) {
  // An explicit multiple of the pages: 2 MiB with huge pages packs the regions end to end, 12 MiB
  // spaces them so (both ranks compute the same and the data go across).
  for (std::size_t align : {std::size_t{2} << 20, std::size_t{12} << 20}) {
    auto cfg = small_config("align" + std::to_string(align >> 20));
    cfg.huge_pages = 1;
    cfg.pool_bytes = 5u << 20;
    cfg.region_align_bytes = align;
    std::vector<std::size_t> strides(2), regions(2);
    with_ranks(
        2, cfg.name,
        [&](shm::communicator& comm) {
          strides[static_cast<std::size_t>(comm.rank())] = comm.region_stride();
          regions[static_cast<std::size_t>(comm.rank())] = comm.huge_pages().region_bytes;
          auto a = comm.allocate<float>(1u << 20);
          std::fill(a.begin(), a.end(), static_cast<float>(comm.rank() + 1));
          comm.allreduce(a, kft::ops::sum);
          if (std::any_of(a.begin(), a.end(), [](float x) { return x != 3.0f; }))
            throw std::runtime_error("region_align_bytes=" + std::to_string(align) + ": wrong sum");
        },
        cfg);
    BOOST_TEST_CONTEXT("region_align_bytes=" << align) {
      BOOST_TEST(strides[0] == strides[1]);
      BOOST_TEST(strides[0] % align == 0u);
      BOOST_TEST(strides[0] >= regions[0]);
      BOOST_TEST(strides[0] - regions[0] < align);
    }
  }
  // Not a multiple of the pages: refused at construction, naming the setting and the value.
  for (auto [huge, align] : {std::pair{1, std::size_t{3} << 20}, std::pair{0, std::size_t{5000}}}) {
    auto bad = small_config("alignbad" + std::to_string(huge));
    bad.huge_pages = huge;
    bad.region_align_bytes = align;
    BOOST_CHECK_EXCEPTION(shm::communicator(std::make_shared<kft::rendezvous::memory_store>(), 0, 1, bad),
                          kft::usage_error, [&](const kft::usage_error& e) {
                            const std::string m = e.what();
                            return m.find("region_align_bytes") != std::string::npos &&
                                   m.find(std::to_string(align)) != std::string::npos;
                          });
  }
}

BOOST_AUTO_TEST_CASE(mismatch_is_reported_on_both_sides) {
  std::mutex mu;
  std::vector<std::string> messages;
  with_ranks(2, "mismatch", [&](shm::communicator& comm) {
    std::vector<float> big(1048576), small(4096);
    comm.barrier();
    try {
      if (comm.rank() == 1) comm.allreduce(std::span<const float>(big), std::span<float>(big), kft::ops::sum);
      else comm.broadcast(std::span<float>(small), 0);
    } catch (const kft::mismatch_error& e) {
      std::lock_guard lock(mu);
      messages.push_back(e.what());
    }
  });
  BOOST_REQUIRE(messages.size() == 2u);
  for (const auto& m : messages) {
    BOOST_TEST_INFO(m);
    BOOST_TEST(m.find("#2 allreduce f32 x 1048576 (sum)") != std::string::npos);
    BOOST_TEST(m.find("#2 broadcast f32 x 4096 (root 0)") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(timeout_names_the_missing_rank_and_stops_the_group) {
  std::mutex mu;
  std::string timeout_msg, remote_msg;
  with_ranks(3, "timeout", [&](shm::communicator& comm) {
    std::vector<std::int32_t> v(10, 1);
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(1500ms);  // too late for the others' 300 ms deadline
      try {
        comm.allreduce(std::span<std::int32_t>(v), kft::ops::sum);
      } catch (const kft::remote_error& e) {
        std::lock_guard lock(mu);
        remote_msg = e.what();
      }
      return;
    }
    try {
      comm.allreduce(std::span<std::int32_t>(v), kft::ops::sum, {.timeout = 300ms});
    } catch (const kft::timeout_error& e) {
      std::lock_guard lock(mu);
      if (timeout_msg.empty()) timeout_msg = e.what();
    } catch (const kft::remote_error&) {
      // the other waiting rank may see the first one's abort before its own deadline
    }
  });
  BOOST_TEST_INFO(timeout_msg);
  BOOST_TEST(timeout_msg.find("allreduce #1: (i32 x 10, sum, one_shot) timed out after 300 ms") != std::string::npos);
  BOOST_TEST(timeout_msg.find("waiting for rank(s) 2 (at #0)") != std::string::npos);
  BOOST_TEST_INFO(remote_msg);
  BOOST_TEST(remote_msg.find("stopped the group") != std::string::npos);
}

// A rank inside another communicator's call (the hierarchical allreduce's inter-node step)
// is the middle of a chain: a peer's wait for it lasts that call's bound longer, once, and then
// names what the rank waits in; an abort with the inner call's error arrives before that.
BOOST_AUTO_TEST_CASE(a_wait_on_a_rank_inside_another_call_names_the_chain) {
  // Rank 0 allreduces with a 200 ms deadline while rank 1 runs `elsewhere` instead; the error
  // rank 0 gets, and how long it waited for it.
  const auto rank0_error = [](const char* name, std::optional<std::chrono::milliseconds> expect, auto elsewhere) {
    std::mutex mu;
    std::string msg;
    std::chrono::milliseconds took{0};
    with_ranks(2, name, [&](shm::communicator& comm) {
      std::vector<std::int32_t> v(10, 1);
      if (expect) comm.expect_outside(*expect);
      if (comm.rank() == 1) {
        elsewhere(comm);
        return;
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        comm.allreduce(std::span<std::int32_t>(v), kft::ops::sum, {.timeout = 200ms});
      } catch (const kft::error& e) {
        std::lock_guard lock(mu);
        msg = e.what();
      }
      took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    });
    return std::pair{msg, took};
  };

  auto [msg, took] = rank0_error("outside", 600ms, [](shm::communicator& comm) {
    const auto inside = comm.outside("gloo allreduce #7 (rail 0, rank 0/2) for job rank 5", 400ms);
    std::this_thread::sleep_for(1500ms);
  });
  BOOST_TEST_INFO(msg);
  BOOST_TEST(msg.find("timed out after 200 ms + 400 ms (the inner call's deadline) in arrival waiting for rank(s) 1 "
                      "(at #0, itself waiting in gloo allreduce #7 (rail 0, rank 0/2) for job rank 5)") != std::string::npos);
  BOOST_TEST(took.count() >= 550);  // the bound was waited, not just the 200 ms

  // The inner call fails and its rank aborts the node with that error: the waiting peer gets it.
  std::tie(msg, took) = rank0_error("outside-abort", 10s, [](shm::communicator& comm) {
    {
      const auto inside = comm.outside("gloo allreduce #3 (rail 0, rank 0/2) for job rank 5", 5s);
      std::this_thread::sleep_for(500ms);  // past rank 0's 200 ms deadline
    }
    comm.abort("gloo allreduce #3 timed out: rank 5 recorded no failure");
  });
  BOOST_TEST_INFO(msg);
  BOOST_TEST(msg.find("rank 1 stopped the group: gloo allreduce #3 timed out: rank 5 recorded no failure") !=
             std::string::npos);

  // Back from the other call: an ordinary timeout again.
  std::tie(msg, took) = rank0_error("outside-left", 10s, [](shm::communicator& comm) {
    { const auto inside = comm.outside("gloo allreduce #1 (rail 0, rank 0/2) for job rank 5", 5s); }
    std::this_thread::sleep_for(1000ms);
  });
  BOOST_TEST_INFO(msg);
  BOOST_TEST(msg.find("timed out after 200 ms in arrival waiting for rank(s) 1 (at #0)") != std::string::npos);

  // No expect_outside: the wait keeps its own deadline and still names the chain.
  std::tie(msg, took) = rank0_error("outside-unexpected", std::nullopt, [](shm::communicator& comm) {
    const auto inside = comm.outside("gloo allreduce #2 (rail 0, rank 0/2) for job rank 5", 5s);
    std::this_thread::sleep_for(1000ms);
  });
  BOOST_TEST_INFO(msg);
  BOOST_TEST(msg.find("timed out after 200 ms in arrival waiting for rank(s) 1 (at #0, itself waiting in gloo allreduce "
                      "#2 (rail 0, rank 0/2) for job rank 5)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(abort_reaches_every_rank) {
  std::atomic<int> remote{0};
  std::mutex mu;
  std::vector<std::string> other;
  with_ranks(4, "abort", [&](shm::communicator& comm) {
    comm.barrier();
    if (comm.rank() == 3) {
      comm.abort("rank 3 hit NaN in its gradients");
      return;
    }
    try {
      comm.barrier({.timeout = 30s});
    } catch (const kft::remote_error& e) {
      if (std::string(e.what()).find("rank 3 stopped the group: rank 3 hit NaN") != std::string::npos) ++remote;
      else {
        std::lock_guard lock(mu);
        other.push_back(e.what());
      }
    }
  });
  BOOST_TEST(remote.load() == 3);
  for (const auto& m : other) BOOST_TEST_MESSAGE("unexpected: " << m);
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  // Boost.Test's assertions are not thread-safe: the rank threads count, the test thread checks.
  std::atomic<int> refused{0};
  auto usage_error_from = [&](auto&& call) {
    try {
      call();
    } catch (const kft::usage_error&) {
      ++refused;
    }
  };
  with_ranks(2, "bad", [&](shm::communicator& comm) {
    std::vector<float> a(10), b(11);
    usage_error_from([&] { comm.allreduce(std::span<const float>(a), std::span<float>(b), kft::ops::sum); });
    usage_error_from([&] { comm.broadcast(std::span<float>(a), 2); });
    usage_error_from([&] { (void)comm.allocate<float>(1u << 30); });
  });
  BOOST_TEST(refused.load() == 2 * 3);
  BOOST_CHECK_THROW(shm::communicator(std::make_shared<kft::rendezvous::memory_store>(), 2, 2), kft::usage_error);
}

// Input and output that share bytes without being one buffer: a rank's output would overwrite
// input that it or a peer has yet to read. Refused before anything is exchanged, on private and
// on pool buffers, and the communicator goes on working.
BOOST_AUTO_TEST_CASE(partly_overlapping_buffers_are_refused) {
  std::mutex mu;
  std::vector<std::string> messages;
  with_ranks(2, "overlap", [&](shm::communicator& comm) {
    std::vector<float> priv(3000, 1.0f);
    auto pool = comm.allocate<float>(3000);
    for (auto* base : {priv.data(), pool.data()}) {
      try {
        comm.allreduce(std::span<const float>(base, 2000), std::span<float>(base + 500, 2000), kft::ops::sum);
        throw std::runtime_error("a partly overlapping allreduce was not refused");
      } catch (const kft::usage_error& e) {
        const std::lock_guard lock(mu);
        messages.emplace_back(e.what());
      }
    }
    std::fill(pool.begin(), pool.end(), 1.0f);
    comm.allreduce(pool, kft::ops::sum);  // in place: fine
    for (float v : pool)
      if (v != 2.0f) throw std::runtime_error("allreduce after a refused call is wrong");
  });
  BOOST_TEST_REQUIRE(messages.size() == 4u);
  for (const auto& m : messages) BOOST_TEST(m.find("overlap without being the same buffer") != std::string::npos, m);
}

// The same for the other collectives, whose in-place forms are particular overlaps: broadcast's
// root (in == out), reduce_scatter (out == in + rank x recv_count), allgather (in == out + rank x
// send_count). Every other shared byte is refused before anything is exchanged, with
// a message naming the collective and the in-place form; the in-place forms and the calls after
// the refusals give the right values, one-shot and chunked sizes alike.
BOOST_AUTO_TEST_CASE(partly_overlapping_buffers_are_refused_by_every_collective) {
  std::atomic<int> refused{0};
  std::mutex mu;
  std::vector<std::string> wrong;
  with_ranks(3, "overlap-all", [&](shm::communicator& comm) {
    const int me = comm.rank(), p = comm.size();
    auto expect_refusal = [&](const char* what, const char* needle, auto&& call) {
      try {
        call();
        const std::lock_guard lock(mu);
        wrong.push_back(std::string(what) + " was not refused on rank " + std::to_string(me));
      } catch (const kft::usage_error& e) {
        if (std::string(e.what()).find(needle) == std::string::npos) {
          const std::lock_guard lock(mu);
          wrong.push_back(std::string(what) + ": message without \"" + needle + "\": " + e.what());
        }
        ++refused;
      }
    };
    for (std::size_t n : {std::size_t{5}, std::size_t{300000}}) {  // mailbox and staged chunks
      const auto un = static_cast<std::size_t>(p);
      std::vector<float> buf(n * un * 2 + 64, 1.0f);
      float* b = buf.data();
      expect_refusal("reduce_scatter", "input + rank x recv_count", [&] {
        // the output one element past this rank's in-place slice
        comm.reduce_scatter(std::span<const float>(b, n * un), std::span<float>(b + static_cast<std::size_t>(me) * n + 1, n),
                            kft::ops::sum);
      });
      expect_refusal("allgather", "output + rank x send_count", [&] {
        comm.allgather(std::span<const float>(b + 1, n), std::span<float>(b, n * un));
      });
      // The in-place forms.
      for (std::size_t i = 0; i < n * un; ++i) b[i] = static_cast<float>(me + 1);
      comm.reduce_scatter(std::span<const float>(b, n * un), std::span<float>(b + static_cast<std::size_t>(me) * n, n),
                          kft::ops::sum);
      for (std::size_t i = 0; i < n; ++i)
        if (b[static_cast<std::size_t>(me) * n + i] != static_cast<float>(p * (p + 1) / 2)) {
          const std::lock_guard lock(mu);
          wrong.push_back("in-place reduce_scatter of " + std::to_string(n) + " is wrong on rank " + std::to_string(me));
          break;
        }
      for (std::size_t i = 0; i < n; ++i) b[static_cast<std::size_t>(me) * n + i] = static_cast<float>(10 * me + 7);
      comm.allgather(std::span<const float>(b + static_cast<std::size_t>(me) * n, n), std::span<float>(b, n * un));
      for (std::size_t i = 0; i < n * un; ++i)
        if (b[i] != static_cast<float>(10 * static_cast<int>(i / n) + 7)) {
          const std::lock_guard lock(mu);
          wrong.push_back("in-place allgather of " + std::to_string(n) + " is wrong on rank " + std::to_string(me));
          break;
        }
      if (me == 0) std::fill(b, b + n, 42.0f);
      comm.broadcast(std::span<float>(b, n), 0);
      if (std::count(b, b + n, 42.0f) != static_cast<std::ptrdiff_t>(n)) {
        const std::lock_guard lock(mu);
        wrong.push_back("in-place broadcast of " + std::to_string(n) + " is wrong on rank " + std::to_string(me));
      }
    }
    // broadcast: only the root reads its input, so only the root can refuse it; the others
    // refuse the call with it (naming the root) instead of waiting for it, and the next
    // broadcast pairs up as usual.
    for (std::size_t n : {std::size_t{5}, std::size_t{300000}}) {
      std::vector<float> buf(n + 1, 1.0f);
      if (me == 0)
        expect_refusal("broadcast", "broadcast: the root's input and output buffers overlap", [&] {
          comm.broadcast(std::span<const float>(buf.data(), n), std::span<float>(buf.data() + 1, n), 0);
        });
      else
        expect_refusal("broadcast on a non-root rank", "rank 0 refused #", [&] { comm.broadcast(std::span<float>(buf.data(), n), 0); });
      if (me == 0) std::fill(buf.begin(), buf.end(), 5.0f);
      comm.broadcast(std::span<float>(buf.data(), n), 0);
      if (std::count(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), 5.0f) != static_cast<std::ptrdiff_t>(n)) {
        const std::lock_guard lock(mu);
        wrong.push_back("broadcast after a refused one is wrong on rank " + std::to_string(me));
      }
    }
  });
  for (const auto& w : wrong) BOOST_ERROR(w);
  BOOST_TEST(refused.load() == 2 * (3 + 3 + 3));  // two sizes: reduce_scatter, allgather and broadcast on every rank
}

// Arguments only one rank can see as wrong (its own buffers): that rank refuses the call, and
// the others refuse it too at once, naming that rank, the collective and its number, instead
// of waiting out the timeout (60 s here); every rank's next call pairs up and is right.
BOOST_AUTO_TEST_CASE(a_call_refused_on_one_rank_is_refused_on_every_rank_at_once) {
  std::mutex mu;
  std::vector<std::string> wrong;
  std::atomic<int> refused{0};
  with_ranks(3, "refuse-one", [&](shm::communicator& comm) {
    const int me = comm.rank();
    kft::options o;
    o.timeout = std::chrono::seconds(60);
    for (std::size_t n : {std::size_t{6}, std::size_t{300000}}) {
      std::vector<float> buf(2 * n, static_cast<float>(me + 1));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        if (me == 1)  // overlapping halves: refused here only
          comm.allreduce(std::span<const float>(buf.data(), n), std::span<float>(buf.data() + 1, n), kft::ops::sum, o);
        else
          comm.allreduce(std::span<const float>(buf.data(), n), std::span<float>(buf.data() + n, n), kft::ops::sum, o);
        const std::lock_guard lock(mu);
        wrong.push_back("rank " + std::to_string(me) + " ran the allreduce that rank 1 refused");
      } catch (const kft::usage_error& e) {
        ++refused;
        const std::string m = e.what(), seq = "#" + std::to_string(comm.sequence());
        const char* expected = me == 1 ? "overlap without being the same buffer" : "rank 1 refused ";
        if (m.find(expected) == std::string::npos || (me != 1 && (m.find(seq + " allreduce") == std::string::npos))) {
          const std::lock_guard lock(mu);
          wrong.push_back("rank " + std::to_string(me) + ": expected \"" + expected + "\" and " + seq + ": " + m);
        }
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) {
        const std::lock_guard lock(mu);
        wrong.push_back("rank " + std::to_string(me) + " waited for the refused call instead of refusing it");
      }
      std::fill(buf.begin(), buf.end(), static_cast<float>(me + 1));
      comm.allreduce(std::span<const float>(buf.data(), n), std::span<float>(buf.data() + n, n), kft::ops::sum, o);
      if (std::count(buf.begin() + static_cast<std::ptrdiff_t>(n), buf.end(), 6.0f) != static_cast<std::ptrdiff_t>(n)) {
        const std::lock_guard lock(mu);
        wrong.push_back("the allreduce after the refused one is wrong on rank " + std::to_string(me));
      }
    }
  });
  for (const auto& w : wrong) BOOST_ERROR(w);
  BOOST_TEST(refused.load() == 2 * 3);
}
