// SPDX-License-Identifier: Apache-2.0
// A rank that hangs or breaks its job on purpose, for kft-trace's tests
// (tests/integration/trace_hang_test.py): 20 allreduces of 1024 floats, then a barrier, through
// the process group kft::init makes, with a 3 s deadline and the flight recorder on
// (KFT_TRACE_DIR). One rank, the victim, misbehaves at call 10:
//
//   stop   it stops itself (SIGSTOP) before the call: the others wait for it to their deadline
//   skip   it skips the call, so its barrier meets the others' last allreduce
//   size   its call has 1023 floats where the others' have 1024
//
//   trace_hang_worker <stop|skip|size> <victim rank>
//
// A rank whose call fails prints kft's error and exits 1.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <kft/init.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: trace_hang_worker <stop|skip|size> <victim rank>\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int victim = std::stoi(argv[2]);
  if (mode != "stop" && mode != "skip" && mode != "size") {
    std::fprintf(stderr, "trace_hang_worker: mode \"%s\" is not stop, skip or size\n", mode.c_str());
    return 2;
  }
  constexpr int calls = 20, bad_call = 10;
  try {
    kft::init_options io;
    io.group.timeout = std::chrono::seconds(3);
    auto job = kft::init(argc, argv, std::move(io));
    const int rank = job.world().rank;
    auto& pg = job.group();
    std::vector<float> x(1024, 1.0f);
    for (int call = 1; call <= calls; ++call) {
      const bool me = rank == victim && call == bad_call;
      if (me && mode == "stop") ::raise(SIGSTOP);
      if (me && mode == "skip") continue;
      pg.allreduce(std::span<float>(x.data(), me && mode == "size" ? x.size() - 1 : x.size()), kft::ops::max);
    }
    pg.barrier();
    std::printf("rank %d: done\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
