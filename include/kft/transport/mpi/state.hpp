// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/mpi/state.hpp
/// @brief One MPI communicator's state (component `kft::mpi`): the duplicated `MPI_Comm`, call
/// numbering, the optional signature check, and the nonblocking calls polled with deadlines.
///
/// Every collective runs as an MPI-3 nonblocking call (`MPI_Iallreduce`, ...) polled with a
/// deadline, so a rank that never arrives gives a `timeout_error` instead of a hang. MPI cannot
/// cancel a collective: after a timeout the communicator refuses further calls. f16 and bf16
/// reduce through user ops that accumulate in float; `avg` is a sum divided locally; MPI's
/// in-place reduce-scatter result is moved to kft's place (slice `rank`).
#pragma once

#include <kft/config.hpp>
#include <kft/core/timeout.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/state.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <kft/async/engine.hpp>
#include <kft/core/backoff.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/deadline.hpp>
#include <kft/core/mpi_error.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/mpi/types.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi {

using namespace std::chrono_literals;

/// @brief Settings of one communicator (the transport reads no environment variable; the
/// process groups apply `KFT_MPI_CHECK` and `KFT_TIMEOUT`).
struct config {
  std::chrono::milliseconds timeout = default_job_timeout;  ///< default deadline of every collective (the groups apply KFT_TIMEOUT)
  /// Compare every call's signature (collective, dtype, op, count, root, sequence number) across
  /// ranks with one extra small MPI_Allreduce. Off by default (it doubles small-message latency).
  bool check_signatures = false;
  group_identity identity{};  ///< where this communicator sits in the job (default: from MPI_COMM_WORLD)
};

namespace detail {

/// One collective started with an `MPI_I*` call, and what completes it.
struct pending {
  MPI_Request req = MPI_REQUEST_NULL;
  collective op = collective::none;
  std::uint64_t seq = 0;
  std::size_t count = 0;
  dtype type = dtype::f32;
  std::chrono::milliseconds timeout{0};
  int divide = 0;  // avg: divide by this once done
  void* out = nullptr;
  bool inplace_rs = false;  // in-place reduce-scatter: move MPI's result to slice `rank`
  void* rs_base = nullptr;
  void* rs_out = nullptr;
  std::size_t rs_bytes = 0;

  void finish() {
    if (inplace_rs && rs_out != rs_base) std::memmove(rs_out, rs_base, rs_bytes);
    if (divide > 0) {
      const void* src[1] = {out};
      kernels::reduce(out, src, 1, count, type, op_kind::avg, divide);
    }
    divide = 0;
    inplace_rs = false;
  }
};

struct state {
  MPI_Comm comm = MPI_COMM_NULL;
  config cfg;
  int rank = 0, size = 0;
  std::uint64_t issued = 0;  // calls numbered so far
  kft::detail::failure_latch stop;
  std::vector<unsigned char> scratch;     // ring: one segment, grown when a bigger call comes
  std::unique_ptr<async::engine> engine;  // background progress, when MPI allows threads

  state() = default;
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() {
    engine.reset();  // queued work first (each bounded by its deadline)
    if (comm == MPI_COMM_NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm);
  }

  void adopt(MPI_Comm c) {
    comm = c;
    check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "set-up", 0);
    check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", "set-up", 0);
    check(MPI_Comm_size(comm, &size), "MPI_Comm_size", "set-up", 0);
    if (cfg.identity.world_size < 0) {
      MPI_Comm_rank(MPI_COMM_WORLD, &cfg.identity.world_rank);
      MPI_Comm_size(MPI_COMM_WORLD, &cfg.identity.world_size);
    }
    // Work progresses on a thread of its own only where MPI allows calls from several threads.
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided == MPI_THREAD_MULTIPLE) engine = std::make_unique<async::engine>("mpi rank " + std::to_string(rank));
  }

  error_site site(std::string op, std::uint64_t seq) const {
    return error_site::in(cfg.identity, rank, size, "mpi " + std::move(op), seq);
  }
  void check(int rc, const char* call, const std::string& op, std::uint64_t seq) const {
    if (rc != MPI_SUCCESS) mpi_check(rc, call, site(op, seq));  // (the site only on the failure path)
  }
  void require(const std::string& op, std::uint64_t seq) const {
    if (comm == MPI_COMM_NULL)
      throw usage_error("this communicator is empty (a split with a negative color)", site(op, seq));
    if (stop.stopped()) stop.check(site(op, seq));
  }
  int int_count(std::size_t count, const std::string& op, std::uint64_t seq) const {
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw usage_error(std::to_string(count) + " elements exceed MPI's int count; split the call", site(op, seq));
    return static_cast<int>(count);
  }
  std::chrono::milliseconds timeout_of(const options& o) const { return timeout_or(o, cfg.timeout); }

  // Numbers nothing (the caller did); checks the state and, when asked, compares signatures.
  pending begin(collective c, const options& o, std::size_t count, dtype t, op_kind k, int root, std::uint64_t seq) {
    const std::string op(name(c));
    require(op, seq);
    if (cfg.check_signatures) compare_signatures(op, count, t, k, root, o.tag, seq);
    pending p;
    p.op = c;
    p.seq = seq;
    p.count = count;
    p.type = t;
    p.timeout = timeout_of(o);
    return p;
  }

  bool test(pending& p) {
    if (p.req == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&p.req, &done, MPI_STATUS_IGNORE), "MPI_Test", std::string(name(p.op)), p.seq);
    if (done) p.finish();
    return done != 0;
  }

  // The error of a call that ran out of time; the communicator is stopped (MPI cannot cancel).
  timeout_error timed_out(pending& p) {
    stop.set("a timed-out " + std::string(name(p.op)) + " #" + std::to_string(p.seq));
    p.req = MPI_REQUEST_NULL;  // abandoned
    return timeout_error(std::string(name(p.op)) + " (" + std::to_string(p.count) + " x " + std::string(kft::name(p.type)) +
                             ") timed out after " + kft::detail::describe_duration(p.timeout) + " waiting for the " +
                             std::to_string(size - 1) + " other rank(s) of this MPI communicator (MPI does not say " +
                             "which rank is late)",
                         site(std::string(name(p.op)), p.seq));
  }

  // Polls to completion or the deadline. MPI progresses only inside MPI calls: poll often,
  // yield rather than sleep for long.
  void wait(pending& p) {
    const auto d = deadline::after(p.timeout);
    if (!poll_until([&] { return test(p); }, d, backoff::oversubscribed(200us), 256)) throw timed_out(p);
  }

  void compare_signatures(const std::string& op, std::size_t count, dtype t, op_kind k, int root, std::uint32_t tag,
                          std::uint64_t seq) {
    const std::int64_t mine[6] = {static_cast<std::int64_t>(seq),
                                  static_cast<std::int64_t>(op.size() * 131 + static_cast<std::size_t>(op[0] + op[1])),
                                  static_cast<std::int64_t>(count),
                                  static_cast<std::int64_t>(t) * 16 + static_cast<std::int64_t>(k), root,
                                  static_cast<std::int64_t>(tag)};
    std::int64_t both[12];  // max of mine, max of -mine
    for (int i = 0; i < 6; ++i) both[i] = mine[i], both[6 + i] = -mine[i];
    check(MPI_Allreduce(MPI_IN_PLACE, both, 12, MPI_INT64_T, MPI_MAX, comm), "MPI_Allreduce", op, seq);
    bool same = true;
    for (int i = 0; i < 6; ++i) same = same && both[i] == -both[6 + i];
    if (same) return;
    // Someone differs: everyone learns who, and names the first rank that differs from it.
    std::vector<std::int64_t> all(6 * static_cast<std::size_t>(size));
    check(MPI_Allgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, comm), "MPI_Allgather", op, seq);
    check(MPI_Barrier(comm), "MPI_Barrier", op, seq);
    for (int r = 0; r < size; ++r) {
      if (std::memcmp(&all[6 * static_cast<std::size_t>(r)], mine, sizeof mine) == 0) continue;
      const std::int64_t* s = &all[6 * static_cast<std::size_t>(r)];
      stop.set("signature mismatch");
      throw mismatch_error("rank " + std::to_string(r) + " is at #" + std::to_string(s[0]) + " (count " +
                               std::to_string(s[2]) + ", " + std::string(kft::name(static_cast<dtype>(s[3] / 16))) + " " +
                               std::string(kft::name(static_cast<op_kind>(s[3] % 16))) + ", root " + std::to_string(s[4]) +
                               ", tag " + std::to_string(s[5]) + "), rank " + std::to_string(rank) + " at #" +
                               std::to_string(seq) + " " + op + " (count " + std::to_string(count) + ", " +
                               std::string(kft::name(t)) + " " + std::string(kft::name(k)) + ", root " +
                               std::to_string(root) + ", tag " + std::to_string(tag) + ")",
                           site(op, seq));
    }
  }

  // ---- starting each collective (nonblocking) --------------------------------------------

  pending start_allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o,
                          std::uint64_t seq) {
    pending p = begin(collective::allreduce, o, count, t, op, -1, seq);
    check(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, int_count(count, "allreduce", seq), detail::datatype(t),
                         detail::reduction(t, op), comm, &p.req),
          "MPI_Iallreduce", "allreduce", seq);
    if (op == op_kind::avg) {
      p.out = out;
      p.divide = size;
    }
    return p;
  }
  pending start_broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o,
                          std::uint64_t seq) {
    pending p = begin(collective::broadcast, o, count, t, op_kind::sum, root, seq);
    if (rank == root && in != out && count) std::memcpy(out, in, count * size_of(t));
    check(MPI_Ibcast(out, int_count(count, "broadcast", seq), detail::datatype(t), root, comm, &p.req), "MPI_Ibcast",
          "broadcast", seq);
    return p;
  }
  // In place when out == in + rank * recv_count. MPI's in-place form leaves the result at the
  // start of the buffer; kft's convention is slice `rank`.
  pending start_reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o,
                               std::uint64_t seq) {
    pending p = begin(collective::reduce_scatter, o, recv_count, t, op, -1, seq);
    const std::size_t es = size_of(t);
    const bool in_place = static_cast<const unsigned char*>(in) + static_cast<std::size_t>(rank) * recv_count * es ==
                          static_cast<unsigned char*>(out);
    if (in_place) {
      p.inplace_rs = true;
      p.rs_base = const_cast<void*>(in);
    }
    check(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : in, in_place ? const_cast<void*>(in) : out,
                                    int_count(recv_count, "reduce_scatter", seq), detail::datatype(t),
                                    detail::reduction(t, op), comm, &p.req),
          "MPI_Ireduce_scatter_block", "reduce_scatter", seq);
    p.rs_out = out;
    p.rs_bytes = recv_count * es;
    if (op == op_kind::avg) {
      p.out = out;
      p.divide = size;
    }
    return p;
  }
  // In place when in == out + rank * send_count.
  pending start_allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o,
                          std::uint64_t seq) {
    pending p = begin(collective::allgather, o, send_count, t, op_kind::sum, -1, seq);
    const bool in_place = static_cast<const unsigned char*>(in) ==
                          static_cast<unsigned char*>(out) + static_cast<std::size_t>(rank) * send_count * size_of(t);
    const int n = int_count(send_count, "allgather", seq);
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, detail::datatype(t), out, n, detail::datatype(t), comm, &p.req),
          "MPI_Iallgather", "allgather", seq);
    return p;
  }
  pending start_barrier(const options& o, std::uint64_t seq) {
    pending p = begin(collective::barrier, o, 0, dtype::u8, op_kind::sum, -1, seq);
    check(MPI_Ibarrier(comm, &p.req), "MPI_Ibarrier", "barrier", seq);
    return p;
  }
};

}  // namespace detail
}  // namespace mpi
KFT_NAMESPACE_END
