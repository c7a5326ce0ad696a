// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/allreduce.hpp
/// @brief The shared-memory allreduce: one-shot (mailbox, one synchronisation) for small
/// messages; chunked one-shot and two-shot (reduce-scatter + allgather per staging chunk,
/// double-buffered so ranks pipeline without barriers) for large ones; zero-copy inputs and
/// outputs in the pool skip the copies (docs/algorithms.md has the step and byte costs).
#pragma once

#include <algorithm>
#include <cstring>

#include <kft/kernels/reduce.hpp>
#include <kft/transport/shm/state.hpp>

KFT_NAMESPACE_BEGIN
namespace shm::detail {

// Two-shot with every rank's input and output in the pool (the DDP reducer's buckets, in
// place): rank r reduces slice r of the whole message from every rank's input and writes the
// result straight into every rank's output, in one pass (in place, the lines it writes are the
// ones it has just read: no read-for-ownership). Each rank reads N and writes N bytes, against
// 2.5 N read and written by reduce-scatter + allgather through its own output (p = 2), and the
// call synchronises twice (arrival, done) instead of three times. Nobody else reads or writes
// slice r of any buffer, so in place is safe; the caller's check has refused partial overlap.
//
// With more ranks than CPUs (p > 2, from 16 MiB: config::claim_blocks, claim_from_bytes) the
// slices are not fixed: the message is cut into blocks that the ranks claim from a counter in
// the segment, so whichever rank runs does the next block. Fixed slices would leave a CPU idle
// (3 ranks on 2 CPUs: the rank alone on its CPU finishes its third and waits while two ranks
// share the other CPU), and the scheduler moves nobody over while the waiter polls. A block is still reduced and written by one rank only, from the
// inputs in rank order, so results do not depend on who did it (bit-identical on every rank).
// Below 16 MiB the fixed slices measured as fast or faster (4 ranks on 2 vCPUs, 256 KiB-4 MiB).
inline void allreduce_direct(state& s, const state::call& k, std::uint64_t in_off, std::uint64_t out_off,
                             std::size_t count, dtype t, op_kind op) {
  const std::size_t es = size_of(t);
  // Out of place and larger than the caches: every output with streaming stores (nobody reads
  // them before the call ends; no read-for-ownership, and they do not push the inputs out of the
  // caches). In place they were just read: cached.
  const bool stream = in_off != out_off && count * es >= s.cfg.streaming_bytes;
  const std::uint64_t g = s.chunk++;
  const int next = (s.me + 1) % s.p;
  // Reduces elements [first, first + n) of every input into every output.
  auto reduce_range = [&](std::size_t first, std::size_t n) {
    const auto in_of = [&](int r) { return s.pool(r) + in_off + first * es; };
    const auto out_of = [&](int r) { return s.pool(r) + out_off + first * es; };
    if (s.p == 2) {
      for (int r = 0; r < s.p; ++r) s.srcs[static_cast<std::size_t>(r)] = in_of(r);
      kernels::reduce_copy(out_of(s.me), out_of(next), stream, s.srcs.data(), s.p, n, t, op, s.p, stream);
      return;
    }
    if (stream) {
      // One pass: every result vector streamed into every output (mine first, then the
      // others'), nothing kept or read back. It replaced reducing 32 KiB blocks into private
      // scratch and streaming copies of it, which wrote and read the scratch p times per block
      // (docs/algorithms.md; the table in docs/performance.md).
      for (int r = 0; r < s.p; ++r) {
        s.srcs[static_cast<std::size_t>(r)] = in_of(r);
        s.dsts[static_cast<std::size_t>(r)] = out_of((s.me + r) % s.p);
      }
      kernels::reduce_all(s.dsts.data(), s.p, true, s.srcs.data(), s.p, n, t, op, s.p);
      return;
    }
    // In place, or below streaming_bytes: blocks small enough to stay in the core's cache between the reduction into my
    // output and the copies into the others' (the lines just read and written are cached).
    const std::size_t block = std::max<std::size_t>(1, state::direct_block_bytes / es);
    for (std::size_t b = 0; b < n; b += block) {
      const std::size_t m = std::min(block, n - b);
      for (int r = 0; r < s.p; ++r) s.srcs[static_cast<std::size_t>(r)] = in_of(r) + b * es;
      kernels::reduce_copy(out_of(s.me) + b * es, out_of(next) + b * es, false, s.srcs.data(), s.p, m, t, op, s.p);
      for (int r = (next + 1) % s.p; r != s.me; r = (r + 1) % s.p)
        std::memcpy(out_of(r) + b * es, out_of(s.me) + b * es, m * es);
    }
  };
  if (s.claims && s.p > 2 && count * es >= s.cfg.claim_from_bytes) {
    // Claimed blocks. The counter only grows: this call's claims start at `direct_base`, and
    // every rank claims once past the end before it stops, so the next call starts p later.
    // (No rank claims for the next call before every rank has arrived at it, i.e. finished this.)
    // About four blocks per rank, 32-256 KiB each: enough for a busy CPU's ranks to take fewer.
    const std::size_t unit_bytes = std::clamp<std::size_t>(count * es / (4 * static_cast<std::size_t>(s.p)),
                                                           state::direct_block_bytes, state::direct_claim_bytes);
    const std::size_t unit = std::max<std::size_t>(1, unit_bytes / es);
    const std::uint64_t units = (count + unit - 1) / unit;
    for (;;) {
      const std::uint64_t u = s.hdr->direct_next.fetch_add(1, std::memory_order_relaxed) - s.direct_base;
      if (u >= units) break;
      s.claimed.fetch_add(1, std::memory_order_relaxed);
      const std::size_t first = static_cast<std::size_t>(u) * unit;
      reduce_range(first, std::min(unit, count - first));
    }
    s.direct_base += units + static_cast<std::uint64_t>(s.p);
  } else {
    const auto mine = s.slice(count, s.me);
    reduce_range(mine.first, mine.second);
  }
  if (stream) kernels::stream_fence();
  // Every output is complete, and no input is read again, once every rank is done (each rank
  // publishes done after its last block; every block was claimed before anyone stopped).
  s.finish_chunk(g);
  s.wait_done(k, g + 1, "direct reduce");
}

inline void allreduce(state& s, const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o) {
  const std::size_t es = size_of(t), bytes = count * es;
  if (kft::detail::overlap_partly(in, out, bytes))
    s.refuse(collective::allreduce,
             usage_error("allreduce: the input and output buffers overlap without being the same buffer (in place "
                         "passes one buffer as both)",
                         s.site("allreduce", s.seq)));
  const auto in_off = s.pool_offset(in, bytes), out_off = s.pool_offset(out, bytes);
  const algo a = s.resolve(collective::allreduce, bytes, o, in_off != detail::no_offset);
  auto k = s.begin(collective::allreduce, t, op, count, -1, a, o, in_off, out_off);
  if (s.p == 1) {  // nothing to exchange: the result is the input (avg divides by 1, exactly)
    s.arrive_and_check(k);
    if (bytes && in != out) std::memmove(out, in, bytes);
    return;
  }
  if (a == algo::one_shot && bytes <= s.cfg.small_bytes) {
    if (bytes) std::memcpy(s.small(s.me, k.sig.seq), in, bytes);
    s.staged.fetch_add(bytes, std::memory_order_relaxed);
    s.arrive_and_check(k);
    for (int r = 0; r < s.p; ++r) s.srcs[static_cast<std::size_t>(r)] = s.small(r, k.sig.seq);
    kernels::reduce(out, s.srcs.data(), s.p, count, t, op, s.p);
    return;
  }
  s.arrive_and_check(k);
  if (count == 0) return;
  const bool zc_in = in_off != detail::no_offset, zc_out = out_off != detail::no_offset;
  if (a == algo::two_shot && zc_in && zc_out) return allreduce_direct(s, k, in_off, out_off, count, t, op);
  // Outputs bigger than the caches are written with streaming stores (no read-for-ownership);
  // from copy_streaming_bytes on, so is the staging the peers read (it reaches them through
  // memory rather than from this core's cache; config.hpp), and the output with it (measured:
  // streaming the staging alone gained nothing below streaming_bytes).
  const bool stream_staging = bytes >= s.cfg.copy_streaming_bytes;
  const bool stream = !zc_out && (bytes >= s.cfg.streaming_bytes || stream_staging);
  // Chunk: a multiple of p elements that fits the staging buffer.
  std::size_t chunk_elems = s.cfg.staging_bytes / es;
  if (chunk_elems >= static_cast<std::size_t>(s.p)) chunk_elems -= chunk_elems % static_cast<std::size_t>(s.p);
  const auto* src_user = static_cast<const unsigned char*>(in);
  auto* dst_user = static_cast<unsigned char*>(out);
  const std::size_t chunks = (count + chunk_elems - 1) / chunk_elems;
  const std::uint64_t g0 = s.chunk;
  s.chunk += chunks;
  auto chunk_at = [&](std::size_t i) { return std::pair{i * chunk_elems, std::min(chunk_elems, count - i * chunk_elems)}; };
  // Copy in what the others will read: every slice but my own for two-shot (I read mine in
  // place), everything for one-shot. Publishes stage 3g+1.
  auto copy_in = [&](std::size_t i) {
    const std::uint64_t g = g0 + i;
    const auto [off, n] = chunk_at(i);
    s.claim_chunk(k, g);
    if (!zc_in) {
      if (a == algo::one_shot) {
        std::memcpy(s.staging(s.me, g), src_user + off * es, n * es);
        s.staged.fetch_add(n * es, std::memory_order_relaxed);
      } else {
        const auto [sb, sn] = s.slice(n, s.me);
        kernels::copy(s.staging(s.me, g), src_user + off * es, sb * es, stream_staging);
        kernels::copy(s.staging(s.me, g) + (sb + sn) * es, src_user + (off + sb + sn) * es, (n - sb - sn) * es,
                      stream_staging);
        s.staged.fetch_add((n - sn) * es, std::memory_order_relaxed);
        if (stream_staging) kernels::stream_fence();  // streaming stores before the flag that publishes them
      }
    }
    s.set_stage(3 * g + 1);
  };
  // Two-shot from a private input runs one chunk ahead: chunk g+1 is copied in while the
  // others finish reducing chunk g, so a rank that waited for the slowest one works instead.
  const bool ahead = a == algo::two_shot && !zc_in;
  if (ahead) copy_in(0);
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::uint64_t g = g0 + i;
    const std::size_t off = chunk_at(i).first, n = chunk_at(i).second;  // (lambdas below capture them)
    const auto [sb, sn] = s.slice(n, s.me);
    if (!ahead) copy_in(i);
    s.wait_stage(k, 3 * g + 1, "copy-in");
    auto src_of = [&](int r) -> const unsigned char* {
      return zc_in ? s.pool(r) + in_off + off * es : s.staging(r, g);
    };
    if (a == algo::one_shot) {  // chunked one-shot: everyone reduces everything
      for (int r = 0; r < s.p; ++r) s.srcs[static_cast<std::size_t>(r)] = src_of(r);
      if (zc_out) {
        // The output is in the shared pool, where peers may still be reading their inputs:
        // reduce aside, and write it only once everyone is done reading this chunk.
        // Scratch: my other staging buffer, which every peer finished with (chunk g-1)
        // before it flagged chunk g.
        unsigned char* scratch = s.staging(s.me, g + 1);
        kernels::reduce(scratch, s.srcs.data(), s.p, n, t, op, s.p);
        s.set_stage(3 * g + 2);
        s.wait_stage(k, 3 * g + 2, "one-shot reduce");
        std::memcpy(dst_user + off * es, scratch, n * es);
        s.staged.fetch_add(n * es, std::memory_order_relaxed);
      } else {
        kernels::reduce(dst_user + off * es, s.srcs.data(), s.p, n, t, op, s.p);
      }
      s.finish_chunk(g);
      continue;
    }
    // 2. Reduce-scatter: my slice of the chunk from every rank, into shared memory where the
    //    others fetch it (my pool output, else my staging slice), and into my output.
    for (int r = 0; r < s.p; ++r)
      s.srcs[static_cast<std::size_t>(r)] =
          (r == s.me && !zc_in ? src_user + off * es : src_of(r)) + sb * es;
    unsigned char* shared_slice = zc_out ? s.pool(s.me) + out_off + (off + sb) * es : s.staging(s.me, g) + sb * es;
    if (zc_out) {
      kernels::reduce(shared_slice, s.srcs.data(), s.p, sn, t, op, s.p);
    } else {  // one pass writes both: no read-back of the slice for the output
      kernels::reduce_copy(shared_slice, dst_user + (off + sb) * es, stream, s.srcs.data(), s.p, sn, t, op, s.p,
                           stream_staging);
      s.staged.fetch_add(sn * es, std::memory_order_relaxed);
      if (stream_staging) kernels::stream_fence();
    }
    s.set_stage(3 * g + 2);
    // The next chunk's copy-in (its staging buffer is free once every rank finished chunk g-1).
    if (ahead && i + 1 < chunks) copy_in(i + 1);
    s.wait_stage(k, 3 * g + 2, "reduce-scatter");
    // 3. Allgather: the others' reduced slices into my output.
    for (int r = 0; r < s.p; ++r) {
      if (r == s.me) continue;
      const auto [b0, bn] = s.slice(n, r);
      const unsigned char* from = zc_out ? s.pool(r) + out_off + (off + b0) * es : s.staging(r, g) + b0 * es;
      kernels::copy(dst_user + (off + b0) * es, from, bn * es, stream);
    }
    if (stream) kernels::stream_fence();
    s.finish_chunk(g);
  }
  // Peers may still be reading my zero-copy buffer (one-shot: my pool input, when the output is
  // private; two-shot: my pool output's slice): the caller may write into it as soon as this
  // returns (the DDP reducer's next backward pass), so wait until every rank is done with it.
  if (a == algo::one_shot ? zc_in && !zc_out : zc_out) s.wait_done(k, s.chunk, "zero-copy release");
}

}  // namespace shm::detail
KFT_NAMESPACE_END
