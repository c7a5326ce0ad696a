// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/state.hpp
/// @brief One Gloo context and what kft keeps beside it: connecting (the members' places in the
/// store, Gloo's full mesh), the sites errors name, and the failure protocol every collective
/// runs under (`guarded`: a failed call is recorded, the connections are cut, the others'
/// records are read, and kft's error is thrown; later calls are refused).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/state.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <kft/async/engine.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/gloo/config.hpp>
#include <kft/transport/gloo/device.hpp>
#include <kft/transport/gloo/failure.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

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

  // Collective over the `n` ranks that meet in `st`: each publishes its place (job rank, host)
  // under kft/member/<r>, Gloo connects a full mesh of TCP pairs through the store, and each
  // reads every member's place.
  void connect(std::shared_ptr<rendezvous::store> st, int r, int n, std::shared_ptr<::gloo::transport::Device> device,
               config c) {
    cfg = std::move(c);
    rank = r;
    size = n;
    if (!st) throw usage_error("a Gloo communicator needs a store", error_site::of("gloo init"));
    if (!device) throw usage_error("a Gloo communicator needs a device (make_device)", error_site::of("gloo init"));
    if (size < 1 || rank < 0 || rank >= size)
      throw usage_error("rank " + std::to_string(rank) + " of " + std::to_string(size) + " is not a place in a group",
                        error_site::of("gloo init"));
    store = std::move(st);
    const int world_rank = cfg.identity.world_rank >= 0 ? cfg.identity.world_rank : rank;
    store->set("kft/member/" + std::to_string(rank), std::to_string(world_rank) + " " + cfg.host);
    ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(cfg.timeout);
    if (size > 1) {
      store_adapter meet(store, cfg.timeout);
      const sigpipe_blocked quiet;
      try {
        ctx->connectFullMesh(meet, device);
      } catch (const ::gloo::Exception& e) {
        throw transport_error("Gloo could not connect this rank to its peers: " + tidy(e.what()), site("connect", 0));
      } catch (const timeout_error& e) {  // a peer never published its address (Gloo's key = its rank)
        throw timeout_error("connecting to the other " + std::to_string(size - 1) + " rank(s) timed out after " +
                                kft::detail::describe_duration(cfg.timeout) + ": " + e.detail(),
                            site("connect", 0));
      }
    }
    for (int m = 0; m < size; ++m) {
      const auto place = store->get("kft/member/" + std::to_string(m), cfg.timeout);
      const auto sp = place.find(' ');
      world_of.push_back(std::stoi(place.substr(0, sp)));
      host_of.push_back(sp == std::string::npos ? std::string() : place.substr(sp + 1));
    }
  }

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
  // Refuses call `c` #`seq` when an earlier failure or an abort stopped the communicator.
  void require(collective c, std::uint64_t seq) {
    std::lock_guard lock(stop_mu);
    stop.check(site(std::string(name(c)), seq));
  }

  // Stops the communicator on every rank: the abort record names this rank and `reason`, and
  // the closed connections end each peer's current call at once.
  void abort(std::string_view reason) noexcept {
    {
      std::lock_guard lock(stop_mu);
      if (stop.stopped()) return;
      stop.set("aborted: " + std::string(reason));
    }
    try {
      store->set(abort_key, std::to_string(rank) + " " + std::string(reason));
    } catch (...) {  // the store is gone: the closed connections still stop the peers
    }
    try {
      const sigpipe_blocked quiet;
      if (ctx) ctx->closeConnections();
    } catch (...) {
    }
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
    // This rank's own abort (another thread) stopped the call under way: a remote_error, as the
    // shared-memory transport's call under way when its group is aborted (a later call is
    // refused by the latch: a usage_error, as everywhere).
    if (!local_abort.empty())
      throw remote_error(op + " #" + std::to_string(seq) + " was cut short: this rank's communicator was " + local_abort,
                         site(op, seq));
    // A connection the peer's side closed or reset: its process died (the kernel closed its
    // sockets) or its own call failed and cut the connections, and then it records at once.
    // Half a second is plenty for the living to record; a dead rank never does, and the
    // survivors of a shrink should not wait out the whole grace to learn who is gone.
    auto grace = cfg.report_grace;
    if (what.find("reset by peer") != std::string::npos || what.find("closed by peer") != std::string::npos ||
        what.find("Broken pipe") != std::string::npos)
      grace = std::min(grace, std::chrono::milliseconds(500));
    const auto notes = compare_notes(store, rank, size, op, seq, what, grace, world_of, host_of);
    const std::string shape = " (" + std::to_string(count) + " x " + std::string(kft::name(t)) + ")";
    if (!notes.aborted.empty())
      throw remote_error(op + shape + " stopped: " + notes.aborted, site(op, seq));
    if (what.find("Timed out") != std::string::npos)
      throw timeout_error(op + shape + " timed out after " + kft::detail::describe_duration(timeout) + " (Gloo: " + what +
                              ")" + notes.text,
                          site(op, seq));
    throw transport_error(op + shape + " failed: " + what + notes.text, site(op, seq));
  }

  // Runs one Gloo call `f` of collective `c` #`seq`; what Gloo throws becomes `fail`'s error.
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

// `avg` is a sum divided locally: data[i] /= by, in kft's kernels.
inline void divide(void* data, std::size_t count, dtype t, int by) {
  const void* src[1] = {data};
  kernels::reduce(data, src, 1, count, t, op_kind::avg, by);
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
