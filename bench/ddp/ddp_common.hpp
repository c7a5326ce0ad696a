// SPDX-License-Identifier: Apache-2.0
// ddp_common.hpp: what the DDP benches (ddp_overlap, ddp_perf) share: the job's process group
// (any launcher kft discovers), sizes with K/M/G suffixes, medians, and the slowest rank's time.
#pragma once

#include "../common/sizes.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <kft/init.hpp>
#include <kft/kft.hpp>

namespace ddp_bench {

using clk = std::chrono::steady_clock;

inline double seconds(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// The job: who this process is, the store, and a process group over every rank with a
/// shared pool of `pool_bytes` (the reducers' bucket storage), joined through kft::init as
/// every kft program does.
struct job {
  kft::environment env;
  kft::session session;
  const kft::world_info& me;
  kft::group::process_group& pg;
  std::shared_ptr<kft::rendezvous::store> store;

  explicit job(std::size_t pool_bytes)
      : env(kft::environment::process()),
        session(kft::init(options(env, pool_bytes))),
        me(session.world()),
        pg(session.group()),
        store(session.store()) {}

  /// Every rank leaves at the same instant, as nearly as the clock allows. On one host the
  /// processes share CLOCK_MONOTONIC (steady_clock), so they agree on a start 1 ms after the
  /// latest one's arrival and each waits for it (sleeping, then polling the last 300 us). A
  /// barrier alone lets the ranks go tens to hundreds of microseconds apart (the wake-up of a
  /// rank asleep in it), and a timed step would count that skew as the peers' waiting. Ranks on
  /// several hosts do not share a clock: there it is a barrier.
  void start_together() {
    if (me.local_size.value_or(0) != me.world_size) {
      pg.barrier();
      return;
    }
    using ns = std::chrono::nanoseconds;
    std::int64_t at = std::chrono::duration_cast<ns>(clk::now().time_since_epoch() + std::chrono::milliseconds(1)).count();
    pg.allreduce(&at, &at, 1, kft::dtype::i64, kft::op_kind::max);
    const clk::time_point start{ns(at)};
    std::this_thread::sleep_until(start - std::chrono::microseconds(300));
    while (clk::now() < start) std::this_thread::yield();
  }

  /// The slowest rank's value (every rank gets it).
  double slowest(double v) {
    pg.allreduce(&v, &v, 1, kft::dtype::f64, kft::op_kind::max);
    return v;
  }

 private:
  static kft::init_options options(const kft::environment& env, std::size_t pool_bytes) {
    kft::init_options o;
    o.env = env;
    o.group.shm.pool_bytes = pool_bytes;
    return o;
  }
};

}  // namespace ddp_bench
