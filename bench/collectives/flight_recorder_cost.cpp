// SPDX-License-Identifier: Apache-2.0
// What the flight recorder costs (issue 47: at most 1% at the 8-byte allreduce rate). Run
// under kftrun, one process per rank, on one node (the shared-memory group, the fastest path,
// where the recorder's share is largest):
//
//   kftrun --nproc-per-node 4 -- flight_recorder_cost [--calls 20000] [--rounds 9] [--bytes 8]
//
// Each round times `--calls` allreduces of `--bytes` (f64 elements, sum) through the process
// group twice, with its flight recorder on (2048 entries) and off, in alternating order; a
// round's time is the slowest rank's. Rank 0 prints every round and the medians:
//   flight_recorder_cost: 4 ranks, 8 bytes: off 1.234 us, on 1.240 us a call: +0.5% (median of 9 rounds),
//   +0.4% (median of the rounds' own differences)
// and, for scale, what recording costs one thread alone (begin + end of an entry).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kft/core/flight_recorder.hpp>
#include <kft/init.hpp>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 20000, rounds = 9, bytes = 8, entries = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (v <= 0) {
      std::fprintf(stderr, "flight_recorder_cost: %s %s is not a positive number\n", argv[i], argv[i + 1]);
      return 2;
    }
    if (a == "--calls") calls = v;
    else if (a == "--rounds") rounds = v;
    else if (a == "--bytes") bytes = v;
    else if (a == "--entries") entries = v;
    else {
      std::fprintf(stderr, "usage: flight_recorder_cost [--calls N] [--rounds N] [--bytes N] [--entries N]\n");
      return 2;
    }
  }
  try {
    auto job = kft::init(argc, argv);
    auto& pg = job.group();
    const std::size_t n = static_cast<std::size_t>(std::max<long>(bytes / 8, 1));
    std::vector<double> x(n, 1.0);
    using clk = std::chrono::steady_clock;
    auto timed = [&](bool on) {
      pg.record({.entries = on ? static_cast<std::size_t>(entries) : std::size_t{0}, .dir = ""});
      pg.barrier();
      const auto t0 = clk::now();
      for (long c = 0; c < calls; ++c) pg.allreduce(std::span<double>(x), kft::ops::sum);
      double s = std::chrono::duration<double>(clk::now() - t0).count();
      pg.allreduce(std::span<double>(&s, 1), kft::ops::max);
      return s / static_cast<double>(calls) * 1e6;  // us a call, the slowest rank's
    };
    for (long w = 0; w < std::max<long>(calls / 10, 100); ++w) pg.allreduce(std::span<double>(x), kft::ops::sum);
    std::vector<double> off, on, paired;
    for (long r = 0; r < rounds; ++r) {
      const bool first_on = r % 2 == 1;  // (alternate which goes first)
      const double a = timed(first_on), b = timed(!first_on);
      (first_on ? on : off).push_back(a);
      (first_on ? off : on).push_back(b);
      // (a round's two halves ran back to back: their ratio leaves out the machine's drift
      // between rounds, which the medians of all rounds do not)
      paired.push_back((on.back() - off.back()) / off.back() * 100.0);
      if (pg.rank() == 0)
        std::printf("round %ld: off %.3f us, on %.3f us a call\n", r + 1, off.back(), on.back());
    }
    if (pg.rank() == 0) {
      // For scale: one thread recording alone (no collective).
      kft::trace::recorder alone("alone", static_cast<std::size_t>(entries));
      const long k = 1000000;
      const auto t0 = clk::now();
      for (long c = 0; c < k; ++c) {
        const auto s = alone.begin(kft::collective::allreduce, kft::dtype::f64, n, static_cast<std::uint64_t>(c), 0,
                                   kft::algo::automatic, -1, false);
        kft::trace::recorder::end(s, true);
      }
      const double each = std::chrono::duration<double>(clk::now() - t0).count() / static_cast<double>(k) * 1e9;
      const double mo = median(off), mn = median(on);
      std::printf("flight_recorder_cost: %d ranks, %ld bytes: off %.3f us, on %.3f us a call: %+.1f%% (median of %ld "
                  "rounds), %+.1f%% (median of the rounds' own differences); recording alone %.1f ns a call\n",
                  pg.size(), bytes, mo, mn, (mn - mo) / mo * 100.0, rounds, median(paired), each);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flight_recorder_cost: %s\n", e.what());
    return 1;
  }
  return 0;
}
