// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/flight_recorder.hpp
/// @brief The flight recorder: every process group keeps a ring of its last N collectives, and
/// the process writes every ring to a file when a call passes its deadline or fails, when the
/// group is aborted, on a fatal signal and on SIGUSR1 (issue 47; PyTorch's NCCL flight recorder
/// and NCCL's RAS answer the same question: which rank, which collective).
///
///     KFT_TRACE_DIR=/tmp/trace kftrun --nproc-per-node 4 -- ./train    # kill -USR1 <pid> to look
///
/// Each entry holds the group's name and generation, the call's sequence number, collective,
/// dtype, count, root, algorithm, its enqueue, start and end times (steady clock, ns) and its
/// state (queued, running, completed, failed). A call costs a few stores into a slot of the
/// ring, and two reads of the CPU's time-stamp counter when the calls are far enough apart
/// (`recorder::begin`): no lock, no atomic read-modify-write, no allocation
/// (bench/collectives/flight_recorder_cost.cpp measures it against 8-byte allreduces;
/// docs/flight-recorder.md has the numbers).
///
/// The dump, `<dir>/rank<R>.jsonl` (R: the job's rank), is JSON lines: one line about the
/// process (rank, world size, host, pid, why, when, and the last failure's error and the ranks
/// it waited for), then, group by group, one line about the group (this rank's place in it, its
/// size) and one line per recorded call, oldest first. It is written with async-signal-safe calls only (open, write,
/// rename), so a fatal signal's handler can write it; a dump replaces the previous one
/// atomically. `kft-trace <dir>` reads every rank's file and names the rank at fault
/// (tools/kft-trace, docs/flight-recorder.md).
///
/// Settings (read by `make_process_group` through `group::trace_settings`): `KFT_TRACE_DIR` (where
/// dumps go; unset: no dumps, the rings are still kept), `KFT_TRACE_ENTRIES` (ring size, 2048;
/// 0: no recording).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/namespace.hpp>
#include <kft/core/options.hpp>

KFT_NAMESPACE_BEGIN
namespace trace {

/// @brief Now, steady clock, ns (the clock `async::work_state` uses).
inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// @brief Now, in the recorder's cheapest unit: the CPU's time-stamp counter on x86 (about 10 ns
/// to read on a VM, where a steady-clock read costs about 20), else steady-clock ns. A dump
/// converts ticks to steady-clock ns with two (ticks, ns) pairs: one taken when the process
/// started recording and one at the dump.
inline std::int64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return static_cast<std::int64_t>(__builtin_ia32_rdtsc());
#else
  return now_ns();
#endif
}

/// @brief Where a recorded call stands.
enum class state : std::uint8_t { empty, queued, running, completed, failed };

constexpr std::string_view name(state s) {
  constexpr std::string_view names[] = {"empty", "queued", "running", "completed", "failed"};
  return names[static_cast<int>(s)];
}

/// @brief A field of an entry that another thread may read while the calling thread writes it
/// (a live status's thread; a dump from another thread): relaxed atomic loads and stores, plain
/// moves on x86 and AArch64, so the writer pays nothing and the reader's race is defined.
template <class T>
class relaxed {
 public:
  relaxed() = default;
  constexpr relaxed(T v) noexcept : v_(v) {}  // NOLINT(google-explicit-constructor)
  relaxed(const relaxed&) = delete;
  relaxed& operator=(const relaxed&) = delete;
  operator T() const noexcept { return v_.load(std::memory_order_relaxed); }  // NOLINT
  relaxed& operator=(T v) noexcept {
    v_.store(v, std::memory_order_relaxed);
    return *this;
  }

 private:
  std::atomic<T> v_{};
};

/// @brief One recorded call (a slot of the ring). Written by the calling thread (and, for an
/// asynchronous call, by the thread that completes it); read by a dump, possibly from a signal
/// handler while a call is being written, or by a live status's thread: a dump may show one
/// entry half-updated, never crash.
struct entry {
  std::atomic<std::uint64_t> id{0};  ///< the call's number in this ring (1, 2, ...); 0: empty
  relaxed<std::uint64_t> seq{0};     ///< the group's sequence number of the call
  /// Identical blocking calls in a row share one entry (`recorder::begin`): the last one's
  /// sequence number, and how many (1: the entry is one call).
  relaxed<std::uint64_t> seq_last{0};
  relaxed<std::uint32_t> calls{1};
  relaxed<std::uint64_t> count{0};      ///< elements
  relaxed<std::int64_t> enqueue_ns{0};  ///< issued (steady clock)
  std::atomic<std::int64_t> start_ns{0};
  std::atomic<std::int64_t> end_ns{0};
  /// The times' unit: `ticks()` for all three (a blocking call), or ticks for the enqueue and
  /// steady-clock ns for start and end (an asynchronous call: its work's own timestamps).
  std::atomic<bool> ns_times{false};
  /// True when start (and end) were read for this call; false when the recorder, issuing calls
  /// faster than its budget allows a clock read each, gave it its last reading (an earlier
  /// time: a lower bound of the start) and no end time (`recorder::begin`).
  relaxed<bool> timed{true};
  relaxed<std::uint32_t> generation{0};  ///< the group's membership generation (shrinks and joins)
  relaxed<std::int32_t> root{-1};        ///< broadcast's root, else -1
  relaxed<collective> op{collective::none};
  relaxed<dtype> type{dtype::u8};
  relaxed<algo> algorithm{algo::automatic};
  std::atomic<state> st{state::empty};
};

/// @brief Where a call's entry is: what an asynchronous call's completion writes to (the slot
/// is written only while it still holds that call: the ring may have moved on).
struct slot_ref {
  entry* e = nullptr;
  std::uint64_t id = 0;
  bool timed = false;  ///< this call read the clock at its start, so it reads it at its end
  /// @brief The call ran from `start_ns` to `end_ns` (steady clock) and ended `ok` or failed.
  void finish(std::int64_t start_ns, std::int64_t end_ns, bool ok) const noexcept {
    if (!e || e->id.load(std::memory_order_relaxed) != id) return;
    e->ns_times.store(true, std::memory_order_relaxed);
    e->start_ns.store(start_ns ? start_ns : end_ns, std::memory_order_relaxed);
    e->end_ns.store(end_ns, std::memory_order_relaxed);
    e->st.store(ok ? state::completed : state::failed, std::memory_order_release);
  }
  /// @brief A blocking call returned (`ok`) or threw, now (in ticks, as it began).
  void end(bool ok) const noexcept {
    if (!e) return;
    if (timed) e->end_ns.store(ticks(), std::memory_order_relaxed);
    e->st.store(ok ? state::completed : state::failed, std::memory_order_release);
  }
};

/// @brief The recorder's settings.
struct settings {
  std::size_t entries = 2048;  ///< the ring's size; 0: no recording
  std::string dir;             ///< where dumps go ("": none)
};

class recorder;

namespace detail {

// The process's recorders and what a dump says about the process, reachable from a signal
// handler: fixed arrays, atomics, no allocation.
struct registry {
  static constexpr int max_recorders = 64;
  std::array<std::atomic<recorder*>, max_recorders> slots{};
  char dir[512] = {0};       // where dumps go ("": none)
  char identity[512] = {0};  // "\"rank\":3,\"world_size\":8,\"host\":\"node1\"" (JSON members)
  int rank = -1;
  // The last call of this process that failed (its error, the job ranks it waited for or was
  // failed by), for the next dump: written by `note_failure` before `dump`, outside handlers.
  char failure[1024] = {0};
  std::array<int, 64> waiting_for{};
  int waiting_n = 0;
  // What a call in flight waits for now (job ranks), for a dump taken while it waits (SIGUSR1,
  // or kftrun stopping the job): set by a transport's slow wait, cleared when it ends
  // (`waiting_now`). Either a copy (`now_copy`, written by the one wait that owns it:
  // `copy_owned`; `now_list` null) or a transport's own list (`now_list`).
  std::array<std::atomic<int>, 64> now_copy{};
  std::atomic<bool> copy_owned{false};
  std::atomic<const int*> now_list{nullptr};
  std::atomic<int> now_n{0};
  std::atomic<std::int64_t> step{-1};  // the training step this process is at (note_step); -1: unknown
  std::atomic<int> dumping{0};
  std::atomic<bool> writing{false};
  std::int64_t ticks0 = ticks(), ns0 = now_ns();  // (a dump's second pair converts ticks to ns)
  std::int64_t read_cost = measure_read_cost();   // ticks one ticks() costs
  static std::int64_t measure_read_cost() noexcept {
    const std::int64_t t0 = ticks();
    std::int64_t t = t0;
    for (int i = 0; i < 256; ++i) t = ticks();
    return std::max<std::int64_t>((t - t0) / 256, 1);
  }
};
inline registry& the_registry() {
  static registry r;
  return r;
}

// A small buffer that appends text and numbers without allocating, flushed to a file
// descriptor (async-signal-safe).
class writer {
 public:
  explicit writer(int fd) : fd_(fd) {}
  ~writer() { flush(); }
  writer& text(std::string_view s) {
    for (char c : s) put(c);
    return *this;
  }
  // A JSON string's contents: quotes, backslashes and control characters escaped.
  writer& escaped(std::string_view s) {
    for (char c : s) {
      if (c == '"' || c == '\\') {
        put('\\');
        put(c);
      } else if (static_cast<unsigned char>(c) < 0x20) {
        text("\\u00");
        put("0123456789abcdef"[(c >> 4) & 0xf]);
        put("0123456789abcdef"[c & 0xf]);
      } else {
        put(c);
      }
    }
    return *this;
  }
  writer& number(std::int64_t v) {
    char digits[24];
    int n = 0;
    const bool neg = v < 0;
    std::uint64_t u = neg ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    if (neg) put('-');
    while (n) put(digits[--n]);
    return *this;
  }
  void flush() {
    std::size_t done = 0;
    while (done < used_) {
      const ssize_t w = ::write(fd_, buf_ + done, used_ - done);
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    used_ = 0;
  }

 private:
  void put(char c) {
    if (used_ == sizeof buf_) flush();
    buf_[used_++] = c;
  }
  int fd_;
  char buf_[4096];
  std::size_t used_ = 0;
};

inline void copy_text(char* to, std::size_t cap, std::string_view from) {
  const std::size_t n = std::min(cap - 1, from.size());
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

}  // namespace detail

/// @brief One group's ring. Registers itself with the process (for dumps) while it lives.
class recorder {
 public:
  /// `group`: the group's name in the dump; `rank`, `size` and `id`: as `place` and `identify`
  /// set them, given here so that the ring is complete when a dump on another thread first sees
  /// it.
  recorder(std::string group, std::size_t entries, int rank = -1, int size = -1, std::string_view id = {})
      : ring_(std::bit_ceil(entries ? entries : 1)), rank_(rank), size_(size) {
    mask_ = ring_.size() - 1;
    detail::copy_text(group_, sizeof group_, group);
    detail::copy_text(id_, sizeof id_, id);
    auto& r = detail::the_registry();
    for (auto& s : r.slots) {
      recorder* none = nullptr;
      if (s.compare_exchange_strong(none, this)) {
        slot_ = &s;
        break;
      }
    }
  }
  ~recorder() {
    if (slot_) slot_->store(nullptr);
    // (a dump in progress on another thread reads this ring: wait for it)
    while (detail::the_registry().dumping.load() != 0) ::usleep(1000);
  }
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;

  /// @brief The group's name changed (a shrink or a join: "... (shrunk to 3 of 4 ranks)").
  void rename(std::string_view group) { detail::copy_text(group_, sizeof group_, group); }
  /// @brief This rank's place in the group and the group's size, for the dump's group line (a
  /// reader then knows how many ranks should have written one).
  void place(int rank, int size) noexcept {
    rank_ = rank;
    size_ = size;
  }
  /// @brief The group's id in the dump (`group_id`): the same on every rank of the group, where
  /// its name may not be (it says which host address a rank uses). Empty: the name.
  void identify(std::string_view id) { detail::copy_text(id_, sizeof id_, id); }

  /// @brief Records a call issued now: `running` (a blocking call) or `queued` (asynchronous).
  /// One thread issues a group's calls (they are ordered), so the counter is not a read-modify-write.
  ///
  /// The clock: a call is timed (its start and end read) when the recorder can afford it: two
  /// reads cost at most 0.25% of the time between calls (`read_budget`: a quarter of issue 47's
  /// 1%, which the rest of the recording shares). Calls issued faster (8-byte allreduces
  /// between two shared-memory ranks: about 150 ns each) are timed one in `stride` (a power of
  /// two, at most 256, from the last interval measured); the others take the last reading as
  /// their start, a lower bound, and no end (`entry::timed` false).
  ///
  /// A blocking call identical to the one before it (collective, dtype, count, root, algorithm,
  /// generation), numbered next and issued once that one completed, is folded into its entry:
  /// `seq_last` and `calls` grow, the state goes back to running, and its end is read when its
  /// start was. A tight loop of one collective then writes one cache line, not a new entry per
  /// call; the entry keeps the first call's start and the last timed call's end.
  slot_ref begin(collective op, dtype t, std::size_t count, std::uint64_t seq, std::uint32_t generation, algo a,
                 int root, bool queued) noexcept {
    const std::uint64_t last = next_.load(std::memory_order_relaxed);
    const bool fresh = ++since_ >= stride_;
    std::int64_t now = last_read_;
    if (fresh) {
      now = ticks();
      pace(now);
    }
    if (!queued && last != 0) {
      entry& p = ring_[static_cast<std::size_t>((last - 1) & mask_)];
      if (p.seq_last + 1 == seq && p.count == count && p.op == op && p.type == t && p.root == root &&
          p.algorithm == a && p.generation == generation && p.st.load(std::memory_order_relaxed) == state::completed &&
          !p.ns_times.load(std::memory_order_relaxed)) {
        p.seq_last = seq;
        p.calls = p.calls + 1;  // (one writer)
        p.st.store(state::running, std::memory_order_release);
        return {&p, last, fresh};
      }
    }
    const std::uint64_t id = last + 1;
    entry& e = ring_[static_cast<std::size_t>((id - 1) & mask_)];
    e.id.store(0, std::memory_order_relaxed);  // (a dump skips the slot while it is rewritten)
    e.seq = seq;
    e.seq_last = seq;
    e.calls = 1;
    e.count = count;
    e.generation = generation;
    e.root = root;
    e.op = op;
    e.type = t;
    e.algorithm = a;
    e.timed = fresh;
    e.enqueue_ns = now;
    e.start_ns.store(queued ? 0 : now, std::memory_order_relaxed);
    e.end_ns.store(0, std::memory_order_relaxed);
    e.ns_times.store(false, std::memory_order_relaxed);
    e.st.store(queued ? state::queued : state::running, std::memory_order_relaxed);
    e.id.store(id, std::memory_order_release);
    next_.store(id, std::memory_order_release);
    return {&e, id, fresh};
  }
  /// @brief A blocking call begun with `begin` returned (`ok`) or threw.
  static void end(const slot_ref& s, bool ok) noexcept { s.end(ok); }

  /// @brief How many calls share one clock reading now (1: every call is timed).
  std::uint32_t stride() const noexcept { return stride_; }
  /// @brief Calls recorded so far (the ring holds the last `capacity()` of them).
  std::uint64_t recorded() const noexcept { return next_.load(std::memory_order_relaxed); }
  std::size_t capacity() const noexcept { return ring_.size(); }
  std::string_view group() const noexcept { return group_; }
  /// @brief The entries still in the ring, oldest first (a copy: for tests and tools).
  std::vector<const entry*> entries() const {
    std::vector<const entry*> out;
    const std::uint64_t n = recorded();
    for (std::uint64_t id = n > ring_.size() ? n - ring_.size() + 1 : 1; id <= n; ++id) {
      const entry& e = ring_[static_cast<std::size_t>((id - 1) & mask_)];
      if (e.id.load(std::memory_order_acquire) == id) out.push_back(&e);
    }
    return out;
  }

  /// @brief The newest call as a JSON object (group id and generation, seq, op, dtype, count,
  /// state, start and end in steady-clock ns), or "" when none: what a live status shows. For
  /// identical calls folded into one entry, `seq` is the last one's, `start_ns` the first's and
  /// `end_ns` the last timed one's.
  /// Not for a signal handler (it allocates).
  std::string last_call_json(double ns_per_tick) const {
    const std::uint64_t n = recorded();
    if (n == 0) return {};
    const entry& e = ring_[static_cast<std::size_t>((n - 1) & mask_)];
    if (e.id.load(std::memory_order_acquire) != n) return {};  // (being rewritten: the next look sees it)
    const bool ns = e.ns_times.load(std::memory_order_relaxed);
    std::string out;
    auto add = [&](std::string_view k, const std::string& v, bool quoted) {
      out += (out.empty() ? "{\"" : ",\"");
      out += k;
      out += quoted ? "\":\"" + v + "\"" : "\":" + v;
    };
    std::string id = id_[0] ? id_ : group_;
    std::erase_if(id, [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; });
    add("group_id", id, true);
    add("generation", std::to_string(e.generation), false);
    add("seq", std::to_string(e.seq_last), false);
    add("op", std::string(kft::name(e.op)), true);
    add("dtype", std::string(kft::name(e.type)), true);
    add("count", std::to_string(e.count), false);
    add("state", std::string(name(e.st.load(std::memory_order_acquire))), true);
    add("start_ns", std::to_string(as_ns(e.start_ns.load(std::memory_order_relaxed), ns, ns_per_tick)), false);
    add("end_ns", std::to_string(as_ns(e.end_ns.load(std::memory_order_relaxed), ns, ns_per_tick)), false);
    // (rewritten for a newer call meanwhile: what was read may mix two calls; the next look sees it)
#if defined(__SANITIZE_THREAD__)
    if (e.id.load(std::memory_order_seq_cst) != n) return {};  // (TSan has no fences)
#else
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.id.load(std::memory_order_relaxed) != n) return {};
#endif
    return out + "}";
  }

  /// @brief An entry's time in steady-clock ns (`ns_per_tick`: the dump's conversion).
  static std::int64_t as_ns(std::int64_t t, bool ns, double ns_per_tick) noexcept {
    if (t == 0 || ns) return t;
    const auto& r = detail::the_registry();
    return r.ns0 + static_cast<std::int64_t>(static_cast<double>(t - r.ticks0) * ns_per_tick);
  }

  /// @brief Appends this ring's entries as JSON lines (async-signal-safe); times in steady-clock
  /// ns (`ns_per_tick` converts `ticks()`).
  void write_to(detail::writer& w, double ns_per_tick) const {
    const std::uint64_t n = recorded();
    // The group's line: what a reader needs to know who else should have written this group.
    const char* group_id = id_[0] ? id_ : group_;
    w.text("{\"group\":\"").escaped(group_).text("\",\"group_id\":\"").escaped(group_id);
    w.text("\",\"group_rank\":").number(static_cast<int>(rank_));
    w.text(",\"group_size\":").number(static_cast<int>(size_)).text(",\"recorded\":").number(static_cast<std::int64_t>(n));
    w.text(",\"capacity\":").number(static_cast<std::int64_t>(ring_.size())).text("}\n");
    for (std::uint64_t id = n > ring_.size() ? n - ring_.size() + 1 : 1; id <= n; ++id) {
      const entry& e = ring_[static_cast<std::size_t>((id - 1) & mask_)];
      if (e.id.load(std::memory_order_acquire) != id) continue;  // (being rewritten)
      const bool ns = e.ns_times.load(std::memory_order_relaxed);
      w.text("{\"group_id\":\"").escaped(group_id).text("\",\"generation\":").number(e.generation);
      w.text(",\"id\":").number(static_cast<std::int64_t>(id)).text(",\"seq\":").number(static_cast<std::int64_t>(e.seq));
      w.text(",\"seq_last\":").number(static_cast<std::int64_t>(e.seq_last)).text(",\"calls\":").number(e.calls);
      w.text(",\"op\":\"").text(kft::name(e.op)).text("\",\"dtype\":\"").text(kft::name(e.type));
      w.text("\",\"count\":").number(static_cast<std::int64_t>(e.count)).text(",\"root\":").number(e.root);
      w.text(",\"algorithm\":\"").text(kft::name(e.algorithm)).text("\",\"enqueue_ns\":");
      w.number(as_ns(e.enqueue_ns, false, ns_per_tick));
      w.text(",\"start_ns\":").number(as_ns(e.start_ns.load(std::memory_order_relaxed), ns, ns_per_tick));
      w.text(",\"end_ns\":").number(as_ns(e.end_ns.load(std::memory_order_relaxed), ns, ns_per_tick));
      w.text(",\"timed\":").text(e.timed || ns ? "true" : "false");
      w.text(",\"state\":\"").text(name(e.st.load(std::memory_order_acquire))).text("\"}\n");
    }
  }

 private:
  // A reading at `now` after `since_` calls: the stride that keeps two readings within 1% of
  // the calls' time.
  void pace(std::int64_t now) noexcept {
    const std::int64_t per_call = last_read_ ? (now - last_read_) / std::max<std::uint32_t>(since_, 1) : 0;
    // (two readings per stride, at most read_budget of the calls' time)
    const std::int64_t want = per_call > 0 ? (2 * read_budget * detail::the_registry().read_cost + per_call - 1) / per_call : 1;
    stride_ = static_cast<std::uint32_t>(std::bit_ceil(static_cast<std::uint64_t>(std::clamp<std::int64_t>(want, 1, 256))));
    last_read_ = now;
    since_ = 0;
  }

  static constexpr std::int64_t read_budget = 400;  // a clock reading at most 1/400 of the calls' time
  std::vector<entry> ring_;
  std::size_t mask_ = 0;  // ring size - 1 (a power of two)
  std::int64_t last_read_ = 0;  // the last clock reading (ticks)
  std::uint32_t stride_ = 1, since_ = 0;  // calls per reading; calls since the last one
  std::atomic<std::uint64_t> next_{0};
  char group_[256] = {0};
  // This rank's place in the group and the group's size (place): a dump on another thread may
  // read them as the group sets them (the ring is registered before).
  relaxed<int> rank_{-1}, size_{-1};
  char id_[64] = {0};          // the group's id on every rank (identify); "": its name
  std::atomic<recorder*>* slot_ = nullptr;
};

/// @brief Blocking calls' entries, written by the transport: begun right after this rank has
/// published its arrival at a call, so that the wait for the others hides the writing, and ended
/// when the call returns. A process group that records hands its note to a transport that takes
/// notes (the shared-memory one: `shm::communicator::note_arrivals`), and records the calls of
/// the others itself, before they start.
///
/// Why: between two shared-memory ranks an 8-byte allreduce takes about 140 ns, and writing an
/// entry a few ns, which on the call's path is several percent; after its arrival flag is out,
/// a rank only waits for its peer's flag to cross between cores (bench/collectives/
/// flight_recorder_cost.cpp; docs/flight-recorder.md). The entry's start is then the rank's
/// arrival, not its issue, and its algorithm the one the transport chose. One thread makes a
/// group's blocking calls, and the transport writes the note on that thread, inside the call:
/// nothing here is shared.
struct arrival_note {
  recorder* rec = nullptr;
  std::uint32_t generation = 0;  ///< the group's generation, for the entries
  bool open = false;             ///< a call's entry is begun and not yet ended (`ref`)
  slot_ref ref;
  std::uint64_t last_seq = 0;  ///< the transport's sequence number of the last call written

  /// @brief The transport's side: call `seq` is under way here. (Not inlined: the transport's
  /// call path stays as it is without a recorder.)
  [[gnu::noinline]] void write(collective op, dtype t, std::size_t count, std::uint64_t seq, algo a,
                               int root) noexcept {
    ref = rec->begin(op, t, count, seq, generation, a, root, false);
    last_seq = seq;
    open = true;
  }
  /// @brief The transport's side: the call returned.
  void close() noexcept {
    open = false;
    ref.end(true);
  }
  /// @brief The group's side, when a call threw: its entry, to be ended as failed. When the
  /// transport wrote none (the call failed before its arrival), it is written now; `numbered`
  /// is the transport's sequence number now, the call's own when the transport numbered it,
  /// else the one before.
  slot_ref failed(collective op, dtype t, std::size_t count, std::uint64_t numbered, algo a, int root) noexcept {
    if (!open) {
      const bool unnumbered = numbered == last_seq;  // (its error came before the transport's count)
      write(op, t, count, unnumbered ? numbered + 1 : numbered, a, root);
      if (unnumbered) last_seq = numbered;
    }
    open = false;
    return ref;
  }
};

/// @brief Writes every recorder of this process to `<KFT_TRACE_DIR>/rank<R>.jsonl`, saying
/// `why` ("deadline", "abort", "SIGUSR1", "SIGSEGV", ...). Async-signal-safe: open, write,
/// rename only. Returns false when no directory is set or the file could not be written.
inline bool dump(const char* why) noexcept {
  auto& r = detail::the_registry();
  if (r.dir[0] == '\0') return false;
  // One dump at a time (two groups failing at once on two threads would write the same file;
  // the first one's holds both rings).
  if (r.writing.exchange(true)) return false;
  r.dumping.fetch_add(1);
  struct done_writing {
    detail::registry& reg;
    ~done_writing() {
      reg.dumping.fetch_sub(1);
      reg.writing.store(false);
    }
  } finished{r};
  char path[600], tmp[620];
  {
    // "<dir>/rank<R>.jsonl" and "<dir>/.rank<R>.jsonl.<pid>"
    auto build = [&](char* out, std::size_t cap, bool temporary) {
      std::size_t n = 0;
      auto add = [&](const char* s) {
        while (*s && n + 1 < cap) out[n++] = *s++;
      };
      auto add_number = [&](long long v) {
        char d[24];
        int k = 0;
        if (v < 0) {
          add("-");
          v = -v;
        }
        do {
          d[k++] = static_cast<char>('0' + v % 10);
          v /= 10;
        } while (v);
        while (k && n + 1 < cap) out[n++] = d[--k];
      };
      add(r.dir);
      add(temporary ? "/.rank" : "/rank");
      add_number(r.rank);
      add(".jsonl");
      if (temporary) {
        add(".");
        add_number(static_cast<long long>(::getpid()));
      }
      out[n] = '\0';
    };
    build(path, sizeof path, false);
    build(tmp, sizeof tmp, true);
  }
  ::mkdir(r.dir, 0755);  // (one level; an existing one is fine)
  const int fd = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  {
    detail::writer w(fd);
    struct timespec real {};
    ::clock_gettime(CLOCK_REALTIME, &real);
    w.text("{\"kft_trace\":1,").text(r.identity).text(",\"pid\":").number(::getpid());
    w.text(",\"why\":\"").escaped(why).text("\",\"now_ns\":").number(now_ns());
    w.text(",\"unix_ms\":").number(static_cast<std::int64_t>(real.tv_sec) * 1000 + real.tv_nsec / 1000000);
    if (const int k = r.now_n.load(std::memory_order_acquire); k > 0) {
      const int* list = r.now_list.load(std::memory_order_acquire);
      w.text(",\"waiting_now\":[");
      for (int i = 0; i < k && i < static_cast<int>(r.now_copy.size()); ++i) {
        if (i) w.text(",");
        w.number(list ? list[i] : r.now_copy[static_cast<std::size_t>(i)].load(std::memory_order_relaxed));
      }
      w.text("]");
    }
    if (r.failure[0] != '\0') {
      w.text(",\"error\":\"").escaped(r.failure).text("\",\"waiting_for\":[");
      for (int i = 0; i < r.waiting_n; ++i) {
        if (i) w.text(",");
        w.number(r.waiting_for[static_cast<std::size_t>(i)]);
      }
      w.text("]");
    }
    w.text("}\n");
    const std::int64_t t1 = ticks(), n1 = now_ns();
    const double ns_per_tick =
        t1 > r.ticks0 + 1000 ? static_cast<double>(n1 - r.ns0) / static_cast<double>(t1 - r.ticks0) : 1.0;
    for (auto& s : r.slots)
      if (recorder* rec = s.load()) rec->write_to(w, ns_per_tick);
  }
  ::close(fd);
  const bool ok = ::rename(tmp, path) == 0;
  if (!ok) ::unlink(tmp);
  return ok;
}

/// @brief Keeps a failed call's error (`what`) and the job ranks it waited for or was failed by
/// (`kft::error::waiting_for`) for the dumps that follow: their first line carries them as
/// `error` and `waiting_for`, and `kft-trace` follows the links from rank to rank. Not for a
/// signal handler (a dump of a failure calls it first, then `dump`).
inline void note_failure(std::string_view what, const std::vector<int>& waiting_for) noexcept {
  auto& r = detail::the_registry();
  detail::copy_text(r.failure, sizeof r.failure, what);
  r.waiting_n = static_cast<int>(std::min(waiting_for.size(), r.waiting_for.size()));
  std::copy_n(waiting_for.begin(), r.waiting_n, r.waiting_for.begin());
}

/// @brief While it lives, a dump says this thread's call waits for `ranks` (job ranks): a
/// transport's wait sets it when it turns slow (not per call) and it is cleared when the wait
/// ends, so a dump taken meanwhile (SIGUSR1, or kftrun stopping a failed job) shows whom each
/// rank waited for, and `kft-trace` follows the chain. The process keeps one such note (the
/// last wait to set it; with several ranks as threads of one process, a copied list is written
/// by one wait at a time: another's `set` meanwhile notes nothing).
class waiting_now {
 public:
  waiting_now() = default;
  waiting_now(const waiting_now&) = delete;
  waiting_now& operator=(const waiting_now&) = delete;
  ~waiting_now() { clear(); }
  /// Copies `ranks[0..n)` (at most 64): for a list the caller rebuilds. Allocates nothing.
  void set(const int* ranks, int n) noexcept {
    auto& r = detail::the_registry();
    if (!owns_copy_) {
      bool expected = false;
      if (!r.copy_owned.compare_exchange_strong(expected, true, std::memory_order_acquire)) return;
      owns_copy_ = true;
    }
    r.now_n.store(0, std::memory_order_release);
    n = std::min(n, static_cast<int>(r.now_copy.size()));
    for (int i = 0; i < n; ++i) r.now_copy[static_cast<std::size_t>(i)].store(ranks[i], std::memory_order_relaxed);
    r.now_list.store(nullptr, std::memory_order_release);
    r.now_n.store(n, std::memory_order_release);
    set_ = true;
  }
  /// Points at `ranks` (kept alive by the caller until this ends): for a fixed list, no copy.
  void point(const int* ranks, int n) noexcept {
    auto& r = detail::the_registry();
    r.now_n.store(0, std::memory_order_release);
    r.now_list.store(ranks, std::memory_order_release);
    r.now_n.store(std::min(n, 64), std::memory_order_release);
    set_ = true;
  }
  void clear() noexcept {
    auto& r = detail::the_registry();
    if (set_) r.now_n.store(0, std::memory_order_release);
    set_ = false;
    if (owns_copy_) r.copy_owned.store(false, std::memory_order_release);
    owns_copy_ = false;
  }

 private:
  bool set_ = false;
  bool owns_copy_ = false;
};

/// @brief The training step this process is at, for a live status (kftrun's status; the
/// trainer notes it once a step: one relaxed store).
inline void note_step(std::int64_t step) noexcept {
  detail::the_registry().step.store(step, std::memory_order_relaxed);
}

/// @brief The steady-clock ns per `ticks()` now (the conversion a dump uses).
inline double ns_per_tick() noexcept {
  const auto& r = detail::the_registry();
  const std::int64_t t1 = ticks(), n1 = now_ns();
  return t1 > r.ticks0 + 1000 ? static_cast<double>(n1 - r.ns0) / static_cast<double>(t1 - r.ticks0) : 1.0;
}

/// @brief Calls `f(const recorder&)` for every live recorder, keeping each alive meanwhile.
template <class F>
void for_each_recorder(F&& f) {
  auto& r = detail::the_registry();
  r.dumping.fetch_add(1);
  struct done {
    detail::registry& reg;
    ~done() { reg.dumping.fetch_sub(1); }
  } finished{r};
  for (auto& s : r.slots)
    if (recorder* rec = s.load()) f(*rec);
}

namespace detail {
inline void on_signal(int sig) {
  const int saved = errno;
  const char* why = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS"
                    : sig == SIGFPE ? "SIGFPE" : sig == SIGILL ? "SIGILL" : sig == SIGABRT ? "SIGABRT" : "signal";
  dump(why);
  errno = saved;
  if (sig == SIGUSR1) return;
  // A fatal signal: the default action, as if kft had not been here.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
}  // namespace detail

/// @brief Sets where dumps go and what they say about this process, and installs the signal
/// handlers once (SIGUSR1: dump and go on; SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: dump, then
/// the default action). Without a directory nothing is installed. A handler the program set
/// before is kept (kft's is not installed over it).
inline void configure(const settings& s, int rank, int world_size, std::string_view host) {
  auto& r = detail::the_registry();
  // (ranks that are threads of one process, as in tests, configure it one at a time: the last
  // one's identity stays)
  static std::mutex one_at_a_time;
  const std::lock_guard lock(one_at_a_time);
  r.rank = rank;
  std::string id = "\"rank\":" + std::to_string(rank) + ",\"world_size\":" + std::to_string(world_size) + ",\"host\":\"";
  for (char c : host) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) continue;
    id += c;
  }
  id += "\"";
  detail::copy_text(r.identity, sizeof r.identity, id);
  if (s.dir.empty()) return;
  detail::copy_text(r.dir, sizeof r.dir, s.dir);
  // (per signal, so calling this again installs nothing twice: kft's handler is not SIG_DFL)
  for (int sig : {SIGUSR1, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;  // the program's own
    struct sigaction sa {};
    sa.sa_handler = detail::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace trace
KFT_NAMESPACE_END
