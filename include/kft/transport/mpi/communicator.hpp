// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/mpi/communicator.hpp
/// @brief Collectives over MPI (component `kft::mpi`), with kft's dtypes, ops, errors and deadlines.
///
///     kft::mpi::communicator world;                       // a duplicate of MPI_COMM_WORLD
///     world.allreduce(std::span<const float>(g), std::span<float>(g), kft::ops::avg);
///     auto rail = world.split(local_rank, rank, "rail " + std::to_string(local_rank));
///     auto w = rail.allreduce_async(in, out, kft::ops::sum);
///     w.wait();
///
/// The communicator owns a duplicate of the caller's `MPI_Comm` (so kft's traffic never matches
/// the program's own), with `MPI_ERRORS_RETURN`: every MPI return code becomes a kft exception
/// through `kft::mpi_check`, keeping MPI's text. `state.hpp` has the nonblocking calls and their
/// deadlines, `ring.hpp` kft's ring, `types.hpp` the datatypes and f16/bf16 ops.
///
/// Asynchronous calls (`*_async`, returning `kft::async::work`) run in submission order. When
/// MPI was initialised with `MPI_THREAD_MULTIPLE` they progress on the communicator's own
/// engine thread (real background progress, `background_progress()`); otherwise MPI allows
/// calls from one thread only, so they start at once and progress whenever the caller tests or
/// waits (kft's ring then runs inside the call). Algorithms: `automatic` (MPI's own) and, for
/// allreduce, `ring`; any other is a `usage_error`.
///
/// `abort(reason)` stops this rank's use of the communicator (its calls then fail, naming the
/// reason); MPI cannot stop one communicator on the other ranks, which find out through their
/// deadlines. `abort_job()` ends the whole MPI job (`MPI_Abort`).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/communicator.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <kft/transport/concepts.hpp>
#include <kft/transport/mpi/ring.hpp>
#include <kft/transport/mpi/state.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi {

/// @brief An MPI communicator owned by kft: RAII, move-only; `split` is explicit.
class communicator : public typed_collectives<communicator> {
  using typed = typed_collectives<communicator>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  /// @brief Duplicates `comm` (collective over it). The default is MPI_COMM_WORLD.
  /// @throws usage_error when MPI is not initialised, transport_error when MPI fails
  explicit communicator(MPI_Comm comm = MPI_COMM_WORLD, config cfg = {}) : s_(std::make_shared<detail::state>()) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
      throw usage_error("MPI is not initialised (call MPI_Init before creating a kft::mpi::communicator)",
                        error_site::of("mpi communicator"));
    if (comm == MPI_COMM_NULL) throw usage_error("MPI_COMM_NULL given", error_site::of("mpi communicator"));
    s_->cfg = std::move(cfg);
    MPI_Comm dup = MPI_COMM_NULL;
    mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup", error_site::of("mpi communicator"));
    s_->adopt(dup);
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;

  /// @brief False for the result of a split with a negative color (no communicator).
  bool valid() const noexcept { return s_ && s_->comm != MPI_COMM_NULL; }
  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  std::uint64_t sequence() const noexcept { return s_->issued; }
  MPI_Comm native() const noexcept { return s_->comm; }
  const config& configuration() const noexcept { return s_->cfg; }
  /// @brief True when asynchronous work progresses on a thread of its own (MPI_THREAD_MULTIPLE).
  bool background_progress() const noexcept { return s_->engine != nullptr; }
  error_site next_site(collective c) const { return s_->site(std::string(name(c)), s_->issued + 1); }

  /// @brief Collective: ranks with the same `color` form a new communicator, ordered by `key`.
  /// A negative color gives an invalid (empty) communicator. `label` names it in messages
  /// ("rail 1": `kft: rank 5/8 (rail 1, rank 1/2) mpi allreduce #41: ...`).
  communicator split(int color, int key, std::string label = {}) const {
    drain();
    s_->require("split", s_->issued + 1);
    communicator c(empty{});
    c.s_->cfg = s_->cfg;
    c.s_->cfg.identity.label = label.empty() ? "split " + std::to_string(color) : std::move(label);
    MPI_Comm out = MPI_COMM_NULL;
    s_->check(MPI_Comm_split(s_->comm, color < 0 ? MPI_UNDEFINED : color, key, &out), "MPI_Comm_split", "split", 0);
    if (out != MPI_COMM_NULL) c.s_->adopt(out);
    return c;
  }

  // ---- runtime-typed collectives --------------------------------------------------------------

  /// @brief out = in reduced over all ranks; in == out is in place. `algo::ring` runs kft's ring;
  /// `automatic` MPI's own allreduce.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    const auto seq = issue(collective::allreduce, o, true);
    if (o.algorithm == algo::ring) return detail::ring_allreduce(*s_, in, out, count, t, op, o, seq);
    auto p = s_->start_allreduce(in, out, count, t, op, o, seq);
    s_->wait(p);
  }
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));
    auto p = s_->start_broadcast(in, out, count, t, root, o, issue(collective::broadcast, o, true));
    s_->wait(p);
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count x size), reduced over all ranks.
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    auto p = s_->start_reduce_scatter(in, out, recv_count, t, op, o, issue(collective::reduce_scatter, o, true));
    s_->wait(p);
  }
  /// @brief out (send_count x size) = every rank's in, in rank order.
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    auto p = s_->start_allgather(in, out, send_count, t, o, issue(collective::allgather, o, true));
    s_->wait(p);
  }
  void barrier(const options& o = {}) {
    auto p = s_->start_barrier(o, issue(collective::barrier, o, true));
    s_->wait(p);
  }

  // ---- asynchronous ---------------------------------------------------------------------------

  async::work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    const auto seq = issue(collective::allreduce, o, false);
    if (o.algorithm == algo::ring) {
      if (!s_->engine) {  // no thread may progress it: runs now
        detail::ring_allreduce(*s_, in, out, count, t, op, o, seq);
        return async::work::completed(collective::allreduce, seq);
      }
      return s_->engine->submit({collective::allreduce, seq, s_->timeout_of(o), {}},
                                [s = s_, in, out, count, t, op, o, seq] { detail::ring_allreduce(*s, in, out, count, t, op, o, seq); });
    }
    return launch(collective::allreduce, o, seq,
                  [=](detail::state& s) { return s.start_allreduce(in, out, count, t, op, o, seq); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));
    const auto seq = issue(collective::broadcast, o, false);
    return launch(collective::broadcast, o, seq,
                  [=](detail::state& s) { return s.start_broadcast(in, out, count, t, root, o, seq); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                                   const options& o = {}) {
    const auto seq = issue(collective::reduce_scatter, o, false);
    return launch(collective::reduce_scatter, o, seq,
                  [=](detail::state& s) { return s.start_reduce_scatter(in, out, recv_count, t, op, o, seq); });
  }
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    const auto seq = issue(collective::allgather, o, false);
    return launch(collective::allgather, o, seq,
                  [=](detail::state& s) { return s.start_allgather(in, out, send_count, t, o, seq); });
  }
  async::work barrier_async(const options& o = {}) {
    const auto seq = issue(collective::barrier, o, false);
    return launch(collective::barrier, o, seq, [=](detail::state& s) { return s.start_barrier(o, seq); });
  }

  /// @brief Stops this rank's use of the communicator: every later call fails naming `reason`.
  void abort(std::string_view reason) noexcept {
    if (s_) s_->stop.set("aborted: " + std::string(reason));
  }
  /// @brief Ends every process of the MPI job (`MPI_Abort`): for a failure nothing else can contain.
  [[noreturn]] void abort_job(std::string_view reason, int code = 1) noexcept {
    std::fprintf(stderr, "kft: rank %d/%d: aborting the MPI job: %.*s\n", s_ ? s_->rank : -1, s_ ? s_->size : -1,
                 static_cast<int>(reason.size()), reason.data());
    MPI_Abort(s_ && s_->comm != MPI_COMM_NULL ? s_->comm : MPI_COMM_WORLD, code);
    std::abort();
  }

 private:
  struct empty {};
  explicit communicator(empty) : s_(std::make_shared<detail::state>()) {}

  void drain() const {
    if (s_->engine) s_->engine->drain();
  }

  // Numbers a call; refuses algorithms MPI does not run. A synchronous call first lets the
  // queued ones finish, so every rank starts its collectives in program order.
  std::uint64_t issue(collective c, const options& o, bool sync) {
    const bool ok = o.algorithm == algo::automatic || (c == collective::allreduce && o.algorithm == algo::ring);
    if (!ok)
      kft::detail::unsupported_algorithm(o.algorithm, "MPI", c == collective::allreduce ? "auto, ring" : "auto",
                                         next_site(c));
    if (sync) drain();
    return ++s_->issued;
  }

  // An MPI_I* call as async work: on the engine (started there, in order, and polled to the
  // end), or started now and progressed by the caller's test/wait.
  template <class Start>
  async::work launch(collective c, const options& o, std::uint64_t seq, Start start) {
    const auto timeout = s_->timeout_of(o);
    if (s_->engine)
      return s_->engine->submit({c, seq, timeout, {}}, [s = s_, start] {
        auto p = start(*s);
        s->wait(p);
      });
    auto p = std::make_shared<detail::pending>(start(*s_));
    auto st = std::make_shared<async::work_state>();
    st->op = c;
    st->seq = seq;
    st->timeout = timeout;
    st->progress = [s = s_, p] { return s->test(*p); };
    st->on_timeout = [s = s_, p] { return std::make_exception_ptr(s->timed_out(*p)); };
    return async::work(std::move(st));
  }

  std::shared_ptr<detail::state> s_;
};

static_assert(async_communicator<communicator>);

}  // namespace mpi
KFT_NAMESPACE_END
