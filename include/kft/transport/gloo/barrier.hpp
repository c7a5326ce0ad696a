// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/barrier.hpp
/// @brief The Gloo barrier: Gloo's own (returns once every rank has called it).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/barrier.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/barrier.h>

#include <cstdint>

#include <kft/core/options.hpp>
#include <kft/transport/gloo/state.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

inline void barrier(state& s, const options& o, std::uint64_t seq) {
  s.require(collective::barrier, seq);
  if (s.size == 1) return;
  const auto timeout = kft::timeout_or(o, s.cfg.timeout);
  s.guarded(collective::barrier, seq, 0, dtype::u8, timeout, [&] {
    ::gloo::BarrierOptions g(s.ctx);
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::barrier(g);
  });
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
