// SPDX-License-Identifier: Apache-2.0
// A rank of a DDP training job for the straggler detection (trainer_options::stragglers; issue
// 47 item 5), run by kftrun. Driven by tests/integration/straggler_test.py (one slowed rank, and
// a control run) and bench/ddp/straggler_soak.py (minutes without a slowed rank).
//
//   straggler_worker [--steps N | --seconds S] [--work-ms MS] [--sleep] [--log FILE] [--pin]
//                    [--slow-rank R --slow-step K (--cgroup-procs FILE | --busy-share F)]
//
// --sleep: a step's work is the loops once and a sleep of --work-ms (the trainer's own noise,
// apart from the CPUs': sleeping ranks do not compete for them).
// --exchange-cost N: after training, N allgathers like a window's exchange, timed.
// The model is a linear regression on 1024 features whose forward and backward are plain CPU
// loops (no BLAS, no threads), repeated until a step's work is about --work-ms (calibrated on
// rank 0 before training, the same repetitions on every rank). --seconds: as many steps as
// rank 0's calibration says fit in that time. Rank R writes its process id into FILE (a CPU
// cgroup's cgroup.procs whose quota the driver set) just before step K, so from step K on it
// really runs slower; or, with --busy-share F, rank R starts a process on its own CPU(s) that
// spins F of every 6 ms and sleeps the rest, which takes that share from the rank (F = 1/6:
// 20% slower). --pin: rank r's threads run on CPU r % (CPUs this process may use).
// At each window of the detection every rank records the largest verdict any rank got (its
// work per step against the others' median - 1), and the largest a rank got in two windows in a
// row (the smaller of the two: what the default sustain of 2 compares with the threshold); at
// the end each rank prints
//   straggler_worker: rank R of P steps S windows W max_excess X max_sustained Y named N slowed_at K
// (K: the step rank R joined the cgroup; 0: none) and rank 0 the trainer's summary line.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>

namespace ddp = kft::ddp;

namespace {

constexpr std::size_t features = 1024;

// Sample i's feature k: a fixed function of (i, k) in [-0.5, 0.5).
float feature(std::uint32_t i, std::size_t k) {
  const std::uint32_t h = (i * 2654435761u) ^ (static_cast<std::uint32_t>(k) * 40503u + 0x9e3779b9u);
  return static_cast<float>((h >> 8) & 0xffff) / 65536.0f - 0.5f;
}
float target(std::uint32_t i) { return std::sin(0.01f * static_cast<float>(i)); }

struct regression {
  std::vector<float> w = std::vector<float>(features, 0.0f), b = std::vector<float>(1, 0.0f);
  std::vector<float> gw = std::vector<float>(features, 0.0f);
  int reps = 1;  // the loop's repetitions: a step's work
  std::chrono::microseconds sleep{0};  // --sleep: the work is a sleep this long (no CPU)
  std::vector<ddp::tensor_ref> parameters() { return {{"w", w}, {"b", b}}; }
  ddp::stats compute(std::span<const std::uint32_t> idx) {
    ddp::stats s;
    if (sleep.count()) std::this_thread::sleep_for(sleep);
    float gb = 0.0f;
    for (int rep = 0; rep < reps; ++rep) {
      std::fill(gw.begin(), gw.end(), 0.0f);
      gb = 0.0f;
      s = {};
      for (auto i : idx) {
        float pred = b[0];
        for (std::size_t k = 0; k < features; ++k) pred += w[k] * feature(i, k);
        const float err = pred - target(i);
        s.loss_sum += static_cast<double>(err * err);
        s.count += 1;
        for (std::size_t k = 0; k < features; ++k) gw[k] += 2 * err * feature(i, k);
        gb += 2 * err;
      }
    }
    const float n = static_cast<float>(idx.size());
    for (auto& v : gw) v /= n;
    gw.push_back(gb / n);  // (the bias at the end, taken off below)
    return s;
  }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    auto s = compute(idx);
    const float gb = gw.back();
    gw.pop_back();
    std::copy(gw.begin(), gw.end(), g[0].begin());
    g[1][0] = gb;
    g.ready(1);
    g.ready(0);
    return s;
  }
};

// The largest verdict of every window (the trainer's detection, read after each step).
struct watcher : ddp::observer {
  int named = 0;
  void on_straggler(const ddp::straggler_event& e) override { named += !e.recovered; }
};

// A process that is busy `share` of the time in periods of `period_us` (spinning, then
// sleeping), on the CPUs this process may use (the caller pinned it): it takes that share of
// the CPU from whatever else runs there. Dies with its parent.
pid_t start_busy(double share, long period_us) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const auto busy = std::chrono::microseconds(static_cast<long>(share * static_cast<double>(period_us)));
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    const auto until = next + busy;
    while (std::chrono::steady_clock::now() < until) {
    }
    next += std::chrono::microseconds(period_us);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count();
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
  }
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback = "") {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}
bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto job = kft::init(argc, argv);
    auto& pg = job.group();
    const int rank = pg.rank(), size = pg.size();
    if (flag(argc, argv, "--pin")) {
      cpu_set_t allowed;
      CPU_ZERO(&allowed);
      if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        std::vector<int> cpus;
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<std::size_t>(rank) % cpus.size()], &one);
        // Every thread of the process (the transport's started before this), then the ones to come.
        for (const auto& t : std::filesystem::directory_iterator("/proc/self/task"))
          if (::sched_setaffinity(std::stoi(t.path().filename().string()), sizeof one, &one) != 0)
            std::perror("straggler_worker: sched_setaffinity");
      }
    }
    const double work_ms = std::stod(arg(argc, argv, "--work-ms", "20"));
    const int slow_rank = std::stoi(arg(argc, argv, "--slow-rank", "-1"));
    const auto slow_step = static_cast<std::uint64_t>(std::stoull(arg(argc, argv, "--slow-step", "0")));
    const std::string procs = arg(argc, argv, "--cgroup-procs");
    const double busy_share = std::stod(arg(argc, argv, "--busy-share", "0"));
    pid_t busy = 0;
    constexpr std::uint64_t batch = 8;
    const bool sleeping = flag(argc, argv, "--sleep");

    // Calibration on rank 0: repetitions for a step of about work_ms; every rank takes them.
    regression m;
    std::vector<std::uint32_t> probe(batch);
    for (std::uint32_t i = 0; i < batch; ++i) probe[i] = i;
    double reps_and_steps[2] = {1, 0};
    if (rank == 0) {
      (void)m.compute(probe);  // (warm)
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 5; ++k) (void)m.compute(probe);
      const double one = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
      reps_and_steps[0] = sleeping ? 1.0 : std::max(1.0, std::round(work_ms / std::max(one, 1e-3)));
      const double seconds = std::stod(arg(argc, argv, "--seconds", "0"));
      const double step_ms = sleeping ? work_ms + one : one * reps_and_steps[0];
      reps_and_steps[1] = seconds > 0 ? std::ceil(seconds * 1e3 / step_ms)
                                      : std::stod(arg(argc, argv, "--steps", "300"));
    }
    pg.broadcast(reps_and_steps, reps_and_steps, 2, kft::dtype::f64, 0);
    m.reps = static_cast<int>(reps_and_steps[0]);
    if (sleeping) {  // (the loops once, a sleep for the rest)
      m.sleep = std::chrono::microseconds(static_cast<long>(work_ms * 1e3));
    }
    const auto steps = static_cast<std::uint64_t>(reps_and_steps[1]);

    ddp::sgd opt({.lr = 0.01f});
    ddp::trainer_options o;
    o.batch = batch;
    o.epochs = 1000000;
    o.max_steps = steps;
    o.seed = 3;
    o.log_json = arg(argc, argv, "--log");
    o.label = "straggler_worker";
    watcher w;
    o.observers = {&w};
    ddp::trainer<regression, ddp::sgd>* tp = nullptr;
    double max_excess = 0.0, max_sustained = 0.0;  // (sustained: the smaller of two windows in a row)
    std::vector<double> previous;
    const bool trace = flag(argc, argv, "--trace");  // every window's verdicts, on rank 0's stderr
    std::uint64_t windows = 0, slowed_at = 0;
    o.on_step = [&](std::uint64_t step) {
      const auto& d = tp->stragglers();
      if (d.windows() != windows) {
        windows = d.windows();
        const auto ex = d.last_excess();
        previous.resize(ex.size(), std::numeric_limits<double>::quiet_NaN());
        for (std::size_t r = 0; r < ex.size(); ++r) {
          if (std::isnan(ex[r])) continue;
          max_excess = std::max(max_excess, ex[r]);
          if (!std::isnan(previous[r])) max_sustained = std::max(max_sustained, std::min(ex[r], previous[r]));
        }
        previous.assign(ex.begin(), ex.end());
        if (trace && rank == 0) {
          std::fprintf(stderr, "window %llu:", static_cast<unsigned long long>(step));
          for (double x : d.last_excess()) std::fprintf(stderr, " %+.3f", x);
          std::fprintf(stderr, "\n");
        }
      }
      if (rank == slow_rank && step + 1 == slow_step && busy_share > 0) {
        busy = start_busy(busy_share, 6000);
        slowed_at = step + 1;
      }
      if (rank == slow_rank && step + 1 == slow_step && !procs.empty()) {
        std::ofstream f(procs);
        f << ::getpid() << "\n";
        f.flush();
        if (!f) {
          std::fprintf(stderr, "straggler_worker: rank %d: cannot join the cgroup through %s\n", rank, procs.c_str());
          std::exit(3);
        }
        slowed_at = step + 1;
      }
    };
    ddp::trainer t(pg, m, opt, o);
    tp = &t;
    const auto sum = t.fit(static_cast<std::uint64_t>(size) * batch * 1024);
    if (busy > 0) {
      ::kill(busy, SIGKILL);
      ::waitpid(busy, nullptr, 0);
    }
    // --exchange-cost N: what a window's exchange costs, timed alone: N allgathers of two f64
    // per rank (the trainer's call), the slowest rank's mean.
    if (const int n = std::stoi(arg(argc, argv, "--exchange-cost", "0")); n > 0) {
      double mine[2] = {1.0, 10.0};
      std::vector<double> all(2 * static_cast<std::size_t>(size));
      for (int k = 0; k < 100; ++k) pg.allgather(mine, all.data(), 2, kft::dtype::f64);
      pg.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < n; ++k) pg.allgather(mine, all.data(), 2, kft::dtype::f64);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
      pg.allreduce(&us, &us, 1, kft::dtype::f64, kft::op_kind::max);
      if (rank == 0) std::printf("straggler_worker: exchange %.2f us (allgather of 2 f64 per rank, %d ranks)\n", us, size);
    }
    std::printf("straggler_worker: rank %d of %d steps %llu windows %llu max_excess %.4f max_sustained %.4f named %d "
                "slowed_at %llu\n",
                rank, size, static_cast<unsigned long long>(sum.steps), static_cast<unsigned long long>(windows), max_excess,
                max_sustained, w.named, static_cast<unsigned long long>(slowed_at));
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "straggler_worker: %s\n", e.what());
    return 1;
  }
}
