// Shared-memory collectives with ranks as threads: every collective x dtype x op, counts
// {0, 1, 7, 4099, 1 Mi + 3}, 1 to 5 ranks, in place and out of place, every algorithm, plus
// zero-copy buffers, async work, barriers, mismatches, timeouts and aborts.
#define BOOST_TEST_MODULE kft_shm_collectives
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

using namespace std::chrono_literals;
namespace shm = kft::shm;

namespace {

const std::vector<std::size_t> counts{0, 1, 7, 4099, (1u << 20) + 3};
const std::vector<kft::dtype> dtypes{kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16,
                                     kft::dtype::i32, kft::dtype::i64, kft::dtype::u8};
const std::vector<kft::op_kind> op_list{kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min, kft::op_kind::max,
                                        kft::op_kind::avg};
const std::vector<kft::algo> algos{kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot};

// The 1 Mi + 3 count runs on one type of each kind (float, 16-bit float, integer).
bool big_dtype(kft::dtype t) { return t == kft::dtype::f32 || t == kft::dtype::bf16 || t == kft::dtype::i64; }

// Small buffers so that 4099 elements already take several chunks and the one-shot slot overflows.
shm::config small_config(const std::string& name) {
  shm::config c;
  c.staging_bytes = 16u << 10;
  c.small_bytes = 4u << 10;
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

// Integer-valued inputs, exact in every dtype for up to 5 ranks (sums <= 75, products <= 243).
int value(int rank, std::size_t i, kft::op_kind op) {
  if (op == kft::op_kind::prod) return 1 + static_cast<int>((static_cast<std::size_t>(rank) + i) % 3);
  if (op == kft::op_kind::min || op == kft::op_kind::max) return static_cast<int>((static_cast<std::size_t>(rank) * 7 + i) % 11);
  return (rank + 1) * static_cast<int>(i % 5 + 1);
}

// Element access through the dtype, with the library's own accumulate-then-round semantics.
double load(const void* p, kft::dtype t, std::size_t i) {
  switch (t) {
    case kft::dtype::f32: return static_cast<const float*>(p)[i];
    case kft::dtype::f64: return static_cast<const double*>(p)[i];
    case kft::dtype::f16: return kft::half::to_float(static_cast<const std::uint16_t*>(p)[i]);
    case kft::dtype::bf16: return kft::bfloat16::to_float(static_cast<const std::uint16_t*>(p)[i]);
    case kft::dtype::i32: return static_cast<const std::int32_t*>(p)[i];
    case kft::dtype::i64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case kft::dtype::u8: return static_cast<const std::uint8_t*>(p)[i];
  }
  return 0;
}
void store_value(void* p, kft::dtype t, std::size_t i, int v) {
  switch (t) {
    case kft::dtype::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case kft::dtype::f64: static_cast<double*>(p)[i] = v; break;
    case kft::dtype::f16: static_cast<std::uint16_t*>(p)[i] = kft::half::from_float(static_cast<float>(v)); break;
    case kft::dtype::bf16: static_cast<std::uint16_t*>(p)[i] = kft::bfloat16::from_float(static_cast<float>(v)); break;
    case kft::dtype::i32: static_cast<std::int32_t*>(p)[i] = v; break;
    case kft::dtype::i64: static_cast<std::int64_t*>(p)[i] = v; break;
    case kft::dtype::u8: static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(v); break;
  }
}

double expected(int p, std::size_t i, kft::op_kind op, kft::dtype t) {
  double acc = value(0, i, op);
  for (int r = 1; r < p; ++r) {
    const double v = value(r, i, op);
    switch (op) {
      case kft::op_kind::sum:
      case kft::op_kind::avg: acc += v; break;
      case kft::op_kind::prod: acc *= v; break;
      case kft::op_kind::min: acc = std::min(acc, v); break;
      case kft::op_kind::max: acc = std::max(acc, v); break;
    }
  }
  if (t == kft::dtype::u8) acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<long long>(acc)));
  if (op == kft::op_kind::avg) {
    const bool integral = t == kft::dtype::i32 || t == kft::dtype::i64 || t == kft::dtype::u8;
    acc = integral ? std::trunc(acc / p) : acc / p;
  }
  return acc;
}

bool close_enough(double got, double want, kft::dtype t) {
  if (t == kft::dtype::f16 || t == kft::dtype::bf16)  // one rounding to 11 or 8 significant bits
    return std::fabs(got - want) <= std::fabs(want) * (t == kft::dtype::f16 ? 1e-3 : 8e-3) + 1e-6;
  if (t == kft::dtype::f32) return std::fabs(got - want) <= std::fabs(want) * 1e-7;
  return got == want;
}

std::size_t count_wrong(const std::vector<unsigned char>& buf, kft::dtype t, std::size_t n,
                        const std::function<double(std::size_t)>& want) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!close_enough(load(buf.data(), t, i), want(i), t)) ++wrong;
  return wrong;
}

}  // namespace

BOOST_AUTO_TEST_CASE(allreduce_sweep) {
  for (int p = 1; p <= 5; ++p) {
    with_ranks(p, "ar" + std::to_string(p), [&](shm::communicator& comm) {
      const int me = comm.rank();
      for (auto t : dtypes)
        for (auto op : op_list)
          for (auto n : counts)
            for (auto a : algos)
              for (bool in_place : {false, true}) {
                if (n > 5000 && !big_dtype(t)) continue;  // keep it fast: the big count on f32, bf16, i64
                if (n > 5000 && a != kft::algo::automatic && op != kft::op_kind::sum) continue;
                const std::size_t es = kft::size_of(t);
                std::vector<unsigned char> in(n * es + 1), out(n * es + 1, 0xee);
                for (std::size_t i = 0; i < n; ++i) store_value(in.data(), t, i, value(me, i, op));
                auto& dst = in_place ? in : out;
                comm.allreduce(in.data(), dst.data(), n, t, op, {.algorithm = a});
                const auto wrong = count_wrong(dst, t, n, [&](std::size_t i) { return expected(p, i, op, t); });
                if (wrong != 0 || (!in_place && out[n * es] != 0xee))
                  throw std::runtime_error("allreduce " + std::string(kft::name(t)) + " " + std::string(kft::name(op)) +
                                           " x " + std::to_string(n) + " " + std::string(kft::name(a)) +
                                           (in_place ? " in place" : "") + ": " + std::to_string(wrong) +
                                           " wrong (or wrote past the end)");
              }
    });
  }
}

BOOST_AUTO_TEST_CASE(broadcast_sweep) {
  for (int p = 1; p <= 5; ++p) {
    with_ranks(p, "bc" + std::to_string(p), [&](shm::communicator& comm) {
      const int me = comm.rank();
      for (auto t : dtypes)
        for (auto n : counts)
          for (auto a : algos)
            for (int root : {0, p - 1})
              for (bool in_place : {false, true}) {
                if (n > 5000 && !big_dtype(t)) continue;
                const std::size_t es = kft::size_of(t);
                std::vector<unsigned char> in(n * es + 1), out(n * es + 1, 0xee);
                for (std::size_t i = 0; i < n; ++i) store_value(in.data(), t, i, me == root ? value(root, i, kft::op_kind::sum) : -1);
                auto& dst = in_place ? in : out;
                comm.broadcast(in.data(), dst.data(), n, t, root, {.algorithm = a});
                const auto wrong = count_wrong(dst, t, n, [&](std::size_t i) {
                  double v = value(root, i, kft::op_kind::sum);
                  return t == kft::dtype::u8 ? static_cast<double>(static_cast<std::uint8_t>(v)) : v;
                });
                if (wrong != 0)
                  throw std::runtime_error("broadcast " + std::string(kft::name(t)) + " x " + std::to_string(n) +
                                           " root " + std::to_string(root) + " " + std::string(kft::name(a)) + ": " +
                                           std::to_string(wrong) + " wrong");
              }
    });
  }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_sweep) {
  for (int p = 1; p <= 5; ++p) {
    with_ranks(p, "rs" + std::to_string(p), [&](shm::communicator& comm) {
      const int me = comm.rank();
      for (auto t : dtypes)
        for (auto op : op_list)
          for (auto rc : counts)
            for (auto a : algos) {
              if (rc > 5000 && !big_dtype(t)) continue;
              if (rc > 5000 && a != kft::algo::automatic && op != kft::op_kind::sum) continue;
              const std::size_t es = kft::size_of(t), total = rc * static_cast<std::size_t>(p);
              std::vector<unsigned char> in(total * es), out(rc * es + 1, 0xee);
              for (std::size_t i = 0; i < total; ++i) store_value(in.data(), t, i, value(me, i, op));
              comm.reduce_scatter(in.data(), out.data(), rc, t, op, {.algorithm = a});
              const auto wrong = count_wrong(out, t, rc, [&](std::size_t i) {
                return expected(p, static_cast<std::size_t>(me) * rc + i, op, t);
              });
              if (wrong != 0 || out[rc * es] != 0xee)
                throw std::runtime_error("reduce_scatter " + std::string(kft::name(t)) + " " +
                                         std::string(kft::name(op)) + " x " + std::to_string(rc) + " " +
                                         std::string(kft::name(a)) + ": " + std::to_string(wrong) + " wrong");
            }
    });
  }
}

BOOST_AUTO_TEST_CASE(allgather_sweep) {
  for (int p = 1; p <= 5; ++p) {
    with_ranks(p, "ag" + std::to_string(p), [&](shm::communicator& comm) {
      const int me = comm.rank();
      for (auto t : dtypes)
        for (auto sc : counts)
          for (auto a : algos) {
            const std::size_t es = kft::size_of(t), total = sc * static_cast<std::size_t>(p);
            std::vector<unsigned char> in(sc * es), out(total * es + 1, 0xee);
            for (std::size_t i = 0; i < sc; ++i) store_value(in.data(), t, i, value(me, i, kft::op_kind::sum));
            comm.allgather(in.data(), out.data(), sc, t, {.algorithm = a});
            const auto wrong = count_wrong(out, t, total, [&](std::size_t j) {
              const double v = value(static_cast<int>(j / std::max<std::size_t>(sc, 1)), j % std::max<std::size_t>(sc, 1),
                                     kft::op_kind::sum);
              return t == kft::dtype::u8 ? static_cast<double>(static_cast<std::uint8_t>(v)) : v;
            });
            if (wrong != 0 || out[total * es] != 0xee)
              throw std::runtime_error("allgather " + std::string(kft::name(t)) + " x " + std::to_string(sc) + " " +
                                       std::string(kft::name(a)) + ": " + std::to_string(wrong) + " wrong");
          }
    });
  }
}

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
  with_ranks(2, "bad", [&](shm::communicator& comm) {
    std::vector<float> a(10), b(11);
    BOOST_CHECK_THROW(comm.allreduce(std::span<const float>(a), std::span<float>(b), kft::ops::sum), kft::usage_error);
    BOOST_CHECK_THROW(comm.broadcast(std::span<float>(a), 2), kft::usage_error);
    BOOST_CHECK_THROW((void)comm.allocate<float>(1u << 30), kft::usage_error);
  });
  BOOST_CHECK_THROW(shm::communicator(std::make_shared<kft::rendezvous::memory_store>(), 2, 2), kft::usage_error);
}
