// SPDX-License-Identifier: Apache-2.0
// A rank of a real multi-process job using the shared-memory communicator, started by kftrun,
// mpirun or by hand (tests/integration/shm_process_test.py). Modes:
//   sweep      every collective on f32/bf16/i64 x sum/max/avg, counts 0..1Mi+3, in place and
//              out of place, zero-copy; exit 0 when every element is right
//   kill       allreduce in a loop; rank 1 kills itself (SIGKILL) at iteration 20; the others
//              must fail with a kft::error (printed) and exit 3
//   kill_mid_call  rank 1 arrives 300 ms after the others (their wait is slow, so the call's
//              deadline is already set), starts a 64 MiB allreduce on a thread and kills itself
//              10 ms into it: the survivors must see the death in a later phase of that call
//              (exit 3), not run into the 60 s deadline
//   mismatch   rank 0 broadcasts 4096 floats while rank 1 allreduces 1048576: mismatch_error, exit 4
//   shrink [R] allreduce in a loop; rank R (2) notes the time in the store and kills itself at
//              iteration 20; the survivors catch the remote_error, shrink (group/shrink.hpp) and
//              check an allreduce and a broadcast in the smaller group; each prints its membership
//              and how long after the death it had the error and the new group; exit 0
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kft/init.hpp>
#include <kft/kft.hpp>
#include <kft/group/factory.hpp>
#include <kft/group/shrink.hpp>
#include <kft/transport/shm/communicator.hpp>

using namespace std::chrono_literals;

namespace {

float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13)); }

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void sweep(kft::shm::communicator& comm) {
  const int me = comm.rank(), p = comm.size();
  const float ranks_sum = static_cast<float>(p * (p + 1) / 2);
  for (std::size_t n : {0ul, 1ul, 7ul, 4099ul, (1ul << 20) + 3}) {
    for (auto a : {kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot}) {
      std::vector<float> in(n), out(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = value(me, i);
      comm.allreduce(std::span<const float>(in), std::span<float>(out), kft::ops::sum, {.algorithm = a});
      for (std::size_t i = 0; i < n; ++i) check(out[i] == ranks_sum * static_cast<float>(i % 13), "allreduce f32 sum");
      std::vector<kft::bfloat16> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = kft::bfloat16(static_cast<float>(me + static_cast<int>(i % 3)));
      comm.allreduce(std::span<kft::bfloat16>(h), kft::ops::max, {.algorithm = a});
      for (std::size_t i = 0; i < n; ++i) check(static_cast<float>(h[i]) == static_cast<float>(p - 1 + static_cast<int>(i % 3)), "allreduce bf16 max");
      std::vector<std::int64_t> q(n, me * 10);
      comm.allreduce(std::span<std::int64_t>(q), kft::ops::avg, {.algorithm = a});
      for (auto x : q) check(x == (10 * (p * (p - 1) / 2)) / p, "allreduce i64 avg");
      // broadcast from the last rank, in place
      std::vector<float> b(n, me == p - 1 ? 3.5f : -1.f);
      comm.broadcast(std::span<float>(b), p - 1, {.algorithm = a});
      for (auto x : b) check(x == 3.5f, "broadcast");
      // reduce_scatter and allgather
      std::vector<float> rs_in(n * static_cast<std::size_t>(p)), rs_out(n);
      for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = value(me, i);
      comm.reduce_scatter(std::span<const float>(rs_in), std::span<float>(rs_out), kft::ops::sum, {.algorithm = a});
      for (std::size_t i = 0; i < n; ++i)
        check(rs_out[i] == ranks_sum * static_cast<float>((static_cast<std::size_t>(me) * n + i) % 13), "reduce_scatter");
      std::vector<float> ag(n * static_cast<std::size_t>(p));
      comm.allgather(std::span<const float>(in), std::span<float>(ag), {.algorithm = a});
      for (std::size_t j = 0; j < ag.size(); ++j) check(ag[j] == value(static_cast<int>(j / n), j % n), "allgather");
    }
  }
  auto zc = comm.allocate<float>(300001);
  for (std::size_t i = 0; i < zc.size(); ++i) zc[i] = value(me, i);
  comm.allreduce(zc, kft::ops::sum);
  for (std::size_t i = 0; i < zc.size(); ++i) check(zc[i] == ranks_sum * static_cast<float>(i % 13), "zero-copy allreduce");
  comm.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sweep";
  int status = 0;
  std::optional<kft::session> job;
  try {
    // Who this rank is and the job's store (MPI's under mpirun, kftrun's, or rank 0's when
    // started by hand); no group: this worker builds the shared-memory communicator itself.
    job.emplace(kft::init(argc, argv, {.make_group = false}));
    const kft::world_info& me = job->world();
    if (mode == "die_at_startup" && me.rank == 1) {  // met the store, before the shared segment
      std::this_thread::sleep_for(300ms);
      ::raise(SIGKILL);
    }
    kft::shm::config cfg;
    cfg.pool_bytes = 4u << 20;
    // stall: the job's timeout (kftrun --timeout, or KFT_TIMEOUT under mpirun), which init read: a
    // transport built directly takes its config's, so the worker applies it as the groups do.
    cfg.timeout = mode == "stall" ? job->timeout() : 60s;
    cfg.name = "shm-worker";
    kft::shm::communicator comm(job->store(), me.rank, me.world_size, cfg);
    if (mode == "sweep") {
      sweep(comm);
      std::printf("shm_worker sweep: rank %d of %d OK\n", me.rank, me.world_size);
    } else if (mode == "kill") {
      std::vector<float> buf(1 << 18, 1.0f);
      try {
        for (int it = 0; it < 100000; ++it) {
          if (me.rank == 1 && it == 20) ::raise(SIGKILL);
          comm.allreduce(std::span<float>(buf), kft::ops::avg);
        }
      } catch (const kft::error& e) {
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
        status = 3;
      }
    } else if (mode == "kill_mid_call") {
      std::vector<float> buf(16u << 20, 1.0f);
      comm.barrier();
      if (me.rank == 1) {
        std::this_thread::sleep_for(300ms);
        std::thread t([&] { comm.allreduce(std::span<float>(buf), kft::ops::sum); });
        std::this_thread::sleep_for(10ms);
        ::raise(SIGKILL);
        t.join();
      }
      try {
        for (int it = 0; it < 4; ++it) comm.allreduce(std::span<float>(buf), kft::ops::sum);
      } catch (const kft::error& e) {
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
        status = 3;
      }
    } else if (mode == "die_at_startup") {
      comm.barrier();  // not reached: rank 1 is gone
    } else if (mode == "stall") {
      std::vector<float> buf(1024, 1.0f);
      if (me.rank == 1) std::this_thread::sleep_for(120s);  // a rank stuck in its own code
      try {
        comm.allreduce(std::span<float>(buf), kft::ops::sum);
      } catch (const kft::timeout_error& e) {
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
        status = 5;
      }
    } else if (mode == "shrink") {
      using clk = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for the processes of a machine
      auto ns = [](clk::time_point t) { return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count(); };
      std::vector<float> buf(1 << 16, 1.0f);
      const int victim = argc > 2 ? std::atoi(argv[2]) : 2;  // the rank that dies (its store must live on)
      std::optional<clk::time_point> failed_at;
      try {
        for (int it = 0; it < 100000; ++it) {
          if (me.rank == victim && it == 20) {
            job->store()->set("shrink-test/killed-at", std::to_string(ns(clk::now())));
            ::raise(SIGKILL);
          }
          comm.allreduce(std::span<float>(buf), kft::ops::sum);
        }
      } catch (const kft::remote_error& e) {
        failed_at = clk::now();
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
      }
      check(failed_at.has_value(), "the loop ended without the remote_error");
      auto next = kft::group::shrink(comm, job->store());
      const auto shrunk_at = clk::now();
      const auto& m = next.members;
      check(next.comm.rank() == m.rank && next.comm.size() == m.size(), "the new communicator's place");
      // The new group works: a sum over the survivors (old rank + 1 each) and a broadcast from its last rank.
      std::vector<float> v(4099, static_cast<float>(me.rank + 1));
      next.comm.allreduce(std::span<float>(v), kft::ops::sum);
      float want = 0.0f;
      for (int r : m.members) want += static_cast<float>(r + 1);
      for (float x : v) check(x == want, "allreduce over the survivors");
      std::vector<float> b(1000, m.rank == m.size() - 1 ? 7.0f : 0.0f);
      next.comm.broadcast(std::span<float>(b), m.size() - 1);
      for (float x : b) check(x == 7.0f, "broadcast in the shrunk group");
      next.comm.barrier();
      const auto killed = std::stoll(job->store()->get("shrink-test/killed-at", 10s));
      std::printf("shm_worker shrink: rank %d -> %d of %d (members %s, lost %d, generation %llu); error %.0f ms, "
                  "new group %.0f ms after the death\n",
                  me.rank, m.rank, m.size(), m.describe().c_str(), m.lost().empty() ? -1 : m.lost()[0],
                  static_cast<unsigned long long>(m.generation), static_cast<double>(ns(*failed_at) - killed) / 1e6,
                  static_cast<double>(ns(shrunk_at) - killed) / 1e6);
      comm = std::move(next.comm);
    } else if (mode == "shrink_group") {
      // The same through a process group, shrunk in place: a reference to it (as a trainer or a
      // reducer holds) stays valid. Rank R (argv[2]) dies at iteration 20.
      const int victim = argc > 2 ? std::atoi(argv[2]) : 2;
      kft::group::process_group pg = kft::group::make_process_group(me, job->store());
      kft::group::process_group& held = pg;
      std::vector<float> buf(1 << 16, 1.0f);
      bool failed = false;
      try {
        for (int it = 0; it < 100000; ++it) {
          if (me.rank == victim && it == 20) ::raise(SIGKILL);
          held.allreduce(std::span<float>(buf), kft::ops::sum);
        }
      } catch (const kft::remote_error& e) {
        failed = true;
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
      }
      check(failed, "the loop ended without the remote_error");
      const auto m = pg.shrink(job->store());
      check(held.rank() == m.rank && held.size() == m.size(), "the held reference sees the shrunk group");
      std::vector<float> v(100000, static_cast<float>(me.rank + 1));
      held.allreduce(std::span<float>(v), kft::ops::sum);
      float want = 0.0f;
      for (int r : m.members) want += static_cast<float>(r + 1);
      for (float x : v) check(x == want, "allreduce over the survivors through the process group");
      std::printf("shm_worker shrink_group: rank %d -> %d of %d (members %s); %s\n", me.rank, held.rank(), held.size(),
                  m.describe().c_str(), held.description().c_str());
    } else if (mode == "mismatch") {
      std::vector<float> big(1048576), small(4096);
      comm.barrier();
      try {
        if (me.rank == 1) comm.allreduce(std::span<float>(big), kft::ops::sum);
        else comm.broadcast(std::span<float>(small), 0);
      } catch (const kft::mismatch_error& e) {
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
        status = 4;
      }
    } else {
      std::fprintf(stderr, "shm_worker: unknown mode %s\n", mode.c_str());
      status = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shm_worker: %s\n", e.what());
    status = 1;
  }
#if KFT_WITH_MPI
  // A failed rank aborts the job: MPI_Finalize would wait for the stuck one.
  if (job && job->owns_mpi() && status != 0) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  return status;  // ~session: the store, then MPI_Finalize
}
