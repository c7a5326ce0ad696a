// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/hex.hpp
/// @brief Bytes as lowercase hex and back: how kft puts binary values (tokens, NCCL unique ids,
/// CUDA IPC handles, store keys of the file store) where only text is safe.
///
///     std::string t = kft::detail::to_hex(&handle, sizeof handle);             // "3f00a1..."
///     kft::detail::from_hex(t, &handle, sizeof handle, "rank 1's handle", site);  // or throws
///
/// Two digits a byte, in memory order, lowercase only: what kft writes is the only form it
/// reads (an upper-case digit is bad input, as it always was).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace detail {

/// The sixteen digits, lowercase.
inline constexpr char hex_digits[] = "0123456789abcdef";

/// @brief The value of a lowercase hex digit, or -1 for any other character.
constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/// @brief The lowercase hex of `n` bytes at `data` (2 x n characters).
inline std::string to_hex(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += hex_digits[p[i] >> 4];
    out += hex_digits[p[i] & 15];
  }
  return out;
}

/// @brief The lowercase hex of arbitrary bytes.
inline std::string to_hex(std::string_view bytes) { return to_hex(bytes.data(), bytes.size()); }

/// @brief Reads `text`, the lowercase hex of exactly `n` bytes, into `out[0..n)`.
/// @return empty when it is; otherwise what is wrong with it ("31 characters, want 32",
///   "character 4 is 'X'"), and `out` holds an unspecified part of the bytes. For callers that
///   word their own error; `from_hex` below throws one.
[[nodiscard]] inline std::string read_hex(std::string_view text, void* out, std::size_t n) {
  if (text.size() != 2 * n)
    return std::to_string(text.size()) + " characters, want " + std::to_string(2 * n);
  auto* p = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      const std::size_t at = hi < 0 ? 2 * i : 2 * i + 1;
      return "character " + std::to_string(at) + " is '" + excerpt(text.substr(at, 1)) + "'";
    }
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return {};
}

/// @brief `read_hex`, or an `E` (a kft::error: transport_error for text that came from a
/// store or a file) at `site` naming `what` and the text (made printable and cut to 80 bytes):
/// `<what> "12x4" is not the lowercase hex of 2 bytes (character 2 is 'x')`.
template <class E = transport_error>
void from_hex(std::string_view text, void* out, std::size_t n, std::string_view what, const error_site& site) {
  if (std::string why = read_hex(text, out, n); !why.empty())
    throw E(std::string(what) + " \"" + excerpt(text, 80) + "\" is not the lowercase hex of " + std::to_string(n) +
                " bytes (" + why + ")",
            site);
}

}  // namespace detail
KFT_NAMESPACE_END
