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
///
/// Nothing here reads the process environment. A config's timeouts default to constants
/// (`default_job_timeout`, `default_timeouts`); `job_timeout(env)` reads `KFT_TIMEOUT` from an
/// `environment` it is given, and the places that make a process group (`kft::init`,
/// `group::make_process_group` and the group makers, `rendezvous::connect_store`) apply it to
/// the configs they build (`apply_timeout`). A transport a program constructs itself takes its
/// config's timeout: the program applies the job's when it wants it.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>

#include <kft/core/environment.hpp>
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

/// @brief The job's timeout: `KFT_TIMEOUT` from `env`, or `default_job_timeout` when it is unset
/// or empty.
/// @throws config_error naming KFT_TIMEOUT and its value when it is malformed
inline std::chrono::milliseconds job_timeout(const environment& env) {
  const auto v = env.get("KFT_TIMEOUT");
  return v && !v->empty() ? detail::parse_duration("KFT_TIMEOUT", *v) : default_job_timeout;
}

/// @brief derived_timeouts::from(job_timeout(env)).
/// @throws config_error naming a malformed KFT_TIMEOUT
inline derived_timeouts timeouts(const environment& env) { return derived_timeouts::from(job_timeout(env)); }

/// @brief How a maker applies the job's timeouts to a config it builds: `setting` takes
/// `job.*which` where it still holds its constant default (`default_timeouts.*which`); a value
/// the program chose stays. (A program that sets exactly the default gets the job's.)
///
///     apply_timeout(cfg.timeout, t);                                   // the job's T
///     apply_timeout(cfg.report_grace, t, &derived_timeouts::report_grace);
constexpr void apply_timeout(std::chrono::milliseconds& setting, const derived_timeouts& job,
                             std::chrono::milliseconds derived_timeouts::*which = &derived_timeouts::job) noexcept {
  if (setting == default_timeouts.*which) setting = job.*which;
}

KFT_NAMESPACE_END
