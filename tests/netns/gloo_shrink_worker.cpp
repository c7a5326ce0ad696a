// SPDX-License-Identifier: Apache-2.0
// A rank of a job across network-namespace hosts (shared memory per node + Gloo between them)
// that allreduces until a rank is lost, then shrinks its process group (the survivors agree
// through the job's store and build the group again over themselves) and checks the smaller
// group. Driven by tests/netns/gloo-shrink.sh.
//
//   gloo_shrink_worker <dir> <timeout seconds> [victims (job ranks, comma-separated) [iteration]]
//
// Victims kill themselves (SIGKILL) as the given iteration starts, after writing the time of
// death (ms since the epoch, CLOCK_REALTIME: one clock across the namespaces) to <dir>/death.
// Without victims the ranks allreduce until an error (a cut link). Every rank writes its pid to
// <dir>/pid.<rank> and prints "ready". A survivor prints
//   gloo_shrink: rank R -> r of n, members M, generation G, error E ms, shrunk S ms after the death, knew lost: L
// (L: the job ranks it knew were gone when its call failed, pg.lost_ranks(), or "none")
// then "gloo_shrink: rank R ok" when an allreduce, a broadcast and a barrier of the new group
// gave what its members should, or kft's error and exits 1.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <kft/init.hpp>

namespace {
long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gloo_shrink_worker <dir> <timeout seconds> [victims [iteration]]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto timeout = std::chrono::seconds(std::stoi(argv[2]));
  std::vector<int> victims;
  if (argc > 3) {
    std::stringstream list(argv[3]);
    for (std::string r; std::getline(list, r, ',');) victims.push_back(std::stoi(r));
  }
  const long kill_at = argc > 4 ? std::stol(argv[4]) : 200;
  int job_rank = -1;
  try {
    kft::init_options io;
    io.group.timeout = timeout;
    auto job = kft::init(argc, argv, std::move(io));
    job_rank = job.world().rank;
    auto& pg = job.group();
    std::ofstream(dir + "/pid." + std::to_string(job_rank)) << ::getpid() << "\n";
    pg.barrier();
    std::printf("ready rank %d: %s\n", job_rank, pg.description().c_str());
    std::fflush(stdout);
    const bool victim = std::find(victims.begin(), victims.end(), job_rank) != victims.end();
    std::vector<float> x(1u << 18);
    const float want = static_cast<float>(pg.size() * (pg.size() + 1) / 2);
    long long err_ms = 0;
    try {
      for (long step = 0;; ++step) {
        if (victim && step == kill_at) {
          std::ofstream(dir + "/death") << now_ms() << "\n";
          ::raise(SIGKILL);
        }
        for (auto& v : x) v = static_cast<float>(job_rank + 1);
        pg.allreduce(std::span<float>(x), kft::ops::sum);
        if (x[0] != want || x.back() != want) {
          std::fprintf(stderr, "rank %d: step %ld: wrong sum %g, want %g\n", job_rank, step, double(x[0]), double(want));
          return 1;
        }
      }
    } catch (const kft::error& e) {
      err_ms = now_ms();
      std::fprintf(stderr, "rank %d: the allreduce failed: %s\n", job_rank, e.what());
    }
    std::string knew;  // the ranks this rank knew were gone when its call failed
    for (int r : pg.lost_ranks()) knew += (knew.empty() ? "" : ",") + std::to_string(r);
    const auto m = pg.shrink(job.store());
    const long long shrunk_ms = now_ms();
    long long death = 0;
    std::ifstream(dir + "/death") >> death;
    std::printf("gloo_shrink: rank %d -> %d of %d, members %s, generation %llu, error %lld ms, shrunk %lld ms after the death, "
                "knew lost: %s\n",
                job_rank, pg.rank(), pg.size(), m.describe().c_str(), static_cast<unsigned long long>(m.generation),
                death ? err_ms - death : -1, death ? shrunk_ms - death : -1, knew.empty() ? "none" : knew.c_str());
    std::fflush(stdout);
    // The new group: an allreduce of each member's job rank + 1, a broadcast from its last rank, a barrier.
    const float members_sum =
        static_cast<float>(std::accumulate(m.members.begin(), m.members.end(), 0) + static_cast<int>(m.members.size()));
    for (auto& v : x) v = static_cast<float>(job_rank + 1);
    pg.allreduce(std::span<float>(x), kft::ops::sum);
    if (x[0] != members_sum || x.back() != members_sum) {
      std::fprintf(stderr, "rank %d: after the shrink: wrong sum %g, want %g\n", job_rank, double(x[0]), double(members_sum));
      return 1;
    }
    std::vector<int> b(16, job_rank);
    pg.broadcast(std::span<int>(b), pg.size() - 1);
    if (b[0] != m.members.back() || b[15] != m.members.back()) {
      std::fprintf(stderr, "rank %d: after the shrink: broadcast gave %d, want %d\n", job_rank, b[0], m.members.back());
      return 1;
    }
    pg.barrier();
    std::printf("gloo_shrink: rank %d ok\n", job_rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", job_rank, e.what());
    return 1;
  }
}
