// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/backoff.hpp
/// @brief Waiting politely: spin briefly, then yield, then sleep with growing pauses.
///
/// Tests run more ranks than cores, so a wait that only spins starves the very process it
/// waits for. Every polling wait in kft goes through `backoff`.
#pragma once

#include <chrono>
#include <thread>

#include <kft/core/namespace.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KFT_DETAIL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KFT_DETAIL_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define KFT_DETAIL_CPU_RELAX() ((void)0)
#endif

KFT_NAMESPACE_BEGIN

/// @brief One waiter's escalating pause: `pause()` between two polls of a condition.
///
/// The default suits a waiter whose peers run on other cores: poll often, then spin with
/// longer pauses, then yield, then sleep. `backoff::oversubscribed()` suits more waiters than
/// cores: the peer a waiter needs may be waiting for this very core, so after a few polls the
/// waiter yields (a yield hands the core to a runnable peer at once; a sleep costs a timer
/// tick), and sleeps only when yielding for a while has not helped (the peers are computing).
class backoff {
 public:
  /// @param max_sleep the longest single sleep once spinning and yielding are exhausted
  explicit backoff(std::chrono::microseconds max_sleep = std::chrono::milliseconds(20))
      : backoff(max_sleep, 256, 64, 64) {}

  /// @brief The policy for more waiting threads than online CPUs.
  static backoff oversubscribed(std::chrono::microseconds max_sleep = std::chrono::milliseconds(20)) {
    return backoff(max_sleep, 16, 0, 4096);
  }

  void pause() {
    if (step_ < fast_spins_) {
      KFT_DETAIL_CPU_RELAX();  // poll often at first: a flag set by a running peer shows up fast
    } else if (step_ < fast_spins_ + slow_spins_) {
      for (int i = 0; i < 16; ++i) KFT_DETAIL_CPU_RELAX();
    } else if (step_ < fast_spins_ + slow_spins_ + yields_) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep_);
      sleep_ = sleep_ * 2 > max_sleep_ ? max_sleep_ : sleep_ * 2;
    }
    ++step_;
  }
  /// @brief True when the next pause() would sleep: a waiter that can be woken (futex) sleeps
  /// `sleep_time()` itself instead, then calls `slept()`.
  bool sleeps_next() const noexcept { return step_ >= fast_spins_ + slow_spins_ + yields_; }
  std::chrono::microseconds sleep_time() const noexcept { return sleep_; }
  void slept() noexcept {
    sleep_ = sleep_ * 2 > max_sleep_ ? max_sleep_ : sleep_ * 2;
    ++step_;
  }
  void reset() {
    step_ = 0;
    sleep_ = std::chrono::microseconds(50);
  }

 private:
  backoff(std::chrono::microseconds max_sleep, int fast_spins, int slow_spins, int yields)
      : fast_spins_(fast_spins), slow_spins_(slow_spins), yields_(yields), max_sleep_(max_sleep) {}

  int fast_spins_, slow_spins_, yields_;
  int step_ = 0;
  std::chrono::microseconds sleep_{50};
  std::chrono::microseconds max_sleep_;
};

KFT_NAMESPACE_END
