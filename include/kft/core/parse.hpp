// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/parse.hpp
/// @brief Strict parsing of the integers and lists launchers put in the environment.
///
/// Launcher variables are decimal integers with nothing around them. Anything else
/// (`"abc"`, `" 3"`, `"+3"`, `"3x"`, `"99999999999"`) is a `config_error` that names the
/// variable and the value, never a silent 0 as atoi() would give.
#pragma once

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

namespace detail {

inline std::string context_suffix(std::string_view context) {
  return context.empty() ? std::string() : " (" + std::string(context) + ")";
}

/// Parses all of `text` as a decimal integer in [lo, hi]; throws config_error naming `what`.
inline std::int64_t parse_integer(std::string_view what, std::string_view text, std::int64_t lo,
                                  std::int64_t hi, std::string_view context) {
  auto fail = [&](const std::string& why) -> config_error {
    return config_error(std::string(what), std::string(text), why + context_suffix(context));
  };
  if (text.empty()) throw fail("is empty; expected an integer");
  std::int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) throw fail("is out of range");
  if (ec != std::errc() || ptr != last) throw fail("is not an integer");
  if (v < lo) {
    if (lo == 0) throw fail("is negative; expected 0 or more");
    throw fail("is below the minimum " + std::to_string(lo));
  }
  if (v > hi) throw fail("is above the maximum " + std::to_string(hi));
  return v;
}

/// Splits on `sep`, keeping empty pieces (callers reject them with context).
inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

}  // namespace detail

/// @brief Reads an optional integer variable in [lo, hi]; nullopt when unset.
/// @throws config_error when set but not a decimal integer in range.
inline std::optional<int> env_int(const environment& env, std::string_view name, int lo = 0,
                                  int hi = std::numeric_limits<int>::max(),
                                  std::string_view context = {}) {
  auto v = env.get(name);
  if (!v) return std::nullopt;
  return static_cast<int>(detail::parse_integer(name, *v, lo, hi, context));
}

/// @brief Reads a required integer variable in [lo, hi].
/// @throws config_error when unset, or set but malformed.
inline int env_int_required(const environment& env, std::string_view name, int lo = 0,
                            int hi = std::numeric_limits<int>::max(),
                            std::string_view context = {}) {
  auto v = env_int(env, name, lo, hi, context);
  if (!v)
    throw config_error(std::string(name), "", "is not set but is required" +
                                                  detail::context_suffix(context));
  return *v;
}

KFT_NAMESPACE_END
