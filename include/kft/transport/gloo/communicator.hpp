// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/communicator.hpp
/// @brief CPU collectives over Gloo's TCP transport (component `kft::gloo`), met through kft's
/// store, with kft's dtypes, ops, errors and deadlines: what carries data between nodes when
/// no MPI launcher started the job (kftrun agents, torchrun, a Kubeflow TrainJob).
///
///     auto nic = kft::gloo::choose_interface(env.get("KFT_SOCKET_IFNAME"), master_addr);
///     auto scoped = std::make_shared<kft::rendezvous::prefix_store>(store, "grad/");
///     kft::gloo::communicator comm(scoped, rank, size, kft::gloo::make_device(nic));
///     comm.allreduce(std::span<float>(g), kft::ops::avg);
///
/// Construction is collective: every rank publishes its place (job rank, host) in the store,
/// and Gloo connects a full mesh of TCP pairs through it (`store` must be a scope of its own,
/// e.g. a `prefix_store`, one per communicator). Collectives:
///  - allreduce: Gloo's ring (reduce-scatter then allgather: each segment reduced once, so every
///    rank gets the same bits), with kft's reduction kernels for every dtype and op (f16/bf16 in
///    float, rounded once per step); `avg` is a sum divided locally. Algorithms: `automatic`
///    and `ring` (the same); any other is a usage_error.
///  - broadcast, allgather, barrier: Gloo's.
///  - reduce_scatter: kft's ring over Gloo's point-to-point buffers (p-1 steps, each rank sends
///    one slice to its right while receiving one from its left): 1/p of an allreduce's traffic.
///
/// **Failures.** Every call has a deadline (`options::timeout`, else `config::timeout`). When a
/// call fails (a deadline, a peer's connection reset), this rank records the failure in the
/// store, closes its connections (so every peer's current call fails at once instead of at
/// its own deadline), and waits up to `config::report_grace` for the other ranks' records: the
/// error names the ranks that recorded none (stopped, dead, cut off, or not in this call),
/// with their hosts. A rank that called `abort(reason)` is named with its reason
/// (`remote_error`). After a failure the communicator refuses further calls.
///
/// Asynchronous calls run in submission order on the communicator's own thread (Gloo's calls
/// block); a synchronous call first lets them finish.
///
/// The facade. The pieces, one concern per file: `config.hpp` (deadlines, identity, host),
/// `device.hpp` (the interface, Gloo's TCP device, the store seen by Gloo, SIGPIPE),
/// `failure.hpp` (the failure and abort records in the store), `state.hpp` (connecting, the
/// sites errors name, the failure protocol every call runs under), and one file per collective
/// (`allreduce.hpp`, `broadcast.hpp`, `reduce_scatter.hpp`, `allgather.hpp`, `barrier.hpp`).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/communicator.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <kft/async/engine.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/gloo/allgather.hpp>
#include <kft/transport/gloo/allreduce.hpp>
#include <kft/transport/gloo/barrier.hpp>
#include <kft/transport/gloo/broadcast.hpp>
#include <kft/transport/gloo/config.hpp>
#include <kft/transport/gloo/device.hpp>
#include <kft/transport/gloo/reduce_scatter.hpp>
#include <kft/transport/gloo/state.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo {

/// @brief A Gloo context owned by kft: move-only, collective to build.
class communicator : public typed_collectives<communicator> {
  using typed = typed_collectives<communicator>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  /// @brief Collective over the `size` ranks that meet in `store` (a scope of their own).
  /// @throws usage_error for a bad place, timeout_error when a rank does not arrive within
  /// `cfg.timeout` (naming the keys), transport_error when Gloo cannot connect
  communicator(std::shared_ptr<rendezvous::store> store, int rank, int size,
               std::shared_ptr<::gloo::transport::Device> device, config cfg = {})
      : s_(std::make_shared<detail::state>()) {
    s_->connect(std::move(store), rank, size, std::move(device), std::move(cfg));
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  ~communicator() {
    if (s_ && s_->engine) s_->engine->drain();  // queued calls end here, not on their own thread
  }

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  std::uint64_t sequence() const noexcept { return s_->issued; }
  const config& configuration() const noexcept { return s_->cfg; }
  /// @brief The job rank of member `r` (for messages).
  int world_rank_of(int r) const { return s_->world(r); }
  error_site next_site(collective c) const { return s_->site(std::string(name(c)), s_->issued + 1); }
  /// @brief The members this rank found gone: a failed call's connection to it was closed or
  /// reset from its side and it recorded no failure within the grace (a killed process's kernel
  /// closes its sockets; a living rank whose call failed records at once). What a shrink
  /// counts as lost (group/shrink.hpp). Empty until a call failed that way.
  std::vector<int> lost_ranks() const {
    const std::lock_guard lock(s_->stop_mu);
    auto out = s_->lost;
    std::sort(out.begin(), out.end());
    return out;
  }
  /// @brief Gloo's context, for what kft does not wrap.
  const std::shared_ptr<::gloo::rendezvous::Context>& native() const noexcept { return s_->ctx; }

  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    detail::allreduce(*s_, in, out, count, t, op, o, issue(collective::allreduce, o, true));
  }
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));
    detail::broadcast(*s_, in, out, count, t, root, o, issue(collective::broadcast, o, true));
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count x size), reduced over all ranks.
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    detail::reduce_scatter(*s_, in, out, recv_count, t, op, o, issue(collective::reduce_scatter, o, true));
  }
  /// @brief out (send_count x size) = every rank's in, in rank order.
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    detail::allgather(*s_, in, out, send_count, t, o, issue(collective::allgather, o, true));
  }
  void barrier(const options& o = {}) { detail::barrier(*s_, o, issue(collective::barrier, o, true)); }

  async::work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    const auto seq = issue(collective::allreduce, o, false);
    return submit(collective::allreduce, o, seq,
                  [s = s_, in, out, count, t, op, o, seq] { detail::allreduce(*s, in, out, count, t, op, o, seq); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, size(), next_site(collective::broadcast));
    const auto seq = issue(collective::broadcast, o, false);
    return submit(collective::broadcast, o, seq,
                  [s = s_, in, out, count, t, root, o, seq] { detail::broadcast(*s, in, out, count, t, root, o, seq); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                                   const options& o = {}) {
    const auto seq = issue(collective::reduce_scatter, o, false);
    return submit(collective::reduce_scatter, o, seq, [s = s_, in, out, recv_count, t, op, o, seq] {
      detail::reduce_scatter(*s, in, out, recv_count, t, op, o, seq);
    });
  }
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    const auto seq = issue(collective::allgather, o, false);
    return submit(collective::allgather, o, seq,
                  [s = s_, in, out, send_count, t, o, seq] { detail::allgather(*s, in, out, send_count, t, o, seq); });
  }
  async::work barrier_async(const options& o = {}) {
    const auto seq = issue(collective::barrier, o, false);
    return submit(collective::barrier, o, seq, [s = s_, o, seq] { detail::barrier(*s, o, seq); });
  }

  /// @brief Stops the communicator on every rank: records `reason` in the store and closes this
  /// rank's connections, so each peer's current or next call fails with a `remote_error`
  /// naming this rank and the reason; this rank's later calls fail too. A call of this rank
  /// already in flight on another thread is not woken (Gloo offers no way to wake it): it ends
  /// at its deadline, or sooner when a peer's closed connection reaches it, with a remote_error
  /// naming the abort (as shm's call under way when its group is aborted).
  void abort(std::string_view reason) noexcept {
    if (s_) s_->abort(reason);
  }

 private:
  void drain() const {
    if (s_->engine) s_->engine->drain();
  }
  std::uint64_t issue(collective c, const options& o, bool sync) {
    const bool ok = o.algorithm == algo::automatic || (c == collective::allreduce && o.algorithm == algo::ring);
    if (!ok)
      kft::detail::unsupported_algorithm(o.algorithm, "Gloo", c == collective::allreduce ? "auto, ring" : "auto",
                                         next_site(c));
    if (sync) drain();
    return ++s_->issued;
  }
  template <class F>
  async::work submit(collective c, const options& o, std::uint64_t seq, F&& f) {
    if (!s_->engine) s_->engine = std::make_unique<async::engine>("gloo rank " + std::to_string(s_->rank));
    return s_->engine->submit({c, seq, kft::timeout_or(o, s_->cfg.timeout), {}}, std::forward<F>(f));
  }

  std::shared_ptr<detail::state> s_;
};

static_assert(async_communicator<communicator>);

}  // namespace gloo
KFT_NAMESPACE_END
