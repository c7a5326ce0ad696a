// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/background.hpp
/// @brief Slow clean-up on threads of its own, so that a failed call can throw at its deadline.
///
/// Some clean-up after a failure takes seconds: `ncclCommAbort` waits for the communicator's
/// kernels and proxy threads to stop. Run where the failure is found, it delays the error it
/// follows by as much (a stalled NCCL collective with a 1 s deadline threw after ~8 s). Handed
/// to `background::run`, it runs on a thread of its own and the caller throws at once.
///
/// Process exit waits for jobs still running, each up to its own limit, so a job never races
/// the libraries' own teardown (the CUDA runtime's, say) while it is within that limit. A job
/// past it is named on stderr and left behind. `wait` lets a caller be sure that everything
/// handed over has ended (a test, or code that resets the device).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <kft/core/log.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace detail {

/// @brief The process's background clean-up jobs (one instance: `background::instance()`).
class background {
 public:
  /// @brief The process's instance, created on first use. It is never destroyed (a job left
  /// running past exit may still touch it); exit waits for its jobs instead (`at_exit`).
  static background& instance() {
    static background* const b = new background;
    static const at_exit waiter{b};
    return *b;
  }

  /// @brief Runs `job` on a thread of its own. `limit` bounds how long process exit waits for
  /// it. When no thread can be started, runs it here: the caller then waits, as it would have
  /// without this. Exceptions from `job` are caught and logged. Never throws.
  void run(std::string what, std::chrono::milliseconds limit, std::function<void()> job) noexcept {
    job_record* j = nullptr;
    try {
      std::lock_guard<std::mutex> lk(m_);
      collect_locked();
      jobs_.emplace_back();  // (the one step that may throw: `job` is still the caller's)
      j = &jobs_.back();
      j->what = std::move(what);
      j->limit = std::chrono::steady_clock::now() + limit;
      j->job = std::move(job);
      j->thread = std::thread([this, j] { finish(j); });
      return;
    } catch (...) {
    }
    if (j == nullptr) {  // no memory for the record: `job` was not moved from
      try {
        job();
      } catch (...) {
      }
      return;
    }
    // No thread: the job runs here.
    finish(j);
    std::lock_guard<std::mutex> lk(m_);
    collect_locked();
  }

  /// @brief How many jobs have not ended yet.
  std::size_t in_flight() const {
    std::lock_guard<std::mutex> lk(m_);
    return running_locked();
  }

  /// @brief Waits until every job handed over so far has ended, or `timeout` passed.
  /// @return true when none is left running
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(m_);
    const bool all = cv_.wait_for(lk, timeout, [this] { return running_locked() == 0; });
    collect_locked();
    return all;
  }

  /// @brief What exit does: waits for the jobs still running, each up to its limit, then names
  /// those left on stderr and lets them go. Returns how many were left.
  std::size_t settle_for_exit() noexcept {
    try {
      std::unique_lock<std::mutex> lk(m_);
      collect_locked();
      if (jobs_.empty()) return 0;
      auto last = jobs_.front().limit;
      for (const auto& j : jobs_) last = std::max(last, j.limit);
      cv_.wait_until(lk, last, [this] { return running_locked() == 0; });
      collect_locked();
      std::string names;
      for (auto& j : jobs_) {
        names += (names.empty() ? "" : "; ") + j.what;
        if (j.thread.joinable()) j.thread.detach();  // it ends on its own, or with the process
      }
      const std::size_t left = jobs_.size();
      if (left > 0) log::warn("kft", "exiting with clean-up still running past its limit, not waited for: " + names);
      return left;
    } catch (...) {
      return 0;
    }
  }

  background(const background&) = delete;
  background& operator=(const background&) = delete;

 private:
  background() = default;

  struct at_exit {
    background* b;
    ~at_exit() { (void)b->settle_for_exit(); }
  };

  struct job_record {
    std::string what;
    std::chrono::steady_clock::time_point limit;
    std::function<void()> job;
    std::thread thread{};
    bool done = false;
  };

  void finish(job_record* j) noexcept {
    try {
      j->job();
    } catch (const std::exception& e) {
      log::warn("kft", j->what + " failed: " + e.what());
    } catch (...) {
      log::warn("kft", j->what + " failed");
    }
    try {
      j->job = nullptr;  // what it held goes now, outside the lock (its destructors may be slow)
    } catch (...) {
    }
    std::lock_guard<std::mutex> lk(m_);
    j->done = true;
    cv_.notify_all();
  }

  std::size_t running_locked() const {
    std::size_t n = 0;
    for (const auto& j : jobs_) n += j.done ? 0 : 1;
    return n;
  }

  // Joins the threads of jobs that ended (each has at most its last few instructions left,
  // none of which reads its record) and drops their records.
  void collect_locked() {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      if (it->thread.joinable()) it->thread.join();
      it = jobs_.erase(it);
    }
  }

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::list<job_record> jobs_;  // a list: a running job keeps a pointer to its record
};

}  // namespace detail

/// @brief Waits until the clean-up that kft runs in the background after a failure has ended
/// (today: the `ncclCommAbort` of a communicator that failed or passed its deadline), or
/// `timeout` passed. Code that resets the device, or checks that a failed stream drained, calls
/// it first. @return true when none is left running
inline bool wait_for_background_cleanup(std::chrono::milliseconds timeout) {
  return detail::background::instance().wait(timeout);
}

/// @brief How many background clean-up jobs have not ended yet.
inline std::size_t background_cleanup_in_flight() { return detail::background::instance().in_flight(); }

KFT_NAMESPACE_END
