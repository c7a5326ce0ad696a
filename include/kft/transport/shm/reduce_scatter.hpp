// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/reduce_scatter.hpp
/// @brief The shared-memory reduce-scatter: from the mailboxes for small messages; for large
/// ones every rank stages p pieces of each chunk and reduces its own piece from all ranks.
#pragma once

#include <algorithm>
#include <cstring>

#include <kft/kernels/reduce.hpp>
#include <kft/transport/shm/state.hpp>

KFT_NAMESPACE_BEGIN
namespace shm::detail {

inline void reduce_scatter(state& s, const void* in, void* out, std::size_t rc, dtype t, op_kind op, const options& o) {
  const std::size_t es = size_of(t), bytes = rc * es * static_cast<std::size_t>(s.p);
  // In place is out == in + rank x recv_count (the chunks copy every piece in before the
  // output of that chunk is written); any other shared byte would be overwritten unread.
  if (kft::detail::ranges_overlap(in, bytes, out, rc * es) &&
      out != static_cast<const unsigned char*>(in) + static_cast<std::size_t>(s.me) * rc * es)
    s.refuse(collective::reduce_scatter,
             usage_error("reduce_scatter: the output (" + std::to_string(rc) +
                             " elements) overlaps the input other than at input + rank x recv_count (rank " +
                             std::to_string(s.me) + ": in place)",
                         s.site("reduce_scatter", s.seq)));
  const algo a = s.resolve(collective::reduce_scatter, bytes, o);
  auto k = s.begin(collective::reduce_scatter, t, op, rc, -1, a, o, detail::no_offset, detail::no_offset);
  if (a == algo::one_shot && bytes <= s.cfg.small_bytes) {
    if (bytes) std::memcpy(s.small(s.me, k.sig.seq), in, bytes);
    s.arrive_and_check(k);
    if (rc == 0) return;
    for (int r = 0; r < s.p; ++r) s.srcs[static_cast<std::size_t>(r)] = s.small(r, k.sig.seq) + static_cast<std::size_t>(s.me) * rc * es;
    kernels::reduce(out, s.srcs.data(), s.p, rc, t, op, s.p);
    return;
  }
  s.arrive_and_check(k);
  if (rc == 0) return;
  // Chunk m elements of every rank's slice: stage p pieces of m, reduce my piece.
  const std::size_t m_max = std::max<std::size_t>(1, s.cfg.staging_bytes / es / static_cast<std::size_t>(s.p));
  for (std::size_t off = 0; off < rc; off += m_max) {
    const std::size_t m = std::min(m_max, rc - off);
    const std::uint64_t g = s.chunk++;
    s.claim_chunk(k, g);
    unsigned char* mine = s.staging(s.me, g);
    for (int piece = 0; piece < s.p; ++piece)
      std::memcpy(mine + static_cast<std::size_t>(piece) * m * es,
                  static_cast<const unsigned char*>(in) + (static_cast<std::size_t>(piece) * rc + off) * es, m * es);
    s.set_stage(3 * g + 1);
    s.wait_stage(k, 3 * g + 1, "copy-in");
    for (int r = 0; r < s.p; ++r)
      s.srcs[static_cast<std::size_t>(r)] = s.staging(r, g) + static_cast<std::size_t>(s.me) * m * es;
    kernels::reduce(static_cast<unsigned char*>(out) + off * es, s.srcs.data(), s.p, m, t, op, s.p);
    s.finish_chunk(g);
  }
}

}  // namespace shm::detail
KFT_NAMESPACE_END
