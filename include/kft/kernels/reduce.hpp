// SPDX-License-Identifier: Apache-2.0
/// @file kft/kernels/reduce.hpp
/// @brief The reduction inner loop, type-erased at the transport boundary.
///
/// `reduce(dst, srcs, n, count, dtype, op, divisor)` computes, for every element i,
/// `dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i]` in that order (so every rank that
/// reduces the same inputs gets bit-identical results), then divides by `divisor` for `avg`.
/// `dst` may be one of the sources. Loops work on vectors as wide as the target's registers (GCC/Clang
/// vector extensions, which become SSE/AVX/AVX-512/NEON instructions) with a scalar tail; f16 and bf16 are
/// widened to float, reduced, and rounded once (see reduce_16).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>

KFT_NAMESPACE_BEGIN
namespace kernels {

namespace detail {

template <class T, op_kind Op>
inline T apply(T a, T b) {
  if constexpr (Op == op_kind::sum || Op == op_kind::avg) return static_cast<T>(a + b);
  else if constexpr (Op == op_kind::prod) return static_cast<T>(a * b);
  else if constexpr (Op == op_kind::min) return b < a ? b : a;
  else return a < b ? b : a;
}

// The widest vector register the target has, in bytes. A generic vector wider than the hardware's
// (64 bytes without AVX-512) is lowered through the stack by GCC, which costs more than it gains.
#if defined(__AVX512F__)
inline constexpr std::size_t vector_bytes = 64;
#elif defined(__AVX__)
inline constexpr std::size_t vector_bytes = 32;
#else
inline constexpr std::size_t vector_bytes = 16;
#endif

template <class T>
inline T load(const void* p, std::size_t byte_offset) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + byte_offset, sizeof v);
  return v;
}

// Built-in element types: four independent register-wide vectors per iteration (the adds of
// one element still happen in source order, so the result is the scalar loop's, bit for bit),
// then single vectors, then a scalar tail; elements [0, head) go through the scalar loop too
// (a streaming store's alignment). Each result goes to `out`, a local class of the caller with
// `vectors(byte_offset, a0, a1, a2, a3)` (four consecutive vectors), `vector(byte_offset, a)`
// and `scalar(byte_offset, T)`: the writing (and its order) differs between
// reduce_native and reduce_native_all, the reducing is this one body. (A local class, not a
// lambda with an `auto` parameter: a vector typedef's attribute does not survive being a
// template argument.)
template <class T, op_kind Op, class Out>
void reduce_native_body(Out& out, const void* const* srcs, int n, std::size_t head, std::size_t count, int divisor) {
  typedef T vec __attribute__((vector_size(vector_bytes)));
  constexpr std::size_t W = vector_bytes / sizeof(T);
  constexpr std::size_t VB = sizeof(vec);
  const void* const s0 = srcs[0];
  const T d = static_cast<T>(divisor);
  const auto ld = [](const void* p, std::size_t o) {
    vec v;
    std::memcpy(&v, static_cast<const unsigned char*>(p) + o, VB);
    return v;
  };
  const auto combine = [](vec a, vec b) -> vec {
    if constexpr (Op == op_kind::sum || Op == op_kind::avg) return a + b;
    else if constexpr (Op == op_kind::prod) return a * b;
    else if constexpr (Op == op_kind::min) return b < a ? b : a;
    else return a < b ? b : a;
  };
  const auto scalar = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      const std::size_t o = i * sizeof(T);
      T a = load<T>(s0, o);
      for (int k = 1; k < n; ++k) a = apply<T, Op>(a, load<T>(srcs[k], o));
      if constexpr (Op == op_kind::avg) a = static_cast<T>(a / d);
      out.scalar(o, a);
    }
  };
  scalar(0, head);
  std::size_t i = head;
  for (; i + 4 * W <= count; i += 4 * W) {
    const std::size_t o = i * sizeof(T);
    vec a0 = ld(s0, o), a1 = ld(s0, o + VB), a2 = ld(s0, o + 2 * VB), a3 = ld(s0, o + 3 * VB);
    for (int k = 1; k < n; ++k) {
      const void* s = srcs[k];
      a0 = combine(a0, ld(s, o));
      a1 = combine(a1, ld(s, o + VB));
      a2 = combine(a2, ld(s, o + 2 * VB));
      a3 = combine(a3, ld(s, o + 3 * VB));
    }
    if constexpr (Op == op_kind::avg) {
      a0 = a0 / d;
      a1 = a1 / d;
      a2 = a2 / d;
      a3 = a3 / d;
    }
    out.vectors(o, a0, a1, a2, a3);
  }
  for (; i + W <= count; i += W) {
    const std::size_t o = i * sizeof(T);
    vec a = ld(s0, o);
    for (int k = 1; k < n; ++k) a = combine(a, ld(srcs[k], o));
    if constexpr (Op == op_kind::avg) a = a / d;
    out.vector(o, a);
  }
  scalar(i, count);
}

// One register-wide vector of `bytes` (a multiple of 16) at `v` stored at `into`, with 16-byte
// non-temporal stores when `stream` (`into` 16-byte aligned). (Not a template on the vector
// type: see reduce_native_body.)
inline void store_vector(unsigned char* into, const void* v, std::size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    for (std::size_t b = 0; b < bytes; b += 16) {
      __m128i x;
      std::memcpy(&x, static_cast<const unsigned char*>(v) + b, 16);
      _mm_stream_si128(reinterpret_cast<__m128i*>(into + b), x);
    }
    return;
  }
#else
  (void)stream;
#endif
  std::memcpy(into, v, bytes);
}

// Into `dst` and, when not null, a second copy `dst2`, each streamed when asked and aligned.
template <class T, op_kind Op>
void reduce_native(void* dst_v, void* dst2_v, bool stream2, const void* const* srcs, int n, std::size_t count,
                   int divisor, bool stream1) {
  typedef T vec __attribute__((vector_size(vector_bytes)));
  auto* dst = static_cast<unsigned char*>(dst_v);
  auto* dst2 = static_cast<unsigned char*>(dst2_v);  // a second copy of the result, or null
  // Streaming stores need 16-byte aligned addresses: the elements before dst2's first aligned
  // one go through the scalar loop (same order of operations, so the same bits).
  std::size_t head = 0;
#if defined(__SSE2__)
  if (dst2 && stream2) {
    const std::size_t mis = reinterpret_cast<std::uintptr_t>(dst2) & 15;
    if (mis % sizeof(T) != 0) stream2 = false;
    else head = std::min(count, ((16 - mis) & 15) / sizeof(T));
  }
  // dst streams too only when dst2's alignment head aligns it as well.
  stream1 = stream1 && stream2 && ((reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(dst2)) & 15) == 0;
#else
  stream2 = false;
  stream1 = false;
#endif
  struct to_two {
    unsigned char *dst, *dst2;
    bool stream1, stream2;
    void vector(std::size_t o, const vec& v) const {
      store_vector(dst + o, &v, sizeof v, stream1);
      if (dst2) store_vector(dst2 + o, &v, sizeof v, stream2);
    }
    void vectors(std::size_t o, const vec& a0, const vec& a1, const vec& a2, const vec& a3) const {
      vector(o, a0);
      vector(o + sizeof a0, a1);
      vector(o + 2 * sizeof a0, a2);
      vector(o + 3 * sizeof a0, a3);
    }
    void scalar(std::size_t o, T a) const {
      std::memcpy(dst + o, &a, sizeof(T));
      if (dst2) std::memcpy(dst2 + o, &a, sizeof(T));
    }
  } out{dst, dst2, stream1, stream2};
  reduce_native_body<T, Op>(out, srcs, n, head, count, divisor);
}

// Built-in element types into several outputs at once: each register-wide result is written to
// every output (with `stream`, non-temporal stores where every output shares one 16-byte
// alignment), so a reduction that every rank needs goes from the inputs to all outputs in one
// pass, with no private copy read back. The same body as reduce_native: the same bits.
template <class T, op_kind Op>
void reduce_native_all(void* const* dsts, int ndst, bool stream, const void* const* srcs, int n, std::size_t count,
                       int divisor) {
  typedef T vec __attribute__((vector_size(vector_bytes)));
  std::size_t head = 0;
#if defined(__SSE2__)
  if (stream) {
    const std::size_t mis = reinterpret_cast<std::uintptr_t>(dsts[0]) & 15;
    for (int j = 1; j < ndst; ++j)
      if ((reinterpret_cast<std::uintptr_t>(dsts[j]) & 15) != mis) stream = false;
    if (mis % sizeof(T) != 0) stream = false;
    if (stream) head = std::min(count, ((16 - mis) & 15) / sizeof(T));
  }
#else
  stream = false;
#endif
  struct to_all {
    void* const* dsts;
    int ndst;
    bool stream;
    void vector(std::size_t o, const vec& v) const {
      for (int j = 0; j < ndst; ++j) store_vector(static_cast<unsigned char*>(dsts[j]) + o, &v, sizeof v, stream);
    }
    void vectors(std::size_t o, const vec& a0, const vec& a1, const vec& a2, const vec& a3) const {
      for (int j = 0; j < ndst; ++j) {  // each output's lines whole before the next output's
        auto* into = static_cast<unsigned char*>(dsts[j]) + o;
        store_vector(into, &a0, sizeof a0, stream);
        store_vector(into + sizeof a0, &a1, sizeof a0, stream);
        store_vector(into + 2 * sizeof a0, &a2, sizeof a0, stream);
        store_vector(into + 3 * sizeof a0, &a3, sizeof a0, stream);
      }
    }
    void scalar(std::size_t o, T a) const {
      for (int j = 0; j < ndst; ++j) std::memcpy(static_cast<unsigned char*>(dsts[j]) + o, &a, sizeof(T));
    }
  } out{dsts, ndst, stream};
  reduce_native_body<T, Op>(out, srcs, n, head, count, divisor);
}

// 16-bit floats in register-wide vectors, with no conversion instruction needed (plain SSE2/NEON
// integer and float lane operations): a 32-bit lane holds two adjacent elements (little-endian:
// element 2j in the low half). Each is widened to float exactly, the inputs are reduced in float in
// source order, and the sum is rounded once to nearest-even, any NaN becoming the one positive quiet
// NaN (which NaN operand an addition returns, and so its sign, depends on the compiler's operand
// order: a canonical NaN keeps builds and ranks bit-identical), exactly as
// half::from_float and bfloat16::from_float round: so the vector body, the scalar tail and every
// rank's result agree bit for bit. (The compiler's _Float16 conversions without F16C go through
// libgcc one element at a time: 20-50x slower, measured by bench/ddp_micro.)
template <class H, op_kind Op>
void reduce_16(void* dst_v, const void* const* srcs, int n, std::size_t count, int divisor) {
  auto* dst = static_cast<unsigned char*>(dst_v);
  const float d = static_cast<float>(divisor);
  std::size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  typedef float vf __attribute__((vector_size(vector_bytes)));
  typedef std::uint32_t vu __attribute__((vector_size(vector_bytes)));
  constexpr std::size_t E = vector_bytes / 2;  // elements per vector
  const auto ld = [](const void* p, std::size_t o) {
    vu v;
    std::memcpy(&v, static_cast<const unsigned char*>(p) + o, sizeof v);
    return v;
  };
  const auto as_float = [](vu u) {
    vf f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  const auto as_bits = [](vf f) {
    vu u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  // A 16-bit value in the low half of each lane -> float.
  const auto widen = [&](vu h) -> vf {
    if constexpr (std::is_same_v<H, bfloat16>) {
      return as_float(h << 16);
    } else {
      const vu em = h & 0x7fffu, sign = (h & 0x8000u) << 16;
      const vu normal = (em << 13) + (112u << 23);                 // rebias the exponent
      const vu sub = as_bits(as_float((113u << 23) | (em << 13)) - as_float(vu{} + (113u << 23)));  // m * 2^-24
      const vu infnan = (em << 13) | 0x7f800000u;
      const vu r = em < 0x400u ? sub : normal;
      return as_float((em >= 0x7c00u ? infnan : r) | sign);
    }
  };
  // float -> a 16-bit value in the low half of each lane.
  const auto narrow = [&](vf f) -> vu {
    const vu x = as_bits(f);
    if constexpr (std::is_same_v<H, bfloat16>) {
      const vu rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
      return (x & 0x7fffffffu) > 0x7f800000u ? vu{} + 0x7fc0u : rounded;
    } else {
      const vu sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
      const vu normal = (absx - 0x38000000u + 0xfffu + ((absx >> 13) & 1u)) >> 13;
      const vu sub = as_bits(as_float(absx) + 0.5f) - 0x3f000000u;  // the FPU rounds to 2^-24 units
      vu r = absx < 0x38800000u ? sub : normal;
      r = absx >= 0x477ff000u ? vu{} + 0x7c00u : r;
      r = r | sign;
      return absx > 0x7f800000u ? vu{} + 0x7e00u : r;
    }
  };
  const auto combine = [](vf a, vf b) -> vf {
    if constexpr (Op == op_kind::sum || Op == op_kind::avg) return a + b;
    else if constexpr (Op == op_kind::prod) return a * b;
    else if constexpr (Op == op_kind::min) return b < a ? b : a;
    else return a < b ? b : a;
  };
  for (; i + E <= count; i += E) {
    const std::size_t o = i * 2;
    vu u = ld(srcs[0], o);
    vf lo = widen(u & 0xffffu), hi = widen(u >> 16);
    for (int k = 1; k < n; ++k) {
      u = ld(srcs[k], o);
      lo = combine(lo, widen(u & 0xffffu));
      hi = combine(hi, widen(u >> 16));
    }
    if constexpr (Op == op_kind::avg) {
      lo = lo / d;
      hi = hi / d;
    }
    const vu out = narrow(lo) | (narrow(hi) << 16);
    std::memcpy(dst + o, &out, sizeof out);
  }
#endif
  for (; i < count; ++i) {
    const std::size_t o = i * 2;
    float a = H::to_float(load<std::uint16_t>(srcs[0], o));
    for (int k = 1; k < n; ++k) a = apply<float, Op>(a, H::to_float(load<std::uint16_t>(srcs[k], o)));
    if constexpr (Op == op_kind::avg) a /= d;
    const std::uint16_t r = H::from_float(a);
    std::memcpy(dst + o, &r, 2);
  }
}

template <op_kind Op>
void reduce_typed(void* dst, void* dst2, bool stream2, const void* const* srcs, int n, std::size_t count, dtype t,
                  int divisor, bool stream1) {
  switch (t) {
    case dtype::f32: return reduce_native<float, Op>(dst, dst2, stream2, srcs, n, count, divisor, stream1);
    case dtype::f64: return reduce_native<double, Op>(dst, dst2, stream2, srcs, n, count, divisor, stream1);
    case dtype::i32: return reduce_native<std::int32_t, Op>(dst, dst2, stream2, srcs, n, count, divisor, stream1);
    case dtype::i64: return reduce_native<std::int64_t, Op>(dst, dst2, stream2, srcs, n, count, divisor, stream1);
    case dtype::u8: return reduce_native<std::uint8_t, Op>(dst, dst2, stream2, srcs, n, count, divisor, stream1);
    case dtype::f16: return reduce_16<half, Op>(dst, srcs, n, count, divisor);
    case dtype::bf16: return reduce_16<bfloat16, Op>(dst, srcs, n, count, divisor);
  }
}

template <op_kind Op>
void reduce_all_typed(void* const* dsts, int ndst, bool stream, const void* const* srcs, int n, std::size_t count,
                      dtype t, int divisor) {
  switch (t) {
    case dtype::f32: return reduce_native_all<float, Op>(dsts, ndst, stream, srcs, n, count, divisor);
    case dtype::f64: return reduce_native_all<double, Op>(dsts, ndst, stream, srcs, n, count, divisor);
    case dtype::i32: return reduce_native_all<std::int32_t, Op>(dsts, ndst, stream, srcs, n, count, divisor);
    case dtype::i64: return reduce_native_all<std::int64_t, Op>(dsts, ndst, stream, srcs, n, count, divisor);
    case dtype::u8: return reduce_native_all<std::uint8_t, Op>(dsts, ndst, stream, srcs, n, count, divisor);
    case dtype::f16:
    case dtype::bf16: break;  // reduce_all: reduce + copies
  }
}

}  // namespace detail

/// @brief Copies `bytes`; with `streaming`, large aligned spans are written with non-temporal
/// stores (no read-for-ownership, no cache pollution): for outputs bigger than the caches,
/// which nobody reads again soon. Callers fence (`stream_fence`) before publishing.
inline void copy(void* dst, const void* src, std::size_t bytes, bool streaming) {
#if defined(__SSE2__)
  if (streaming && bytes >= 4096) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    std::size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(dst, src, bytes);
}

/// @brief Orders earlier streaming stores before later stores (e.g. a flag).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

namespace detail {
inline void reduce_dispatch(void* dst, void* dst2, bool stream2, const void* const* srcs, int n, std::size_t count,
                            dtype t, op_kind op, int divisor, bool stream1 = false) {
  switch (op) {
    case op_kind::sum: return reduce_typed<op_kind::sum>(dst, dst2, stream2, srcs, n, count, t, divisor, stream1);
    case op_kind::prod: return reduce_typed<op_kind::prod>(dst, dst2, stream2, srcs, n, count, t, divisor, stream1);
    case op_kind::min: return reduce_typed<op_kind::min>(dst, dst2, stream2, srcs, n, count, t, divisor, stream1);
    case op_kind::max: return reduce_typed<op_kind::max>(dst, dst2, stream2, srcs, n, count, t, divisor, stream1);
    case op_kind::avg: return reduce_typed<op_kind::avg>(dst, dst2, stream2, srcs, n, count, t, divisor, stream1);
  }
}
}  // namespace detail

/// @brief dst = srcs[0] op ... op srcs[n-1] (elementwise, in this order); `avg` divides by `divisor`.
inline void reduce(void* dst, const void* const* srcs, int n, std::size_t count, dtype t, op_kind op, int divisor) {
  if (count == 0) return;
  if (n == 1 && op != op_kind::avg) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * size_of(t));
    return;
  }
  detail::reduce_dispatch(dst, nullptr, false, srcs, n, count, t, op, divisor);
}

/// @brief `reduce` into `dst` and the same values into `dst2` in the same pass: the two-shot
/// allreduce's slice goes to the shared staging buffer (for the peers) and to the caller's
/// output without reading it back. With `streaming`, `dst2` is written with non-temporal stores
/// where it is 16-byte aligned (callers fence, `stream_fence`, before publishing). 16-bit
/// formats reduce into `dst`, then copy. With `streaming_first` as well, `dst` is streamed too
/// where its alignment matches dst2's (outputs nobody reads before the call ends).
inline void reduce_copy(void* dst, void* dst2, bool streaming, const void* const* srcs, int n, std::size_t count,
                        dtype t, op_kind op, int divisor, bool streaming_first = false) {
  if (count == 0) return;
  if ((n == 1 && op != op_kind::avg) || t == dtype::f16 || t == dtype::bf16) {
    reduce(dst, srcs, n, count, t, op, divisor);
    copy(dst2, dst, count * size_of(t), streaming);
    return;
  }
  detail::reduce_dispatch(dst, dst2, streaming, srcs, n, count, t, op, divisor, streaming && streaming_first);
}

/// @brief `reduce` into every one of `dsts[0..ndst)` in one pass over the inputs: each result
/// vector is stored into every output (with `streaming`, non-temporal stores where the outputs
/// share one 16-byte alignment; callers fence, `stream_fence`, before publishing). The direct
/// zero-copy allreduce writes every rank's output this way. 16-bit formats reduce into `dsts[0]`,
/// then copy. Every output gets `reduce`'s bits.
inline void reduce_all(void* const* dsts, int ndst, bool streaming, const void* const* srcs, int n, std::size_t count,
                       dtype t, op_kind op, int divisor) {
  if (count == 0 || ndst <= 0) return;
  if ((n == 1 && op != op_kind::avg) || t == dtype::f16 || t == dtype::bf16) {
    reduce(dsts[0], srcs, n, count, t, op, divisor);
    for (int j = 1; j < ndst; ++j) copy(dsts[j], dsts[0], count * size_of(t), streaming);
    return;
  }
  switch (op) {
    case op_kind::sum: return detail::reduce_all_typed<op_kind::sum>(dsts, ndst, streaming, srcs, n, count, t, divisor);
    case op_kind::prod: return detail::reduce_all_typed<op_kind::prod>(dsts, ndst, streaming, srcs, n, count, t, divisor);
    case op_kind::min: return detail::reduce_all_typed<op_kind::min>(dsts, ndst, streaming, srcs, n, count, t, divisor);
    case op_kind::max: return detail::reduce_all_typed<op_kind::max>(dsts, ndst, streaming, srcs, n, count, t, divisor);
    case op_kind::avg: return detail::reduce_all_typed<op_kind::avg>(dsts, ndst, streaming, srcs, n, count, t, divisor);
  }
}

}  // namespace kernels
KFT_NAMESPACE_END
