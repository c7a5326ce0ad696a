// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/deadline.hpp
/// @brief A point in time a wait must not pass, and the one polling loop kft waits with.
///
///     const auto d = kft::deadline::after(timeout);
///     if (!kft::poll_until([&] { return flag.load(); }, d)) throw kft::timeout_error(...);
///
/// `poll_until` checks the condition, pauses with a `backoff` (spin, yield, sleep: more ranks
/// than cores must not livelock), and reads the clock only every few polls, so a fast wait
/// costs no clock reads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include <kft/core/backoff.hpp>

KFT_NAMESPACE_BEGIN

/// @brief A steady-clock deadline; `never()` has none.
class deadline {
 public:
  using clock = std::chrono::steady_clock;

  static deadline after(std::chrono::milliseconds d) { return deadline(clock::now() + d); }
  static deadline at(clock::time_point t) { return deadline(t); }
  static deadline never() { return deadline(clock::time_point::max()); }

  bool passed() const { return when_ != clock::time_point::max() && clock::now() >= when_; }
  /// @brief Time left (zero once passed; a very long time for `never()`).
  std::chrono::milliseconds left() const {
    if (when_ == clock::time_point::max()) return std::chrono::hours(24 * 365);
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(when_ - clock::now()));
  }
  clock::time_point when() const noexcept { return when_; }

 private:
  explicit deadline(clock::time_point t) : when_(t) {}
  clock::time_point when_;
};

/// @brief Polls `ready()` until it returns true (then true) or the deadline passes (then false).
/// The clock is read every `clock_every` polls. `ready` may throw; that ends the wait.
template <class Ready>
bool poll_until(Ready&& ready, const deadline& d, backoff b = backoff(), std::uint32_t clock_every = 64) {
  for (std::uint32_t spin = 1;; ++spin) {
    if (ready()) return true;
    if (spin % clock_every == 0 && d.passed()) return ready();  // one last look at the deadline
    b.pause();
  }
}

KFT_NAMESPACE_END
