// SPDX-License-Identifier: Apache-2.0
// flags.hpp: the flags every *_perf program takes, nccl-tests' (-b -e -i -f -n -w -c -d -o -r
// -a -T) and kft's own (--backend, --algo, --algos, --zero-copy, --peers, --latency, ...), read
// into `settings`; which apply is the collective's `descriptor` (harness.hpp). Part of
// harness.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>

#include "../common/sizes.hpp"
#include "harness.hpp"
#include "settings.hpp"

namespace kft_bench {

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
std::optional<int> parse_flags(const descriptor& c, int argc, char** argv, int rank, settings& a) {
  CLI::App app{"kft " + std::string(c.kft_name) + " benchmark in nccl-tests' format (run under mpirun)"};
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
    if (c.has_op) a.ops = parse_ops(o);
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
  if (c.has_root) {
    a.all_roots = a.root == -1;
    if (a.root < -1) return bad("-r must be a rank or -1");
  } else {
    a.root = 0;
  }
  if (c.kind != coll::allreduce) {
    if (a.latency) return bad("--latency is measured by allreduce_perf");
    if (app.count("--peers") > 0 && a.peers) return bad("--peers is measured by allreduce_perf");
    a.peers = false;
  }
  if (a.backend == "nccl" && a.latency) return bad("--latency compares host allreduces (not --backend nccl)");
  return std::nullopt;
}

}  // namespace kft_bench
