// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/ops.hpp
/// @brief Reductions as function objects (`kft::ops::sum`, ...), recognised by every backend
/// through their `kind`.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief The reductions collectives support.
enum class op_kind : std::uint8_t { sum, prod, min, max, avg };

/// @brief "sum", "prod", ... (nccl-tests' redop column).
constexpr std::string_view name(op_kind o) {
  constexpr std::string_view names[] = {"sum", "prod", "min", "max", "avg"};
  return names[static_cast<int>(o)];
}

namespace ops {
/// @brief Sum. `avg` is a sum divided by the number of ranks (integer division for integers).
struct sum_t {
  static constexpr op_kind kind = op_kind::sum;
};
struct prod_t {
  static constexpr op_kind kind = op_kind::prod;
};
struct min_t {
  static constexpr op_kind kind = op_kind::min;
};
struct max_t {
  static constexpr op_kind kind = op_kind::max;
};
struct avg_t {
  static constexpr op_kind kind = op_kind::avg;
};
inline constexpr sum_t sum{};
inline constexpr prod_t prod{};
inline constexpr min_t min{};
inline constexpr max_t max{};
inline constexpr avg_t avg{};
}  // namespace ops

/// @brief Any of the `kft::ops` objects.
template <class Op>
concept reduction = requires { { Op::kind } -> std::convertible_to<op_kind>; };

KFT_NAMESPACE_END
