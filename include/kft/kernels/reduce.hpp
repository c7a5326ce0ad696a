/// @file kft/kernels/reduce.hpp
/// @brief The reduction inner loop, type-erased at the transport boundary.
///
/// `reduce(dst, srcs, n, count, dtype, op, divisor)` computes, for every element i,
/// `dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i]` in that order (so every rank that
/// reduces the same inputs gets bit-identical results), then divides by `divisor` for `avg`.
/// `dst` may be one of the sources. Loops work on 64-byte vectors (GCC/Clang vector
/// extensions, which become SSE/AVX/NEON instructions) with a scalar tail; f16 and bf16 are
/// widened to float, reduced, and rounded once.
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

// Built-in element types: vectors of 64 bytes.
template <class T, op_kind Op>
void reduce_native(void* dst_v, const void* const* srcs, int n, std::size_t count, int divisor) {
  constexpr std::size_t W = 64 / sizeof(T);
  typedef T vec __attribute__((vector_size(64)));
  auto* dst = static_cast<unsigned char*>(dst_v);
  std::size_t i = 0;
  for (; i + W <= count; i += W) {
    vec acc, x;
    std::memcpy(&acc, static_cast<const unsigned char*>(srcs[0]) + i * sizeof(T), sizeof acc);
    for (int k = 1; k < n; ++k) {
      std::memcpy(&x, static_cast<const unsigned char*>(srcs[k]) + i * sizeof(T), sizeof x);
      if constexpr (Op == op_kind::sum || Op == op_kind::avg) acc = acc + x;
      else if constexpr (Op == op_kind::prod) acc = acc * x;
      else if constexpr (Op == op_kind::min) acc = x < acc ? x : acc;
      else acc = acc < x ? x : acc;
    }
    if constexpr (Op == op_kind::avg) acc = acc / static_cast<T>(divisor);
    std::memcpy(dst + i * sizeof(T), &acc, sizeof acc);
  }
  for (; i < count; ++i) {
    T acc, x;
    std::memcpy(&acc, static_cast<const unsigned char*>(srcs[0]) + i * sizeof(T), sizeof(T));
    for (int k = 1; k < n; ++k) {
      std::memcpy(&x, static_cast<const unsigned char*>(srcs[k]) + i * sizeof(T), sizeof(T));
      acc = apply<T, Op>(acc, x);
    }
    if constexpr (Op == op_kind::avg) acc = static_cast<T>(acc / static_cast<T>(divisor));
    std::memcpy(dst + i * sizeof(T), &acc, sizeof(T));
  }
}

// Widening and narrowing of 16-bit floats in bulk. binary16 uses the compiler's _Float16 where it
// has one (hardware conversion instructions with F16C, otherwise libgcc's exact routines);
// bfloat16 is a shift.
template <class H>
inline void widen(float* out, const std::uint16_t* in, std::size_t m) {
#if defined(__FLT16_MAX__)
  if constexpr (std::is_same_v<H, half>) {
    _Float16 tmp[256];
    std::memcpy(tmp, in, m * 2);
    for (std::size_t j = 0; j < m; ++j) out[j] = static_cast<float>(tmp[j]);
    return;
  } else  // (an else, not a loop after a return: nvcc warns about unreachable code)
#endif
  {
    for (std::size_t j = 0; j < m; ++j) out[j] = H::to_float(in[j]);
  }
}
template <class H>
inline void narrow(std::uint16_t* out, const float* in, std::size_t m) {
#if defined(__FLT16_MAX__)
  if constexpr (std::is_same_v<H, half>) {
    _Float16 tmp[256];
    for (std::size_t j = 0; j < m; ++j) tmp[j] = static_cast<_Float16>(in[j]);
    std::memcpy(out, tmp, m * 2);
    return;
  } else
#endif
  {
    for (std::size_t j = 0; j < m; ++j) out[j] = H::from_float(in[j]);
  }
}

// 16-bit floats: widen a block to float, reduce, round once.
template <class H, op_kind Op>
void reduce_16(void* dst_v, const void* const* srcs, int n, std::size_t count, int divisor) {
  constexpr std::size_t B = 256;
  float acc[B], x[B];
  std::uint16_t raw[B];
  auto* dst = static_cast<std::uint16_t*>(dst_v);
  for (std::size_t i = 0; i < count; i += B) {
    const std::size_t m = std::min(B, count - i);
    std::memcpy(raw, static_cast<const std::uint16_t*>(srcs[0]) + i, m * 2);
    widen<H>(acc, raw, m);
    for (int k = 1; k < n; ++k) {
      std::memcpy(raw, static_cast<const std::uint16_t*>(srcs[k]) + i, m * 2);
      widen<H>(x, raw, m);
      for (std::size_t j = 0; j < m; ++j) acc[j] = apply<float, Op>(acc[j], x[j]);
    }
    if constexpr (Op == op_kind::avg)
      for (std::size_t j = 0; j < m; ++j) acc[j] /= static_cast<float>(divisor);
    narrow<H>(raw, acc, m);
    std::memcpy(dst + i, raw, m * 2);
  }
}

template <op_kind Op>
void reduce_typed(void* dst, const void* const* srcs, int n, std::size_t count, dtype t, int divisor) {
  switch (t) {
    case dtype::f32: return reduce_native<float, Op>(dst, srcs, n, count, divisor);
    case dtype::f64: return reduce_native<double, Op>(dst, srcs, n, count, divisor);
    case dtype::i32: return reduce_native<std::int32_t, Op>(dst, srcs, n, count, divisor);
    case dtype::i64: return reduce_native<std::int64_t, Op>(dst, srcs, n, count, divisor);
    case dtype::u8: return reduce_native<std::uint8_t, Op>(dst, srcs, n, count, divisor);
    case dtype::f16: return reduce_16<half, Op>(dst, srcs, n, count, divisor);
    case dtype::bf16: return reduce_16<bfloat16, Op>(dst, srcs, n, count, divisor);
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

/// @brief dst = srcs[0] op ... op srcs[n-1] (elementwise, in this order); `avg` divides by `divisor`.
inline void reduce(void* dst, const void* const* srcs, int n, std::size_t count, dtype t, op_kind op, int divisor) {
  if (count == 0) return;
  if (n == 1 && op != op_kind::avg) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * size_of(t));
    return;
  }
  switch (op) {
    case op_kind::sum: return detail::reduce_typed<op_kind::sum>(dst, srcs, n, count, t, divisor);
    case op_kind::prod: return detail::reduce_typed<op_kind::prod>(dst, srcs, n, count, t, divisor);
    case op_kind::min: return detail::reduce_typed<op_kind::min>(dst, srcs, n, count, t, divisor);
    case op_kind::max: return detail::reduce_typed<op_kind::max>(dst, srcs, n, count, t, divisor);
    case op_kind::avg: return detail::reduce_typed<op_kind::avg>(dst, srcs, n, count, t, divisor);
  }
}

}  // namespace kernels
KFT_NAMESPACE_END
