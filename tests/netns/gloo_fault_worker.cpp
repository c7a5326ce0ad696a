// SPDX-License-Identifier: Apache-2.0
// A rank of a job that allreduces until something breaks (tests/netns/gloo-faults.sh): the
// process group the factory makes (shared memory per node + Gloo between nodes) with a short
// deadline. It writes its pid to <dir>/pid.<rank>, prints "ready", checks every result, and on
// a failure prints kft's error and exits 1.
//
//   gloo_fault_worker <dir> <timeout seconds> [max seconds]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <kft/init.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gloo_fault_worker <dir> <timeout seconds> [max seconds]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto timeout = std::chrono::seconds(std::stoi(argv[2]));
  const auto max = std::chrono::seconds(argc > 3 ? std::stoi(argv[3]) : 300);
  try {
    kft::init_options io;
    io.group.timeout = timeout;
    auto job = kft::init(argc, argv, std::move(io));
    const kft::world_info& me = job.world();
    auto& pg = job.group();
    std::ofstream(dir + "/pid." + std::to_string(me.rank)) << ::getpid() << "\n";
    pg.barrier();
    std::printf("ready rank %d: %s\n", me.rank, pg.description().c_str());
    std::fflush(stdout);
    std::vector<float> x(1u << 18);
    const auto t0 = std::chrono::steady_clock::now();
    const float want = static_cast<float>(me.world_size * (me.world_size + 1) / 2);
    for (long step = 0; std::chrono::steady_clock::now() - t0 < max; ++step) {
      for (auto& v : x) v = static_cast<float>(me.rank + 1);
      pg.allreduce(std::span<float>(x), kft::ops::sum);
      if (x[0] != want || x.back() != want) {
        std::fprintf(stderr, "rank %d: step %ld: wrong sum %g, want %g\n", me.rank, step, double(x[0]), double(want));
        return 1;
      }
    }
    std::printf("rank %d: done\n", me.rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
