// SPDX-License-Identifier: Apache-2.0
// A rank that steps and allreduces for a while, for kftrun's live status
// (tests/integration/live_status_test.py, bench/fault/live_status_bench.py): every step notes
// its number (kft::trace::note_step, as the trainer does), allreduces 1024 floats and sleeps
// `pause_ms`. It writes its pid to <dir>/pid.<rank> and prints "ready rank R" once every rank
// has met.
//
//   status_worker <dir> <seconds> [pause_ms]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <kft/init.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: status_worker <dir> <seconds> [pause_ms]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto seconds = std::chrono::seconds(std::stoi(argv[2]));
  const auto pause = std::chrono::milliseconds(argc > 3 ? std::stoi(argv[3]) : 20);
  try {
    auto job = kft::init(argc, argv);
    const int rank = job.world().rank;
    auto& pg = job.group();
    std::ofstream(dir + "/pid." + std::to_string(rank)) << ::getpid() << "\n";
    pg.barrier();
    std::printf("ready rank %d\n", rank);
    std::fflush(stdout);
    std::vector<float> x(1024, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t step = 1; std::chrono::steady_clock::now() - t0 < seconds; ++step) {
      kft::trace::note_step(step);
      pg.allreduce(std::span<float>(x), kft::ops::max);
      std::this_thread::sleep_for(pause);
    }
    pg.barrier();
    std::printf("rank %d: done\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
