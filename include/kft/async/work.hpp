// SPDX-License-Identifier: Apache-2.0
/// @file kft/async/work.hpp
/// @brief `kft::async::work`: the one handle of an asynchronous operation, returned by every
/// communicator (shm, mpi, nccl), every process group and the DDP reducer.
///
///     kft::async::work w = comm.allreduce_async(in, out, n, kft::dtype::f32, kft::op_kind::sum);
///     ...                      // compute while it runs
///     w.wait();                // rethrows the operation's kft::error (rank, operation, sequence)
///
/// Rules, the same for every backend:
///  - `wait()` returns when the operation is done and rethrows its error (every call does);
///    `test()` says whether it is done without blocking; `wait_for(d)` waits at most `d`.
///  - Every wait has a deadline: the operation's timeout, counted from when it starts running
///    (an operation queued behind others waits for them, each bounded by its own deadline),
///    plus a second of grace. Past it, `wait()` throws `timeout_error` (the backend may also
///    stop the communicator, as MPI and NCCL must: they cannot cancel a collective).
///  - Destroying (or assigning over) an unfinished handle waits for it, up to the same
///    deadline, and never throws: the caller's buffers are never written after the handle is
///    gone, unless the operation outlives its own deadline (then the communicator is broken).
///  - `sequence()` is the operation's number on its communicator; `op()` its collective.
///
/// A backend makes a handle from a `work_state` that it completes (an engine's worker, as
/// `engine.hpp` does), or that the waiting thread drives through `progress` (MPI_Test,
/// cudaEventQuery).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <kft/core/backoff.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/error.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/core/timeout.hpp>

KFT_NAMESPACE_BEGIN
namespace async {

using clock = std::chrono::steady_clock;

/// @brief The shared state of one operation (the backend's side of a `work`).
struct work_state {
  collective op = collective::none;
  std::uint64_t seq = 0;
  std::chrono::milliseconds timeout{default_job_timeout};  ///< the operation's own deadline (its backend sets it)
  std::string name;  ///< for messages, e.g. "allreduce (f32 x 1048576)"; empty = name(op)

  /// Drives completion from the waiting thread: returns true once the operation is done and
  /// throws its error if it failed. Empty when something else completes the state.
  std::function<bool()> progress;
  /// Called once when a wait passes the deadline: stops what it must and returns the error
  /// the handle then holds. Empty: a plain timeout_error.
  std::function<std::exception_ptr()> on_timeout;
  /// Set by the engine that queued it: `help(helper, this)` runs the operation (and whatever is
  /// queued before it) on the waiting thread when the engine's worker is not running anything,
  /// so a waiter does not pay the worker's wake-up; a no-op otherwise.
  void (*help)(void* helper, work_state* self) = nullptr;
  void* helper = nullptr;

  /// @brief Marks the operation done (with its error, if any) and wakes every waiter.
  void complete(std::exception_ptr e = nullptr) noexcept {
    {
      std::lock_guard lock(mu_);
      if (done_.load(std::memory_order_relaxed)) return;
      const bool ok = !e;
      error_ = std::move(e);
      done_ns_.store(now_ns(), std::memory_order_relaxed);
      traced().finish(started_ns_.load(std::memory_order_relaxed), done_ns_.load(std::memory_order_relaxed), ok);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  /// @brief When the operation started running / completed (steady clock, ns; 0 = not yet).
  std::int64_t started_ns() const noexcept { return started_ns_.load(std::memory_order_acquire); }
  std::int64_t done_ns() const noexcept { return done_ns_.load(std::memory_order_acquire); }
  /// @brief Marks the operation as running: its deadline counts from now.
  void start() noexcept {
    started_ns_.store(now_ns(), std::memory_order_release);
    const std::int64_t t = started_ns_.load(std::memory_order_relaxed);
    const trace::slot_ref r = traced();  // (the flight recorder's entry, when one is attached)
    if (r.e && r.e->id.load(std::memory_order_relaxed) == r.id) {
      r.e->start_ns.store(t, std::memory_order_relaxed);
      r.e->st.store(trace::state::running, std::memory_order_relaxed);
    }
  }
  /// @brief The flight recorder's entry of this operation: written when it starts and when it
  /// completes (at once, if it already has).
  void attach_trace(const trace::slot_ref& r) noexcept {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed)) {
      r.finish(started_ns_.load(std::memory_order_relaxed), done_ns_.load(std::memory_order_relaxed), !error_);
      return;
    }
    if (const std::int64_t t = started_ns_.load(std::memory_order_relaxed); t && r.e) {
      r.e->start_ns.store(t, std::memory_order_relaxed);
      r.e->st.store(trace::state::running, std::memory_order_relaxed);
    }
    trace_id_.store(r.id, std::memory_order_relaxed);
    trace_entry_.store(r.e, std::memory_order_release);
  }
  /// @brief Makes a finished state fresh for another operation (an engine recycling states
  /// that no handle holds any more; keeps the name's capacity).
  void reset() noexcept {
    op = collective::none;
    seq = 0;
    name.clear();
    progress = nullptr;
    on_timeout = nullptr;
    help = nullptr;
    helper = nullptr;
    error_ = nullptr;
    started_ns_.store(0, std::memory_order_relaxed);
    done_ns_.store(0, std::memory_order_relaxed);
    done_.store(false, std::memory_order_relaxed);
    trace_entry_.store(nullptr, std::memory_order_relaxed);
    trace_id_.store(0, std::memory_order_relaxed);
  }

  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() const {
    std::lock_guard lock(mu_);
    return error_;
  }

  /// @brief One look: runs `progress` if there is one; true once done.
  bool poll() {
    if (done()) return true;
    if (progress) {
      try {
        if (progress()) complete();
      } catch (...) {
        complete(std::current_exception());
      }
    }
    return done();
  }

  /// @brief Waits until done or until `limit` (if earlier than the operation's own deadline);
  /// true when done. At the operation's deadline the state completes with the timeout error.
  bool wait_until(clock::time_point limit) {
    if (help && !done() && started_ns() == 0) help(helper, this);
    backoff b = backoff::oversubscribed(std::chrono::microseconds(500));
    for (std::uint32_t spin = 1;; ++spin) {
      if (poll()) return true;
      if (spin % 16 != 0) {
        if (progress) b.pause();
        else {  // completed by another thread: sleep on the condition variable
          std::unique_lock lock(mu_);
          cv_.wait_for(lock, std::chrono::milliseconds(2), [&] { return done_.load(std::memory_order_relaxed); });
        }
        continue;
      }
      const auto now = clock::now();
      if (now >= own_deadline()) {
        expire();
        return true;
      }
      if (now >= limit) return false;
    }
  }

 public:
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
  }
 private:
  // Queued and not started: no deadline yet (the work ahead of it has its own). Running: its
  // start (or the first wait, for progress-driven work, which runs from submission) + timeout
  // + 1 s grace.
  clock::time_point own_deadline() {
    auto started = started_ns_.load(std::memory_order_acquire);
    if (started == 0) {
      if (!progress) return clock::time_point::max();
      std::int64_t expected = 0;
      started_ns_.compare_exchange_strong(expected, now_ns());
      started = started_ns_.load();
    }
    return clock::time_point(std::chrono::nanoseconds(started)) + timeout + std::chrono::seconds(1);
  }
  void expire() {
    std::exception_ptr e;
    try {
      if (on_timeout) e = on_timeout();
    } catch (...) {
      e = std::current_exception();
    }
    if (!e) {
      error_site s;
      s.operation = name.empty() ? std::string(kft::name(op)) : name;
      if (seq) s.sequence = seq;
      e = std::make_exception_ptr(timeout_error(
          "did not complete within its deadline (" + kft::detail::describe_duration(timeout) + " + 1 s)", s));
    }
    // (the flight recorder, when KFT_TRACE_DIR is set: the dump carries the error)
    try {
      std::rethrow_exception(e);
    } catch (const kft::error& err) {
      trace::note_failure(err.what(), err.waiting_for());
    } catch (...) {
    }
    trace::dump("deadline");
    complete(e);
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::atomic<std::int64_t> started_ns_{0};
  std::atomic<std::int64_t> done_ns_{0};
  std::exception_ptr error_;
  // The flight recorder's entry (set once, under mu_, before the operation completes).
  std::atomic<trace::entry*> trace_entry_{nullptr};
  std::atomic<std::uint64_t> trace_id_{0};
  trace::slot_ref traced() const noexcept {
    trace::entry* e = trace_entry_.load(std::memory_order_acquire);
    return {e, e ? trace_id_.load(std::memory_order_relaxed) : 0, false};
  }
};

/// @brief A running asynchronous operation. Move-only; see the file comment for the rules.
class [[nodiscard]] work {
 public:
  /// @brief An empty handle: done, nothing to wait for.
  work() = default;
  explicit work(std::shared_ptr<work_state> s) : s_(std::move(s)) {}
  /// @brief A handle of an operation that already finished (e.g. a one-rank group).
  static work completed(collective op = collective::none, std::uint64_t seq = 0) {
    auto s = std::make_shared<work_state>();
    s->op = op;
    s->seq = seq;
    s->complete();
    return work(std::move(s));
  }

  work(work&&) noexcept = default;
  work& operator=(work&& o) noexcept {
    if (this != &o) {
      settle();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  work(const work&) = delete;
  work& operator=(const work&) = delete;
  ~work() { settle(); }

  /// @brief Blocks until done; rethrows the operation's error (timeout_error past the deadline).
  void wait() {
    if (!s_) return;
    s_->wait_until(clock::time_point::max());
    if (auto e = s_->error()) std::rethrow_exception(e);
  }
  /// @brief True when done (then `wait()` returns at once); never blocks.
  bool test() {
    if (!s_) return true;
    if (!s_->poll()) return false;
    if (auto e = s_->error()) std::rethrow_exception(e);
    return true;
  }
  /// @brief Waits up to `d`; true when done (rethrowing its error).
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) {
    if (!s_) return true;
    if (!s_->wait_until(clock::now() + std::chrono::duration_cast<clock::duration>(d))) return false;
    if (auto e = s_->error()) std::rethrow_exception(e);
    return true;
  }

  std::uint64_t sequence() const noexcept { return s_ ? s_->seq : 0; }
  collective op() const noexcept { return s_ ? s_->op : collective::none; }
  /// @brief The operation's shared state (its timestamps: `started_ns()`, `done_ns()`), or nullptr.
  const work_state* state() const noexcept { return s_.get(); }
  /// @brief Has the flight recorder's entry `r` written when the operation starts and ends.
  void record_into(const trace::slot_ref& r) noexcept {
    if (s_) s_->attach_trace(r);
    else r.finish(0, trace::now_ns(), true);
  }
  /// @brief False for an empty (default-constructed, moved-from or detached) handle.
  bool valid() const noexcept { return s_ != nullptr; }
  /// @brief Lets go without waiting: for stream-ordered work (NCCL), where later work on the
  /// same stream sees the result anyway; the caller keeps the buffers alive until it has
  /// synchronised by other means. Errors of the operation are then seen by the next call.
  void detach() noexcept { s_.reset(); }

 private:
  void settle() noexcept {
    if (!s_) return;
    try {
      s_->wait_until(clock::time_point::max());
    } catch (...) {
    }
    s_.reset();
  }

  std::shared_ptr<work_state> s_;
};

}  // namespace async
KFT_NAMESPACE_END
