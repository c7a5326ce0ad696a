// ddp_common.hpp: what the DDP benches (ddp_overlap, ddp_perf) share: the job's process group
// (any launcher kft discovers), sizes with K/M/G suffixes, medians, and the slowest rank's time.
#pragma once

#include "sizes.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <kft/group/factory.hpp>
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
/// shared pool of `pool_bytes` (the reducers' bucket storage).
struct job {
  kft::environment env;
  kft::world_info me;
  kft::rendezvous::store_handle store;
  kft::group::process_group pg;

  explicit job(std::size_t pool_bytes)
      : env(kft::environment::process()),
        me(kft::discover(env)),
        store(kft::rendezvous::connect_store(me, env)),
        pg(make(me, store, env, pool_bytes)) {}

  /// The slowest rank's value (every rank gets it).
  double slowest(double v) {
    pg.allreduce(&v, &v, 1, kft::dtype::f64, kft::op_kind::max);
    return v;
  }

 private:
  static kft::group::process_group make(const kft::world_info& me, kft::rendezvous::store_handle& s,
                                        const kft::environment& env, std::size_t pool_bytes) {
    kft::group::group_options go;
    go.shm.pool_bytes = pool_bytes;
    return kft::group::make_process_group(me, s.client, go, env);
  }
};

}  // namespace ddp_bench
