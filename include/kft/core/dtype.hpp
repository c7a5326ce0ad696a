// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/dtype.hpp
/// @brief Element types kft moves and reduces, and the one trait that maps C++ types to them.
///
/// `kft::half` (IEEE binary16) and `kft::bfloat16` are 16-bit storage types; reductions on
/// them accumulate in float. Everything else maps to a built-in type.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief The element types of collectives.
enum class dtype : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

/// @brief Short name, as in messages: "f32", "bf16", ...
constexpr std::string_view name(dtype t) {
  constexpr std::string_view names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  return names[static_cast<int>(t)];
}
/// @brief The name nccl-tests prints in its "type" column.
constexpr std::string_view nccl_name(dtype t) {
  constexpr std::string_view names[] = {"float", "double", "half", "bfloat16", "int32", "int64", "uint8"};
  return names[static_cast<int>(t)];
}
/// @brief Bytes per element.
constexpr std::size_t size_of(dtype t) {
  constexpr std::size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  return sizes[static_cast<int>(t)];
}

/// @brief IEEE 754 binary16, stored; converts to and from float (round to nearest even; every NaN
/// becomes 0x7e00, so results never depend on which NaN an operation happened to return).
struct half {
  std::uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    std::uint32_t out;
    if (exp == 0x1f) {
      out = sign | 0x7f800000u | (mant << 13);  // inf / nan
    } else if (exp != 0) {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | ((112u - static_cast<std::uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(out);
  }
  static std::uint16_t from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return 0x7e00u;  // every NaN: the one quiet NaN (see the struct)
    if (absx == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (absx < 0x38800000u) {  // subnormal or zero in half
      if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);
      const std::uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
      // In units of 2^-24: mant * 2^(e - 150) / 2^-24 = mant >> (126 - e), with 14 <= 126 - e <= 24.
      const int shift = 126 - static_cast<int>(absx >> 23);
      std::uint32_t r = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
      return static_cast<std::uint16_t>(sign | r);
    }
    std::uint32_t r = ((absx - 0x38000000u) >> 13);
    const std::uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
};

/// @brief bfloat16 (the top half of a float), stored; round to nearest even; every NaN becomes 0x7fc0.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static float to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
  static std::uint16_t from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // every NaN: the one quiet NaN (see half)
    return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
};

namespace detail {
template <class T>
inline constexpr bool always_false = false;
}

/// @brief The dtype of a C++ element type; anything else is a compile-time error.
template <class T>
struct dtype_of {
  static_assert(detail::always_false<T>,
                "kft: unsupported element type. Collectives take float, double, kft::half, kft::bfloat16, "
                "std::int32_t, std::int64_t or std::uint8_t.");
};
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<half> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <class T>
struct dtype_of<const T> : dtype_of<T> {};

template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

KFT_NAMESPACE_END
