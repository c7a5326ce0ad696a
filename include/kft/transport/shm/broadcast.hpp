// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/broadcast.hpp
/// @brief The shared-memory broadcast: through the root's mailbox for small messages; for
/// large ones the root stages chunks (double-buffered) and the others copy them out.
#pragma once

#include <algorithm>
#include <cstring>

#include <kft/transport/shm/state.hpp>

KFT_NAMESPACE_BEGIN
namespace shm::detail {

inline void broadcast(state& s, const void* in, void* out, std::size_t count, dtype t, int root, const options& o) {
  const std::size_t es = size_of(t), bytes = count * es;
  if (s.me == root && kft::detail::overlap_partly(in, out, bytes))
    s.refuse(collective::broadcast,
             usage_error("broadcast: the root's input and output buffers overlap without being the same buffer (in "
                         "place passes one buffer as both)",
                         s.site("broadcast", s.seq)));
  const algo a = s.resolve(collective::broadcast, bytes, o);
  auto k = s.begin(collective::broadcast, t, op_kind::sum, count, root, a, o, detail::no_offset, detail::no_offset);
  auto* dst = static_cast<unsigned char*>(out);
  const auto* src = static_cast<const unsigned char*>(in);
  if (a == algo::one_shot && bytes <= s.cfg.small_bytes) {
    if (s.me == root && bytes) std::memcpy(s.small(s.me, k.sig.seq), in, bytes);
    s.arrive_and_check(k);
    if (bytes == 0) return;
    if (s.me != root) std::memcpy(out, s.small(root, k.sig.seq), bytes);
    else if (out != in) std::memcpy(out, in, bytes);
    return;
  }
  s.arrive_and_check(k);
  // The root stages chunks; the others copy them out. Double-buffered like the two-shot.
  const std::size_t chunk_elems = s.cfg.staging_bytes / es;
  for (std::size_t off = 0; off < count; off += chunk_elems) {
    const std::size_t n = std::min(chunk_elems, count - off);
    const std::uint64_t g = s.chunk++;
    if (s.me == root) {
      s.claim_chunk(k, g);
      std::memcpy(s.staging(s.me, g), src + off * es, n * es);
      s.set_stage(3 * g + 1);
      if (out != in) std::memcpy(dst + off * es, src + off * es, n * es);
    } else {
      s.wait_stage_of(k, root, 3 * g + 1, "broadcast copy-in");
      std::memcpy(dst + off * es, s.staging(root, g), n * es);
    }
    s.finish_chunk(g);
  }
}

}  // namespace shm::detail
KFT_NAMESPACE_END
