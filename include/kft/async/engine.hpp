// SPDX-License-Identifier: Apache-2.0
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
///
/// A thread waiting for a work that has not started runs it (and what is queued before it)
/// itself when the worker is idle, instead of waking the worker and sleeping: the common
/// "submit, then wait" pattern costs no thread hand-off.
///
/// On Linux the worker runs under SCHED_BATCH: the same fair share of the CPU, but a wake-up does
/// not preempt the thread that submitted (the rank's compute thread, which usually shares its
/// core when there are more ranks than cores). Without it, queuing a bucket paused the rank's
/// backward for the whole collective (~200 us seen in a KFT_TIMELINE trace), the ranks drifted
/// apart and the next bucket waited for the later one. If the kernel refuses the policy the worker
/// keeps the default one.
///
/// The worker is also bound to one CPU when the engine knows its process's place on the node
/// (`placement`: the local rank among the local ranks, given by the shared-memory communicator
/// and the CPU group): the `index`-th of `count` workers takes the CPU at the same fraction of
/// the CPUs this thread may use (with more workers than CPUs, CPU `index % n`). Left to the
/// scheduler, the workers of two ranks often shared one core while the other idled (a woken
/// thread is placed near its waker, and the ranks' compute threads wander): in a KFT_TIMELINE
/// trace of `bench/ddp_overlap` the progress threads then waited 0.3-2 ms per step for a core and
/// a 4 MiB bucket took 2-3x its time. Without a placement the worker is not bound
/// (`shm::config::bind_progress_thread = false`, `KFT_PROGRESS_AFFINITY=none` through the
/// process groups); a thread allowed only one CPU (a launcher's binding, as `mpirun --bind-to
/// core` makes) is left as it is.
///
/// In steady state a submission allocates nothing: work states are recycled once no handle
/// holds them, tasks up to `task::capacity` bytes live inside the queue's slots, and the queue
/// is a ring that only grows (a training step's collectives reuse the same memory every step).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <kft/async/work.hpp>
#include <kft/core/timeout.hpp>

KFT_NAMESPACE_BEGIN
namespace async {

/// @brief What a submitted operation is, for its work handle and messages.
struct operation {
  collective op = collective::none;
  std::uint64_t seq = 0;
  std::chrono::milliseconds timeout{default_job_timeout};
  std::string name;  ///< optional, e.g. "allreduce (f32 x 1048576)"
};

/// @brief A move-only `void()` callable stored in place when it fits (`capacity` bytes), else
/// on the heap: unlike std::function, a collective's closure (pointers, counts, options) never
/// allocates.
class task {
 public:
  static constexpr std::size_t capacity = 128;

  task() = default;
  template <class F, class D = std::decay_t<F>>
    requires(!std::is_same_v<D, task> && std::is_invocable_v<D&>)
  explicit task(F&& f) {
    if constexpr (sizeof(D) <= capacity && alignof(D) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<D>) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      ops_ = &ops_of<D>;
    } else {  // too big to sit in a slot: one allocation, as std::function would make
      auto boxed = [p = std::make_unique<D>(std::forward<F>(f))] { (*p)(); };
      ::new (static_cast<void*>(buf_)) decltype(boxed)(std::move(boxed));
      ops_ = &ops_of<decltype(boxed)>;
    }
  }
  task(task&& o) noexcept : ops_(std::exchange(o.ops_, nullptr)) {
    if (ops_) ops_->relocate(o.buf_, buf_);
  }
  task& operator=(task&& o) noexcept {
    if (this != &o) {
      reset();
      if ((ops_ = std::exchange(o.ops_, nullptr))) ops_->relocate(o.buf_, buf_);
    }
    return *this;
  }
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }
  void operator()() { ops_->call(buf_); }
  void reset() noexcept {
    if (ops_) std::exchange(ops_, nullptr)->destroy(buf_);
  }

 private:
  struct ops {
    void (*call)(void*);
    void (*relocate)(void* from, void* to) noexcept;  // move-construct into `to`, destroy `from`
    void (*destroy)(void*) noexcept;
  };
  template <class D>
  static constexpr ops ops_of{
      [](void* p) { (*static_cast<D*>(p))(); },
      [](void* from, void* to) noexcept {
        ::new (to) D(std::move(*static_cast<D*>(from)));
        static_cast<D*>(from)->~D();
      },
      [](void* p) noexcept { static_cast<D*>(p)->~D(); },
  };

  alignas(std::max_align_t) unsigned char buf_[capacity];
  const ops* ops_ = nullptr;
};

/// @brief This process's place among the processes of its node that run an engine each (its
/// local rank and their number), for binding the worker; `index < 0` when unknown (not bound).
struct placement {
  int index = -1;
  int count = 0;
};

class engine {
 public:
  explicit engine(std::string name = "kft engine", placement where = {}) : name_(std::move(name)), where_(where) {}
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

  /// @brief Queues `f`; it runs after everything submitted before it.
  template <class F>
  work submit(operation what, F&& f) {
    task t(std::forward<F>(f));
    std::shared_ptr<work_state> st;
    {
      std::lock_guard lock(mu_);
      st = recycled();
      st->op = what.op;
      st->seq = what.seq;
      st->timeout = what.timeout;
      st->name = std::move(what.name);
      st->help = &engine::help_thunk;
      st->helper = this;
      pending_.fetch_add(1, std::memory_order_acq_rel);
      push({st, std::move(t)});
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
    cv_.wait(lock, [&] { return size_ == 0 && !busy_; });
  }
  /// @brief True when nothing is queued or running.
  bool idle() const noexcept { return pending_.load(std::memory_order_acquire) == 0; }
  /// @brief True on the engine's own worker thread (a task that calls back into its owner).
  bool on_worker() const noexcept { return worker_.get_id() == std::this_thread::get_id(); }
  const std::string& name() const noexcept { return name_; }
  /// @brief The CPU the worker is bound to, or -1 (not bound, or not started yet: the worker
  /// starts with the first submission).
  int worker_cpu() const noexcept { return worker_cpu_.load(std::memory_order_acquire); }

 private:
  struct item {
    std::shared_ptr<work_state> state;
    task run;
  };

  // A work state no handle holds any more (reset for reuse), or a new one. Under mu_.
  std::shared_ptr<work_state> recycled() {
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer does not model the acquire fence below (GCC warns, -Wtsan), and would
    // report the reuse as a race: under it every call gets a fresh state instead.
    return std::make_shared<work_state>();
#endif
    for (std::size_t n = 0; n < states_.size(); ++n) {
      auto& s = states_[cursor_];
      cursor_ = (cursor_ + 1) % states_.size();
      if (s.use_count() == 1) {  // only this list holds it, and nothing can copy it from here
        std::atomic_thread_fence(std::memory_order_acquire);  // the last holder's writes are visible
        s->reset();
        return s;
      }
    }
    // None free: grow by as many as there are (at least 8), so that a burst deeper than any
    // before (a slow peer, a busy machine) finds spares instead of allocating again.
    const std::size_t first = states_.size(), more = std::max<std::size_t>(8, first);
    for (std::size_t k = 0; k < more; ++k) states_.push_back(std::make_shared<work_state>());
    cursor_ = (first + 1) % states_.size();
    return states_[first];
  }

  // The queue: a ring of slots that doubles when full. Under mu_.
  void push(item&& it) {
    if (size_ == ring_.size()) {
      std::vector<item> bigger(ring_.empty() ? 64 : 2 * ring_.size());
      for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(ring_[(head_ + i) % ring_.size()]);
      ring_ = std::move(bigger);
      head_ = 0;
    }
    ring_[(head_ + size_) % ring_.size()] = std::move(it);
    ++size_;
  }
  item pop() {
    item it = std::move(ring_[head_]);
    head_ = (head_ + 1) % ring_.size();
    --size_;
    return it;
  }

  // Runs one item (the worker's body, also a helping waiter's). Called without mu_.
  static void execute(item& it) {
    it.state->start();
    std::exception_ptr error;
    try {
      it.run();
    } catch (...) {
      error = std::current_exception();
    }
    it.run.reset();  // the closure's captures go before anyone learns the work is done
    it.state->complete(error);
    it.state.reset();
  }

  static void batch_policy() noexcept {
#if defined(__linux__) && defined(SCHED_BATCH)
    sched_param none{};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);  // best effort: a refusal keeps the default
#endif
  }

  // Binds the calling thread (the worker) to its share of the CPUs it may use (inherited from
  // the thread that started it); -1 when it stays as it is.
  static int bind(placement where) noexcept {
#if defined(__linux__)
    if (where.index < 0) return -1;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0) return -1;
    const int n = CPU_COUNT(&allowed);
    if (n < 2) return -1;  // bound already (a launcher's binding): nothing to choose
    const int k = where.count > 0 && where.count <= n
                      ? static_cast<int>(static_cast<long>(where.index) * n / where.count)
                      : where.index % n;
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed) || seen++ != k) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0 ? cpu : -1;  // best effort
    }
#else
    (void)where;
#endif
    return -1;
  }

  void run() {
    batch_policy();
    worker_cpu_.store(bind(where_), std::memory_order_release);
    std::unique_lock lock(mu_);
    while (true) {
      // Never while a helping waiter runs an item: one operation at a time, in order.
      cv_.wait(lock, [&] { return !busy_ && (stopping_ || size_ != 0); });
      if (size_ == 0) return;
      item it = pop();
      busy_ = true;
      lock.unlock();
      execute(it);
      lock.lock();
      busy_ = false;
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      cv_.notify_all();
    }
  }

  // A waiter on `st` runs the queue's head items itself, in order, up to and including `st`,
  // while the worker is idle (it would otherwise first have to wake up: tens of microseconds).
  static void help_thunk(void* self, work_state* st) { static_cast<engine*>(self)->help_until(st); }
  void help_until(const work_state* st) {
    std::unique_lock lock(mu_);
    while (!busy_ && size_ != 0) {
      bool queued = false;
      for (std::size_t i = 0; i < size_ && !queued; ++i) queued = ring_[(head_ + i) % ring_.size()].state.get() == st;
      if (!queued) return;  // already taken by the worker (or never ours)
      item it = pop();
      const bool last = it.state.get() == st;
      busy_ = true;
      lock.unlock();
      execute(it);
      lock.lock();
      busy_ = false;
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      cv_.notify_all();
      if (last) return;
    }
  }

  std::string name_;
  placement where_;
  std::atomic<int> worker_cpu_{-1};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<item> ring_;
  std::size_t head_ = 0, size_ = 0;
  std::vector<std::shared_ptr<work_state>> states_;
  std::size_t cursor_ = 0;
  bool busy_ = false, stopping_ = false;
  std::atomic<int> pending_{0};
  std::thread worker_;
};

}  // namespace async
KFT_NAMESPACE_END
