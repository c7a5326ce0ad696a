// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/allreduce.hpp
/// @brief The Gloo allreduce: Gloo's ring (reduce-scatter then allgather: each segment reduced
/// once, so every rank gets the same bits) with kft's reduction kernels for every dtype and op
/// (f16/bf16 in float, rounded once per step); `avg` is a sum divided locally.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/allreduce.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/allreduce.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <kft/core/options.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/transport/gloo/state.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

// Gloo's reduce function over kft's kernels (`avg` sums; the caller divides).
inline ::gloo::AllreduceOptions::Func reduction(dtype t, op_kind op) {
  const op_kind k = op == op_kind::avg ? op_kind::sum : op;
  return [t, k](void* out, const void* a, const void* b, std::size_t n) {
    const void* src[2] = {a, b};
    kernels::reduce(out, src, 2, n, t, k, 1);
  };
}

inline void allreduce(state& s, const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o,
                      std::uint64_t seq) {
  s.require(collective::allreduce, seq);
  const std::size_t es = size_of(t);
  if (count == 0) return;
  if (in != out) std::memcpy(out, in, count * es);
  if (s.size == 1) return;
  const auto timeout = kft::timeout_or(o, s.cfg.timeout);
  s.guarded(collective::allreduce, seq, count, t, timeout, [&] {
    ::gloo::AllreduceOptions g(s.ctx);
    g.setAlgorithm(::gloo::AllreduceOptions::Algorithm::RING);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), count); });
    g.setReduceFunction(reduction(t, op));
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::allreduce(g);
  });
  if (op == op_kind::avg) divide(out, count, t, s.size);
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
