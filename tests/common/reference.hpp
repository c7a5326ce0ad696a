// Inputs and expected results for collective tests whose reference is computed locally.
// Element i of rank r is a small integer, so every sum, product, min and max is exact in every
// dtype (f16, bf16 and u8 included); u8 gets the pattern shifted to be non-negative.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <kft/core/dtype.hpp>
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

}  // namespace kft_test
