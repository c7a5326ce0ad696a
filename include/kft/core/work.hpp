// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/work.hpp
/// @brief The handle of an asynchronous operation.
#pragma once

#include <chrono>
#include <future>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

/// @brief A running asynchronous operation. Move-only; `wait()` rethrows its error.
///
/// Destroying a handle does not cancel the operation; the communicator still runs it in order.
class [[nodiscard]] work {
 public:
  work() = default;
  explicit work(std::future<void> f) : f_(std::move(f)) {}
  work(work&&) noexcept = default;
  work& operator=(work&&) noexcept = default;
  work(const work&) = delete;
  work& operator=(const work&) = delete;

  /// @brief Blocks until done; rethrows the operation's kft::error.
  void wait() {
    if (!f_.valid()) throw usage_error("wait() on an empty or already waited work handle", error_site::of("work"));
    f_.get();
  }
  /// @brief True when done (wait() then returns at once).
  bool test() const { return !f_.valid() || f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  /// @brief Waits up to `d`; true when done.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    return !f_.valid() || f_.wait_for(d) == std::future_status::ready;
  }

 private:
  std::future<void> f_;
};

KFT_NAMESPACE_END
