// SPDX-License-Identifier: Apache-2.0
// harness.cpp: the *_perf programs' harness, compiled once for all four (harness.hpp says what
// it measures and how). Here: the rows, the run and main; the parts it includes are only
// included here. A collective reaches it as a `descriptor` (harness.hpp).
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

#include "harness.hpp"

#include "backend.hpp"
#include "control.hpp"
#include "settings.hpp"
#include "multinode.hpp"

// Gloo's headers here, where they stood in harness.hpp before, though only peers.hpp uses them:
// the order of what a translation unit defines sways GCC's inlining.
#if KFT_BENCH_WITH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include "flags.hpp"     // the flags
#include "checks.hpp"    // the checks (-c)
#include "bench.hpp"     // a run's state and clock
#include "report.hpp"    // the table and the JSON
#include "peers.hpp"     // memcpy, MPI, Gloo and --latency beside kft

namespace kft_bench {

template <class T>
void bench::run_rows(kft::dtype t, kft::op_kind op, int root) {
  constexpr std::size_t es = sizeof(T);
  const bool first_combo = algos_.empty();
  // nccl-tests' TimeTest: warm up at the largest and at the smallest size before the first row.
  std::size_t last = a_.min_bytes;
  while (next_size(last)) {  // the largest size of the sweep
  }
  for (std::size_t size : {last, a_.min_bytes}) {
    const shape sh = c_.shape_of(size, es, n_);
    for (int w = 0; w < a_.warmup; ++w) collective(send_, recv_, sh.count, t, op, root);
  }
  for (std::size_t size = a_.min_bytes; size <= a_.max_bytes;) {
    const shape sh = c_.shape_of(size, es, n_);
    const kft::algo chosen = a_.algorithm == kft::algo::automatic ? be_.choose(c_.op, sh.send_bytes, a_.zero_copy) : a_.algorithm;
    if (first_combo) algos_.emplace_back(sh.size(), chosen);
    const std::string type_name(kft::nccl_name(t));
    const std::string op_name = c_.has_op ? std::string(kft::name(op)) : "none";
    const int root_col = c_.has_root ? root : -1;
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
      const double busbw = algbw * c_.bus_factor(n_);
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
      for (kft::algo f : be_.forced(c_.op)) {
        kft::options o = opts_;
        o.algorithm = f;
        ctl_.barrier();
        const timing tm = time_calls(a_.warmup, a_.iters, [&] { collective(send_, recv_, sh.count, t, op, root, &o); });
        const double algbw = tm.sec > 0 ? static_cast<double>(sh.alg_bytes) / 1e9 / tm.sec : 0;
        ar.busbw.push_back(algbw * c_.bus_factor(n_));
        forced[std::string(kft::name(f))] = {{"time", tm.sec * 1e6}, {"alg_bw", algbw}, {"bus_bw", algbw * c_.bus_factor(n_)}};
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
    if (c_.kind == coll::allreduce && t == kft::dtype::f32 && op == kft::op_kind::sum) {
      float_sum_rows_.push_back({sh.size(), sh.count, std::string(kft::name(chosen)), oop_us, oop_busbw, rows_.size() - 1});
      if (peers_on_) peers_after_row(float_sum_rows_.size() - 1);
    }
    if (!next_size(size)) break;
  }
}


int bench::run() {
  start_time_ = now_str();
  if (a_.timeout_s > 0) opts_.timeout = std::chrono::seconds(a_.timeout_s);
  opts_.algorithm = a_.algorithm;

  buf_bytes_ = buffer_bytes(c_, a_, n_);
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

  peers_on_ = a_.peers && c_.kind == coll::allreduce && !be_.device() &&
              std::find(a_.types.begin(), a_.types.end(), kft::dtype::f32) != a_.types.end() &&
              std::find(a_.ops.begin(), a_.ops.end(), kft::op_kind::sum) != a_.ops.end();
  peers_before();
  print_header();
  for (auto t : a_.types)
    for (auto op : a_.ops) {
      const int r0 = a_.all_roots ? 0 : a_.root, r1 = a_.all_roots ? n_ - 1 : a_.root;
      if (c_.has_root && (r0 < 0 || r1 >= n_))
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

int run_main(const descriptor& c, int argc, char** argv, launch how) {
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
  if (auto rc = parse_flags(c, argc, argv, rank, s)) return *rc;

  // Across nodes (host names differ, or KFT_HOST_ID splits this machine), or --algo flat or
  // hierarchical, with no backend named: kft's flat and hierarchical allreduce against
  // MPI_Allreduce in one table (bench/collectives/multinode.hpp).
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
    if (c.kind == coll::allreduce)
      return multinode::run(s.min_bytes, [&](std::size_t& x) { return next_size(s, x); }, s.iters,
                            s.warmup, s.algorithm, s.json_path);
    if (rank == 0)
      std::fprintf(stderr, "%s: across nodes, name the communicator (--backend mpi, group or nccl); the "
                           "flat-vs-hierarchical table is allreduce_perf's\n", argv[0]);
    return 2;
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
  auto be = make_backend(s, which, job.store(), how, rank, nranks, local_rank, buffer_bytes(c, s, nranks));
  bench b(c, s, *ctl, *be, rank, nranks);
  b.set_args(argc, argv);
  const int rc = b.run();
  be.reset();
  return rc;
}

int run_program(const descriptor& c, int argc, char** argv) {
  const launch how = launch_of(kft::environment::process());
  const bool with_mpi = how != launch::launcher;
  if (with_mpi) MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run_main(c, argc, argv, how);
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
