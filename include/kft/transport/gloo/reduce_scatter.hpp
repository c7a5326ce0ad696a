// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/reduce_scatter.hpp
/// @brief kft's ring reduce-scatter over Gloo's point-to-point buffers: p-1 steps, each rank
/// sending one slice to its right while receiving one from its left (1/p of an allreduce's
/// traffic); `avg` is a sum divided locally.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/reduce_scatter.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <kft/core/deadline.hpp>
#include <kft/core/options.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/transport/gloo/state.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

inline constexpr std::uint8_t ring_slot_prefix = 0x6b;  // 'k': apart from Gloo's own collectives' slots

// kft's ring reduce-scatter: chunk c starts at rank c+1 and travels right, each rank adding its
// own slice c, and ends reduced at rank c. Two slices of scratch (the partial being sent, the
// one arriving) alternate.
inline void reduce_scatter(state& s, const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                           const options& o, std::uint64_t seq) {
  s.require(collective::reduce_scatter, seq);
  const std::size_t es = size_of(t), bytes = recv_count * es, p = static_cast<std::size_t>(s.size),
                    r = static_cast<std::size_t>(s.rank);
  const auto* src = static_cast<const unsigned char*>(in);
  if (recv_count == 0) return;
  if (s.size == 1) {
    if (src != out) std::memmove(out, src, bytes);
    return;
  }
  const auto timeout = kft::timeout_or(o, s.cfg.timeout);
  const op_kind k = op == op_kind::avg ? op_kind::sum : op;
  if (s.scratch.size() < 2 * bytes) s.scratch.resize(2 * bytes);
  unsigned char* buf[2] = {s.scratch.data(), s.scratch.data() + bytes};
  const int right = (s.rank + 1) % s.size, left = (s.rank + s.size - 1) % s.size;
  const auto slot = ::gloo::Slot::build(ring_slot_prefix, s.tag(seq));
  s.guarded(collective::reduce_scatter, seq, recv_count, t, timeout, [&] {
    const auto d = deadline::after(timeout);
    auto left_ms = [&] { return std::max(d.left(), std::chrono::milliseconds(1)); };
    // Step 0 sends this rank's own slice r-1 as it is.
    auto first = s.ctx->createUnboundBuffer(const_cast<unsigned char*>(src) + ((r + p - 1) % p) * bytes, bytes);
    auto ub0 = s.ctx->createUnboundBuffer(buf[0], bytes);
    auto ub1 = s.ctx->createUnboundBuffer(buf[1], bytes);
    ::gloo::transport::UnboundBuffer* ubs[2] = {ub0.get(), ub1.get()};
    ::gloo::transport::UnboundBuffer* sending = first.get();
    int arriving = 0;
    for (std::size_t step = 0; step + 1 < p; ++step) {
      const std::size_t c = (r + 2 * p - step - 2) % p;  // the chunk arriving now
      ubs[arriving]->recv(left, slot);
      sending->send(right, slot);
      ubs[arriving]->waitRecv(left_ms());
      const void* parts[2] = {buf[arriving], src + c * bytes};
      const bool last = step + 2 == p;
      kernels::reduce(last ? out : buf[arriving], parts, 2, recv_count, t, k, 1);
      sending->waitSend(left_ms());
      sending = ubs[arriving];
      arriving ^= 1;
    }
  });
  if (op == op_kind::avg) divide(out, recv_count, t, s.size);
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
