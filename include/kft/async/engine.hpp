/// @file kft/async/engine.hpp
/// @brief A progress engine: one FIFO worker thread per communicator (or group) that runs its
/// asynchronous operations in submission order.
///
///     kft::async::engine e("shm node 0");
///     auto w = e.submit({kft::collective::allreduce, seq, timeout}, [&] { run_allreduce(); });
///     e.drain();   // a synchronous call first lets every queued one finish (same order on every rank)
///
/// Every rank submits its collectives in the same order (the program's order), and one worker
/// runs them one after the other, so the ranks meet in the same order: no tag matching, no
/// reordering. The worker starts with the first submission and sleeps on a condition variable
/// when the queue is empty (no spinning: more ranks than cores must not livelock). A task's
/// exception becomes its work's error. Destruction finishes what is queued (each operation is
/// bounded by its own deadline), then joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <kft/async/work.hpp>

KFT_NAMESPACE_BEGIN
namespace async {

/// @brief What a submitted operation is, for its work handle and messages.
struct operation {
  collective op = collective::none;
  std::uint64_t seq = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string name;  ///< optional, e.g. "allreduce (f32 x 1048576)"
};

class engine {
 public:
  explicit engine(std::string name = "kft engine") : name_(std::move(name)) {}
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  /// @brief Queues `task`; it runs after everything submitted before it.
  template <class F>
  work submit(operation what, F&& task) {
    auto st = std::make_shared<work_state>();
    st->op = what.op;
    st->seq = what.seq;
    st->timeout = what.timeout;
    st->name = std::move(what.name);
    pending_.fetch_add(1, std::memory_order_acq_rel);
    {
      std::lock_guard lock(mu_);
      queue_.push_back({st, std::function<void()>(std::forward<F>(task))});
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    }
    cv_.notify_all();
    return work(std::move(st));
  }

  /// @brief Waits until nothing is queued or running. Each queued operation is bounded by its
  /// own deadline, so this is too.
  void drain() {
    if (idle()) return;  // the common case, without a lock
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  /// @brief True when nothing is queued or running.
  bool idle() const noexcept { return pending_.load(std::memory_order_acquire) == 0; }
  /// @brief True on the engine's own worker thread (a task that calls back into its owner).
  bool on_worker() const noexcept { return worker_.get_id() == std::this_thread::get_id(); }
  const std::string& name() const noexcept { return name_; }

 private:
  struct item {
    std::shared_ptr<work_state> state;
    std::function<void()> task;
  };

  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item it = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      it.state->start();
      std::exception_ptr error;
      try {
        it.task();
      } catch (...) {
        error = std::current_exception();
      }
      it.state->complete(error);
      it = {};
      lock.lock();
      busy_ = false;
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      cv_.notify_all();
    }
  }

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<item> queue_;
  bool busy_ = false, stopping_ = false;
  std::atomic<int> pending_{0};
  std::thread worker_;
};

}  // namespace async
KFT_NAMESPACE_END
