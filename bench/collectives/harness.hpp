// SPDX-License-Identifier: Apache-2.0
// harness.hpp: nccl-tests' *_perf for kft's communicators, written once. Each collective has a
// short file (all_reduce.cpp, broadcast.cpp, reduce_scatter.cpp, all_gather.cpp) with what is
// its own (sizes, bus factor, in-place offsets, the call, the check), as nccl-tests' src/<coll>.cu
// next to its common.cu. `--backend shm|mpi|group|nccl` picks the communicator measured
// (backend.hpp). Run under mpirun (or kftrun, for shm) with every rank on one node:
//
//     mpirun -np 2 build/bench/allreduce_perf -b 8 -e 256M -f 2 --json /tmp/ar2.json
//     mpirun -np 2 build/bench/allreduce_perf --backend nccl -b 8 -e 1G -f 2   (one GPU per rank)
//
// What it prints is nccl-tests' table: the same flags (-b -e -i -f -n -w -c -d -o -r -a -T), the
// same header, row and footer formats (src/util.cu), the same sizes (count = size/typesize;
// per-rank counts of reduce_scatter/allgather rounded down to 16 bytes) and the same busbw
// factors (allreduce 2(n-1)/n, broadcast 1, reduce_scatter/allgather (n-1)/n), so scripts
// written for nccl-tests read it. Method:
//  - time: per size, w warm-up calls, a barrier, n back-to-back calls; a rank's time is the
//    average call; the row shows the slowest rank's (-a 3, kft's default; nccl-tests' -a 1,
//    the ranks' mean, is there too).
//  - checking (-c 1) happens before timing: inputs are small integers that depend on rank and
//    index, exact in every dtype (sums stay below 2^8 for bfloat16, 2^11 for half), so #wrong
//    counts exact mismatches, summed over ranks (f16/bf16 and `avg` on floats get a 1-2 ulp
//    tolerance). Outputs start as 0xff bytes (NaN for floats); an out-of-place call that
//    changes its input counts as wrong too.
//  - buffers: one send and one receive buffer of the largest size, touched before anything is
//    timed and reused for every size and every call (nothing is rotated, so sizes that fit in
//    the caches are timed in cache, as in nccl-tests and the OSU benchmarks).
//  - peers (allreduce_perf, on by default; float sum only): after kft's table, in the same run
//    and on the same buffers: a single-thread memcpy on rank 0 alone, Open MPI's MPI_Allreduce
//    as it comes, the same after mallopt() keeps freed memory (so its per-call temporaries do
//    not page-fault; what MALLOC_MMAP_THRESHOLD_ does), and Gloo's ring allreduce over TCP on
//    127.0.0.1 when built with Gloo. Their iterations are capped so that one size takes about
//    --peer-budget seconds.
//  - --latency: per-call p50/p99 of small float-sum allreduces, kft vs MPI_Allreduce (each call's
//    time is the slowest rank's; back-to-back one-shot calls overlap, so the table's average
//    call can be shorter than this p50).
//  - --algos: every forced algorithm timed right after each row, so "is auto the best choice"
//    is answered within one run (on a shared VM whole runs can be 2x apart).
//  - --p50: nccl-tests-like per-call columns (i_p50, i_p99) after each half of the table.
//
// Only rank 0 prints. Extra tables are '#' lines after nccl-tests' footer, so the only
// non-comment lines are nccl-tests' rows. The peers and --latency run for the host backends;
// NCCL's device buffers are filled and checked through host copies (not timed).
#pragma once

#include "../common/sizes.hpp"

#include <malloc.h>
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kft/core/options.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/discovery/mpi.hpp>
#include <kft/init.hpp>
#include <kft/rendezvous/connect.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#include <kft/transport/shm/config.hpp>

#include "backend.hpp"
#include "control.hpp"
#include "settings.hpp"
#include "multinode.hpp"

#if KFT_BENCH_WITH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif


namespace kft_bench {

using clk = std::chrono::steady_clock;
using json = nlohmann::json;

// ---- what a collective's file provides (all_reduce.cpp, ...) -----------------------------

enum class coll { allreduce, broadcast, reduce_scatter, allgather };

// Sizes of one row (nccl-tests GetCollByteCount): `count` is the per-call count argument.
struct shape {
  std::size_t count = 0, send_bytes = 0, recv_bytes = 0;
  std::size_t alg_bytes = 0;  // S in algbw = S / t
  std::size_t size() const { return std::max(send_bytes, recv_bytes); }
};

// ---- flags (settings.hpp) ---------------------------------------------------------------------

// The next row's size (-f factor, else -i step); false past -e. The one place sizes advance.
bool next_size(const settings& a, std::size_t& size) {
  if (a.step_factor > 1) {
    if (size > a.max_bytes / a.step_factor) return false;
    size *= a.step_factor;
  } else {
    if (size + a.step_bytes > a.max_bytes) return false;
    size += a.step_bytes;
  }
  return true;
}

std::vector<kft::dtype> parse_types(const std::string& s) {
  using kft::dtype;
  if (s == "all") return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64, dtype::u8};
  for (int i = 0; i < 7; ++i) {
    const auto t = static_cast<dtype>(i);
    if (s == kft::nccl_name(t) || s == kft::name(t)) return {t};
  }
  if (s == "int") return {dtype::i32};
  if (s == "fp16" || s == "float16") return {dtype::f16};
  if (s == "fp32") return {dtype::f32};
  if (s == "fp64") return {dtype::f64};
  if (s == "int8" || s == "char" || s == "uint32" || s == "uint64")
    throw std::invalid_argument("datatype " + s + " is not one kft reduces (float, double, half, bfloat16, int32, int64, uint8)");
  throw std::invalid_argument("unknown datatype " + s);
}

std::vector<kft::op_kind> parse_ops(const std::string& s) {
  using kft::op_kind;
  if (s == "all") return {op_kind::sum, op_kind::prod, op_kind::max, op_kind::min, op_kind::avg};
  for (int i = 0; i < 5; ++i)
    if (s == kft::name(static_cast<op_kind>(i))) return {static_cast<op_kind>(i)};
  throw std::invalid_argument("unknown op " + s + " (sum, prod, min, max, avg or all)");
}

kft::algo parse_algo(const std::string& s) {
  if (s == "auto" || s == "automatic") return kft::algo::automatic;
  if (s == "one_shot" || s == "one-shot") return kft::algo::one_shot;
  if (s == "two_shot" || s == "two-shot") return kft::algo::two_shot;
  if (s == "flat") return kft::algo::flat;
  if (s == "hierarchical") return kft::algo::hierarchical;
  throw std::invalid_argument("unknown --algo " + s + " (auto, one_shot, two_shot, flat, hierarchical)");
}

// Returns the exit code to stop with, or nullopt to run.
template <class C>
std::optional<int> parse_flags(int argc, char** argv, int rank, settings& a) {
  CLI::App app{"kft " + std::string(C::kft_name) + " benchmark in nccl-tests' format (run under mpirun)"};
  std::string b = "32M", e = "32M", i = "1M", d = "float", o = "sum", al = "auto", lm = "64K";
  int f = 1, nthreads = 1, ngpus = 1, agg = 1;
  app.add_option("-b,--minbytes", b, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", e, "largest size in bytes")->capture_default_str();
  app.add_option("-i,--stepbytes", i, "step between sizes when -f is 1")->capture_default_str();
  app.add_option("-f,--stepfactor", f, "multiply the size by this between rows")->capture_default_str();
  app.add_option("-n,--iters", a.iters, "timed calls per size")->capture_default_str();
  app.add_option("--min-time", a.min_time,
                 "time at least this many seconds of calls per size (n warm calls estimate the count; 0: exactly -n)")
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", a.warmup, "untimed calls per size before timing")->capture_default_str();
  app.add_option("-c,--check", a.check, "check passes per size before timing (0: no check, #wrong is N/A)")
      ->capture_default_str();
  app.add_option("-d,--datatype", d, "float, double, half, bfloat16, int32, int64, uint8 (or f32, f64, f16, bf16, "
                                     "i32, i64, u8), or all")->capture_default_str();
  // Every program takes -o and -r, as nccl-tests' do; only the collectives that have them use them.
  app.add_option("-o,--op", o, "sum, prod, min, max, avg or all (allreduce, reduce_scatter)")->capture_default_str();
  app.add_option("-r,--root", a.root, "broadcast root, -1 for every rank in turn (broadcast)")->capture_default_str();
  app.add_option("-a,--average", a.average, "combine ranks' times: 0 rank 0, 1 mean, 2 min, 3 max (kft default: 3)")
      ->capture_default_str();
  app.add_option("-T,--timeout", a.timeout_s, "seconds before a stuck collective fails (0: kft's default)");
  app.add_option("-t,--nthreads", nthreads, "nccl-tests' threads per process (must be 1)");
  app.add_option("-g,--ngpus", ngpus, "nccl-tests' GPUs per thread (must be 1)");
  app.add_option("-m,--agg_iters", agg, "nccl-tests' aggregated iterations (must be 1)");
  app.add_option("--algo", al, "kft algorithm: auto, one_shot, two_shot (one node); flat, hierarchical (across nodes)")->capture_default_str();
  app.add_flag("--algos", a.algos,
               "also time every forced algorithm (out-of-place) right after each row: a same-run comparison table");
  app.add_flag("--zero-copy", a.zero_copy, "buffers from comm.allocate_bytes (inside the shared segment)");
  app.add_flag("--memcpy-beside", a.memcpy_beside,
               "after each size, memcpy the same bytes between this rank's same buffers on min(ranks, CPUs) "
               "ranks at once, at least 10 ms (the others sleep): JSON memcpy_beside, the slowest copier's GB/s; "
               "with more ranks than CPUs, from 1 MiB, also on every rank at once with a one-float allreduce "
               "after each copy: memcpy_beside_all");
  app.add_option("--json", a.json_path, "write rows (nccl-tests -J layout plus peers and kft's algorithm) to FILE");
  app.add_flag("--peers,!--no-peers", a.peers,
               "also measure memcpy, MPI_Allreduce (default, tuned malloc) and Gloo (allreduce_perf only; float sum)");
  app.add_flag("--gloo,!--no-gloo", a.gloo, "include Gloo among the peers when built with it");
  app.add_option("--peer-budget", a.peer_budget, "about this many seconds per peer and size (caps iterations)")
      ->capture_default_str();
  app.add_flag("--latency", a.latency, "per-call p50/p99 of small float-sum allreduces, kft vs MPI (allreduce_perf)");
  app.add_option("--latency-iters", a.latency_iters, "calls per size for --latency")->capture_default_str();
  app.add_option("--latency-max", lm, "largest size --latency measures (K/M/G suffixes)")->capture_default_str();
  app.add_flag("--p50", a.p50, "time every call too and add i_p50 i_p99 columns (max over ranks per call)");
  app.add_option("--backend", a.backend,
                 "what is measured: shm (kft's shared memory), mpi (kft::mpi::communicator), group (shared memory "
                 "per node + MPI between nodes), nccl (device buffers); auto = shm on one node, the across-nodes "
                 "table otherwise")
      ->check(CLI::IsMember({"auto", "shm", "mpi", "group", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", a.device, "nccl: CUDA device of this rank (default: local rank modulo the devices)");
  app.add_option("--staging-bytes", a.staging_bytes, "kft config::staging_bytes (0: kft's default)");
  app.add_option("--small-bytes", a.small_bytes, "kft config::small_bytes (0: kft's default)");
  std::string pe = "0";
  app.add_option("--pool-extra", pe,
                 "--zero-copy: this many bytes more in each rank's pool than the two buffers (K/M/G suffixes): "
                 "moves the ranks' regions apart in the segment (docs/performance.md: the 4-rank spacing)")
      ->capture_default_str();
  app.add_option("--copy-streaming-bytes", a.copy_streaming_bytes,
                 "kft config::copy_streaming_bytes (-1: kft's default or KFT_SHM_COPY_STREAMING_BYTES)")
      ->check(CLI::Range(-1LL, std::numeric_limits<long long>::max()));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    std::ostringstream out, errs;
    const int rc = app.exit(err, out, errs);
    if (rank == 0) {
      std::cout << out.str();
      std::cerr << errs.str();
    }
    return rc;
  }
  auto bad = [&](const std::string& msg) -> std::optional<int> {
    if (rank == 0) std::cerr << argv[0] << ": " << msg << "\n";
    return 2;
  };
  try {
    a.min_bytes = parse_size(b);
    a.max_bytes = parse_size(e);
    a.step_bytes = parse_size(i);
    a.latency_max = parse_size(lm);
    a.pool_extra = parse_size(pe);
    a.types = parse_types(d);
    if constexpr (C::has_op) a.ops = parse_ops(o);
    a.algorithm = parse_algo(al);
  } catch (const std::exception& ex) {
    return bad(ex.what());
  }
  if (f < 1) return bad("-f must be >= 1");
  a.step_factor = static_cast<std::size_t>(f);
  if (a.step_factor == 1 && a.step_bytes == 0) return bad("-i must be > 0 when -f is 1");
  if (a.step_factor > 1 && a.min_bytes == 0) return bad("-b must be > 0 when -f is > 1");
  if (a.min_bytes > a.max_bytes) return bad("-b is larger than -e");
  if (a.iters < 1) return bad("-n must be >= 1");
  if (!(a.min_time >= 0 && a.min_time <= 60)) return bad("--min-time must be between 0 and 60 seconds");
  if (a.warmup < 0 || a.check < 0) return bad("-w and -c must be >= 0");
  if (a.average < 0 || a.average > 3) return bad("-a must be 0, 1, 2 or 3");
  if (nthreads != 1 || ngpus != 1 || agg != 1) return bad("-t, -g and -m must be 1: kft runs one rank per process");
  if (a.zero_copy && a.backend != "shm" && a.backend != "auto") return bad("--zero-copy needs --backend shm");
  if (a.pool_extra && !a.zero_copy) return bad("--pool-extra needs --zero-copy");
  if (a.latency_iters < 1) return bad("--latency-iters must be >= 1");
  if constexpr (C::has_root) {
    a.all_roots = a.root == -1;
    if (a.root < -1) return bad("-r must be a rank or -1");
  } else {
    a.root = 0;
  }
  if constexpr (C::kind != coll::allreduce) {
    if (a.latency) return bad("--latency is measured by allreduce_perf");
    if (app.count("--peers") > 0 && a.peers) return bad("--peers is measured by allreduce_perf");
    a.peers = false;
  }
  if (a.backend == "nccl" && a.latency) return bad("--latency compares host allreduces (not --backend nccl)");
  return std::nullopt;
}

// ---- element values ----------------------------------------------------------------------------

template <class T>
struct elem {
  static T make(std::int64_t v) { return static_cast<T>(v); }
  static double value(T x) { return static_cast<double>(x); }
};
template <>
struct elem<kft::half> {
  static kft::half make(std::int64_t v) { return kft::half(static_cast<float>(v)); }
  static double value(kft::half x) { return static_cast<double>(static_cast<float>(x)); }
};
template <>
struct elem<kft::bfloat16> {
  static kft::bfloat16 make(std::int64_t v) { return kft::bfloat16(static_cast<float>(v)); }
  static double value(kft::bfloat16 x) { return static_cast<double>(static_cast<float>(x)); }
};

// Inputs: small integers of rank and index, chosen so that the sum over all ranks stays exact.
struct pattern {
  kft::op_kind op = kft::op_kind::sum;
  int p = 1;
  std::size_t mod = 2;

  pattern(kft::dtype t, kft::op_kind o, int nranks) : op(o), p(nranks) {
    std::size_t limit = std::size_t{1} << 24;  // exact integers in float
    if (t == kft::dtype::bf16) limit = 256;
    if (t == kft::dtype::f16) limit = 2048;
    if (t == kft::dtype::u8) limit = 255;
    mod = std::clamp<std::size_t>(limit / static_cast<std::size_t>(p), 2, 1021);
  }
  std::int64_t at(int r, std::size_t i) const {
    const std::size_t h = i * 7 + static_cast<std::size_t>(r) * 13;
    if (op == kft::op_kind::prod) return h % 3 == 0 ? 2 : 1;  // products stay <= 2^p
    return static_cast<std::int64_t>(h % mod);
  }
  std::int64_t reduced(std::size_t i) const {
    std::int64_t acc = at(0, i);
    for (int r = 1; r < p; ++r) {
      const std::int64_t v = at(r, i);
      switch (op) {
        case kft::op_kind::sum:
        case kft::op_kind::avg: acc += v; break;
        case kft::op_kind::prod: acc *= v; break;
        case kft::op_kind::min: acc = std::min(acc, v); break;
        case kft::op_kind::max: acc = std::max(acc, v); break;
      }
    }
    return acc;
  }
};

// What a correct reduction of element i stores, computed the way kft's kernels round: integer
// math for integers, one division for avg (in float for f32/f16/bf16, double for f64).
template <class T>
T expected_reduced(const pattern& pt, std::size_t i) {
  const std::int64_t acc = pt.reduced(i);
  if (pt.op != kft::op_kind::avg) return elem<T>::make(acc);
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(acc / pt.p);
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(acc) / static_cast<double>(pt.p);
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(acc) / static_cast<float>(pt.p);
  } else {
    return T(static_cast<float>(acc) / static_cast<float>(pt.p));
  }
}

// Relative tolerance of a check: 0 (exact) unless rounding can legitimately differ.
double tolerance(kft::dtype t, kft::op_kind op) {
  if (t == kft::dtype::f16) return 2e-3;
  if (t == kft::dtype::bf16) return 1.6e-2;
  if (op == kft::op_kind::avg && t == kft::dtype::f32) return 2.5e-7;
  if (op == kft::op_kind::avg && t == kft::dtype::f64) return 5e-16;
  return 0;
}

template <class T, class F>
void fill(void* dst, std::size_t n, F&& value_of) {
  T* d = static_cast<T*>(dst);
  for (std::size_t i = 0; i < n; ++i) d[i] = value_of(i);
}

template <class T, class F>
std::int64_t count_wrong(const void* got_v, std::size_t n, double tol, F&& expected_of) {
  const T* got = static_cast<const T*>(got_v);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = elem<T>::value(got[i]), x = elem<T>::value(expected_of(i));
    const bool ok = tol == 0 ? g == x : std::fabs(g - x) <= tol * std::max(1.0, std::fabs(x));
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

// ---- printing (nccl-tests src/util.cu) ----------------------------------------------------------

// getFloatStr: as many decimals as fit in `width`.
std::string float_str(double value, int width) {
  char buf[64];
  if (!std::isfinite(value)) {
    std::snprintf(buf, sizeof buf, "%*s", width, std::isnan(value) ? "nan" : "inf");
    return buf;
  }
  int power = 0;
  for (double v = 1; value >= v && power < 40; v *= 10) power++;
  if (power < width - 2) std::snprintf(buf, sizeof buf, "%*.2f", width, value);
  else if (power < width - 1) std::snprintf(buf, sizeof buf, "%*.1f", width, value);
  else if (power < width + 1) std::snprintf(buf, sizeof buf, "%*.0f", width, value);
  else if (width >= 7) std::snprintf(buf, sizeof buf, "%*.1e", width, value);
  else std::snprintf(buf, sizeof buf, "%*.0e", width, value);
  return buf;
}

std::string root_str(int root) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%6i", root);
  return buf;
}

std::string now_str() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// ---- the run -------------------------------------------------------------------------------------

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

// ---- the ranks' own coordination: control.hpp (MPI's; shared memory's is made in backends.cpp)


#if KFT_BENCH_WITH_GLOO
// Gloo's context over TCP on the loopback interface; the rendezvous is a FileStore in a fresh
// directory under /tmp whose name rank 0 broadcasts.
class gloo_peer {
 public:
  gloo_peer(control& ctl, int rank, int size) {
    std::string dir(256, '\0');
    if (rank == 0) {
      char tmpl[] = "/tmp/kft-bench-gloo-XXXXXX";
      if (::mkdtemp(tmpl) != nullptr) std::snprintf(dir.data(), dir.size(), "%s", tmpl);
    }
    ctl.bcast(dir.data(), dir.size(), 0);
    dir.resize(std::strlen(dir.c_str()));
    if (dir.empty()) throw std::runtime_error("mkdtemp(/tmp/kft-bench-gloo-XXXXXX) failed on rank 0");
    std::string failure;
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      attr.ai_family = AF_INET;
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::FileStore store(dir);
      ctx_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx_->setTimeout(std::chrono::seconds(300));
      ctx_->connectFullMesh(store, dev);
    } catch (const std::exception& e) {
      failure = e.what();
      ctx_.reset();
    }
    ctl.barrier();
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    std::int64_t ok = ctx_ ? 1 : 0;
    ctl.reduce(&ok, 1, kft::op_kind::min);
    if (!ok) throw std::runtime_error("gloo set-up failed" + (failure.empty() ? std::string() : ": " + failure));
  }
  void allreduce(const float* in, float* out, std::size_t count) {
    gloo::AllreduceOptions o(ctx_);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setInput(const_cast<float*>(in), count);
    o.setOutput(out, count);
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
    o.setTag(tag_++);
    gloo::allreduce(o);
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::uint32_t tag_ = 0;
};
#endif

struct peer_point {
  double time_us = 0, algbw = 0, busbw = 0, minflt = 0;
  int iters = 0;
  bool valid = false;
};

// Lifts the calling thread's CPU binding for its lifetime (threads it creates inherit that).
class unbound_scope {
 public:
  unbound_scope() {
    cpu_set_t all;
    CPU_ZERO(&all);
    const long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < ncpu && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), &all);
    active_ = ::sched_getaffinity(0, sizeof bound_, &bound_) == 0 && ::sched_setaffinity(0, sizeof all, &all) == 0;
  }
  ~unbound_scope() {
    if (active_) ::sched_setaffinity(0, sizeof bound_, &bound_);
  }
  unbound_scope(const unbound_scope&) = delete;
  unbound_scope& operator=(const unbound_scope&) = delete;
  bool active() const { return active_; }

 private:
  cpu_set_t bound_{};
  bool active_ = false;
};

// What a collective's `verify` works with: this rank's place, the expected values, and host
// views of the send and receive buffers (the buffers themselves for host backends; copies,
// moved to and from the device, for NCCL). Nothing here is timed.
// Bytes of each of the two buffers: the largest row of any type (recv also holds the in-place
// input), at least 64, at least --latency-max.
template <class C>
std::size_t buffer_bytes(const settings& a, int n) {
  std::size_t bytes = 64;
  for (auto t : a.types)
    for (std::size_t size = a.min_bytes; size <= a.max_bytes;) {
      bytes = std::max(bytes, C::shape_of(size, kft::size_of(t), n).size());
      if (!next_size(a, size)) break;
    }
  if (a.latency) bytes = std::max(bytes, a.latency_max);
  return bytes;
}

template <class T>
struct check_ctx {
  backend& be;
  control& ctl;
  int me, p, root;
  std::size_t cnt;           // the call's count
  std::size_t send_bytes, recv_bytes;
  const pattern& pt;
  double tol;
  void* send;                // the backend's buffers
  void* recv;
  unsigned char* hs;         // their host views
  unsigned char* hr;
  std::function<void(const void*, void*)> call;  // the collective, on the backend's buffers
  std::function<std::pair<const void*, void*>()> in_place;  // where its in-place form reads and writes
  std::int64_t changed = 0;  // input elements an out-of-place call changed

  T mine(std::size_t i) const { return elem<T>::make(pt.at(me, i)); }
  T reduced(std::size_t i) const { return expected_reduced<T>(pt, i); }
  T rooted(std::size_t i) const { return elem<T>::make(pt.at(root, i)); }
  T gathered(std::size_t i) const { return elem<T>::make(pt.at(static_cast<int>(i / cnt), i % cnt)); }

  template <class F>
  void fill_send(std::size_t n, F&& f) {
    fill<T>(hs, n, f);
    if (be.device()) be.to_device(send, hs, n * sizeof(T));
  }
  void clear_recv() { std::memset(hr, 0xff, recv_bytes); }
  template <class F>
  void fill_recv(std::size_t offset, std::size_t n, F&& f) {
    fill<T>(hr + offset * sizeof(T), n, f);
  }
  void upload_recv() {
    if (be.device()) be.to_device(recv, hr, recv_bytes);
  }
  void run_out_of_place() { call(send, recv); }
  /// The out-of-place check's first half, the same for every collective: `n` input elements
  /// from `f`, a cleared output, the call, and a count of input elements the call changed.
  template <class F>
  void out_of_place_with(std::size_t n, F&& f) {
    fill_send(n, f);
    clear_recv();
    upload_recv();
    run_out_of_place();
    changed += send_changed(n, f);
  }
  void run_in_place() {
    const auto [in, out] = in_place();
    call(in, out);
  }
  template <class F>
  std::int64_t recv_wrong(std::size_t offset, std::size_t n, double tolerance, F&& f) {
    if (be.device()) be.to_host(hr, recv, recv_bytes);
    return count_wrong<T>(hr + offset * sizeof(T), n, tolerance, f);
  }
  template <class F>
  std::int64_t send_changed(std::size_t n, F&& f) {
    if (be.device()) be.to_host(hs, send, n * sizeof(T));
    return count_wrong<T>(hs, n, 0, f);
  }
};

template <class C>
class bench {
 public:
  bench(const settings& s, control& ctl, backend& be, int rank, int nranks)
      : a_(s), ctl_(ctl), be_(be), me_(rank), n_(nranks) {}

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
    C::run(be_, in, out, count, t, op, root, o ? *o : opts_);
  }
  std::pair<const void*, void*> in_place_buffers(const shape& sh, std::size_t es) const {
    return C::in_place(static_cast<unsigned char*>(recv_), sh.count, es, me_);
  }

  template <class T>
  std::int64_t verify(const shape& sh, kft::dtype t, kft::op_kind op, int root, bool in_place, std::int64_t& changed);
  template <class T>
  void run_rows(kft::dtype t, kft::op_kind op, int root);

  void print_header();
  void print_footer();
  // Peers (allreduce_perf, float sum): MPI_Allreduce as configured is measured for every size
  // before kft's table (mallopt cannot be undone), then mallopt, then memcpy, tuned MPI and Gloo
  // right after each kft row, so kft and its peers are timed seconds apart.
  void peers_before();
  void measure_mpi_default();
  void peers_after_row(std::size_t idx);
  void print_peers();
  void run_latency();
  void write_json();

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

template <class C>
template <class T>
std::int64_t bench<C>::verify(const shape& sh, kft::dtype t, kft::op_kind op, int root, bool in_place,
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
  const std::int64_t wrong = C::template verify<T>(v, in_place);
  changed += v.changed;
  return wrong;
}

template <class C>
template <class T>
void bench<C>::run_rows(kft::dtype t, kft::op_kind op, int root) {
  constexpr std::size_t es = sizeof(T);
  const bool first_combo = algos_.empty();
  // nccl-tests' TimeTest: warm up at the largest and at the smallest size before the first row.
  std::size_t last = a_.min_bytes;
  while (next_size(last)) {  // the largest size of the sweep
  }
  for (std::size_t size : {last, a_.min_bytes}) {
    const shape sh = C::shape_of(size, es, n_);
    for (int w = 0; w < a_.warmup; ++w) collective(send_, recv_, sh.count, t, op, root);
  }
  for (std::size_t size = a_.min_bytes; size <= a_.max_bytes;) {
    const shape sh = C::shape_of(size, es, n_);
    const kft::algo chosen = a_.algorithm == kft::algo::automatic ? be_.choose(C::op, sh.send_bytes, a_.zero_copy) : a_.algorithm;
    if (first_combo) algos_.emplace_back(sh.size(), chosen);
    const std::string type_name(kft::nccl_name(t));
    const std::string op_name = C::has_op ? std::string(kft::name(op)) : "none";
    const int root_col = C::has_root ? root : -1;
    if (me_ == 0) {
      std::printf("%12zu  %12zu  %8s  %6s  %6s", sh.size(), sh.count, type_name.c_str(), op_name.c_str(),
                  root_str(root_col).c_str());
      std::fflush(stdout);
    }
    json row = {{"size", sh.size()}, {"count", sh.count}, {"type", type_name}, {"redop", op_name},
                {"root", root_str(root_col)}};
    double oop_us = 0, oop_busbw = 0;
    int iterations = 0;  // the most timed calls of the two halves (--min-time may add calls)
    for (int half = 0; half < 2; ++half) {
      const bool in_place = half == 1;
      std::int64_t wrong = 0, changed = 0;
      for (int c = 0; c < a_.check; ++c) wrong += verify<T>(sh, t, op, root, in_place, changed);
      wrong = sum_all(wrong);
      changed = sum_all(changed);
      input_changed_ += changed;
      wrong += changed;
      errors_ += wrong;
      const void* in = send_;
      void* out = recv_;
      if (in_place) std::tie(in, out) = in_place_buffers(sh, es);
      auto call = [&] { collective(in, out, sh.count, t, op, root); };
      ctl_.barrier();
      for (int w = 0; w < a_.warmup; ++w) call();
      const int n = iterations_for(call);
      const timing tm = time_calls(0, n, call);
      iterations = std::max(iterations, n);
      std::optional<iter_stats> st;
      if (a_.p50) st = time_each(0, n, call);
      worst_minflt_ = std::max(worst_minflt_, tm.minflt);
      const double algbw = tm.sec > 0 ? static_cast<double>(sh.alg_bytes) / 1e9 / tm.sec : 0;
      const double busbw = algbw * C::bus_factor(n_);
      bw_sum_ += busbw;
      ++bw_count_;
      if (me_ == 0) {
        const std::string ts = float_str(tm.sec * 1e6, 7), as = float_str(algbw, 6), bs = float_str(busbw, 6);
        if (a_.check) std::printf("  %7s  %6s  %6s  %6g", ts.c_str(), as.c_str(), bs.c_str(), static_cast<double>(wrong));
        else std::printf("  %7s  %6s  %6s    N/A", ts.c_str(), as.c_str(), bs.c_str());
        if (st) std::printf("  %7s  %7s", float_str(st->p50 * 1e6, 7).c_str(), float_str(st->p99 * 1e6, 7).c_str());
        std::fflush(stdout);
      }
      json h = {{"time", tm.sec * 1e6}, {"alg_bw", algbw}, {"bus_bw", busbw},
                {"nwrong", a_.check ? json(wrong) : json(nullptr)}, {"minflt_per_call", tm.minflt}};
      if (st) h["per_iter"] = {{"p50_us", st->p50 * 1e6}, {"p99_us", st->p99 * 1e6}};
      row[in_place ? "in_place" : "out_of_place"] = h;
      if (!in_place) {
        oop_us = tm.sec * 1e6;
        oop_busbw = busbw;
      }
    }
    if (me_ == 0) {
      std::printf("\n");
      std::fflush(stdout);
    }
    if (a_.algos) {  // the forced algorithms, out-of-place, right after this row
      algo_row ar{type_name, op_name, sh.size(), chosen, {row["out_of_place"]["bus_bw"].get<double>()}};
      json forced = json::object();
      for (kft::algo f : be_.forced(C::op)) {
        kft::options o = opts_;
        o.algorithm = f;
        ctl_.barrier();
        const timing tm = time_calls(a_.warmup, a_.iters, [&] { collective(send_, recv_, sh.count, t, op, root, &o); });
        const double algbw = tm.sec > 0 ? static_cast<double>(sh.alg_bytes) / 1e9 / tm.sec : 0;
        ar.busbw.push_back(algbw * C::bus_factor(n_));
        forced[std::string(kft::name(f))] = {{"time", tm.sec * 1e6}, {"alg_bw", algbw}, {"bus_bw", algbw * C::bus_factor(n_)}};
      }
      row["out_of_place_forced"] = std::move(forced);
      algo_rows_.push_back(ar);
    }
    if (a_.memcpy_beside && sh.send_bytes > 0 && sh.send_bytes == sh.recv_bytes) {
      row["memcpy_beside"] = memcpy_beside(sh.send_bytes);
      const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
      if (cpus > 0 && n_ > cpus && sh.send_bytes >= (std::size_t{1} << 20))
        row["memcpy_beside_all"] = memcpy_beside_all(sh.send_bytes);
    }
    row["actual_iterations"] = iterations;
    row["algorithm"] = std::string(kft::name(chosen));
    row["algorithm_requested"] = std::string(kft::name(a_.algorithm));
    row["zero_copy"] = a_.zero_copy;
    rows_.push_back(std::move(row));
    if (C::kind == coll::allreduce && t == kft::dtype::f32 && op == kft::op_kind::sum) {
      float_sum_rows_.push_back({sh.size(), sh.count, std::string(kft::name(chosen)), oop_us, oop_busbw, rows_.size() - 1});
      if (peers_on_) peers_after_row(float_sum_rows_.size() - 1);
    }
    if (!next_size(size)) break;
  }
}

template <class C>
void bench<C>::print_header() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char line[512];
  std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu %d] kft %s\n", me_, 0,
                static_cast<int>(::getpid()), host, be_.device_index(), ::sched_getcpu(), be_.name().c_str());
  std::vector<char> lines(sizeof line * static_cast<std::size_t>(n_));
  ctl_.gather(line, sizeof line, lines.data());
  if (me_ != 0) return;
  if (shm_cfg_) std::printf("# kft %s collective_perf (shared-memory transport, nccl-tests format)\n", KFT_VERSION_STRING);
  else std::printf("# kft %s collective_perf (%s, nccl-tests format)\n", KFT_VERSION_STRING, be_.describe().c_str());
  std::printf("# Collective test starting: %s\n", C::nccl_name);
  std::printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: 1 "
              "validation: %d graph: 0\n",
              a_.min_bytes, a_.max_bytes, a_.step_factor > 1 ? a_.step_factor : a_.step_bytes,
              a_.step_factor > 1 ? "factor" : "bytes", a_.warmup, a_.iters, a_.check);
  const char* avg_names[] = {"rank 0's", "the ranks' mean", "the fastest rank's", "the slowest rank's"};
  if (shm_cfg_) {
    const char* tuning = std::getenv("KFT_SHM_TUNING");
    std::printf("# kft: %d ranks, algo %s, zero-copy %s, staging %zu B, one-shot slot %zu B, copy path streamed from %zu B, "
                "time = %s average call (-a %d)\n"
                "# kft: crossovers: %s%s\n",
                n_, std::string(kft::name(a_.algorithm)).c_str(), a_.zero_copy ? "on" : "off", shm_cfg_->staging_bytes,
                shm_cfg_->small_bytes, shm_cfg_->copy_streaming_bytes, avg_names[a_.average], a_.average,
                tuning && *tuning ? "KFT_SHM_TUNING=" : "kft's defaults (include/kft/transport/shm/tuning.hpp)",
                tuning && *tuning ? tuning : "");
    std::printf("# kft: %s\n", be_.describe().c_str());  // its pages among the rest
  }
  else
    std::printf("# kft: %d ranks, backend %s, algo %s, time = %s average call (-a %d)\n", n_, be_.name().c_str(),
                std::string(kft::name(a_.algorithm)).c_str(), avg_names[a_.average], a_.average);
  std::printf("# buffers: one send and one receive buffer of %zu B, touched before timing and reused by every size and "
              "call (not rotated)\n",
              buf_bytes_);
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < n_; ++r) std::printf("%s", lines.data() + sizeof line * static_cast<std::size_t>(r));
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", "");
  if (a_.p50) std::printf("           out-of-place (+ per-call p50/p99)                 in-place (+ per-call p50/p99)\n");
  else std::printf("           out-of-place                       in-place          \n");
  auto cols = [&](const char* c0, const char* c1, const char* c2, const char* c3, const char* c4, const char* t,
                  const char* al, const char* bu, const char* wr, const char* p50, const char* p99) {
    std::printf("# %10s  %12s  %8s  %6s  %6s", c0, c1, c2, c3, c4);
    for (int h = 0; h < 2; ++h) {
      std::printf("  %7s  %6s  %6s  %6s", t, al, bu, wr);
      if (a_.p50) std::printf("  %7s  %7s", p50, p99);
    }
    std::printf(" %*s\n", 0, "");
  };
  cols("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_p50", "i_p99");
  cols("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
  std::fflush(stdout);
}

template <class C>
void bench<C>::print_footer() {
  if (me_ != 0) return;
  const double avg = bw_count_ ? bw_sum_ / bw_count_ : 0;
  const int errs = static_cast<int>(std::min<std::int64_t>(errors_, INT_MAX));
  std::printf("# %-20s : %d %s\n", "Out of bounds values", errs, errs ? "FAILED" : "OK");
  std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
  std::printf("#\n");
  std::printf("# Collective test concluded: %s\n", C::nccl_name);
  std::printf("#\n");
  if (input_changed_)
    std::printf("# kft: out-of-place calls changed %lld input elements (counted in #wrong)\n",
                static_cast<long long>(input_changed_));
  // The algorithm automatic picked, as runs of sizes.
  if (a_.algorithm != kft::algo::automatic) {
    std::printf("# kft algorithm: %s (forced with --algo)\n", std::string(kft::name(a_.algorithm)).c_str());
  } else if (!algos_.empty()) {
    std::printf("# kft algorithm (auto):");
    for (std::size_t i = 0; i < algos_.size();) {
      std::size_t j = i;
      while (j + 1 < algos_.size() && algos_[j + 1].second == algos_[i].second) ++j;
      std::printf("%s %s for %zu..%zu B", i ? "," : "", std::string(kft::name(algos_[i].second)).c_str(), algos_[i].first,
                  algos_[j].first);
      i = j + 1;
    }
    std::printf("\n");
  }
  std::printf("# minor page faults per timed kft call, worst rank and size: %g\n", worst_minflt_);
  std::fflush(stdout);
}

template <class C>
void bench<C>::print_algos() {
  if (me_ != 0 || algo_rows_.empty()) return;
  const auto forced = be_.forced(C::op);
  std::printf("#\n# kft algorithms in the same run: out-of-place busbw (GB/s), forced algorithms timed right after each row\n");
  std::printf("# %10s  %8s  %6s  %8s  %8s", "size", "type", "redop", "auto", "auto");
  for (auto f : forced) std::printf("  %8s", std::string(kft::name(f)).c_str());
  std::printf("  %9s\n# %10s  %8s  %6s  %8s  %8s", "auto/best", "(B)", "", "", "chose", "(GB/s)");
  for (std::size_t k = 0; k < forced.size(); ++k) std::printf("  %8s", "(GB/s)");
  std::printf("  %9s\n", "");
  for (const auto& r : algo_rows_) {
    double best = 0;
    for (std::size_t k = 1; k < r.busbw.size(); ++k) best = std::max(best, r.busbw[k]);
    std::printf("# %10zu  %8s  %6s  %8s  %8.2f", r.size, r.type.c_str(), r.op.c_str(), std::string(kft::name(r.chosen)).c_str(),
                r.busbw[0]);
    for (std::size_t k = 1; k < r.busbw.size(); ++k) std::printf("  %8.2f", r.busbw[k]);
    std::printf("  %9.2f\n", best > 0 ? r.busbw[0] / best : 0.0);
  }
  std::fflush(stdout);
}

inline peer_point point_of(const std::pair<timing, int>& r, std::size_t bytes, double factor) {
  peer_point p;
  p.time_us = r.first.sec * 1e6;
  p.algbw = r.first.sec > 0 ? static_cast<double>(bytes) / 1e9 / r.first.sec : 0;
  p.busbw = p.algbw * factor;
  p.minflt = r.first.minflt;
  p.iters = r.second;
  p.valid = true;
  return p;
}

// MPI_Allreduce as configured, every size, before anything changes malloc's settings.
template <class C>
void bench<C>::measure_mpi_default() {
  auto* fin = static_cast<const float*>(send_);
  auto* fout = static_cast<float*>(recv_);
  // Warm-up at the largest and the smallest size, as before kft's rows.
  std::size_t last = a_.min_bytes;
  while (next_size(last)) {  // the largest size of the sweep
  }
  for (std::size_t size : {last, a_.min_bytes}) {
    const std::size_t cnt = C::shape_of(size, sizeof(float), n_).count;
    if (cnt == 0 || cnt > static_cast<std::size_t>(INT_MAX)) continue;
    for (int w = 0; w < std::max(1, a_.warmup); ++w)
      MPI_Allreduce(fin, fout, static_cast<int>(cnt), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  for (std::size_t size = a_.min_bytes; size <= a_.max_bytes;) {
    const shape sh = C::shape_of(size, sizeof(float), n_);
    if (sh.count > 0 && sh.count <= static_cast<std::size_t>(INT_MAX)) {
      const int c = static_cast<int>(sh.count);
      mpi_def_.emplace_back(sh.count, point_of(time_budgeted([&] { MPI_Allreduce(fin, fout, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }),
                                               sh.count * sizeof(float), C::bus_factor(n_)));
    }
    if (!next_size(size)) break;
  }
}

template <class C>
void bench<C>::peers_before() {
  if (!peers_on_) return;
  if (ctl_.mpi()) measure_mpi_default();
  else mpi_note_ = "n/a: not started by an MPI launcher (run it under mpirun to measure MPI_Allreduce)";
  // "Tuned": freed memory stays in the heap, so per-call temporaries stop page-faulting.
  mmap_ok_ = ::mallopt(M_MMAP_THRESHOLD, 1 << 30);
  trim_ok_ = ::mallopt(M_TRIM_THRESHOLD, INT_MAX);
#if KFT_BENCH_WITH_GLOO
  if (a_.gloo) {
    // Gloo does its socket I/O on a thread it creates with the device. Bound to its rank's one
    // core (mpirun's default for few ranks) that thread waits for a scheduler tick on every
    // message; it is created, and Gloo runs, without the binding, as under torchrun.
    unbound_scope unbound;
    try {
      gloo_ = std::make_unique<gloo_peer>(ctl_, me_, n_);
      gloo_note_ = std::string("gloo::allreduce, ring, TCP on 127.0.0.1, tuned malloc") +
                   (unbound.active() ? ", ranks not bound to cores while Gloo runs" : "");
    } catch (const std::exception& e) {
      gloo_note_ = std::string("Gloo failed: ") + e.what();
    }
  } else {
    gloo_note_ = "off (--no-gloo)";
  }
#endif
}

template <class C>
void bench<C>::peers_after_row(std::size_t idx) {
  const auto& r = float_sum_rows_[idx];
  const std::size_t bytes = r.count * sizeof(float);
  const double factor = C::bus_factor(n_);
  auto* fin = static_cast<const float*>(send_);
  auto* fout = static_cast<float*>(recv_);
  peer_point mc, tuned, gl;
  if (bytes > 0) {
    // memcpy: rank 0 alone, the others wait in a barrier.
    double per = 0;
    int iters = 0;
    ctl_.barrier();
    if (me_ == 0) {
      auto t0 = clk::now();
      std::memcpy(recv_, send_, bytes);
      per = std::max(seconds_since(t0), 1e-9);
      // Enough copies to take ~10 ms (timer resolution), at least -n, at most the budget.
      iters = std::max(a_.iters, static_cast<int>(std::min(1e7, 0.01 / per)));
      if (per * iters > a_.peer_budget) iters = std::max(1, static_cast<int>(a_.peer_budget / per));
      t0 = clk::now();
      for (int it = 0; it < iters; ++it) {
        std::memcpy(recv_, send_, bytes);
        asm volatile("" ::"r"(recv_) : "memory");
      }
      per = seconds_since(t0) / iters;
    }
    ctl_.bcast(&per, sizeof per, 0);
    ctl_.bcast(&iters, sizeof iters, 0);
    mc.time_us = per * 1e6;
    mc.algbw = mc.busbw = per > 0 ? static_cast<double>(bytes) / 1e9 / per : 0;
    mc.iters = iters;
    mc.valid = true;
    if (ctl_.mpi() && r.count <= static_cast<std::size_t>(INT_MAX)) {
      const int c = static_cast<int>(r.count);
      tuned = point_of(time_budgeted([&] { MPI_Allreduce(fin, fout, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }), bytes, factor);
    }
#if KFT_BENCH_WITH_GLOO
    if (gloo_) {
      unbound_scope unbound;
      gl = point_of(time_budgeted([&] { gloo_->allreduce(fin, fout, r.count); }), bytes, factor);
    }
#endif
  }
  mcp_.push_back(mc);
  mpi_tuned_.push_back(tuned);
  gl_.push_back(gl);
}

template <class C>
void bench<C>::print_peers() {
  if (me_ != 0 || !a_.peers) return;
  if (!peers_on_) {
    if (be_.device())
      std::printf("#\n# peers: not measured for device buffers (the MPI, Gloo and memcpy peers time host memory)\n");
    else if (C::kind != coll::allreduce)
      std::printf("#\n# peers: measured for allreduce only\n");
    else
      std::printf("#\n# peers: measured for float sum only; this run has no float sum rows (-d float -o sum)\n");
    return;
  }
  const std::size_t k = float_sum_rows_.size();
  std::vector<peer_point> mpi_def(k);
  for (std::size_t i = 0; i < k; ++i)
    for (const auto& [count, p] : mpi_def_)
      if (count == float_sum_rows_[i].count) mpi_def[i] = p;
  std::printf("#\n# kft vs peers: allreduce, float sum, out-of-place, %d ranks, busbw in GB/s (time = %s)\n", n_,
              a_.average == 3 ? "slowest rank's average call" : "as -a says");
  std::printf("#   memcpy: rank 0 alone, one thread, the same bytes; its column is bytes/time in GB/s\n");
  if (mpi_note_.empty())
    std::printf("#   mpi: MPI_Allreduce as configured, every size measured before kft's table; mpi-tune: the same after "
                "mallopt(M_MMAP_THRESHOLD, 1 GiB) -> %s, mallopt(M_TRIM_THRESHOLD, INT_MAX) -> %s\n",
                mmap_ok_ ? "ok" : "refused", trim_ok_ ? "ok" : "refused");
  else
    std::printf("#   mpi, mpi-tune: %s\n", mpi_note_.c_str());
  std::printf("#   gloo: %s\n", gloo_note_.c_str());
  std::printf("#   memcpy, mpi-tune and gloo run right after kft's row of the same size; x<peer> = kft busbw / peer busbw "
              "(x memcpy: kft busbw / memcpy GB/s); peers' calls per size are capped at ~%g s (json: iterations)\n",
              a_.peer_budget);
  std::printf("# %10s  %8s  %8s %7s  %7s  %8s %7s  %8s %7s  %8s %7s  %7s %7s %7s %7s\n", "size", "kft", "kft", "kft",
              "memcpy", "mpi", "mpi", "mpi-tune", "mpi-tune", "gloo", "gloo", "x", "x", "x", "x");
  std::printf("# %10s  %8s  %8s %7s  %7s  %8s %7s  %8s %7s  %8s %7s  %7s %7s %7s %7s\n", "(B)", "algo", "(us)", "busbw",
              "(GB/s)", "(us)", "busbw", "(us)", "busbw", "(us)", "busbw", "memcpy", "mpi", "mpi-tune", "gloo");
  auto t = [](const peer_point& p) { return p.valid ? float_str(p.time_us, 8) : std::string("       -"); };
  auto b = [](const peer_point& p) { return p.valid ? float_str(p.busbw, 7) : std::string("      -"); };
  auto x = [](double kft_bw, const peer_point& p) {
    char buf[32];
    if (!p.valid || p.busbw <= 0) return std::string("      -");
    std::snprintf(buf, sizeof buf, "%7.2f", kft_bw / p.busbw);
    return std::string(buf);
  };
  for (std::size_t i = 0; i < k; ++i) {
    const auto& r = float_sum_rows_[i];
    std::printf("# %10zu  %8s  %8s %7s  %7s  %8s %7s  %8s %7s  %8s %7s  %7s %7s %7s %7s\n", r.size, r.algorithm.c_str(),
                float_str(r.time_us, 8).c_str(), float_str(r.busbw, 7).c_str(), b(mcp_[i]).c_str(), t(mpi_def[i]).c_str(),
                b(mpi_def[i]).c_str(), t(mpi_tuned_[i]).c_str(), b(mpi_tuned_[i]).c_str(), t(gl_[i]).c_str(),
                b(gl_[i]).c_str(), x(r.busbw, mcp_[i]).c_str(), x(r.busbw, mpi_def[i]).c_str(),
                x(r.busbw, mpi_tuned_[i]).c_str(), x(r.busbw, gl_[i]).c_str());
  }
  std::fflush(stdout);
  auto pj = [](const peer_point& p) -> json {
    if (!p.valid) return nullptr;
    return {{"time", p.time_us}, {"alg_bw", p.algbw}, {"bus_bw", p.busbw}, {"iterations", p.iters},
            {"minflt_per_call", p.minflt}};
  };
  for (std::size_t i = 0; i < k; ++i) {
    const auto& r = float_sum_rows_[i];
    json peers = {{"mpi_default", pj(mpi_def[i])}, {"mpi_tuned", pj(mpi_tuned_[i])}, {"gloo_ring", pj(gl_[i])}};
    peers["memcpy"] = mcp_[i].valid ? json{{"time", mcp_[i].time_us}, {"bw", mcp_[i].algbw}, {"iterations", mcp_[i].iters}}
                                    : json(nullptr);
    json ratios = json::object();
    const std::pair<const char*, const peer_point*> named[] = {
        {"memcpy", &mcp_[i]}, {"mpi_default", &mpi_def[i]}, {"mpi_tuned", &mpi_tuned_[i]}, {"gloo_ring", &gl_[i]}};
    for (const auto& [key, p] : named) ratios[key] = p->valid && p->busbw > 0 ? json(r.busbw / p->busbw) : json(nullptr);
    rows_[r.json_index]["peers"] = std::move(peers);
    rows_[r.json_index]["busbw_ratio_kft_over"] = std::move(ratios);
  }
  doc_["peers"] = {{"memcpy", "rank 0 alone, single thread, GB/s = bytes/time, right after kft's row"},
                   {"mpi_default", "MPI_Allreduce, Open MPI as configured, every size measured before kft's table"},
                   {"mpi_tuned", std::string("MPI_Allreduce after mallopt(M_MMAP_THRESHOLD, 1<<30) ") +
                                     (mmap_ok_ ? "ok" : "refused") + ", mallopt(M_TRIM_THRESHOLD, INT_MAX) " +
                                     (trim_ok_ ? "ok" : "refused") + ", right after kft's row"},
                   {"gloo_ring", gloo_note_},
                   {"budget_seconds", a_.peer_budget}};
  if (!mpi_note_.empty()) doc_["peers"]["mpi_default"] = doc_["peers"]["mpi_tuned"] = mpi_note_;
}

template <class C>
void bench<C>::run_latency() {
  if (!a_.latency) return;
  std::vector<std::size_t> sizes{8};
  for (const auto& r : float_sum_rows_)
    if (r.size <= a_.latency_max && r.size != 8 && r.count > 0) sizes.push_back(r.size);
  std::sort(sizes.begin(), sizes.end());
  const int warm = std::max(100, a_.latency_iters / 10);
  auto* fin = static_cast<const float*>(send_);
  auto* fout = static_cast<float*>(recv_);
  if (me_ == 0) {
    std::printf("#\n# latency: allreduce, float sum, out-of-place, %d ranks; %d calls after %d warm-up, each call's time = "
                "slowest rank's\n",
                n_, a_.latency_iters, warm);
    std::printf("# %10s  %8s  %8s %8s  %8s %8s  %9s\n", "size", "kft", "kft p50", "kft p99", "mpi p50", "mpi p99",
                "p50 kft/mpi");
    std::printf("# %10s  %8s  %8s %8s  %8s %8s  %9s\n", "(B)", "algo", "(us)", "(us)", "(us)", "(us)", "");
  }
  for (std::size_t size : sizes) {
    const std::size_t cnt = size / sizeof(float);
    const kft::algo chosen = a_.algorithm == kft::algo::automatic ? be_.choose(kft::collective::allreduce, cnt * sizeof(float), a_.zero_copy) : a_.algorithm;
    ctl_.barrier();
    const iter_stats k = time_each(warm, a_.latency_iters, [&] { be_.allreduce(fin, fout, cnt, kft::dtype::f32, kft::op_kind::sum, opts_); });
    const int c = static_cast<int>(cnt);
    iter_stats m{};
    if (ctl_.mpi()) m = time_each(warm, a_.latency_iters, [&] { MPI_Allreduce(fin, fout, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    if (me_ == 0) {
      if (ctl_.mpi())
        std::printf("# %10zu  %8s  %8.2f %8.2f  %8.2f %8.2f  %9.2f\n", size, std::string(kft::name(chosen)).c_str(),
                    k.p50 * 1e6, k.p99 * 1e6, m.p50 * 1e6, m.p99 * 1e6, m.p50 > 0 ? k.p50 / m.p50 : 0.0);
      else
        std::printf("# %10zu  %8s  %8.2f %8.2f  %8s %8s  %9s\n", size, std::string(kft::name(chosen)).c_str(), k.p50 * 1e6,
                    k.p99 * 1e6, "-", "-", "-");
      std::fflush(stdout);
      latency_.push_back({{"size", size}, {"algorithm", std::string(kft::name(chosen))}, {"iterations", a_.latency_iters},
                          {"kft", {{"p50_us", k.p50 * 1e6}, {"p99_us", k.p99 * 1e6}}},
                          {"mpi", ctl_.mpi() ? json{{"p50_us", m.p50 * 1e6}, {"p99_us", m.p99 * 1e6}} : json(nullptr)}});
    }
  }
}

template <class C>
void bench<C>::write_json() {
  if (me_ != 0 || a_.json_path.empty()) return;
  doc_["version"] = 2;
  doc_["start_time"] = start_time_;
  doc_["args"] = argv_;
  json config = {{"nranks", n_},
                 {"minimum_bytes", a_.min_bytes},
                 {"maximum_bytes", a_.max_bytes},
                 {"warmup_iters", a_.warmup},
                 {"iterations", a_.iters},
                 {"aggregated_iterations", 1},
                 {"validation", a_.check},
                 {"average_mode", a_.average},
                 {"collective", std::string(C::kft_name)},
                 {"kft", {{"version", KFT_VERSION_STRING},
                          {"backend", be_.name()},
                          {"algorithm", std::string(kft::name(a_.algorithm))},
                          {"zero_copy", a_.zero_copy}}}};
  if (shm_cfg_) {
    config["kft"]["staging_bytes"] = shm_cfg_->staging_bytes;
    config["kft"]["small_bytes"] = shm_cfg_->small_bytes;
    config["kft"]["streaming_bytes"] = shm_cfg_->streaming_bytes;
    config["kft"]["copy_streaming_bytes"] = shm_cfg_->copy_streaming_bytes;
    config["kft"]["pool_bytes"] = shm_cfg_->pool_bytes;
  }
  if (a_.step_factor > 1) config["step_factor"] = a_.step_factor;
  else config["step_bytes"] = a_.step_bytes;
  doc_["config"] = std::move(config);
  doc_["results"] = rows_;
  doc_["out_of_bounds"] = {{"count", errors_}, {"okay", errors_ == 0}};
  doc_["average_bus_bandwidth"] = {{"bandwidth", bw_count_ ? bw_sum_ / bw_count_ : 0.0}, {"okay", "unchecked"}};
  if (!latency_.empty()) doc_["latency"] = latency_;
  doc_["end_time"] = now_str();
  std::ofstream out(a_.json_path);
  out << doc_.dump(1) << "\n";
  if (!out) std::fprintf(stderr, "kft bench: could not write %s\n", a_.json_path.c_str());
  else std::printf("# wrote %s\n", a_.json_path.c_str());
}

template <class C>
int bench<C>::run() {
  start_time_ = now_str();
  if (a_.timeout_s > 0) opts_.timeout = std::chrono::seconds(a_.timeout_s);
  opts_.algorithm = a_.algorithm;

  buf_bytes_ = buffer_bytes<C>(a_, n_);
  const std::size_t rounded = (buf_bytes_ + 4095) / 4096 * 4096;

  shm_cfg_ = shm_settings(be_);
  send_ = be_.alloc(rounded, a_.zero_copy);
  recv_ = be_.alloc(rounded, a_.zero_copy);
  if (be_.device()) {
    host_send_.assign(rounded, 0);
    host_recv_.assign(rounded, 0);
  } else {
    std::memset(send_, 0, rounded);  // first touch: no page faults while timing
    std::memset(recv_, 0, rounded);
  }

  peers_on_ = a_.peers && C::kind == coll::allreduce && !be_.device() &&
              std::find(a_.types.begin(), a_.types.end(), kft::dtype::f32) != a_.types.end() &&
              std::find(a_.ops.begin(), a_.ops.end(), kft::op_kind::sum) != a_.ops.end();
  peers_before();
  print_header();
  for (auto t : a_.types)
    for (auto op : a_.ops) {
      const int r0 = a_.all_roots ? 0 : a_.root, r1 = a_.all_roots ? n_ - 1 : a_.root;
      if (C::has_root && (r0 < 0 || r1 >= n_))
        throw std::invalid_argument("root " + std::to_string(a_.root) + " is not a rank (" + std::to_string(n_) + " ranks)");
      for (int root = r0; root <= r1; ++root) switch (t) {
          case kft::dtype::f32: run_rows<float>(t, op, root); break;
          case kft::dtype::f64: run_rows<double>(t, op, root); break;
          case kft::dtype::f16: run_rows<kft::half>(t, op, root); break;
          case kft::dtype::bf16: run_rows<kft::bfloat16>(t, op, root); break;
          case kft::dtype::i32: run_rows<std::int32_t>(t, op, root); break;
          case kft::dtype::i64: run_rows<std::int64_t>(t, op, root); break;
          case kft::dtype::u8: run_rows<std::uint8_t>(t, op, root); break;
        }
    }
  print_footer();
  print_algos();
  print_peers();
  run_latency();
  write_json();
  if (me_ == 0) std::printf("\n");

  ctl_.barrier();  // nobody still reads a peer's zero-copy buffer
  be_.release(send_);
  be_.release(recv_);
  return errors_ ? 1 : 0;
}



launch launch_of(const kft::environment& env) {
  const bool mpi_vars = env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMI_SIZE") || env.has("PMIX_RANK");
  const bool torch_vars = env.has("TORCHELASTIC_RUN_ID") || (env.has("RANK") && env.has("WORLD_SIZE"));
  if (torch_vars) return launch::launcher;  // a worker inherits its agent's PMIx variables (srun ... kftrun)
  return mpi_vars ? launch::mpi : launch::single;
}

template <class C>
int run_main(int argc, char** argv, launch how) {
  const auto env = kft::environment::process();
  int rank = 0, nranks = 1, local_size = 1, local_rank = 0;
  std::optional<kft::world_info> world;
  if (how == launch::launcher) {
    world = kft::discover(env);
    rank = world->rank;
    nranks = world->world_size;
    local_size = world->local_size.value_or(nranks);
    local_rank = world->local_rank.value_or(rank);
  } else {
    kft::discovery::verify_mpi_world(env);  // N singletons of a mismatched launcher: refuse
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Comm local = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
  }
  settings s;
  if (auto rc = parse_flags<C>(argc, argv, rank, s)) return *rc;

  // Across nodes (host names differ, or KFT_HOST_ID splits this machine), or --algo flat or
  // hierarchical, with no backend named: kft's flat and hierarchical allreduce against
  // MPI_Allreduce in one table (bench/multinode.hpp).
  const bool spans_nodes = local_size != nranks || env.has("KFT_HOST_ID");
  const bool across = spans_nodes || s.algorithm == kft::algo::flat || s.algorithm == kft::algo::hierarchical;
  if (s.backend == "auto" && across) {
    if (how == launch::launcher) {
      if (rank == 0)
        std::fprintf(stderr, "%s: across nodes (or with --algo flat/hierarchical) the bench compares kft with "
                             "MPI_Allreduce and needs an MPI launcher (mpirun, srun --mpi=pmix); under kftrun or "
                             "torchrun it measures one node's shared-memory collectives\n", argv[0]);
      return 2;
    }
    if constexpr (C::kind == coll::allreduce) {
      return multinode::run(s.min_bytes, [&](std::size_t& x) { return next_size(s, x); }, s.iters,
                            s.warmup, s.algorithm, s.json_path);
    } else {
      if (rank == 0)
        std::fprintf(stderr, "%s: across nodes, name the communicator (--backend mpi, group or nccl); the "
                             "flat-vs-hierarchical table is allreduce_perf's\n", argv[0]);
      return 2;
    }
  }
  const std::string which = s.backend == "auto" ? "shm" : s.backend;
  if (which == "shm" && spans_nodes) {
    if (rank == 0) std::fprintf(stderr, "%s: --backend shm runs on one node; these ranks span several\n", argv[0]);
    return 2;
  }
  // The store the measured communicator meets through, chosen as every kft program chooses it
  // (kft::init: MPI's under an MPI launcher, which main_of initialised; the launcher's under
  // kftrun or torchrun; an in-process one alone). No group: the bench builds each backend.
  kft::session job = kft::init({.init_mpi = false, .make_group = false});
  // The ranks' own coordination.
  std::unique_ptr<control> ctl;
  if (how == launch::launcher) ctl = make_shm_control(job.store(), rank, nranks);
  else ctl = std::make_unique<mpi_control>();
  auto be = make_backend(s, which, job.store(), how, rank, nranks, local_rank, buffer_bytes<C>(s, nranks));
  bench<C> b(s, *ctl, *be, rank, nranks);
  b.set_args(argc, argv);
  const int rc = b.run();
  be.reset();
  return rc;
}

// The program: MPI (when an MPI launcher started it), the run, and errors as exit codes.
template <class C>
int main_of(int argc, char** argv) {
  const launch how = launch_of(kft::environment::process());
  const bool with_mpi = how != launch::launcher;
  if (with_mpi) MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run_main<C>(argc, argv, how);
  } catch (const kft::config_error& e) {
    // A launcher mix-up or a malformed environment: every rank sees the same, so each exits
    // alone; the launcher's rank 0 says why.
    bool first = true;
    try {
      first = kft::discover_report(kft::environment::process()).world.rank == 0;
    } catch (const kft::error&) {  // the environment itself is malformed: every rank says so
    }
    if (first) std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    rc = 2;
  } catch (const std::exception& e) {
    int rank = 0;
    if (with_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "%s: rank %d: %s\n", argv[0], rank, e.what());
    std::fflush(stderr);
    if (with_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    rc = 1;
  }
  if (with_mpi) MPI_Finalize();
  return rc;
}

}  // namespace kft_bench
