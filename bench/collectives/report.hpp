// SPDX-License-Identifier: Apache-2.0
// report.hpp: what a *_perf program prints and writes: nccl-tests' number formats
// (src/util.cu), the table's header and footer, the --algos table and the --json file. Part
// of harness.cpp.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include <kft/config.hpp>

#include "bench.hpp"

namespace kft_bench {

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

void bench::print_header() {
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
  std::printf("# Collective test starting: %s\n", c_.nccl_name);
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

void bench::print_footer() {
  if (me_ != 0) return;
  const double avg = bw_count_ ? bw_sum_ / bw_count_ : 0;
  const int errs = static_cast<int>(std::min<std::int64_t>(errors_, INT_MAX));
  std::printf("# %-20s : %d %s\n", "Out of bounds values", errs, errs ? "FAILED" : "OK");
  std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
  std::printf("#\n");
  std::printf("# Collective test concluded: %s\n", c_.nccl_name);
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

void bench::print_algos() {
  if (me_ != 0 || algo_rows_.empty()) return;
  const auto forced = be_.forced(c_.op);
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

void bench::write_json() {
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
                 {"collective", std::string(c_.kft_name)},
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

}  // namespace kft_bench
