// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/allgather.hpp
/// @brief The Gloo allgather: Gloo's own, over the whole output (this rank's block moved into
/// place first, unless it is there: in place is in == out + rank x send_count).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/allgather.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/allgather.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <kft/core/options.hpp>
#include <kft/transport/gloo/state.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

inline void allgather(state& s, const void* in, void* out, std::size_t send_count, dtype t, const options& o,
                      std::uint64_t seq) {
  s.require(collective::allgather, seq);
  const std::size_t es = size_of(t), bytes = send_count * es;
  auto* mine = static_cast<unsigned char*>(out) + static_cast<std::size_t>(s.rank) * bytes;
  if (in != mine && bytes) std::memmove(mine, in, bytes);
  if (s.size == 1 || send_count == 0) return;
  const auto timeout = kft::timeout_or(o, s.cfg.timeout);
  s.guarded(collective::allgather, seq, send_count, t, timeout, [&] {
    ::gloo::AllgatherOptions g(s.ctx);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), send_count * static_cast<std::size_t>(s.size)); });
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::allgather(g);
  });
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
