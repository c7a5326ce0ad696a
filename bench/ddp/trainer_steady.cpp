// SPDX-License-Identifier: Apache-2.0
// The trainer's steady state: ranks as threads over the shared-memory process group, example
// 05's MLP on synthetic 784-pixel images, `--warm` steps, then `--steps` measured steps of
// `trainer::step` between two barriers: heap allocations (every thread's), gradient bytes the
// transport copied (staged), and the time per step. The reducer and the model allocate nothing
// once warm, and the buckets are the gradients, so both counts should be 0.
//
//   trainer_steady [--ranks 2] [--steps 200] [--warm 5] [--batch 64] [--zero 0|1] [--check [--max-copied B]]
//
// --check: exit 1 when a step allocates, or copies more than B bytes (default 0) through the
// transport. (With ZeRO-1 the trainer's two f64 counters travel in a bucket of their own, a
// 16-byte allreduce that goes through the transport's mailbox: 32 bytes per step.) The suite
// runs it so. Only trainer_options' batch,
// verify_every, quiet and zero_stage and trainer::step are used, so the same source builds
// against earlier versions of the trainer (bench/scripts/trainer_before_after.sh).
#include <cblas.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

#include "../../examples/05-fashion-mnist/idx.hpp"
#include "../../examples/05-fashion-mnist/mlp.hpp"
#include "../../tests/common/alloc_counter.hpp"

namespace {

struct args {
  int ranks = 2, steps = 200, warm = 5, zero = 0;
  long max_copied = 0;
  std::uint32_t batch = 64;
  bool check = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "trainer_steady: %s\nusage: trainer_steady [--ranks N] [--steps N] [--warm N] [--batch N] "
                       "[--zero 0|1] [--check [--max-copied B]]\n", why.c_str());
  std::exit(2);
}

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--check") {
      a.check = true;
      continue;
    }
    if (i + 1 >= argc) usage(k + " needs a value");
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end || v < 0 || v > 1000000) usage(k + " " + argv[i] + ": not a count");
    if (k == "--ranks" && v >= 1) a.ranks = static_cast<int>(v);
    else if (k == "--steps" && v >= 1) a.steps = static_cast<int>(v);
    else if (k == "--warm") a.warm = static_cast<int>(v);
    else if (k == "--batch" && v >= 1) a.batch = static_cast<std::uint32_t>(v);
    else if (k == "--zero" && v <= 1) a.zero = static_cast<int>(v);
    else if (k == "--max-copied") a.max_copied = v;
    else usage(k + " " + argv[i] + ": not an option or out of range");
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const args a = parse(argc, argv);
  openblas_set_num_threads(1);
  const auto train = fmnist::synthetic(4096, 784, 7), test = fmnist::synthetic(64, 784, 8);
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::barrier sync(a.ranks);
  long allocs = -1;
  std::uint64_t staged = 0;
  double seconds = 0.0;
  std::size_t buckets = 0;
  std::vector<std::string> errors(static_cast<std::size_t>(a.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < a.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        kft::shm::config cfg;
        cfg.name = "trainer-steady-" + std::to_string(::getpid());
        cfg.pool_bytes = 64u << 20;
        kft::group::process_group g(kft::shm::communicator(store, r, a.ranks, cfg), "shm");
        fmnist::mlp m({784, 256, 128, 10}, &train, &test, 11);
        kft::ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
        kft::ddp::trainer_options o;
        o.batch = a.batch;
        o.verify_every = 0;
        o.quiet = true;
        o.zero_stage = a.zero;
        // (the straggler detection off: its first window of each membership gathers the hosts and
        // a naming builds its message, which allocate; its windows in between allocate nothing)
        o.stragglers.every = 0;
        kft::ddp::trainer t(g, m, opt, o);
        std::vector<std::uint32_t> idx(a.batch);
        auto step = [&](int s) {
          for (std::uint32_t k = 0; k < a.batch; ++k)
            idx[k] = static_cast<std::uint32_t>((static_cast<std::size_t>(s) * a.batch * static_cast<std::size_t>(a.ranks) +
                                                 static_cast<std::size_t>(r) * a.batch + k) % train.n);
          t.step(idx);
        };
        for (int s = 0; s < a.warm; ++s) step(s);
        auto* shm = g.get<kft::shm::communicator>();
        g.barrier();
        sync.arrive_and_wait();
        const long a0 = kft_test::allocations.load();
        const std::uint64_t s0 = shm->staged_bytes();
        const auto t0 = std::chrono::steady_clock::now();
        sync.arrive_and_wait();
        for (int s = 0; s < a.steps; ++s) step(a.warm + s);
        g.barrier();
        sync.arrive_and_wait();
        const auto t1 = std::chrono::steady_clock::now();
        const long a1 = kft_test::allocations.load();
        const std::uint64_t mine = shm->staged_bytes() - s0;
        sync.arrive_and_wait();
        if (r == 0) {
          allocs = a1 - a0;
          seconds = std::chrono::duration<double>(t1 - t0).count();
          buckets = t.reduction().buckets().size();
        }
        __atomic_fetch_add(&staged, mine, __ATOMIC_RELAXED);
        t.join();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        sync.arrive_and_drop();
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) {
      std::fprintf(stderr, "trainer_steady: rank %zu: %s\n", r, errors[r].c_str());
      return 1;
    }
  std::printf("# trainer_steady: %d rank(s) as threads, MLP 784-256-128-10, batch %u per rank, ZeRO-%d, %zu bucket(s), "
              "%d steps after %d warm-up\n",
              a.ranks, a.batch, a.zero, buckets, a.steps, a.warm);
  std::printf("allocations per step: %.3f (%ld in all)\n", static_cast<double>(allocs) / a.steps, allocs);
  std::printf("gradient bytes copied per step: %.1f (%llu in all)\n", static_cast<double>(staged) / a.steps,
              static_cast<unsigned long long>(staged));
  std::printf("ms per step: %.3f\n", 1e3 * seconds / a.steps);
  if (a.check && (allocs != 0 || static_cast<double>(staged) / a.steps > static_cast<double>(a.max_copied))) {
    std::fprintf(stderr, "trainer_steady: the steady state is not 0 allocations and at most %ld copied bytes per step\n",
                 a.max_copied);
    return 1;
  }
  return 0;
}
