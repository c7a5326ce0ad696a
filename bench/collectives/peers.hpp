// SPDX-License-Identifier: Apache-2.0
// peers.hpp: what allreduce_perf measures beside kft, in the same run and on the same buffers
// (float sum): memcpy on rank 0, Open MPI's MPI_Allreduce as configured and with malloc tuned,
// Gloo's ring allreduce over TCP on 127.0.0.1 (when built with Gloo), and the --latency table
// (kft against MPI_Allreduce, per call). Part of harness.cpp.
#pragma once

#include <malloc.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#if KFT_BENCH_WITH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include "bench.hpp"
#include "report.hpp"

namespace kft_bench {

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
void bench::measure_mpi_default() {
  auto* fin = static_cast<const float*>(send_);
  auto* fout = static_cast<float*>(recv_);
  // Warm-up at the largest and the smallest size, as before kft's rows.
  std::size_t last = a_.min_bytes;
  while (next_size(last)) {  // the largest size of the sweep
  }
  for (std::size_t size : {last, a_.min_bytes}) {
    const std::size_t cnt = c_.shape_of(size, sizeof(float), n_).count;
    if (cnt == 0 || cnt > static_cast<std::size_t>(INT_MAX)) continue;
    for (int w = 0; w < std::max(1, a_.warmup); ++w)
      MPI_Allreduce(fin, fout, static_cast<int>(cnt), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  for (std::size_t size = a_.min_bytes; size <= a_.max_bytes;) {
    const shape sh = c_.shape_of(size, sizeof(float), n_);
    if (sh.count > 0 && sh.count <= static_cast<std::size_t>(INT_MAX)) {
      const int c = static_cast<int>(sh.count);
      mpi_def_.emplace_back(sh.count, point_of(time_budgeted([&] { MPI_Allreduce(fin, fout, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }),
                                               sh.count * sizeof(float), c_.bus_factor(n_)));
    }
    if (!next_size(size)) break;
  }
}

void bench::peers_before() {
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

void bench::peers_after_row(std::size_t idx) {
  const auto& r = float_sum_rows_[idx];
  const std::size_t bytes = r.count * sizeof(float);
  const double factor = c_.bus_factor(n_);
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

void bench::print_peers() {
  if (me_ != 0 || !a_.peers) return;
  if (!peers_on_) {
    if (be_.device())
      std::printf("#\n# peers: not measured for device buffers (the MPI, Gloo and memcpy peers time host memory)\n");
    else if (c_.kind != coll::allreduce)
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

void bench::run_latency() {
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

}  // namespace kft_bench
