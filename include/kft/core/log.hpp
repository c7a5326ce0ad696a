// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/log.hpp
/// @brief One log line format for every kft tool and library message, and one verbosity switch.
///
/// A line reads `<who> <LEVEL>: <message>`, where `who` names the program and, where it helps,
/// the place in the job (`kftrun[node 1]`, `kft[rank 0]`, `kft-info`):
///
///     kftrun[node 0] INFO: rendezvous round 1: 2 nodes, 4 workers
///     kft[rank 0] INFO: joined as rank 0 of 4 (torchrun): shared memory: 1 node x 4 ranks
///     kftrun ERROR: --nnodes "0": must be at least 1
///
/// Levels, most to least severe: `error`, `warn`, `info`, `debug`. A line is written when its
/// level is at or above the threshold. The threshold comes from `KFT_LOG_LEVEL` (`error`, `warn`,
/// `info` or `debug`; default `info` in the tools, `warn` for library messages such as
/// `kft::init()`'s report); the code below `group/` never reads the environment, so the tools and
/// `kft::init()` apply it through `set_threshold(threshold_from(env, default))`.
#pragma once

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace log {

/// @brief How severe a line is; a smaller value is more severe.
enum class level : int { error = 0, warn = 1, info = 2, debug = 3 };

/// @brief The level's name as `KFT_LOG_LEVEL` spells it.
constexpr std::string_view name(level l) noexcept {
  switch (l) {
    case level::error: return "error";
    case level::warn: return "warn";
    case level::info: return "info";
    case level::debug: return "debug";
  }
  return "?";
}

/// @brief The level's tag in a line (`ERROR`, `WARN`, `INFO`, `DEBUG`).
constexpr std::string_view tag(level l) noexcept {
  switch (l) {
    case level::error: return "ERROR";
    case level::warn: return "WARN";
    case level::info: return "INFO";
    case level::debug: return "DEBUG";
  }
  return "?";
}

/// @brief `error`, `warn` (or `warning`), `info`, `debug`, in any case; nullopt otherwise.
inline std::optional<level> parse(std::string_view s) {
  std::string t(s);
  for (char& c : t) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (t == "error") return level::error;
  if (t == "warn" || t == "warning") return level::warn;
  if (t == "info") return level::info;
  if (t == "debug") return level::debug;
  return std::nullopt;
}

namespace detail {
inline std::atomic<int>& threshold_value() noexcept {
  static std::atomic<int> v{static_cast<int>(level::warn)};
  return v;
}
}  // namespace detail

/// @brief Lines of this level and more severe ones are written (process-wide).
inline void set_threshold(level l) noexcept { detail::threshold_value().store(static_cast<int>(l)); }
inline level threshold() noexcept { return static_cast<level>(detail::threshold_value().load()); }
inline bool enabled(level l) noexcept { return static_cast<int>(l) <= detail::threshold_value().load(); }

/// @brief The threshold `KFT_LOG_LEVEL` asks for, or `fallback` when it is unset or empty.
/// @throws config_error naming `KFT_LOG_LEVEL` and its value when it is not a level
inline level threshold_from(const environment& env, level fallback) {
  const auto v = env.get("KFT_LOG_LEVEL");
  if (!v || v->empty()) return fallback;
  if (auto l = parse(*v)) return *l;
  throw config_error("KFT_LOG_LEVEL", *v, "is not a log level (use error, warn, info or debug)",
                     error_site::of("log"));
}

/// @brief The line as written: `<who> <LEVEL>: <message>` and a newline.
inline std::string format(level l, std::string_view who, std::string_view message) {
  std::string s;
  s.reserve(who.size() + message.size() + 10);
  s.append(who).append(" ").append(tag(l)).append(": ").append(message);
  if (s.empty() || s.back() != '\n') s.push_back('\n');
  return s;
}

/// @brief Writes one line to standard error when `l` is enabled (one write, so lines of
/// concurrent processes do not interleave mid-line).
inline void write(level l, std::string_view who, std::string_view message) {
  if (!enabled(l)) return;
  const std::string s = format(l, who, message);
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

inline void error(std::string_view who, std::string_view m) { write(level::error, who, m); }
inline void warn(std::string_view who, std::string_view m) { write(level::warn, who, m); }
inline void info(std::string_view who, std::string_view m) { write(level::info, who, m); }
inline void debug(std::string_view who, std::string_view m) { write(level::debug, who, m); }

}  // namespace log
KFT_NAMESPACE_END
