// SPDX-License-Identifier: Apache-2.0
// ddp_overlap: how much of the DDP reducer's communication hides behind the backward pass.
//
//     kftrun --nproc-per-node 2 -- build-tests/bench/ddp_overlap --layers 8 --layer-bytes 2M --cap 4M
//     KFT_TIMELINE=/tmp/tl kftrun ... ddp_overlap ...      # + bench/ddp/plot_timeline.py /tmp/tl out.png
//
// A synthetic model of L layers of equal size whose per-layer backward sleeps (the core is
// free: compute standing in for a GPU's). For each ratio rho of backward time to communication
// time it measures, per step, on the slowest rank:
//   C  communication alone: every gradient ready at once, then finish() (the sum of the
//      buckets' allreduce times, one engine);
//   B  the backward's own time (the sleeps, as they really took);
//   T  the step with overlap: layer by layer, sleep then mark_ready; then finish();
//   A  allreduce after backward: all the sleeps, then everything marked, then finish().
// Exposed communication X = max(0, T - B) from wall-clock time, hidden fraction H = 1 - X / C
// (docs/ddp.md). Medians over --steps steps. Numbers, not a pass/fail test. Every timed part
// starts on all ranks at one instant (job::start_together: a shared clock on one host), so the
// skew of leaving a barrier is not counted as exposed communication.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/ddp/reducer.hpp>

#include "ddp_common.hpp"

using namespace ddp_bench;

int main(int argc, char** argv) {
  CLI::App app{"the DDP reducer's overlap of communication with a (sleeping) backward pass"};
  int layers = 8, steps = 9;
  std::string layer_bytes = "2M", cap = "4M", first = "1M";
  std::vector<double> ratios{0.5, 1, 2, 4};
  app.add_option("--layers", layers, "layers (one parameter each)")->capture_default_str();
  app.add_option("--layer-bytes", layer_bytes, "gradient bytes per layer (f32)")->capture_default_str();
  app.add_option("--cap", cap, "bucket_bytes_cap")->capture_default_str();
  app.add_option("--first", first, "first_bucket_bytes")->capture_default_str();
  app.add_option("--ratios", ratios, "backward time / communication time to measure")->delimiter(',');
  app.add_option("--steps", steps, "steps per measurement (median)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const std::size_t per = parse_size(layer_bytes) / sizeof(float);
    job j(2 * per * sizeof(float) * static_cast<std::size_t>(layers) + (1u << 20));
    auto& pg = j.pg;
    const auto& me = j.me;
    std::vector<kft::ddp::parameter> params;
    for (int l = 0; l < layers; ++l) params.push_back({per, kft::dtype::f32, "layer" + std::to_string(l)});
    auto tl = kft::ddp::timeline::from(j.env, pg.rank());
    const bool tracing = tl.on();
    tl.record(false);  // only the overlapped steps of the last ratio
    kft::ddp::reducer red(pg, params,
                          {.limits = {.first_bucket_bytes = parse_size(first), .bucket_bytes_cap = parse_size(cap)},
                           .rebuild_buckets = false,
                           .trace = tracing ? &tl : nullptr});
    auto slowest = [&](double v) { return j.slowest(v); };
    auto mark_all = [&] {
      for (int l = layers - 1; l >= 0; --l) red.mark_ready(static_cast<std::size_t>(l));
    };
    // C: communication alone.
    std::vector<double> comm;
    for (int s = 0; s < steps + 1; ++s) {
      j.start_together();
      const auto t0 = clk::now();
      mark_all();
      red.finish();
      if (s) comm.push_back(slowest(seconds(t0, clk::now())));  // the first step warms up
    }
    const double C = median(comm);
    if (me.rank == 0) {
      std::printf("# ddp_overlap: %d ranks (%s), %d layers x %s f32 gradients, %zu bucket(s) (first %s, cap %s), "
                  "backward = sleeps\n",
                  pg.size(), pg.description().c_str(), layers, layer_bytes.c_str(), red.buckets().size(), first.c_str(),
                  cap.c_str());
      std::printf("# C = communication alone, B = backward, T = step with overlap, A = allreduce after backward; "
                  "X = max(0, T - B), H = 1 - X / C; medians of %d steps, slowest rank\n", steps);
      std::printf("# %6s %10s %10s %10s %10s %8s %8s\n", "B/C", "C (ms)", "B (ms)", "T (ms)", "A (ms)", "H", "A/T");
    }
    for (double rho : ratios) {
      const auto per_layer = std::chrono::duration<double>(rho * C / layers);
      std::vector<double> bs, ts, as, hs;
      for (int s = 0; s < steps; ++s) {
        j.start_together();
        const bool record = tracing && rho == ratios.back();
        tl.record(record);
        const auto t0 = clk::now();
        for (int l = layers - 1; l >= 0; --l) {
          {
            auto span = record ? tl.span("backward layer" + std::to_string(l)) : kft::ddp::timeline::scope(nullptr, "");
            std::this_thread::sleep_for(per_layer);
          }
          red.mark_ready(static_cast<std::size_t>(l));
        }
        const auto t_bwd = clk::now();
        {
          auto span = record ? tl.span("finish") : kft::ddp::timeline::scope(nullptr, "");
          red.finish();
        }
        const auto t_end = clk::now();
        tl.record(false);
        const double B = seconds(t0, t_bwd), T = seconds(t0, t_end);
        j.start_together();
        const auto a0 = clk::now();
        for (int l = 0; l < layers; ++l) std::this_thread::sleep_for(per_layer);
        mark_all();
        red.finish();
        const double A = seconds(a0, clk::now());
        bs.push_back(slowest(B));
        ts.push_back(slowest(T));
        as.push_back(slowest(A));
        hs.push_back(1.0 - std::max(0.0, ts.back() - bs.back()) / C);
      }
      if (me.rank == 0)
        std::printf("  %6.2f %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n", rho, C * 1e3, median(bs) * 1e3, median(ts) * 1e3,
                    median(as) * 1e3, median(hs), median(as) / median(ts));
    }
    tl.write();
    return 0;
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ddp_overlap: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
