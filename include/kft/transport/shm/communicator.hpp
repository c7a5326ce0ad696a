// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/communicator.hpp
/// @brief Intra-node collectives over POSIX shared memory: kft's own fast path inside a node.
///
///     auto store = ...;                                   // the job's store, scoped to this node
///     kft::shm::communicator comm(store, local_rank, local_size);
///     comm.allreduce(std::span<const float>(grad), std::span<float>(grad), kft::ops::sum);
///     auto w = comm.allreduce_async(in, out, kft::ops::avg, {.algorithm = kft::algo::two_shot});
///     w.wait();
///
/// The facade. The pieces, one concern per file: `config.hpp` (sizes, timeout, identity),
/// `layout.hpp` (the segment's wire format), `segment.hpp` (creating and mapping it),
/// `state.hpp` (set-up and the synchronisation protocol), `tuning.hpp` (which algorithm
/// `automatic` runs), and one file per collective (`allreduce.hpp`, `broadcast.hpp`,
/// `reduce_scatter.hpp`, `allgather.hpp` with the barrier). docs/algorithms.md has the
/// algorithms' step and byte costs.
///
/// Asynchronous calls run in submission order on the communicator's progress engine
/// (`async/engine.hpp`); a synchronous call first lets the queued ones finish, so every rank
/// meets its peers in program order. Each call is numbered when it is issued (`sequence()`).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <string_view>
#include <utility>

#include <kft/async/engine.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/shm/allgather.hpp>
#include <kft/transport/shm/allreduce.hpp>
#include <kft/transport/shm/broadcast.hpp>
#include <kft/transport/shm/reduce_scatter.hpp>
#include <kft/transport/shm/state.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

/// @brief A communicator over the ranks of one node, through one shared segment.
///
/// Construction and destruction are the only collective set-up steps; every collective call
/// must be made by all ranks in the same order with matching arguments (checked). Move-only.
class communicator : public typed_collectives<communicator> {
  using typed = typed_collectives<communicator>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  /// @brief Collective over the `size` local ranks: creates (rank 0) or maps the segment,
  /// pre-faults it and waits for everyone.
  /// @param store reached by all local ranks; keys go under "shm/<cfg.name>/"
  /// @throws timeout_error naming the ranks that did not arrive, transport_error on shm failures
  communicator(std::shared_ptr<rendezvous::store> store, int rank, int size, config cfg = {})
      : s_(std::make_unique<detail::state>()) {
    if (size < 1 || rank < 0 || rank >= size)
      throw usage_error("shm communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " is not a valid place",
                        error_site::of("shm init"));
    if (!store) throw usage_error("shm communicator needs a store", error_site::of("shm init"));
    s_->init(*store, rank, size, std::move(cfg));
    engine_ = std::make_unique<async::engine>(
        "shm rank " + std::to_string(rank),
        s_->cfg.bind_progress_thread ? async::placement{rank, size} : async::placement{});
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      engine_.reset();  // queued work of the old communicator finishes first
      s_ = std::move(o.s_);
      engine_ = std::move(o.engine_);
      issued_ = o.issued_;
    }
    return *this;
  }
  ~communicator() { engine_.reset(); }  // the engine's work uses the state: stop it first

  int rank() const noexcept { return s_->me; }
  int size() const noexcept { return s_->p; }
  /// @brief Calls issued so far (the next call's sequence number is this + 1).
  std::uint64_t sequence() const noexcept { return issued_; }
  const config& configuration() const noexcept { return s_->cfg; }
  /// @brief The ranks whose processes are gone (exited, killed, zombies), as this rank sees
  /// them now: after a call failed with a remote_error, the ranks a shrink leaves out
  /// (group/shrink.hpp). Only peers in this rank's pid namespace can be seen.
  std::vector<int> lost_ranks() const {
    std::vector<int> out;
    for (int r = 0; r < s_->p; ++r)
      if (r != s_->me && !s_->alive(r)) out.push_back(r);
    return out;
  }
  /// @brief The CPU this rank's progress thread is bound to (`config::bind_progress_thread`),
  /// or -1: not bound, or not started (it starts with the first asynchronous call).
  int progress_cpu() const noexcept { return engine_ ? engine_->worker_cpu() : -1; }
  /// @brief Blocking calls write their flight-recorder entries into `n`'s recorder, begun once
  /// this rank's arrival is out and ended as they return (trace::arrival_note; a process group
  /// that records does this). nullptr: none. `n` must outlive the communicator or be replaced
  /// first.
  void note_arrivals(trace::arrival_note* n) noexcept { note_ = n; }
  /// @brief The site of the next call, for argument errors (`typed_collectives`).
  error_site next_site(collective c) const { return s_->site(std::string(name(c)), issued_ + 1); }

  // ---- runtime-typed collectives (the type-erased boundary) -----------------------------------

  /// @brief out = in reduced over all ranks. `in == out` is in place. `count` elements.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    run([&] { detail::allreduce(*s_, in, out, count, t, op, o); });
  }
  /// @brief out = root's in. `in` is read on the root only; in == out is in place.
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));  // before it is numbered
    run([&] { detail::broadcast(*s_, in, out, count, t, root, o); });
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count * size) reduced over all ranks.
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    run([&] { detail::reduce_scatter(*s_, in, out, recv_count, t, op, o); });
  }
  /// @brief out (send_count * size) = every rank's in (send_count), in rank order.
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    run([&] { detail::allgather(*s_, in, out, send_count, t, o); });
  }
  /// @brief Returns once every rank has called it.
  void barrier(const options& o = {}) {
    run([&] { detail::barrier(*s_, o); });
  }

  // ---- asynchronous: in submission order on the progress engine ------------------------------
  // The caller keeps the buffers alive and untouched until the work is done.

  async::work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    return submit(collective::allreduce, o, [=](detail::state& s) { detail::allreduce(s, in, out, count, t, op, o); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));
    return submit(collective::broadcast, o, [=](detail::state& s) { detail::broadcast(s, in, out, count, t, root, o); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                                   const options& o = {}) {
    return submit(collective::reduce_scatter, o,
                  [=](detail::state& s) { detail::reduce_scatter(s, in, out, recv_count, t, op, o); });
  }
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    return submit(collective::allgather, o, [=](detail::state& s) { detail::allgather(s, in, out, send_count, t, o); });
  }
  async::work barrier_async(const options& o = {}) {
    return submit(collective::barrier, o, [=](detail::state& s) { detail::barrier(s, o); });
  }

  // ---- zero-copy buffers --------------------------------------------------------------------

  /// @brief A buffer inside the shared segment (collective: every rank makes the same sequence
  /// of allocations, so buffers sit at the same offset in every rank's region). Collectives on
  /// such buffers read the peers' data in place: no copy-in. Lives as long as the communicator.
  /// @throws usage_error when the pool (config::pool_bytes) is exhausted
  void* allocate_bytes(std::size_t bytes) { return s_->allocate(bytes); }
  template <class T>
  std::span<T> allocate(std::size_t count) {
    return {static_cast<T*>(allocate_bytes(count * sizeof(T))), count};
  }

  /// @brief Bytes the allreduces so far copied between callers' buffers and staging memory
  /// (copy-in, and copy-out of what was reduced aside). Inputs and outputs in the pool above
  /// `config::small_bytes` add nothing: the DDP reducer's buckets travel without a copy.
  std::uint64_t staged_bytes() const noexcept { return s_->staged.load(std::memory_order_relaxed); }

  /// @brief Blocks this rank took from the shared counter in direct zero-copy allreduces that
  /// claim blocks (`config::claim_blocks`); 0 where every call used fixed slices.
  std::uint64_t claimed_blocks() const noexcept { return s_->claimed.load(std::memory_order_relaxed); }

  /// @brief What `config::huge_pages` gave this rank: the bytes of its region of the segment
  /// (mailboxes, staging, its part of the pool) in 2 MiB pages, out of `region_bytes`; `why`
  /// says what the kernel refused when not all of it (empty when huge pages were not asked for).
  struct huge_page_report {
    std::size_t bytes = 0, region_bytes = 0;
    std::string why;
  };
  huge_page_report huge_pages() const {
    return {s_->huge_bytes, s_->huge ? s_->region_bytes : 0, s_->huge_note};
  }

  /// @brief Bytes from one rank's region of the segment to the next: its size rounded up to
  /// `config::region_align_bytes` (8 MiB by default with 2 MiB pages; the gap is never touched).
  std::size_t region_stride() const noexcept { return s_->region_stride; }

  /// @brief What algo::automatic runs for this collective and message size; `zero_copy` says
  /// the input is a buffer from `allocate()` (no copy-in, which moves the crossovers).
  algo choose(collective c, std::size_t bytes, bool zero_copy = false) const { return s_->choose(c, bytes, zero_copy); }
  algo choose(std::string_view c, std::size_t bytes, bool zero_copy = false) const {
    if (auto k = collective_named(c)) return choose(*k, bytes, zero_copy);
    throw usage_error("no collective named \"" + std::string(c) + "\"", error_site::of("shm choose"));
  }

  /// @brief Stops the group: every rank's current or next wait fails with a remote_error that
  /// carries `reason`. For the failure path; the communicator cannot be used afterwards.
  void abort(std::string_view reason) noexcept { s_->abort(reason); }

  /// @brief Lets every wait of this rank give a peer that is inside another communicator's call
  /// (`outside`) up to `most` longer than the wait's own timeout, once. Called by the owner of
  /// both communicators (`group::cpu_group`) before the first call, on every rank of the node.
  void expect_outside(std::chrono::milliseconds most) noexcept { s_->outside_most = std::max(most, std::chrono::milliseconds(0)); }

  /// @brief Marks this rank as inside a call of another communicator while it lives
  /// (`communicator::outside`).
  class outside_guard {
   public:
    explicit outside_guard(detail::state* s) noexcept : s_(s) {}
    outside_guard(outside_guard&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    outside_guard& operator=(outside_guard&&) = delete;
    ~outside_guard() {
      if (s_) s_->leave_outside();
    }

   private:
    detail::state* s_;
  };
  /// @brief Tells the node's ranks that this rank is inside a call of another communicator (the
  /// hierarchical allreduce's inter-node step), described by `what` ("gloo allreduce #12 (rail
  /// 0, rank 0/2) for job rank 2", up to 119 characters), which fails by itself within `bound`.
  /// Until the guard ends, a peer whose wait for this rank reaches its deadline waits `bound`
  /// longer once, so the error of the call at the end of the chain (delivered to the node by
  /// `abort`) arrives first; if none does, the peer's timeout names `what`.
  ///
  /// The extra wait is at most `expect_outside`'s `most` (none unless it was called), and the
  /// deadline of asynchronous calls' work handles grows by as much.
  [[nodiscard]] outside_guard outside(std::string_view what, std::chrono::milliseconds bound) noexcept {
    s_->enter_outside(what, bound);
    return outside_guard(s_.get());
  }

 private:
  // A synchronous call: after every queued one, on the caller's thread.
  template <class F>
  void run(F&& f) {
    engine_->drain();
    s_->seq = ++issued_;
    s_->note = note_;  // (an asynchronous call sets none: submit)
    f();
    if (note_ && note_->open) [[unlikely]]  // (the recorder's path out of the way of the other)
      note_->close();
  }
  template <class F>
  async::work submit(collective c, const options& o, F&& f) {
    const std::uint64_t seq = ++issued_;
    const auto timeout = timeout_or(o, s_->cfg.timeout) + s_->outside_most;
    return engine_->submit({c, seq, timeout, {}}, [s = s_.get(), seq, f = std::forward<F>(f)] {
      s->seq = seq;
      s->note = nullptr;  // (the blocking calls' note: run)
      f(*s);
    });
  }

  std::unique_ptr<detail::state> s_;
  std::unique_ptr<async::engine> engine_;
  std::uint64_t issued_ = 0;
  trace::arrival_note* note_ = nullptr;  // note_arrivals
};

static_assert(async_communicator<communicator>);

}  // namespace shm
KFT_NAMESPACE_END
