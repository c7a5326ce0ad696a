// SPDX-License-Identifier: Apache-2.0
// A rank of a real job under kftrun for the fault matrix and the soak
// (tests/integration/fault_matrix.py). It meets the others through kft's store and runs
// collectives on the job's process group.
//
//   fault_worker fault PHASE RANK ACTION
//     PHASE   startup     before meeting the store
//             rendezvous  after the store, before the process group (its shared segment)
//             first       before the first collective
//             small       during a loop of 1 KiB allreduces (a timer thread acts mid-loop)
//             large       during a loop of 16 MiB allreduces (likely inside one)
//     ACTION  kill (SIGKILL itself), stop (SIGSTOP itself), skip (leaves one allreduce out:
//             small/large only), mismatch (a different count: small/large only)
//     kill/stop: every rank loops for 8 s; skip/mismatch: 40 calls then a barrier. Any
//     kft::error is printed ("rank R: ...") and exits 3.
//
//   (Arguments after these are ignored: the tests add a marker to find their processes.)
//
//   fault_worker soak ITERATIONS
//     ITERATIONS collectives of random size (0..256 Ki elements), kind (allreduce, broadcast,
//     allgather, reduce-scatter), dtype (f32, f64, i32, i64) and op (sum, min, max), the same
//     random sequence on every rank, every element checked. Prints RSS and open descriptors
//     every 10 % ("soak: i=... rss_kib=... fds=..."); exit 0 with zero errors.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <kft/group/factory.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>

using namespace std::chrono_literals;

namespace {

void act(const std::string& action) {
  if (action == "kill") ::raise(SIGKILL);
  if (action == "stop") ::kill(::getpid(), SIGSTOP);  // the whole process, every thread
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

long open_fds() {
  long n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

int fault(const std::string& phase, int culprit, const std::string& action) {
  // The culprit acts before it joins (startup), between meeting the store and the group
  // (rendezvous: init without the group, which is built here), or after (the later phases).
  if (phase == "startup" && kft::discover().rank == culprit) act(action);
  auto job = kft::init({.make_group = false});
  const kft::world_info& me = job.world();
  const bool mine = me.rank == culprit;
  if (phase == "rendezvous" && mine) act(action);
  kft::group::group_options go;
  go.shm.pool_bytes = 32u << 20;
  go.shm.name = "fault-worker";
  go.group.warn = false;
  auto pg = kft::group::make_process_group(me, job.store(), go);
  if (phase == "first" && mine) act(action);
  const bool large = phase == "large";
  const std::size_t n = large ? (4u << 20) : 256u;  // 16 MiB or 1 KiB of f32
  std::vector<float> buf(n, 1.0f);
  std::atomic<bool> armed{false};
  std::thread timer;
  if (mine && (phase == "small" || phase == "large") && (action == "kill" || action == "stop"))
    timer = std::thread([&] {
      std::this_thread::sleep_for(400ms);
      armed = true;
      act(action);
    });
  const auto until = std::chrono::steady_clock::now() + 8s;
  int status = 0;
  try {
    // kill/stop: loop until the timer has acted; skip/mismatch: 40 calls, so that a skipped
    // one leaves the culprit's barrier facing the others' 40th allreduce.
    const bool counted = action == "skip" || action == "mismatch";
    for (int it = 0; counted ? it < 40 : std::chrono::steady_clock::now() < until; ++it) {
      if (mine && it == 20 && action == "skip") continue;
      const std::size_t count = mine && it == 20 && action == "mismatch" ? n / 2 : n;
      pg.allreduce(buf.data(), buf.data(), count, kft::dtype::f32, kft::op_kind::avg);
    }
    pg.barrier();
  } catch (const kft::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
    status = 3;
  }
  if (timer.joinable()) timer.join();
  return status;
}

template <class T>
T input(int rank, std::size_t i, std::uint32_t seed) {
  return static_cast<T>(static_cast<int>((i * 2654435761u + seed + static_cast<unsigned>(rank) * 97u) % 61u) - 30);
}

template <class T>
int soak_one(kft::group::process_group& pg, std::mt19937& rng, std::size_t it) {
  const int me = pg.rank(), p = pg.size();
  const std::size_t n = std::uniform_int_distribution<std::size_t>(0, 1u << 18)(rng) >> (rng() % 8);
  const int kind = static_cast<int>(rng() % 4);
  const auto op = std::array{kft::op_kind::sum, kft::op_kind::min, kft::op_kind::max}[rng() % 3];
  const auto seed = static_cast<std::uint32_t>(rng());
  const int root = static_cast<int>(rng() % static_cast<unsigned>(p));
  const auto t = kft::dtype_of_v<T>;
  auto expect = [&](std::size_t i) {
    T acc = input<T>(0, i, seed);
    for (int r = 1; r < p; ++r) {
      const T v = input<T>(r, i, seed);
      acc = op == kft::op_kind::sum ? static_cast<T>(acc + v) : op == kft::op_kind::min ? std::min(acc, v) : std::max(acc, v);
    }
    return acc;
  };
  auto fail = [&](const char* what, std::size_t i) {
    std::fprintf(stderr, "soak: rank %d iteration %zu: %s wrong at element %zu of %zu\n", me, it, what, i, n);
    return 1;
  };
  if (kind == 0) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(me, i, seed);
    pg.allreduce(v.data(), v.data(), n, t, op);
    for (std::size_t i = 0; i < n; ++i)
      if (v[i] != expect(i)) return fail("allreduce", i);
  } else if (kind == 1) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(me, i, seed);
    pg.broadcast(v.data(), v.data(), n, t, root);
    for (std::size_t i = 0; i < n; ++i)
      if (v[i] != input<T>(root, i, seed)) return fail("broadcast", i);
  } else if (kind == 2) {
    std::vector<T> in(n), out(n * static_cast<std::size_t>(p));
    for (std::size_t i = 0; i < n; ++i) in[i] = input<T>(me, i, seed);
    pg.allgather(in.data(), out.data(), n, t);
    for (std::size_t j = 0; j < out.size(); ++j)
      if (out[j] != input<T>(static_cast<int>(j / n), j % n, seed)) return fail("allgather", j);
  } else {
    std::vector<T> in(n * static_cast<std::size_t>(p)), out(n);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = input<T>(me, i, seed);
    pg.reduce_scatter(in.data(), out.data(), n, t, op);
    for (std::size_t i = 0; i < n; ++i)
      if (out[i] != expect(static_cast<std::size_t>(me) * n + i)) return fail("reduce_scatter", i);
  }
  return 0;
}

int soak(long iterations) {
  kft::init_options o;
  o.group.shm.pool_bytes = 32u << 20;
  o.group.shm.name = "soak";
  o.group.group.warn = false;
  auto job = kft::init(std::move(o));
  const kft::world_info& me = job.world();
  auto& pg = job.group();
  std::mt19937 rng(12345);  // the same sequence on every rank
  long errors = 0;
  const long every = std::max(1L, iterations / 10);
  for (long it = 0; it < iterations; ++it) {
    switch (rng() % 4) {
      case 0: errors += soak_one<float>(pg, rng, static_cast<std::size_t>(it)); break;
      case 1: errors += soak_one<double>(pg, rng, static_cast<std::size_t>(it)); break;
      case 2: errors += soak_one<std::int32_t>(pg, rng, static_cast<std::size_t>(it)); break;
      default: errors += soak_one<std::int64_t>(pg, rng, static_cast<std::size_t>(it)); break;
    }
    if ((it + 1) % every == 0 || it == 0)
      std::printf("soak: rank %d i=%ld rss_kib=%ld fds=%ld errors=%ld\n", me.rank, it + 1, rss_kib(), open_fds(), errors);
    std::fflush(stdout);
  }
  pg.barrier();
  return errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "fault" && argc >= 5) return fault(argv[2], std::stoi(argv[3]), argv[4]);
    if (mode == "soak" && argc >= 3) return soak(std::stol(argv[2]));
    std::fprintf(stderr, "usage: fault_worker fault PHASE RANK ACTION | soak ITERATIONS\n");
    return 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "fault_worker: %s\n", e.what());
    return 3;
  }
}
