// SPDX-License-Identifier: Apache-2.0
// Conformance of the communicators whose ranks can be threads of one process: the shared-memory
// transport, the type-erased process group over it, and (with Gloo) the Gloo communicator over
// TCP on 127.0.0.1 and the CPU group with Gloo between two "nodes" (host identities a, a, b, b). One pool of rank threads (each with its
// own communicator) per rank count lives for the whole run; each case is handed to all of them.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>
#if KFT_CONFORMANCE_GLOO
#include <kft/group/gloo_group.hpp>
#include <kft/transport/gloo/communicator.hpp>
#endif

#include "registry.hpp"

using namespace std::chrono_literals;
namespace conf = kft_test::conformance;

namespace {

// Small buffers: 4099 elements already take several chunks and overflow the one-shot slot.
kft::shm::config small_config(const std::string& name) {
  kft::shm::config c;
  c.staging_bytes = 16u << 10;
  c.small_bytes = 4u << 10;
  c.copy_streaming_bytes = 8u << 10;  // sizes on both sides of the streamed staging (n4099 floats: streamed)
  c.timeout = 60s;
  c.name = name;
  return c;
}

// p rank threads, each owning a communicator made by `make(store, rank, p)`; run() hands one
// case to every rank and returns their outcomes (an exception on a rank becomes a wrong count).
template <class Comm>
class rank_pool {
 public:
  using maker = std::function<Comm(std::shared_ptr<kft::rendezvous::store>, int, int)>;
  rank_pool(int p, maker make) : p_(p), results_(static_cast<std::size_t>(p)) {
    auto store = std::make_shared<kft::rendezvous::memory_store>();
    for (int r = 0; r < p; ++r) threads_.emplace_back([this, r, store, make] { loop(r, make(store, r, p_)); });
  }
  ~rank_pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      ++epoch_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  std::vector<conf::outcome> run(const conf::spec& s) {
    std::unique_lock lock(mu_);
    job_ = s;
    done_ = 0;
    ++epoch_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ == p_; });
    return results_;
  }

 private:
  void loop(int r, Comm comm) {
    std::uint64_t seen = 0;
    while (true) {
      conf::spec s;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return epoch_ != seen; });
        seen = epoch_;
        if (stop_) return;
        s = *job_;
      }
      conf::outcome o;
      try {
        o = conf::run_case(comm, s);
      } catch (const std::exception& e) {
        o.wrong = 1;
        o.first = "rank " + std::to_string(r) + " threw: " + e.what();
      }
      std::lock_guard lock(mu_);
      results_[static_cast<std::size_t>(r)] = o;
      if (++done_ == p_) cv_.notify_all();
    }
  }

  int p_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<conf::spec> job_;
  std::uint64_t epoch_ = 0;
  int done_ = 0;
  bool stop_ = false;
  std::vector<conf::outcome> results_;
  std::vector<std::thread> threads_;
};

[[maybe_unused]] std::vector<kft::algo> shm_algorithms(kft::collective) { return {kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot}; }

// A pool per (factory, p), made on first use and kept until the end of the run.
template <class Comm>
conf::runner lazily(int p, typename rank_pool<Comm>::maker make) {
  auto pool = std::make_shared<std::unique_ptr<rank_pool<Comm>>>();
  return [pool, p, make](const conf::spec& s) {
    if (!*pool) *pool = std::make_unique<rank_pool<Comm>>(p, make);
    return (*pool)->run(s);
  };
}

}  // namespace

bool init_unit_test() {
#if !KFT_CONFORMANCE_GLOO
  for (int p = 1; p <= 5; ++p) {
    conf::register_suite("shm", p, conf::cases(p, shm_algorithms),
                         lazily<kft::shm::communicator>(p, [](auto store, int r, int n) {
                           return kft::shm::communicator(store, r, n, small_config("conf"));
                         }));
  }
  // The process group owns any conforming communicator: the same cases through it (auto only).
  for (int p : {1, 3}) {
    conf::register_suite("group_shm", p, conf::cases(p, [](kft::collective) { return std::vector{kft::algo::automatic}; }),
                         lazily<kft::group::process_group>(p, [](auto store, int r, int n) {
                           return kft::group::process_group(kft::shm::communicator(store, r, n, small_config("pg")),
                                                            "shared memory");
                         }));
  }
#else  // the same runner, built a second time as test_conformance_gloo
  const kft::gloo::interface_choice loopback{"lo", "127.0.0.1", "test"};
  for (int p = 1; p <= 4; ++p) {
    conf::register_suite("gloo", p, conf::cases(p, [](kft::collective c) {
                           if (c == kft::collective::allreduce) return std::vector{kft::algo::automatic, kft::algo::ring};
                           return std::vector{kft::algo::automatic};
                         }),
                         lazily<kft::gloo::communicator>(p, [loopback](auto store, int r, int n) {
                           kft::gloo::config c;
                           c.timeout = 60s;
                           return kft::gloo::communicator(store, r, n, kft::gloo::make_device(loopback), c);
                         }));
  }
  // Two nodes of two ranks: flat and hierarchical allreduce over shm + Gloo.
  conf::register_suite("gloo_group", 4, conf::cases(4, [](kft::collective c) {
                         if (c == kft::collective::allreduce)
                           return std::vector{kft::algo::automatic, kft::algo::flat, kft::algo::hierarchical};
                         return std::vector{kft::algo::automatic};
                       }),
                       lazily<kft::group::process_group>(4, [loopback](auto store, int r, int n) {
                         kft::world_info w;
                         w.rank = r;
                         w.world_size = n;
                         w.hostname = "localhost";
                         kft::group::gloo_group_config cfg;
                         cfg.host = r < n / 2 ? "a" : "b";
                         cfg.nic = loopback;
                         cfg.shm = small_config("gloo-group");
                         cfg.gloo.timeout = 60s;
                         cfg.group.warn = false;
                         cfg.group.hierarchical.chunk_bytes = 64u << 10;  // many pipeline chunks
                         cfg.group.hierarchical.small_bytes = 1u << 10;   // the pipelined path from small messages
                         return kft::group::process_group(
                             kft::group::gloo_group(store, w, kft::environment::process(), cfg), "gloo group");
                       }));
#endif
  return true;
}

int main(int argc, char* argv[]) { return boost::unit_test::unit_test_main(&init_unit_test, argc, argv); }
