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
#pragma once

#include <kft/config.hpp>
#include <kft/core/timeout.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/communicator.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/types.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <kft/async/engine.hpp>
#include <kft/core/deadline.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/gloo/device.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo {

using namespace std::chrono_literals;

/// @brief Settings of one communicator (the transport reads no environment variable).
struct config {
  std::chrono::milliseconds timeout = job_timeout();  ///< default deadline of every call and of connecting (KFT_TIMEOUT)
  std::chrono::milliseconds report_grace = timeouts().report_grace;  ///< after a failure: how long to wait for the others' records
  group_identity identity{};                    ///< where this communicator sits in the job
  std::string host;                             ///< this rank's host, for the others' messages
};

namespace detail {

// One Gloo context and what kft keeps beside it.
struct state {
  std::shared_ptr<rendezvous::store> store;
  std::shared_ptr<::gloo::rendezvous::Context> ctx;
  config cfg;
  int rank = 0, size = 0;
  std::uint64_t issued = 0;
  std::vector<int> world_of;       // job rank of each member
  std::vector<std::string> host_of;  // host of each member
  std::mutex stop_mu;                // the latch is set from abort() on any thread
  kft::detail::failure_latch stop;
  std::vector<unsigned char> scratch;  // reduce-scatter: two slices
  std::unique_ptr<async::engine> engine;

  ~state() { engine.reset(); }  // queued work first (each call bounded by its deadline)

  int world(int r) const { return r >= 0 && r < static_cast<int>(world_of.size()) ? world_of[static_cast<std::size_t>(r)] : r; }
  std::string who(int r) const {
    std::string s = "rank " + std::to_string(world(r));
    if (r >= 0 && r < static_cast<int>(host_of.size()) && !host_of[static_cast<std::size_t>(r)].empty())
      s += " (" + host_of[static_cast<std::size_t>(r)] + ")";
    return s;
  }
  error_site site(std::string op, std::uint64_t seq) const {
    return error_site::in(cfg.identity, rank, size, "gloo " + std::move(op), seq);
  }
  std::chrono::milliseconds timeout_of(const options& o) const { return o.timeout.count() > 0 ? o.timeout : cfg.timeout; }
  void require(collective c, std::uint64_t seq) {
    std::lock_guard lock(stop_mu);
    stop.check(site(std::string(name(c)), seq));
  }

  // What the other ranks recorded about this failure (bounded: a host cut off from the store
  // must not hold this rank past its grace).
  struct findings {
    std::string text;
    std::string aborted;  // "rank 3 (host b): reason" when a rank aborted
  };
  findings compare_notes(collective c, std::uint64_t seq, const std::string& what) {
    auto done = std::make_shared<std::promise<findings>>();
    auto fut = done->get_future();
    const auto grace = cfg.report_grace;
    std::thread([st = store, me = rank, n = size, seq, what, grace, done, op = std::string(name(c)), world_of = world_of,
                 host_of = host_of] {
      findings f;
      try {
        st->set("kft/fail/" + std::to_string(me), op + " #" + std::to_string(seq) + ": " + what);
        std::vector<std::string> notes(static_cast<std::size_t>(n));
        const auto d = deadline::after(grace);
        for (;;) {
          int missing = 0;
          for (int r = 0; r < n; ++r) {
            auto& note = notes[static_cast<std::size_t>(r)];
            if (note.empty()) note = st->try_get("kft/fail/" + std::to_string(r)).value_or("");
            missing += note.empty();
          }
          if (missing == 0 || d.passed() || st->try_get("kft/abort")) break;
          std::this_thread::sleep_for(20ms);
        }
        auto name_of = [&](int r) {
          std::string s = "rank " + std::to_string(world_of[static_cast<std::size_t>(r)]);
          if (!host_of[static_cast<std::size_t>(r)].empty()) s += " (" + host_of[static_cast<std::size_t>(r)] + ")";
          return s;
        };
        int aborter = -1;
        if (auto a = st->try_get("kft/abort")) {
          const auto sp = a->find(' ');
          aborter = std::stoi(a->substr(0, sp));
          f.aborted = (aborter >= 0 && aborter < n ? name_of(aborter) : "rank ?") + " aborted the communicator: " +
                      (sp == std::string::npos ? "" : a->substr(sp + 1));
          return done->set_value(std::move(f));
        }
        std::string silent, failed;
        int silent_n = 0, failed_n = 0;
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          const auto& note = notes[static_cast<std::size_t>(r)];
          if (note.empty()) silent += (silent_n++ ? ", " : "") + name_of(r);
          else if (failed_n++ < 3) failed += std::string(failed.empty() ? "" : "; ") + name_of(r) + " failed too at " + note;
        }
        if (silent_n)
          f.text += "; " + std::string(silent_n == 1 ? "the rank that" : "the ranks that") +
                    " recorded no failure within " + kft::detail::describe_duration(grace) +
                    " (stopped, dead, cut off, or not in this call): " + silent;
        else if (n > 1)
          f.text += "; every other rank failed too";
        if (failed_n) f.text += "; " + failed + (failed_n > 3 ? "; ..." : "");
      } catch (const std::exception& e) {
        f.text = "; (the store could not be reached to compare notes with the other ranks: " + std::string(e.what()) + ")";
      }
      done->set_value(std::move(f));
    }).detach();
    if (fut.wait_for(grace + 1s) == std::future_status::ready) return fut.get();
    return {"; (the store did not answer within " + kft::detail::describe_duration(grace + 1s) +
                " to compare notes with the other ranks)",
            {}};
  }

  // A Gloo call failed: record it, cut the connections (the peers fail now, not at their own
  // deadlines), learn what the others saw, and throw kft's error.
  [[noreturn]] void fail(collective c, std::uint64_t seq, std::size_t count, dtype t, std::chrono::milliseconds timeout,
                         const std::string& what) {
    const std::string op(name(c));
    std::string local_abort;
    {
      std::lock_guard lock(stop_mu);
      if (stop.stopped()) local_abort = stop.reason();
      stop.set("a failed " + op + " #" + std::to_string(seq));
    }
    try {
      ctx->closeConnections();
    } catch (...) {  // already closed by the peer: nothing to cut
    }
    if (!local_abort.empty())
      throw usage_error(op + " #" + std::to_string(seq) + " was cut short: this rank's communicator was " + local_abort,
                        site(op, seq));
    const auto notes = compare_notes(c, seq, what);
    const std::string shape = " (" + std::to_string(count) + " x " + std::string(kft::name(t)) + ")";
    if (!notes.aborted.empty())
      throw remote_error(op + shape + " stopped: " + notes.aborted, site(op, seq));
    if (what.find("Timed out") != std::string::npos)
      throw timeout_error(op + shape + " timed out after " + kft::detail::describe_duration(timeout) + " (Gloo: " + what +
                              ")" + notes.text,
                          site(op, seq));
    throw transport_error(op + shape + " failed: " + what + notes.text, site(op, seq));
  }

  // Gloo's messages start with its source location ("[./gloo/transport/tcp/pair.cc:598] ").
  static std::string tidy(std::string what) {
    if (what.starts_with("[")) {
      const auto close = what.find("] ");
      if (close != std::string::npos && what.find(".cc:") < close) what.erase(0, close + 2);
    }
    return what;
  }

  template <class F>
  void guarded(collective c, std::uint64_t seq, std::size_t count, dtype t, std::chrono::milliseconds timeout, F&& f) {
    const sigpipe_blocked quiet;  // a peer gone mid-write is an EPIPE error here, not the process's end
    try {
      f();
    } catch (const ::gloo::Exception& e) {
      fail(c, seq, count, t, timeout, tidy(e.what()));
    } catch (const std::system_error& e) {
      fail(c, seq, count, t, timeout, e.what());
    } catch (const ::gloo::EnforceNotMet& e) {  // an invariant of Gloo's broken under it (e.g. a closed socket)
      fail(c, seq, count, t, timeout, tidy(e.what()));
    }
  }

  std::uint32_t tag(std::uint64_t seq) const { return static_cast<std::uint32_t>(seq); }
};

// Gloo's buffers are typed by element size only; kft's kernels do the arithmetic.
template <class F>
void by_size(std::size_t es, F&& f) {
  switch (es) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    default: return f(std::uint64_t{});
  }
}

inline ::gloo::AllreduceOptions::Func reduction(dtype t, op_kind op) {
  const op_kind k = op == op_kind::avg ? op_kind::sum : op;
  return [t, k](void* out, const void* a, const void* b, std::size_t n) {
    const void* src[2] = {a, b};
    kernels::reduce(out, src, 2, n, t, k, 1);
  };
}

inline void divide(void* data, std::size_t count, dtype t, int by) {
  const void* src[1] = {data};
  kernels::reduce(data, src, 1, count, t, op_kind::avg, by);
}

inline void allreduce(state& s, const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o,
                      std::uint64_t seq) {
  s.require(collective::allreduce, seq);
  const std::size_t es = size_of(t);
  if (count == 0) return;
  if (in != out) std::memcpy(out, in, count * es);
  if (s.size == 1) return;
  const auto timeout = s.timeout_of(o);
  s.guarded(collective::allreduce, seq, count, t, timeout, [&] {
    ::gloo::AllreduceOptions g(s.ctx);
    g.setAlgorithm(::gloo::AllreduceOptions::Algorithm::RING);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), count); });
    g.setReduceFunction(reduction(t, op));
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::allreduce(g);
  });
  if (op == op_kind::avg) divide(out, count, t, s.size);
}

inline void broadcast(state& s, const void* in, void* out, std::size_t count, dtype t, int root, const options& o,
                      std::uint64_t seq) {
  s.require(collective::broadcast, seq);
  const std::size_t es = size_of(t);
  if (s.rank == root && in != out && count) std::memcpy(out, in, count * es);
  if (s.size == 1 || count == 0) return;
  const auto timeout = s.timeout_of(o);
  s.guarded(collective::broadcast, seq, count, t, timeout, [&] {
    ::gloo::BroadcastOptions g(s.ctx);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), count); });
    g.setRoot(root);
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::broadcast(g);
  });
}

inline void allgather(state& s, const void* in, void* out, std::size_t send_count, dtype t, const options& o,
                      std::uint64_t seq) {
  s.require(collective::allgather, seq);
  const std::size_t es = size_of(t), bytes = send_count * es;
  auto* mine = static_cast<unsigned char*>(out) + static_cast<std::size_t>(s.rank) * bytes;
  if (in != mine && bytes) std::memmove(mine, in, bytes);
  if (s.size == 1 || send_count == 0) return;
  const auto timeout = s.timeout_of(o);
  s.guarded(collective::allgather, seq, send_count, t, timeout, [&] {
    ::gloo::AllgatherOptions g(s.ctx);
    by_size(es, [&]<class T>(T) { g.setOutput(static_cast<T*>(out), send_count * static_cast<std::size_t>(s.size)); });
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::allgather(g);
  });
}

inline void barrier(state& s, const options& o, std::uint64_t seq) {
  s.require(collective::barrier, seq);
  if (s.size == 1) return;
  const auto timeout = s.timeout_of(o);
  s.guarded(collective::barrier, seq, 0, dtype::u8, timeout, [&] {
    ::gloo::BarrierOptions g(s.ctx);
    g.setTag(s.tag(seq));
    g.setTimeout(timeout);
    ::gloo::barrier(g);
  });
}

inline constexpr std::uint8_t ring_slot_prefix = 0x6b;  // 'k': apart from Gloo's own collectives' slots

// kft's ring reduce-scatter: chunk c starts at rank c+1 and travels right, each rank adding its
// own slice c, and ends reduced at rank c. Two slices of scratch (the partial being sent, the
// one arriving) alternate.
inline void reduce_scatter(state& s, const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                           const options& o, std::uint64_t seq) {
  s.require(collective::reduce_scatter, seq);
  const std::size_t es = size_of(t), bytes = recv_count * es, p = static_cast<std::size_t>(s.size),
                    r = static_cast<std::size_t>(s.rank);
  const auto* src = static_cast<const unsigned char*>(in);
  if (recv_count == 0) return;
  if (s.size == 1) {
    if (src != out) std::memmove(out, src, bytes);
    return;
  }
  const auto timeout = s.timeout_of(o);
  const op_kind k = op == op_kind::avg ? op_kind::sum : op;
  if (s.scratch.size() < 2 * bytes) s.scratch.resize(2 * bytes);
  unsigned char* buf[2] = {s.scratch.data(), s.scratch.data() + bytes};
  const int right = (s.rank + 1) % s.size, left = (s.rank + s.size - 1) % s.size;
  const auto slot = ::gloo::Slot::build(ring_slot_prefix, s.tag(seq));
  s.guarded(collective::reduce_scatter, seq, recv_count, t, timeout, [&] {
    const auto d = deadline::after(timeout);
    auto left_ms = [&] { return std::max(d.left(), std::chrono::milliseconds(1)); };
    // Step 0 sends this rank's own slice r-1 as it is.
    auto first = s.ctx->createUnboundBuffer(const_cast<unsigned char*>(src) + ((r + p - 1) % p) * bytes, bytes);
    auto ub0 = s.ctx->createUnboundBuffer(buf[0], bytes);
    auto ub1 = s.ctx->createUnboundBuffer(buf[1], bytes);
    ::gloo::transport::UnboundBuffer* ubs[2] = {ub0.get(), ub1.get()};
    ::gloo::transport::UnboundBuffer* sending = first.get();
    int arriving = 0;
    for (std::size_t step = 0; step + 1 < p; ++step) {
      const std::size_t c = (r + 2 * p - step - 2) % p;  // the chunk arriving now
      ubs[arriving]->recv(left, slot);
      sending->send(right, slot);
      ubs[arriving]->waitRecv(left_ms());
      const void* parts[2] = {buf[arriving], src + c * bytes};
      const bool last = step + 2 == p;
      kernels::reduce(last ? out : buf[arriving], parts, 2, recv_count, t, k, 1);
      sending->waitSend(left_ms());
      sending = ubs[arriving];
      arriving ^= 1;
    }
  });
  if (op == op_kind::avg) divide(out, recv_count, t, s.size);
}

}  // namespace detail

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
    s_->cfg = std::move(cfg);
    s_->rank = rank;
    s_->size = size;
    if (!store) throw usage_error("a Gloo communicator needs a store", error_site::of("gloo init"));
    if (!device) throw usage_error("a Gloo communicator needs a device (make_device)", error_site::of("gloo init"));
    if (size < 1 || rank < 0 || rank >= size)
      throw usage_error("rank " + std::to_string(rank) + " of " + std::to_string(size) + " is not a place in a group",
                        error_site::of("gloo init"));
    s_->store = std::move(store);
    const int world = s_->cfg.identity.world_rank >= 0 ? s_->cfg.identity.world_rank : rank;
    s_->store->set("kft/member/" + std::to_string(rank), std::to_string(world) + " " + s_->cfg.host);
    s_->ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    s_->ctx->setTimeout(s_->cfg.timeout);
    if (size > 1) {
      store_adapter meet(s_->store, s_->cfg.timeout);
      const detail::sigpipe_blocked quiet;
      try {
        s_->ctx->connectFullMesh(meet, device);
      } catch (const ::gloo::Exception& e) {
        throw transport_error("Gloo could not connect this rank to its peers: " + detail::state::tidy(e.what()),
                              s_->site("connect", 0));
      } catch (const timeout_error& e) {  // a peer never published its address (Gloo's key = its rank)
        throw timeout_error("connecting to the other " + std::to_string(size - 1) + " rank(s) timed out after " +
                                kft::detail::describe_duration(s_->cfg.timeout) + ": " + e.detail(),
                            s_->site("connect", 0));
      }
    }
    for (int r = 0; r < size; ++r) {
      const auto m = s_->store->get("kft/member/" + std::to_string(r), s_->cfg.timeout);
      const auto sp = m.find(' ');
      s_->world_of.push_back(std::stoi(m.substr(0, sp)));
      s_->host_of.push_back(sp == std::string::npos ? std::string() : m.substr(sp + 1));
    }
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
  /// at its deadline, or sooner when a peer's closed connection reaches it, with a usage_error
  /// naming the abort.
  void abort(std::string_view reason) noexcept {
    if (!s_) return;
    {
      std::lock_guard lock(s_->stop_mu);
      if (s_->stop.stopped()) return;
      s_->stop.set("aborted: " + std::string(reason));
    }
    try {
      s_->store->set("kft/abort", std::to_string(s_->rank) + " " + std::string(reason));
    } catch (...) {  // the store is gone: the closed connections still stop the peers
    }
    try {
      const detail::sigpipe_blocked quiet;
      if (s_->ctx) s_->ctx->closeConnections();
    } catch (...) {
    }
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
    return s_->engine->submit({c, seq, s_->timeout_of(o), {}}, std::forward<F>(f));
  }

  std::shared_ptr<detail::state> s_;
};

static_assert(async_communicator<communicator>);

}  // namespace gloo
KFT_NAMESPACE_END
