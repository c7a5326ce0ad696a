// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/timeout.hpp
/// @brief kft's one timeout setting, `KFT_TIMEOUT`, and every default deadline derived from it.
///
/// One number answers "how long may anything wait before it is a failure?". Each default
/// below derives from it (docs/reliability.md has the table); an explicit option or per-call
/// `options::timeout` still wins. kftrun's `--timeout` sets it for the launcher and passes it
/// to every worker.
///
///     KFT_TIMEOUT=120        seconds
///     KFT_TIMEOUT=90s | 2m | 1500ms | 1.5s
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

namespace detail {

/// "120", "90s", "2m", "1500ms", "1.5s" -> milliseconds in [1 ms, 30 days]. Throws config_error
/// naming `what` otherwise.
inline std::chrono::milliseconds parse_duration(std::string_view what, std::string_view text) {
  auto fail = [&](const std::string& why) {
    return config_error(std::string(what), std::string(text), why, error_site::of("timeout"));
  };
  std::string_view number = text, unit = "s";
  const auto digits_end = text.find_first_not_of("0123456789.");
  if (digits_end != std::string_view::npos) {
    number = text.substr(0, digits_end);
    unit = text.substr(digits_end);
  }
  double scale = 0;
  if (unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m" || unit == "min") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else throw fail("is not a duration (a number of seconds, or with a unit: 90s, 2m, 1500ms)");
  double v = 0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
  if (number.empty() || ec != std::errc() || ptr != number.data() + number.size())
    throw fail("is not a duration (a number of seconds, or with a unit: 90s, 2m, 1500ms)");
  const double ms = v * scale;
  if (!(ms >= 1) || ms > 30.0 * 86'400'000) throw fail("is out of range (1 ms to 30 days)");
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

}  // namespace detail

/// @brief The default of KFT_TIMEOUT: 5 minutes, long enough for a slow first collective
/// (a cold page cache, a large model's first broadcast) and short enough that a hang is noticed.
inline constexpr std::chrono::milliseconds default_job_timeout{300'000};

namespace detail {
struct job_timeout_setting {
  std::chrono::milliseconds value{default_job_timeout};
  std::string bad;  // a malformed KFT_TIMEOUT, as set
  job_timeout_setting() {
    const char* v = std::getenv("KFT_TIMEOUT");
    if (v == nullptr || *v == '\0') return;
    try {
      value = parse_duration("KFT_TIMEOUT", v);
    } catch (const config_error&) {
      bad = v;
    }
  }
  static const job_timeout_setting& get() {
    static const job_timeout_setting s;
    return s;
  }
};
}  // namespace detail

/// @brief KFT_TIMEOUT from the process environment (read once), or the default. Every
/// default deadline is initialised from it, so it does not throw: a malformed value is
/// reported by `discover()` (which every program calls first), `checked_job_timeout()`,
/// kftrun and kft-info, and is otherwise the default.
inline std::chrono::milliseconds job_timeout() noexcept {
  try {
    return detail::job_timeout_setting::get().value;
  } catch (...) {  // allocation failure reading the environment: the default
    return default_job_timeout;
  }
}

/// @brief `job_timeout()`, or a config_error naming a malformed KFT_TIMEOUT.
inline std::chrono::milliseconds checked_job_timeout() {
  const auto& s = detail::job_timeout_setting::get();
  if (!s.bad.empty()) (void)detail::parse_duration("KFT_TIMEOUT", s.bad);  // throws, naming it
  return s.value;
}

/// @brief The defaults every wait takes from the job timeout T (docs/reliability.md).
struct derived_timeouts {
  std::chrono::milliseconds job;            ///< T: collectives, set-up, rendezvous, store connect
  std::chrono::milliseconds store_request;  ///< one store request that is not a wait: min(T, 30 s)
  std::chrono::milliseconds heartbeat;      ///< kftrun agents: T / 60 within [2 s, 30 s] (5 s at T = 300 s)
  std::chrono::milliseconds report_grace;   ///< after a failure, waiting for the peers' reports: min(T, 2 s)
  std::chrono::milliseconds teardown;       ///< destroying a communicator: min(T, 10 s)

  static constexpr derived_timeouts from(std::chrono::milliseconds t) noexcept {
    using namespace std::chrono_literals;
    return {t, std::min<std::chrono::milliseconds>(t, 30s), std::clamp<std::chrono::milliseconds>(t / 60, 2s, 30s),
            std::min<std::chrono::milliseconds>(t, 2s), std::min<std::chrono::milliseconds>(t, 10s)};
  }
};

/// @brief The derived defaults at the default job timeout: what a config holds until the
/// process group (or its maker) applies the job's timeout.
inline constexpr derived_timeouts default_timeouts = derived_timeouts::from(default_job_timeout);

/// @brief derived_timeouts::from(job_timeout()).
inline derived_timeouts timeouts() noexcept { return derived_timeouts::from(job_timeout()); }

KFT_NAMESPACE_END
