// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/mpi/ring.hpp
/// @brief kft's ring allreduce over MPI point-to-point (component `kft::mpi`): `algo::ring`.
///
/// Reduce-scatter then allgather, p-1 steps each, every rank sending one segment (count/p
/// elements) to its right neighbour while receiving one from its left, so every link carries
/// 2(p-1)/p x N in both directions at once. MPI's own choice for large messages may be a
/// reduce + broadcast that uses one direction at a time (Open MPI's libnbc does for p < 4).
/// Segments are reduced in ring order once and then copied: every rank ends with the same bits.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/ring.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <algorithm>
#include <utility>

#include <kft/transport/mpi/state.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi::detail {

inline constexpr int ring_tag = 0x6b66;  // "kf"; the communicator is kft's own duplicate

// Polls point-to-point requests to completion or the deadline. Unlike a collective, a
// point-to-point request can be withdrawn: on a timeout nothing of this call stays in MPI.
inline void poll_p2p(state& s, MPI_Request* reqs, int n, const deadline& d, std::chrono::milliseconds timeout,
                     std::uint64_t seq, const char* phase) {
  const bool done = poll_until(
      [&] {
        int all = 0;
        s.check(MPI_Testall(n, reqs, &all, MPI_STATUSES_IGNORE), "MPI_Testall", "allreduce", seq);
        return all != 0;
      },
      d, backoff::oversubscribed(std::chrono::microseconds(200)), 256);
  if (done) return;
  s.stop.set("a timed-out allreduce #" + std::to_string(seq));
  for (int i = 0; i < n; ++i)
    if (reqs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&reqs[i]);
      MPI_Request_free(&reqs[i]);
    }
  throw timeout_error("allreduce timed out after " + kft::detail::describe_duration(timeout) + " in " + phase +
                          " waiting for rank " + std::to_string((s.rank + s.size - 1) % s.size) +
                          " (left neighbour) or rank " + std::to_string((s.rank + 1) % s.size) + " (right)",
                      s.site("allreduce", seq));
}

inline void average(const state& s, void* data, std::size_t count, dtype t) {
  const void* src[1] = {data};
  kernels::reduce(data, src, 1, count, t, op_kind::avg, s.size);
}

inline void ring_allreduce(state& s, const void* in, void* out, std::size_t count, dtype t, op_kind op,
                           const options& o, std::uint64_t seq) {
  s.require("allreduce", seq);
  const auto timeout = s.timeout_of(o);
  if (s.cfg.check_signatures) s.compare_signatures("allreduce", count, t, op, -1, o.tag, seq);
  const std::size_t es = size_of(t), p = static_cast<std::size_t>(s.size), r = static_cast<std::size_t>(s.rank);
  auto* buf = static_cast<unsigned char*>(out);
  if (in != out && count) std::memcpy(out, in, count * es);
  if (p == 1 || count == 0) {
    if (op == op_kind::avg) average(s, out, count, t);
    return;
  }
  auto seg = [&](std::size_t k) {  // [begin, length) of segment k, the first count % p one longer
    const std::size_t q = count / p, rem = count % p;
    return std::pair{k * q + std::min(k, rem), q + (k < rem ? 1 : 0)};
  };
  s.scratch.resize(std::max(s.scratch.size(), (count / p + 1) * es));
  const int right = static_cast<int>((r + 1) % p), left = static_cast<int>((r + p - 1) % p);
  const op_kind level = op == op_kind::avg ? op_kind::sum : op;
  const auto d = deadline::after(timeout);
  auto exchange = [&](std::size_t send_s, void* recv_to, std::size_t recv_s, const char* phase) {
    const auto [sb, sn] = seg(send_s);
    const auto rn = seg(recv_s).second;
    MPI_Request reqs[2];
    s.check(MPI_Irecv(recv_to, s.int_count(rn * es, "allreduce", seq), MPI_BYTE, left, ring_tag, s.comm, &reqs[0]),
            "MPI_Irecv", "allreduce", seq);
    s.check(MPI_Isend(buf + sb * es, s.int_count(sn * es, "allreduce", seq), MPI_BYTE, right, ring_tag, s.comm, &reqs[1]),
            "MPI_Isend", "allreduce", seq);
    poll_p2p(s, reqs, 2, d, timeout, seq, phase);
  };
  for (std::size_t step = 0; step + 1 < p; ++step) {  // reduce-scatter
    const std::size_t send_s = (r + p - step) % p, recv_s = (r + 2 * p - step - 1) % p;
    exchange(send_s, s.scratch.data(), recv_s, "ring reduce-scatter");
    const auto [rb, rn] = seg(recv_s);
    const void* srcs[2] = {buf + rb * es, s.scratch.data()};
    kernels::reduce(buf + rb * es, srcs, 2, rn, t, level, 1);
  }
  if (op == op_kind::avg) {  // scale the segment this rank owns once, before it is copied around
    const auto [ob, on] = seg((r + 1) % p);
    average(s, buf + ob * es, on, t);
  }
  for (std::size_t step = 0; step + 1 < p; ++step) {  // allgather
    const std::size_t send_s = (r + 1 + p - step) % p, recv_s = (r + p - step) % p;
    exchange(send_s, buf + seg(recv_s).first * es, recv_s, "ring allgather");
  }
}

}  // namespace mpi::detail
KFT_NAMESPACE_END
