// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/process_group.hpp
/// @brief `kft::group::process_group`: any communicator behind one type, as the DDP layer
/// takes it (c10d's ProcessGroup over its backends, type-erased once: one virtual call per
/// collective, never per element).
///
///     kft::group::process_group pg(kft::group::node_communicator(store, me));   // owns it
///     auto w = pg.allreduce_async(grad.data(), grad.data(), n, kft::dtype::f32, kft::op_kind::avg);
///     w.wait();
///
/// It owns a communicator that satisfies `kft::async_communicator` (by value, or through a
/// `unique_ptr` for one that cannot move, such as a `cpu_group`), forwards the five
/// collectives sync and async, and is itself an `async_communicator` (the typed span forms
/// come from `typed_collectives`). `get<C>()` reaches the concrete communicator when one needs
/// it (zero-copy buffers of the shm communicator, say).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/async/work.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/group/shrink.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

class process_group : public typed_collectives<process_group> {
  using typed = typed_collectives<process_group>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  /// @brief Owns `comm` (moved in). `description` says what it is, for messages and logs.
  template <async_communicator C>
    requires(!std::same_as<std::remove_cvref_t<C>, process_group>)
  explicit process_group(C comm, std::string description = {})
      : impl_(std::make_unique<model<C>>(std::make_unique<C>(std::move(comm)))), what_(std::move(description)) {}
  /// @brief Owns `comm` through its pointer (for communicators that cannot move).
  template <async_communicator C>
  explicit process_group(std::unique_ptr<C> comm, std::string description = {})
      : impl_(std::make_unique<model<C>>(std::move(comm))), what_(std::move(description)) {
    if (!static_cast<model<C>&>(*impl_).c) throw usage_error("process_group needs a communicator", error_site::of("group"));
  }
  process_group(process_group&&) noexcept = default;
  process_group& operator=(process_group&&) noexcept = default;

  int rank() const noexcept { return impl_->rank(); }
  int size() const noexcept { return impl_->size(); }
  std::uint64_t sequence() const noexcept { return impl_->sequence(); }
  error_site next_site(collective c) const { return impl_->next_site(c); }
  /// @brief What the group is, e.g. "shared memory: 1 node x 4 ranks".
  const std::string& description() const noexcept { return what_; }

  /// @brief The owned communicator as a `C`, or nullptr when it is another type.
  template <class C>
  C* get() noexcept {
    auto* m = dynamic_cast<model<C>*>(impl_.get());
    return m ? m->c.get() : nullptr;
  }

  // Each call is recorded in the group's flight recorder when it has one (`record`): blocking
  // calls here, asynchronous ones when their work starts and completes.
  void allreduce(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    if (!rec_) return impl_->allreduce(in, out, n, t, op, o);
    traced(collective::allreduce, t, n, o, -1, [&] { impl_->allreduce(in, out, n, t, op, o); });
  }
  void broadcast(const void* in, void* out, std::size_t n, dtype t, int root, const options& o = {}) {
    if (!rec_) return impl_->broadcast(in, out, n, t, root, o);
    traced(collective::broadcast, t, n, o, root, [&] { impl_->broadcast(in, out, n, t, root, o); });
  }
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    if (!rec_) return impl_->reduce_scatter(in, out, n, t, op, o);
    traced(collective::reduce_scatter, t, n, o, -1, [&] { impl_->reduce_scatter(in, out, n, t, op, o); });
  }
  void allgather(const void* in, void* out, std::size_t n, dtype t, const options& o = {}) {
    if (!rec_) return impl_->allgather(in, out, n, t, o);
    traced(collective::allgather, t, n, o, -1, [&] { impl_->allgather(in, out, n, t, o); });
  }
  void barrier(const options& o = {}) {
    if (!rec_) return impl_->barrier(o);
    traced(collective::barrier, dtype::u8, 0, o, -1, [&] { impl_->barrier(o); });
  }

  async::work allreduce_async(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    if (!rec_) return impl_->allreduce_async(in, out, n, t, op, o);
    return traced_async(collective::allreduce, t, n, o, -1, [&] { return impl_->allreduce_async(in, out, n, t, op, o); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t n, dtype t, int root, const options& o = {}) {
    if (!rec_) return impl_->broadcast_async(in, out, n, t, root, o);
    return traced_async(collective::broadcast, t, n, o, root, [&] { return impl_->broadcast_async(in, out, n, t, root, o); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    if (!rec_) return impl_->reduce_scatter_async(in, out, n, t, op, o);
    return traced_async(collective::reduce_scatter, t, n, o, -1,
                        [&] { return impl_->reduce_scatter_async(in, out, n, t, op, o); });
  }
  async::work allgather_async(const void* in, void* out, std::size_t n, dtype t, const options& o = {}) {
    if (!rec_) return impl_->allgather_async(in, out, n, t, o);
    return traced_async(collective::allgather, t, n, o, -1, [&] { return impl_->allgather_async(in, out, n, t, o); });
  }
  async::work barrier_async(const options& o = {}) {
    if (!rec_) return impl_->barrier_async(o);
    return traced_async(collective::barrier, dtype::u8, 0, o, -1, [&] { return impl_->barrier_async(o); });
  }

  /// @brief Keeps a flight recorder of this group's last `s.entries` calls (none when 0):
  /// kft/core/flight_recorder.hpp. `make_process_group` does it from `KFT_TRACE_ENTRIES`; its
  /// dumps go where `trace::configure` said (`KFT_TRACE_DIR`).
  /// `id`: the group's name in the dumps, the same on every rank ("": its description, which
  /// may differ between hosts).
  void record(const trace::settings& s, std::string_view id = {}) {
    impl_->note_arrivals(nullptr);
    notes_ = false;
    note_.reset();
    rec_.reset();
    trace_generation_ = static_cast<std::uint32_t>(generation());
    if (s.entries) {
      rec_ = std::make_unique<trace::recorder>(what_, s.entries, rank(), size(), id);
      note_ = std::make_unique<trace::arrival_note>();
      note_->rec = rec_.get();
      note_->generation = trace_generation_;
      note_->last_seq = impl_->sequence();
      take_notes();
    }
  }
  /// @brief This group's flight recorder, or nullptr.
  const trace::recorder* recorder() const noexcept { return rec_.get(); }

  void abort(std::string_view reason) noexcept {
    if (impl_) impl_->abort(reason);
    if (rec_) trace::dump("abort");
  }

  /// @brief The group's ranks this rank knows are gone, after a call failed: on its node, those
  /// whose processes are gone; across nodes, a Gloo peer that closed the connection and recorded
  /// no failure. What `shrink` files with this rank's arrival, so the survivors together expect
  /// the right count and decide without waiting out `shrink_options::window`.
  std::vector<int> lost_ranks() const { return impl_->lost_ranks(); }

  /// @brief Collective over the survivors, after a call failed because ranks died (a
  /// `remote_error`): they agree through `store` on who is left (group/shrink.hpp) and this
  /// group becomes the smaller one in place, so whoever holds a reference to it keeps a working
  /// group; its rank and size change. A node's shared-memory group shrinks in place; the Gloo
  /// group `make_process_group` builds across nodes is built again over the survivors (its
  /// factory set `rebuild_with`), each generation under store keys of its own; an MPI group
  /// cannot (MPI without ULFM) and throws `membership_error` saying so, unchanged (the job
  /// falls back to a restart).
  membership shrink(std::shared_ptr<rendezvous::store> store, const shrink_options& o = {}) {
    if (rebuild_ && !impl_->shrinks_in_place()) return shrink_by_rebuilding(std::move(store), o);
    auto m = impl_->shrink(std::move(store), o, what_);
    changed(m, "shrunk");
    return m;
  }

  /// @brief Builds the group again over a membership: `rank` of `size` ranks, generation
  /// `generation` (its own store keys). A group across nodes shrinks this way: the factory that
  /// made it says how to make it again (`make_process_group` for Gloo).
  using rebuilder = std::function<process_group(int rank, int size, std::uint64_t generation)>;
  /// @brief Makes this group shrinkable by rebuilding (`rebuilder`); `scope` names its
  /// agreements in the store (the job's: every rank passes the same).
  void rebuild_with(rebuilder r, std::string scope) {
    rebuild_ = std::move(r);
    scope_ = std::move(scope);
  }

  /// @brief Collective, at a step boundary: how many ranks are waiting to join this group
  /// (restarted workers, spares: `join`). Rank 0 asks `store` (one call) and broadcasts the
  /// answer, so every rank gets the same number. 0 for a group that cannot grow.
  std::int64_t waiting_to_join(const std::shared_ptr<rendezvous::store>& store) {
    if (!grows()) return 0;  // (an MPI group: no call at all)
    std::int64_t n = 0;
    if (rank() == 0 && store) n = std::max<std::int64_t>(tickets(*store) - admitted_, 0);
    broadcast(&n, &n, 1, dtype::i64, 0);
    return n;
  }

  /// @brief Collective, at a step boundary, after `waiting_to_join` said some wait: admits
  /// them and becomes the larger group in place (generation + 1); the joiners' `join` (or
  /// `join_rebuilt`, across nodes) returns at the same time. A node's group grows in place; the
  /// Gloo group `make_process_group` builds across nodes is built again over the members and
  /// the joiners. The new ranks hold nothing yet: the caller sends them its state.
  membership grow(std::shared_ptr<rendezvous::store> store, const shrink_options& o = {}) {
    if (!store) throw usage_error("grow: no store", error_site::of("join"));
    std::int64_t t = rank() == 0 ? tickets(*store) : 0;
    broadcast(&t, &t, 1, dtype::i64, 0);
    if (rebuild_ && !impl_->shrinks_in_place()) return grow_by_rebuilding(std::move(store), t, o);
    auto m = impl_->grow(std::move(store), admitted_, t, o, what_);
    admitted_ = t;
    changed(m, "grown");
    return m;
  }

  /// @brief Rank 0 tells ranks still waiting to join that this group finished (they get
  /// `join_closed_error`). Call it when the work is done.
  void close_joins(const std::shared_ptr<rendezvous::store>& store) {
    if (rank() != 0 || !store) return;
    if (rebuild_ && !impl_->shrinks_in_place()) group::close_joins(*store, scope_);
    else impl_->close_joins(*store);
  }

  /// @brief A rank joining a running group across nodes (one `make_process_group` made and
  /// `rebuild_with` can build again) as founding rank `id` of `founding`: asks through `store`
  /// under the group's `scope` (the same `rebuild_with` names), waits up to `wait` to be
  /// admitted at a step boundary, meets the members as the generation it was admitted to, and
  /// builds that generation with `rebuild` as they do. `newcomer()` is true.
  /// @throws join_closed_error when the group finished first
  static process_group join_rebuilt(std::shared_ptr<rendezvous::store> store, std::string scope, int id, int founding,
                                    std::chrono::milliseconds wait, rebuilder rebuild, const shrink_options& o = {}) {
    if (!store) throw usage_error("join: no store", error_site::of("join"));
    if (!rebuild) throw usage_error("join: no way to build the group (rebuilder)", error_site::of("join"));
    auto [a, m] = join_members(*store, scope, id, founding, wait, o);
    process_group g = rebuild(m.rank, m.size(), a.generation);
    g.what_ += " (joined as rank " + std::to_string(id) + ": members " + m.describe() + ", generation " +
               std::to_string(m.generation) + ")";
    g.rebuild_ = std::move(rebuild);
    g.scope_ = std::move(scope);
    g.members_ = m.members;
    g.generation_ = a.generation;
    g.founding_ = founding;
    g.admitted_ = a.tickets;
    g.newcomer_ = true;
    return g;
  }

  /// @brief True when this process joined a running group (`join`): it holds no state of
  /// the members' yet (the trainer takes it from them).
  bool newcomer() const noexcept { return newcomer_; }
  /// @brief How many times the membership changed (shrinks and joins): 0 as first built.
  std::uint64_t generation() const noexcept { return rebuild_ ? generation_ : impl_->generation(); }
  /// @brief How many ranks the group had when it was first built (a node's local ranks).
  int founding_size() const noexcept { return founding_ ? founding_ : size(); }

  /// @brief A rank joining a running node group as founding rank `id` of `founding`: asks
  /// through `store` (the store the members shrink through), waits up to `wait` to be admitted
  /// at a step boundary, and returns the grown group (`newcomer()` true).
  /// @throws join_closed_error when the group finished first
  static process_group join(std::shared_ptr<rendezvous::store> store, shm::config cfg, int id, int founding,
                            std::chrono::milliseconds wait, const shrink_options& o = {}) {
    std::int64_t tickets = 0;
    auto next = group::join(std::move(store), std::move(cfg), id, founding, wait, o, &tickets);
    const int n = next.comm.size();
    process_group g(std::move(next.comm), "shared memory: 1 node x " + std::to_string(n) + " ranks (joined as rank " +
                                              std::to_string(id) + ": members " + next.members.describe() +
                                              ", generation " + std::to_string(next.members.generation) + ")");
    g.admitted_ = tickets;
    g.newcomer_ = true;
    g.founding_ = founding;
    return g;
  }

  /// @brief A buffer inside the communicator's shared memory, where its collectives read it in
  /// place (the shm transport's pool); nullptr when it has none or no room. Collective: every
  /// rank asks for the same sizes in the same order.
  void* allocate_shared(std::size_t bytes) { return impl_->allocate_shared(bytes); }

 private:
  struct base {
    virtual ~base() = default;
    virtual int rank() const noexcept = 0;
    virtual int size() const noexcept = 0;
    virtual std::uint64_t sequence() const noexcept = 0;
    virtual error_site next_site(collective c) const = 0;
    virtual void allreduce(const void*, void*, std::size_t, dtype, op_kind, const options&) = 0;
    virtual void broadcast(const void*, void*, std::size_t, dtype, int, const options&) = 0;
    virtual void reduce_scatter(const void*, void*, std::size_t, dtype, op_kind, const options&) = 0;
    virtual void allgather(const void*, void*, std::size_t, dtype, const options&) = 0;
    virtual void barrier(const options&) = 0;
    virtual async::work allreduce_async(const void*, void*, std::size_t, dtype, op_kind, const options&) = 0;
    virtual async::work broadcast_async(const void*, void*, std::size_t, dtype, int, const options&) = 0;
    virtual async::work reduce_scatter_async(const void*, void*, std::size_t, dtype, op_kind, const options&) = 0;
    virtual async::work allgather_async(const void*, void*, std::size_t, dtype, const options&) = 0;
    virtual async::work barrier_async(const options&) = 0;
    virtual void abort(std::string_view) noexcept = 0;
    virtual void* allocate_shared(std::size_t) = 0;
    virtual membership shrink(std::shared_ptr<rendezvous::store>, const shrink_options&, const std::string& what) = 0;
    virtual membership grow(std::shared_ptr<rendezvous::store>, std::int64_t admitted, std::int64_t tickets,
                            const shrink_options&, const std::string& what) = 0;
    virtual std::int64_t join_tickets(rendezvous::store&) = 0;
    virtual void close_joins(rendezvous::store&) = 0;
    virtual int founding_size() const noexcept = 0;
    virtual std::uint64_t generation() const noexcept = 0;
    virtual bool shrinks_in_place() const noexcept = 0;
    virtual std::vector<int> lost_ranks() const = 0;
    // Hands the communicator the group's flight-recorder note; false: it takes none.
    virtual bool note_arrivals(trace::arrival_note*) noexcept = 0;
  };

  // A group across nodes: the survivors agree (by founding rank, sharing what each saw lost),
  // and every one builds the group again over the membership, generation + 1.
  membership shrink_by_rebuilding(std::shared_ptr<rendezvous::store> store, const shrink_options& o) {
    if (!store) throw usage_error("shrink: no store", error_site::of("shrink"));
    const int n = size(), me = rank();
    const auto ids = founding_ids();
    std::vector<int> lost;
    for (int r : impl_->lost_ranks())
      if (r >= 0 && r < n && r != me) lost.push_back(ids[static_cast<std::size_t>(r)]);
    const std::uint64_t generation = generation_ + 1;
    return rebuild_as(*store, agree_on_members(*store, scope_, generation, ids[static_cast<std::size_t>(me)], founding_,
                                       n - static_cast<std::int64_t>(lost.size()), o, lost, n),
                      ids, "shrunk");
  }

  // This group's ranks by founding rank (members_, or 0..size-1 before any change); sets
  // founding_ when it is not yet.
  std::vector<int> founding_ids() {
    const int n = size();
    if (!founding_) founding_ = n;
    std::vector<int> ids = members_;
    if (ids.empty())
      for (int r = 0; r < n; ++r) ids.push_back(r);
    return ids;
  }
  // Builds the generation `m` agreed on (its members were `before`) and becomes it.
  membership rebuild_as(rendezvous::store& store, membership m, const std::vector<int>& before, const char* how) {
    m.old_size = size();
    m.before = before;
    std::optional<process_group> built;
    try {
      built.emplace(rebuild_(m.rank, m.size(), m.generation));
    } catch (const error&) {  // (a member lost before the build: the next shrink skips this generation)
      detail::mark_failed(store, scope_, m.generation);
      throw;
    }
    process_group& next = *built;
    impl_ = std::move(next.impl_);  // (the previous generation's connections close here)
    take_notes();
    members_ = m.members;
    generation_ = m.generation;
    changed(m, how);
    return m;
  }

  // Whether ranks may join this group: a node's shared-memory group, or one built again over
  // each membership (across nodes).
  bool grows() const noexcept { return impl_->shrinks_in_place() || static_cast<bool>(rebuild_); }
  // How many join tickets were taken so far (one store call; rank 0 asks).
  std::int64_t tickets(rendezvous::store& store) {
    if (rebuild_ && !impl_->shrinks_in_place()) return group::join_tickets(store, scope_);
    return impl_->join_tickets(store);
  }

  // A group across nodes admits the tickets up to `tickets` (rank 0 writes the admissions),
  // every member and joiner agrees on generation + 1, and each builds it again.
  membership grow_by_rebuilding(std::shared_ptr<rendezvous::store> store, std::int64_t tickets, const shrink_options& o) {
    if (tickets <= admitted_)
      throw usage_error("grow: no ranks to admit (tickets " + std::to_string(admitted_) + ".." + std::to_string(tickets) +
                            ")",
                        error_site::of("join"));
    const int n = size(), me = rank();
    const auto ids = founding_ids();
    const std::uint64_t generation = generation_ + 1;
    const std::int64_t expected = n + (tickets - admitted_);
    if (me == 0) admit_joiners(*store, scope_, admitted_, tickets, generation, expected);
    auto m = rebuild_as(*store, agree_on_members(*store, scope_, generation, ids[static_cast<std::size_t>(me)], founding_,
                                         expected, o, {}, 0, intent::grow),
                        ids, "grown");
    admitted_ = tickets;
    return m;
  }

  void changed(const membership& m, const char* how) {
    if (!founding_) founding_ = impl_->founding_size();
    what_ += std::string(" (") + how + " to " + std::to_string(m.size()) + " of " + std::to_string(founding_) +
             " ranks: " + m.describe() + ", generation " + std::to_string(m.generation) + ")";
    trace_generation_ = static_cast<std::uint32_t>(generation());
    if (note_) {
      note_->generation = trace_generation_;
      note_->last_seq = impl_->sequence();
    }
    if (rec_) {
      rec_->rename(what_);
      rec_->place(m.rank, m.size());
    }
  }

  // The flight recorder's side of a call: recorded as it is issued, ended as it returns; a
  // failure that stops the group (its deadline, a dead or aborting peer, a cut connection)
  // writes every ring of the process (trace::dump).
  trace::slot_ref begin_trace(collective c, dtype t, std::size_t n, const options& o, int root, bool queued) noexcept {
    return rec_->begin(c, t, n, impl_->sequence() + 1, trace_generation_, o.algorithm, root, queued);
  }
  static void failed_trace(const trace::slot_ref& r, const std::exception_ptr& e) noexcept {
    trace::recorder::end(r, false);
    const auto dump = [](const kft::error& err, const char* why) {
      trace::note_failure(err.what(), err.waiting_for());
      trace::dump(why);
    };
    try {
      std::rethrow_exception(e);
    } catch (const timeout_error& err) {
      dump(err, "deadline");
    } catch (const remote_error& err) {
      dump(err, "a peer failed");
    } catch (const transport_error& err) {
      dump(err, "a connection failed");
    } catch (const mismatch_error& err) {
      dump(err, "mismatch");
    } catch (...) {
    }
  }
  // A transport that takes notes (shm) writes its blocking calls' entries itself, begun once
  // this rank's arrival is out, where the wait for the others hides it, and ended as they
  // return (trace::arrival_note); the group writes only those of calls that failed before their
  // arrival. The other transports' calls are recorded here, before they start.
  // (always handed over, null included: a communicator moved here from a rebuilt group may hold
  // that group's note, which dies with it)
  void take_notes() noexcept { notes_ = impl_ && impl_->note_arrivals(note_.get()) && note_; }
  template <class F>
  void traced(collective c, dtype t, std::size_t n, const options& o, int root, F&& call) {
    if (!notes_) {
      const auto r = begin_trace(c, t, n, o, root, false);
      try {
        call();
      } catch (...) {
        failed_trace(r, std::current_exception());
        throw;
      }
      return trace::recorder::end(r, true);
    }
    try {
      call();
    } catch (...) {
      failed_trace(note_->failed(c, t, n, impl_->sequence(), o.algorithm, root), std::current_exception());
      throw;
    }
  }
  template <class F>
  async::work traced_async(collective c, dtype t, std::size_t n, const options& o, int root, F&& call) {
    const auto r = begin_trace(c, t, n, o, root, true);
    async::work w = [&]() -> async::work {
      try {
        return call();
      } catch (...) {
        failed_trace(r, std::current_exception());
        throw;
      }
    }();
    w.record_into(r);
    return w;
  }

  // A backend's own work handle becomes async::work (it already is one for kft's transports).
  template <class W>
  static async::work as_work(W&& w) {
    if constexpr (std::same_as<std::remove_cvref_t<W>, async::work>) {
      return std::forward<W>(w);
    } else {
      auto st = std::make_shared<async::work_state>();
      st->op = w.op();
      st->seq = w.sequence();
      st->progress = [h = std::make_shared<std::remove_cvref_t<W>>(std::forward<W>(w))] { return h->test(); };
      return async::work(std::move(st));
    }
  }

  template <class C>
  struct model final : base {
    std::unique_ptr<C> c;
    explicit model(std::unique_ptr<C> comm) : c(std::move(comm)) {}
    int rank() const noexcept override { return c->rank(); }
    int size() const noexcept override { return c->size(); }
    std::uint64_t sequence() const noexcept override { return c->sequence(); }
    error_site next_site(collective k) const override {
      if constexpr (requires { c->next_site(k); }) return c->next_site(k);
      else return error_site::of(std::string(name(k)));
    }
    void allreduce(const void* i, void* o, std::size_t n, dtype t, op_kind op, const options& x) override {
      c->allreduce(i, o, n, t, op, x);
    }
    void broadcast(const void* i, void* o, std::size_t n, dtype t, int r, const options& x) override {
      c->broadcast(i, o, n, t, r, x);
    }
    void reduce_scatter(const void* i, void* o, std::size_t n, dtype t, op_kind op, const options& x) override {
      c->reduce_scatter(i, o, n, t, op, x);
    }
    void allgather(const void* i, void* o, std::size_t n, dtype t, const options& x) override { c->allgather(i, o, n, t, x); }
    void barrier(const options& x) override { c->barrier(x); }
    async::work allreduce_async(const void* i, void* o, std::size_t n, dtype t, op_kind op, const options& x) override {
      return as_work(c->allreduce_async(i, o, n, t, op, x));
    }
    async::work broadcast_async(const void* i, void* o, std::size_t n, dtype t, int r, const options& x) override {
      return as_work(c->broadcast_async(i, o, n, t, r, x));
    }
    async::work reduce_scatter_async(const void* i, void* o, std::size_t n, dtype t, op_kind op, const options& x) override {
      return as_work(c->reduce_scatter_async(i, o, n, t, op, x));
    }
    async::work allgather_async(const void* i, void* o, std::size_t n, dtype t, const options& x) override {
      return as_work(c->allgather_async(i, o, n, t, x));
    }
    async::work barrier_async(const options& x) override { return as_work(c->barrier_async(x)); }
    bool note_arrivals(trace::arrival_note* n) noexcept override {
      if constexpr (requires { c->note_arrivals(n); }) {
        c->note_arrivals(n);
        return true;
      } else {
        return false;
      }
    }
    void abort(std::string_view why) noexcept override { c->abort(why); }
    membership shrink(std::shared_ptr<rendezvous::store> store, const shrink_options& o,
                      const std::string& what) override {
      if constexpr (std::same_as<C, shm::communicator>) {
        auto next = group::shrink(*c, std::move(store), o);
        c = std::make_unique<C>(std::move(next.comm));
        return std::move(next.members);
      } else {
        throw membership_error("this group (" + what + ") cannot shrink: a node's shared-memory group and the "
                                   "Gloo group make_process_group builds can go on without a lost rank, MPI (without "
                                   "ULFM) cannot; restart the job (kftrun --max-restarts, a checkpoint) instead",
                               this->next_site(collective::barrier));
      }
    }
    membership grow(std::shared_ptr<rendezvous::store> store, std::int64_t admitted, std::int64_t tickets,
                    const shrink_options& o, const std::string& what) override {
      if constexpr (std::same_as<C, shm::communicator>) {
        auto next = group::grow(*c, std::move(store), admitted, tickets, o);
        c = std::make_unique<C>(std::move(next.comm));
        return std::move(next.members);
      } else {
        throw membership_error("this group (" + what + ") cannot grow: only a node's shared-memory group admits "
                                   "ranks that join a running job so far",
                               this->next_site(collective::barrier));
      }
    }
    std::int64_t join_tickets(rendezvous::store& store) override {
      if constexpr (std::same_as<C, shm::communicator>) return group::join_tickets(store, shrink_scope(c->configuration()));
      else return 0;
    }
    void close_joins(rendezvous::store& store) override {
      if constexpr (std::same_as<C, shm::communicator>) group::close_joins(store, shrink_scope(c->configuration()));
    }
    std::uint64_t generation() const noexcept override {
      if constexpr (std::same_as<C, shm::communicator>) return c->configuration().generation;
      else return 0;
    }
    bool shrinks_in_place() const noexcept override { return std::same_as<C, shm::communicator>; }
    std::vector<int> lost_ranks() const override {
      if constexpr (requires { c->lost_ranks(); }) return c->lost_ranks();
      else return {};
    }
    int founding_size() const noexcept override {
      if constexpr (std::same_as<C, shm::communicator>) return detail::founding_size(*c);
      else return c->size();
    }
    void* allocate_shared(std::size_t bytes) override {
      if constexpr (requires { c->allocate_bytes(bytes); }) {
        try {
          return c->allocate_bytes(bytes);
        } catch (const usage_error&) {  // no pool, or no room left: the caller uses its own memory
          return nullptr;
        }
      } else {
        return nullptr;
      }
    }
  };

  // (before impl_: a communicator holding it is destroyed first)
  std::unique_ptr<trace::arrival_note> note_;  // the recorder's note for the transport (record)
  std::unique_ptr<base> impl_;
  std::string what_;
  std::int64_t admitted_ = 0;  // join tickets admitted so far (equal on every rank)
  int founding_ = 0;           // the size the group was first built with (0: not changed yet)
  bool newcomer_ = false;      // built by join(): joined a running group
  rebuilder rebuild_;          // a group across nodes: how to build it again (shrink_by_rebuilding)
  std::string scope_;          // its agreements' name in the store
  std::vector<int> members_;   // its ranks by founding rank (empty: not shrunk)
  std::unique_ptr<trace::recorder> rec_;  // the flight recorder (record), or none
  std::uint32_t trace_generation_ = 0;    // generation(), kept for the recorder (changed())
  bool notes_ = false;                    // the transport writes blocking calls' entries (take_notes)
  std::uint64_t generation_ = 0;
};

static_assert(async_communicator<process_group>);

}  // namespace group
KFT_NAMESPACE_END
