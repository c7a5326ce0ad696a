// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/futex.hpp
/// @brief Sleeping on a 32-bit word until another thread or process changes it (Linux futex,
/// shared: works on a word inside a shared-memory segment mapped by several processes).
///
///     const auto seen = word.load();
///     if (!ready()) kft::futex_wait(word, seen, std::chrono::microseconds(500));   // bounded
///     ... elsewhere: publish(); word.fetch_add(1); kft::futex_wake_all(word);
///
/// A wait always has a bound (a lost wake-up costs at most that), and elsewhere than Linux it
/// is a plain sleep of the bound.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word is a plain 32-bit integer");

/// @brief Sleeps while `word == expected`, at most `bound` (or until a wake, or a signal).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::microseconds bound) {
#if defined(__linux__)
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(bound.count() / 1000000);
  ts.tv_nsec = static_cast<long>((bound.count() % 1000000) * 1000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  if (word.load(std::memory_order_acquire) == expected) std::this_thread::sleep_for(bound);
#endif
}

/// @brief Wakes every thread (of any process) sleeping in futex_wait on `word`.
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

KFT_NAMESPACE_END
