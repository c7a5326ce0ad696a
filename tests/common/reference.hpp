// SPDX-License-Identifier: Apache-2.0
// The one reference of kft's collective tests: inputs, expected results, element access through
// a dtype, and the tolerance each dtype/op pair gets (conformance suite, MPI, hierarchical and
// NCCL tests).
//
// Element i of rank r is a small integer, so every sum, product, min and max is exact in every
// dtype (f16, bf16 and u8 included) for the rank counts the tests use; u8 gets the pattern
// shifted to be non-negative. Only an average of floating-point values rounds: once, when the
// sum is divided (or, on NCCL, when inputs are pre-multiplied by 1/n).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <kft/core/dtype.hpp>
#include <kft/core/hash.hpp>
#include <kft/core/ops.hpp>

namespace kft_test {

inline double input(int r, std::size_t i, kft::op_kind op, kft::dtype t) {
  const auto ri = static_cast<std::size_t>(r);
  if (op == kft::op_kind::prod) return (ri + i) % 3 == 0 ? 2.0 : 1.0;
  const auto v = static_cast<double>((ri * 7 + i * 3) % 11);
  return t == kft::dtype::u8 ? v : v - 4.0;
}

// The reduction over p ranks of element i; avg truncates toward zero for integer dtypes.
inline double expected(int p, std::size_t i, kft::op_kind op, kft::dtype t) {
  double acc = input(0, i, op, t);
  for (int r = 1; r < p; ++r) {
    const double x = input(r, i, op, t);
    switch (op) {
      case kft::op_kind::prod: acc *= x; break;
      case kft::op_kind::min: acc = std::min(acc, x); break;
      case kft::op_kind::max: acc = std::max(acc, x); break;
      default: acc += x;
    }
  }
  if (op == kft::op_kind::avg) {
    const bool integer = t == kft::dtype::i32 || t == kft::dtype::i64 || t == kft::dtype::u8;
    acc = integer ? std::trunc(acc / p) : acc / p;
  }
  return acc;
}

// Element i of a buffer of dtype t, as a double (f16/bf16 widened exactly).
inline double get(kft::dtype t, const void* buf, std::size_t i) {
  switch (t) {
    case kft::dtype::f32: return static_cast<const float*>(buf)[i];
    case kft::dtype::f64: return static_cast<const double*>(buf)[i];
    case kft::dtype::f16: return static_cast<float>(static_cast<const kft::half*>(buf)[i]);
    case kft::dtype::bf16: return static_cast<float>(static_cast<const kft::bfloat16*>(buf)[i]);
    case kft::dtype::i32: return static_cast<const std::int32_t*>(buf)[i];
    case kft::dtype::i64: return static_cast<double>(static_cast<const std::int64_t*>(buf)[i]);
    case kft::dtype::u8: return static_cast<const std::uint8_t*>(buf)[i];
  }
  return 0;
}

// Stores v (a value the dtype holds exactly, or rounds once) as element i.
inline void put(kft::dtype t, void* buf, std::size_t i, double v) {
  switch (t) {
    case kft::dtype::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case kft::dtype::f64: static_cast<double*>(buf)[i] = v; break;
    case kft::dtype::f16: static_cast<kft::half*>(buf)[i] = kft::half(static_cast<float>(v)); break;
    case kft::dtype::bf16: static_cast<kft::bfloat16*>(buf)[i] = kft::bfloat16(static_cast<float>(v)); break;
    case kft::dtype::i32: static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v); break;
    case kft::dtype::i64: static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v); break;
    case kft::dtype::u8: static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v); break;
  }
}

// How far a result may be from the reference: exact, except a floating-point average, which
// rounds once on kft's CPU paths (the sum is exact, then one division): half an ulp of the
// result, bounded here by one ulp of max(|want|, 1) (inputs are integers). `roundings` widens
// it for a backend that rounds more often (NCCL's PreMulSum scales each input, then adds in
// the element type: about p + 1 roundings of values up to the inputs' magnitude, 6).
inline double ulp_of(kft::dtype t) {
  switch (t) {
    case kft::dtype::f16: return 0x1p-10;  // 11 significant bits
    case kft::dtype::bf16: return 0x1p-7;  // 8 significant bits
    case kft::dtype::f32: return 0x1p-23;
    case kft::dtype::f64: return 0x1p-52;
    default: return 0.0;
  }
}

inline bool close_enough(double got, double want, kft::dtype t, kft::op_kind op, int roundings = 1) {
  if (op != kft::op_kind::avg || ulp_of(t) == 0.0) return got == want;
  const double scale = roundings > 1 ? 6.0 : std::max(std::fabs(want), 1.0);
  return std::fabs(got - want) <= roundings * ulp_of(t) * scale;
}

// FNV-1a over bytes: the ranks compare their outputs' hashes to check bit-identical results.
inline std::uint64_t bits_hash(const void* data, std::size_t bytes) {
  return kft::detail::fnv1a(std::string_view(static_cast<const char*>(data), bytes));
}

}  // namespace kft_test
