// SPDX-License-Identifier: Apache-2.0
// bench.hpp: the run of one *_perf program, its state and its clock: the buffers, how calls are
// timed (-n, -w, --min-time, -a: the ranks' times combined), --memcpy-beside, and the members
// the other parts define (checks: `verify`; report.hpp: the table's header, footer and JSON;
// peers.hpp: the peer columns and --latency; harness.cpp: the rows and the run). Part of
// harness.cpp.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/shm/config.hpp>

#include "backend.hpp"
#include "checks.hpp"
#include "control.hpp"
#include "flags.hpp"
#include "harness.hpp"
#include "settings.hpp"

namespace kft_bench {

using clk = std::chrono::steady_clock;
using json = nlohmann::json;

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }


struct timing {
  double sec = 0;     // per call, ranks combined by -a
  double minflt = 0;  // minor page faults per call, the worst rank
};

struct iter_stats {
  double p50 = 0, p99 = 0;  // seconds
};

struct kft_row {  // what the peers table needs of a float-sum row
  std::size_t size = 0, count = 0;
  std::string algorithm;
  double time_us = 0, busbw = 0;
  std::size_t json_index = 0;
};

struct peer_point {
  double time_us = 0, algbw = 0, busbw = 0, minflt = 0;
  int iters = 0;
  bool valid = false;
};

#if KFT_BENCH_WITH_GLOO
class gloo_peer;  // peers.hpp
#endif

// Bytes of each of the two buffers: the largest row of any type (recv also holds the in-place
// input), at least 64, at least --latency-max.
std::size_t buffer_bytes(const descriptor& c, const settings& a, int n) {
  std::size_t bytes = 64;
  for (auto t : a.types)
    for (std::size_t size = a.min_bytes; size <= a.max_bytes;) {
      bytes = std::max(bytes, c.shape_of(size, kft::size_of(t), n).size());
      if (!next_size(a, size)) break;
    }
  if (a.latency) bytes = std::max(bytes, a.latency_max);
  return bytes;
}

class bench {
 public:
  bench(const descriptor& c, const settings& s, control& ctl, backend& be, int rank, int nranks)
      : c_(c), a_(s), ctl_(ctl), be_(be), me_(rank), n_(nranks) {}

  int run();

 private:
  bool next_size(std::size_t& size) const { return kft_bench::next_size(a_, size); }

  // -- combining the ranks' numbers (the control plane: MPI or kft's own, see `control`)
  double combine(double v) const {
    double out = v;
    switch (a_.average) {
      case 0: ctl_.bcast(&out, sizeof out, 0); break;
      case 1: ctl_.reduce(&out, 1, kft::op_kind::sum); out /= n_; break;
      case 2: ctl_.reduce(&out, 1, kft::op_kind::min); break;
      default: ctl_.reduce(&out, 1, kft::op_kind::max); break;
    }
    return out;
  }
  double max_all(double v) const {
    ctl_.reduce(&v, 1, kft::op_kind::max);
    return v;
  }
  std::int64_t sum_all(std::int64_t v) const {
    ctl_.reduce(&v, 1, kft::op_kind::sum);
    return v;
  }

  template <class F>
  timing time_calls(int warmup, int iters, F&& call) const {
    for (int w = 0; w < warmup; ++w) call();
    ctl_.barrier();
    const long f0 = minor_faults();
    const auto t0 = clk::now();
    for (int i = 0; i < iters; ++i) call();
    be_.flush();  // a device backend's calls are enqueued: their end is part of the time
    const double sec = seconds_since(t0) / iters;
    const double flt = static_cast<double>(minor_faults() - f0) / iters;
    return {combine(sec), max_all(flt)};
  }

  // How many timed calls make --min-time: -n warm calls estimate one call (the slowest rank's
  // estimate, so every rank makes the same number of calls), then at least min_time worth
  // (at most 1e7). Ten calls of a microsecond would time the clock and the barrier's skew.
  template <class F>
  int iterations_for(F&& call) const {
    if (a_.min_time <= 0) return a_.iters;
    ctl_.barrier();
    const auto t0 = clk::now();
    for (int i = 0; i < a_.iters; ++i) call();
    be_.flush();
    const double per = max_all(seconds_since(t0) / a_.iters);
    if (per <= 0 || per * a_.iters >= a_.min_time) return a_.iters;
    return static_cast<int>(std::min(1e7, a_.min_time / per + 1));
  }

  // One warm memcpy of `bytes` between the send and receive buffers, timed on rank 0, whose
  // estimate decides every rank's count of copies.
  double one_copy_seconds(std::size_t bytes) const {
    double one = 0;
    if (me_ == 0) {
      std::memcpy(recv_, send_, bytes);
      const auto t0 = clk::now();
      std::memcpy(recv_, send_, bytes);
      asm volatile("" ::"r"(recv_) : "memory");
      one = std::max(seconds_since(t0), 1e-9);
    }
    ctl_.bcast(&one, sizeof one, 0);
    return one;
  }

  // --memcpy-beside: memcpy of `bytes` between this rank's send and receive buffers (the
  // collective's own memory: the pool's with --zero-copy) on the first min(ranks, online CPUs)
  // ranks at once, at least -n copies and 10 ms (within --peer-budget); returns the slowest
  // copier's GB/s, on every rank. It runs right after the size's collective calls, so a
  // memory-traffic bound computed from it sees the same phase of a shared machine as the calls.
  // Ranks beyond the CPUs sleep through the copies: polling in a barrier would take CPU time
  // from the copiers, and an allreduce's ranks beyond the CPUs share them too.
  double memcpy_beside(std::size_t bytes) const {
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const int copiers = cpus > 0 && cpus < n_ ? static_cast<int>(cpus) : n_;
    const double one = one_copy_seconds(bytes);
    int n = std::max(a_.iters, static_cast<int>(std::min(1e7, 0.01 / one) + 1));
    if (one * n > a_.peer_budget) n = std::max(1, static_cast<int>(a_.peer_budget / one));
    if (me_ < copiers) std::memcpy(recv_, send_, bytes);
    ctl_.barrier();
    double took = 0;
    if (me_ >= copiers) {
      const double nap = 1.5 * one * n + 0.005;
      timespec ts{static_cast<time_t>(nap), static_cast<long>((nap - static_cast<double>(static_cast<time_t>(nap))) * 1e9)};
      while (::nanosleep(&ts, &ts) != 0) {
      }
    } else {
      const auto t0 = clk::now();
      for (int i = 0; i < n; ++i) {
        std::memcpy(recv_, send_, bytes);
        asm volatile("" ::"r"(recv_) : "memory");  // keep every copy
      }
      took = seconds_since(t0);
    }
    const double slowest = max_all(took);
    ctl_.barrier();
    return slowest > 0 ? static_cast<double>(bytes) * n / slowest / 1e9 : 0;
  }

  // --memcpy-beside with more ranks than online CPUs, from 1 MiB: every rank copies `bytes`
  // between the same buffers at once, and after each copy the ranks meet in a one-float
  // allreduce on the communicator under test (a collective's phases end in such a meeting).
  // Returns the slowest rank's GB/s. Beside memcpy_beside (the CPUs' copiers alone, whose
  // rate shared out evenly is what ranks beyond the CPUs could get at best), this is what p
  // ranks with equal shares of copying get from the scheduler when each copy ends in a wait:
  // three ranks on two CPUs often run two copies, then the third alone.
  double memcpy_beside_all(std::size_t bytes) const {
    const double one = one_copy_seconds(bytes);
    // Each round costs about one copy per rank on each CPU: p/CPUs copies' time.
    int n = std::max(a_.iters, static_cast<int>(std::min(1e6, 0.01 / one) + 1));
    if (one * n * n_ > a_.peer_budget) n = std::max(1, static_cast<int>(a_.peer_budget / (one * n_)));
    float token = 1, sum = 0;
    std::memcpy(recv_, send_, bytes);
    be_.allreduce(&token, &sum, 1, kft::dtype::f32, kft::op_kind::sum, opts_);
    const auto t0 = clk::now();
    for (int i = 0; i < n; ++i) {
      std::memcpy(recv_, send_, bytes);
      asm volatile("" ::"r"(recv_) : "memory");
      be_.allreduce(&token, &sum, 1, kft::dtype::f32, kft::op_kind::sum, opts_);
    }
    const double slowest = max_all(seconds_since(t0));
    ctl_.barrier();
    return slowest > 0 ? static_cast<double>(bytes) * n / slowest / 1e9 : 0;
  }

  // Every call timed; a call's time is the slowest rank's.
  template <class F>
  iter_stats time_each(int warmup, int iters, F&& call) const {
    for (int w = 0; w < warmup; ++w) call();
    std::vector<double> t(static_cast<std::size_t>(iters));
    ctl_.barrier();
    for (auto& x : t) {
      const auto t0 = clk::now();
      call();
      be_.flush();
      x = seconds_since(t0);
    }
    ctl_.reduce(t.data(), t.size(), kft::op_kind::max);
    std::sort(t.begin(), t.end());
    const std::size_t n = t.size();
    const std::size_t i99 = std::min(n - 1, (n * 99 + 99) / 100 - 1);  // nccl-tests percentileIndex
    return {t[n / 2], t[i99]};
  }

  // Peers: w warm-up calls (at least one) pick how many timed calls fit the budget.
  template <class F>
  std::pair<timing, int> time_budgeted(F&& call) const {
    const auto t0 = clk::now();
    const int w = std::max(1, a_.warmup);
    for (int i = 0; i < w; ++i) call();
    const double per = max_all(seconds_since(t0) / w);
    int iters = a_.iters;
    if (per * iters > a_.peer_budget) iters = std::max(1, static_cast<int>(a_.peer_budget / per));
    return {time_calls(0, iters, call), iters};
  }

  void collective(const void* in, void* out, std::size_t count, kft::dtype t, kft::op_kind op, int root,
                  const kft::options* o = nullptr) {
    c_.run(be_, in, out, count, t, op, root, o ? *o : opts_);
  }
  std::pair<const void*, void*> in_place_buffers(const shape& sh, std::size_t es) const {
    return c_.in_place(static_cast<unsigned char*>(recv_), sh.count, es, me_);
  }

  template <class T>
  std::int64_t verify(const shape& sh, kft::dtype t, kft::op_kind op, int root, bool in_place, std::int64_t& changed);
  template <class T>
  void run_rows(kft::dtype t, kft::op_kind op, int root);  // harness.cpp, as run()

  void print_header();  // report.hpp, as print_footer, print_algos and write_json
  void print_footer();
  // Peers (allreduce_perf, float sum): MPI_Allreduce as configured is measured for every size
  // before kft's table (mallopt cannot be undone), then mallopt, then memcpy, tuned MPI and Gloo
  // right after each kft row, so kft and its peers are timed seconds apart. peers.hpp, as
  // run_latency.
  void peers_before();
  void measure_mpi_default();
  void peers_after_row(std::size_t idx);
  void print_peers();
  void run_latency();
  void write_json();

  const descriptor& c_;  // the collective measured
  const settings& a_;
  control& ctl_;
  backend& be_;
  int me_, n_;
  kft::options opts_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  std::vector<unsigned char> host_send_, host_recv_;  // host views of device buffers
  std::size_t buf_bytes_ = 0;

  std::int64_t errors_ = 0, input_changed_ = 0;
  double bw_sum_ = 0;
  int bw_count_ = 0;
  double worst_minflt_ = 0;
  std::vector<kft_row> float_sum_rows_;
  bool peers_on_ = false;
  std::vector<std::pair<std::size_t, peer_point>> mpi_def_;  // by count
  std::vector<peer_point> mcp_, mpi_tuned_, gl_;
  int mmap_ok_ = 0, trim_ok_ = 0;
  std::string gloo_note_ = "not built with Gloo";
  std::string mpi_note_;  // why the MPI columns are empty, when they are
#if KFT_BENCH_WITH_GLOO
  std::unique_ptr<gloo_peer> gloo_;
#endif
  std::vector<std::pair<std::size_t, kft::algo>> algos_;  // per size of the first type/op
  struct algo_row {
    std::string type, op;
    std::size_t size;
    kft::algo chosen;
    std::vector<double> busbw;  // auto, then each forced algorithm
  };
  std::vector<algo_row> algo_rows_;
  void print_algos();
  json doc_, rows_ = json::array(), latency_ = json::array(), peer_notes_ = json::array();
  std::string start_time_;

  std::vector<std::string> argv_;
  const kft::shm::config* shm_cfg_ = nullptr;  // the shm backend's settings (header, json)

 public:
  void set_args(int argc, char** argv) { argv_.assign(argv, argv + argc); }
};

template <class T>
std::int64_t bench::verify(const shape& sh, kft::dtype t, kft::op_kind op, int root, bool in_place,
                           std::int64_t& changed) {
  const pattern pt(t, op, n_);
  unsigned char* hs = be_.device() ? host_send_.data() : static_cast<unsigned char*>(send_);
  unsigned char* hr = be_.device() ? host_recv_.data() : static_cast<unsigned char*>(recv_);
  check_ctx<T> v{be_, ctl_, me_, n_, root, sh.count, sh.send_bytes, sh.recv_bytes, pt, tolerance(t, op), send_, recv_, hs,
                 hr,
                 [&](const void* in, void* out) {
                   collective(in, out, sh.count, t, op, root);
                   be_.flush();
                 },
                 [&] { return in_place_buffers(sh, sizeof(T)); }};
  // Peers may still be reading this rank's buffers from the previous call (zero-copy).
  ctl_.barrier();
  const std::int64_t wrong = std::get<verify_fn<T>>(c_.verify)(v, in_place);
  changed += v.changed;
  return wrong;
}

}  // namespace kft_bench
