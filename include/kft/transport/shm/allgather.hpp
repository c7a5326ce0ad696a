// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/allgather.hpp
/// @brief The shared-memory allgather (from the mailboxes, or staged chunks; zero-copy inputs
/// are read in place from the pool, at each rank's own offset) and the barrier.
#pragma once

#include <algorithm>
#include <cstring>

#include <kft/transport/shm/state.hpp>

KFT_NAMESPACE_BEGIN
namespace shm::detail {

inline void allgather(state& s, const void* in, void* out, std::size_t sc, dtype t, const options& o) {
  const std::size_t es = size_of(t), bytes = sc * es;
  // In place is in == out + rank x send_count (this rank's block, which every copy skips).
  if (kft::detail::ranges_overlap(in, bytes, out, bytes * static_cast<std::size_t>(s.p)) &&
      in != static_cast<const unsigned char*>(out) + static_cast<std::size_t>(s.me) * bytes)
    s.refuse(collective::allgather,
             usage_error("allgather: the input (" + std::to_string(sc) +
                             " elements) overlaps the output other than at output + rank x send_count (rank " +
                             std::to_string(s.me) + ": in place)",
                         s.site("allgather", s.seq)));
  const auto in_off = s.pool_offset(in, bytes);
  const algo a = s.resolve(collective::allgather, bytes, o);
  auto k = s.begin(collective::allgather, t, op_kind::sum, sc, -1, a, o, in_off, detail::no_offset);
  auto* dst = static_cast<unsigned char*>(out);
  if (a == algo::one_shot && bytes <= s.cfg.small_bytes) {
    if (bytes) std::memcpy(s.small(s.me, k.sig.seq), in, bytes);
    s.arrive_and_check(k);
    if (bytes == 0) return;
    for (int r = 0; r < s.p; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * bytes, s.small(r, k.sig.seq), bytes);
    return;
  }
  s.arrive_and_check(k);
  if (sc == 0) return;
  const bool zc = in_off != detail::no_offset;
  for (int r = 0; r < s.p; ++r)  // where each rank's zero-copy input is (or no_offset: staged)
    s.peer_off[static_cast<std::size_t>(r)] = s.box(r, k.sig.seq).sig.in_off;
  const std::size_t chunk_elems = s.cfg.staging_bytes / es;
  for (std::size_t off = 0; off < sc; off += chunk_elems) {
    const std::size_t n = std::min(chunk_elems, sc - off);
    const std::uint64_t g = s.chunk++;
    s.claim_chunk(k, g);
    if (!zc) std::memcpy(s.staging(s.me, g), static_cast<const unsigned char*>(in) + off * es, n * es);
    s.set_stage(3 * g + 1);
    s.wait_stage(k, 3 * g + 1, "copy-in");
    for (int r = 0; r < s.p; ++r) {
      const auto ro = s.peer_off[static_cast<std::size_t>(r)];
      const unsigned char* from = ro != detail::no_offset ? s.pool(r) + ro + off * es : s.staging(r, g);
      unsigned char* to = dst + (static_cast<std::size_t>(r) * sc + off) * es;
      if (from != to) std::memcpy(to, from, n * es);
    }
    s.finish_chunk(g);
  }
  // Peers may still be copying my zero-copy input, which the caller may overwrite once this returns.
  if (zc) s.wait_done(k, s.chunk, "zero-copy release");
}

inline void barrier(state& s, const options& o) {
  auto k = s.begin(collective::barrier, dtype::u8, op_kind::sum, 0, -1, algo::one_shot, o, no_offset, no_offset);
  s.arrive_and_check(k);
}

}  // namespace shm::detail
KFT_NAMESPACE_END
