// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/broadcast.hpp
/// @brief The Gloo broadcast: Gloo's own, into `out` on every rank (the root copies `in` there
/// first when it is not in place).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/broadcast.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/broadcast.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <kft/core/options.hpp>
#include <kft/transport/gloo/state.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

inline void broadcast(state& s, const void* in, void* out, std::size_t count, dtype t, int root, const options& o,
                      std::uint64_t seq) {
  s.require(collective::broadcast, seq);
  const std::size_t es = size_of(t);
  if (s.rank == root && in != out && count) std::memcpy(out, in, count * es);
  if (s.size == 1 || count == 0) return;
  const auto timeout = kft::timeout_or(o, s.cfg.timeout);
  s.guarded(collective::broadcast, seq, count, t, timeout, [&] {
    ::gloo::BroadcastOptions g(s.ctx);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), count); });
    g.setRoot(root);
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::broadcast(g);
  });
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
