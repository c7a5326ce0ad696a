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
#include <kft/core/flight_recorder.hpp>
#include <kft/core/ops.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/gloo/config.hpp>
#include <kft/transport/gloo/device.hpp>
#include <kft/transport/gloo/failure.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

// A Gloo context whose full mesh is connected through kft's store in two requests per rank
// (state::connect). Gloo keeps the transport context and device in protected members of its
// Context, which this subclass fills the way connectFullMesh does.
class mesh_context final : public ::gloo::rendezvous::Context {
 public:
  mesh_context(int r, int n) : ::gloo::rendezvous::Context(r, n) {}

  static std::string key(int from, int to) { return "mesh/" + std::to_string(from) + "/" + std::to_string(to); }

  // What each member published (this rank's own slots are left empty).
  struct peers {
    std::vector<std::string> places;     // "<job rank> <host>"
    std::vector<std::string> addresses;  // its pair's address as Gloo prints it ("[10.0.0.2]:4242")
  };

  // Publishes this rank's place and pair addresses, reads every peer's, connects every pair.
  peers connect(rendezvous::store& st, const std::string& place, std::shared_ptr<::gloo::transport::Device> dev,
                std::chrono::milliseconds timeout) {
    auto tc = dev->createContext(rank, size);
    tc->setTimeout(timeout);
    std::vector<rendezvous::key_value> mine;
    std::vector<std::string> wanted;
    mine.reserve(static_cast<std::size_t>(size - 1));
    wanted.reserve(static_cast<std::size_t>(size - 1));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const auto& pair = tc->createPair(peer);
      const auto address = pair->address().bytes();
      // "<text length> <place>\n<address as text><address bytes>": the text says who, and where
      // Gloo's messages about this pair will say the peer is; the bytes are what Gloo connects to.
      const std::string text = place + "\n" + pair->address().str();
      std::string value = std::to_string(text.size()) + " " + text;
      value.append(address.data(), address.size());
      mine.push_back({key(rank, peer), std::move(value)});
      wanted.push_back(key(peer, rank));
    }
    st.multi_set(mine);
    const auto got = st.multi_get(wanted, timeout);
    peers out;
    out.places.resize(static_cast<std::size_t>(size));
    out.addresses.resize(static_cast<std::size_t>(size));
    for (int peer = 0, i = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::string& v = got[static_cast<std::size_t>(i++)];
      const auto sp = v.find(' ');
      std::size_t len = 0;
      const bool ok = sp != std::string::npos && sp > 0 && sp < 12 &&
                      std::all_of(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(sp),
                                  [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                      (len = std::stoul(v.substr(0, sp)), sp + 1 + len < v.size());
      if (!ok)
        throw transport_error("rank " + std::to_string(peer) + " of the group published a malformed address under " +
                                  key(peer, rank) + " (" + std::to_string(v.size()) + " bytes)",
                              error_site::of("gloo connect"));
      const std::string text = v.substr(sp + 1, len);
      const auto nl = text.rfind('\n');
      out.places[static_cast<std::size_t>(peer)] = text.substr(0, nl);
      if (nl != std::string::npos) out.addresses[static_cast<std::size_t>(peer)] = text.substr(nl + 1);
      const std::vector<char> address(v.begin() + static_cast<std::ptrdiff_t>(sp + 1 + len), v.end());
      tc->getPair(peer)->connect(address);
    }
    device_ = std::move(dev);
    transportContext_ = std::move(tc);
    return out;
  }
};

// One Gloo context and what kft keeps beside it.
struct state {
  std::shared_ptr<rendezvous::store> store;
  std::shared_ptr<::gloo::rendezvous::Context> ctx;
  config cfg;
  int rank = 0, size = 0;
  std::uint64_t issued = 0;
  std::vector<int> world_of;       // job rank of each member
  std::vector<int> others_world;   // the other members' job ranks (what a Gloo call waits for)
  std::vector<std::string> host_of;  // host of each member
  std::vector<std::string> address_of;  // where Gloo's messages say each member's pair is ("[ip]:port")
  std::vector<int> lost;             // members this rank found gone (fail(); guarded by stop_mu)
  std::mutex stop_mu;                // the latch is set from abort() on any thread
  kft::detail::failure_latch stop;
  std::vector<unsigned char> scratch;  // reduce-scatter: two slices
  std::unique_ptr<async::engine> engine;

  ~state() { engine.reset(); }  // queued work first (each call bounded by its deadline)

  // Collective over the `n` ranks that meet in `st`, two store requests per rank whatever `n`:
  // each rank creates its Gloo pair for every other rank and publishes, in one multi_set, one
  // key per peer: "mesh/<from>/<to>" = its place (job rank, host) and the address of its pair
  // for <to>; then reads the keys addressed to it in one multi_get and connects its pairs.
  // (Gloo's own connectFullMesh asks the store 2n times per rank, and each rank reads every
  // rank's whole address list: O(n) requests and O(n^2) bytes per rank.)
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
    const std::string place = std::to_string(world_rank) + " " + cfg.host;
    auto mesh = std::make_shared<mesh_context>(rank, size);
    mesh->setTimeout(cfg.timeout);
    world_of.assign(static_cast<std::size_t>(size), 0);
    host_of.assign(static_cast<std::size_t>(size), std::string());
    world_of[static_cast<std::size_t>(rank)] = world_rank;
    host_of[static_cast<std::size_t>(rank)] = cfg.host;
    if (size > 1) {
      const sigpipe_blocked quiet;
      try {
        const auto met = mesh->connect(*store, place, device, cfg.timeout);
        address_of = met.addresses;
        for (int m = 0; m < size; ++m) {
          if (m == rank) continue;
          const auto& p = met.places[static_cast<std::size_t>(m)];
          const auto sp = p.find(' ');
          world_of[static_cast<std::size_t>(m)] = std::stoi(p.substr(0, sp));
          host_of[static_cast<std::size_t>(m)] = sp == std::string::npos ? std::string() : p.substr(sp + 1);
        }
      } catch (const ::gloo::Exception& e) {
        throw transport_error("Gloo could not connect this rank to its peers: " + tidy(e.what()), site("connect", 0));
      } catch (const timeout_error& e) {  // a peer never published its addresses
        throw timeout_error("connecting to the other " + std::to_string(size - 1) + " rank(s) timed out after " +
                                kft::detail::describe_duration(cfg.timeout) + ": " + e.detail(),
                            site("connect", 0));
      }
    }
    ctx = std::move(mesh);
    for (int m = 0; m < size; ++m)
      if (m != rank) others_world.push_back(world_of[static_cast<std::size_t>(m)]);
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

  // The peer whose side closed or reset this rank's connection is gone when it also recorded no
  // failure: a living rank whose call failed records at once, a killed one never does. Gloo's
  // message `what` names the peer's host ("Connection closed by peer [10.0.0.2]:41234"; the
  // port is whichever end connected), so the peer is the one silent member with that address:
  // none is counted when several silent members share it (one host, several ranks). A shrink
  // counts it as lost (lost_ranks), so the survivors decide as soon as the others have come, not
  // after the agreement's window.
  void note_lost(const std::string& what, const std::vector<int>& silent) {
    auto host_part = [](const std::string& a) {  // "[10.0.0.2]:4242" -> "[10.0.0.2]"
      const auto close = a.find(']');
      return a.starts_with("[") && close != std::string::npos ? a.substr(0, close + 1) : std::string();
    };
    int found = -1, matches = 0;
    for (int m : silent) {
      if (m < 0 || m >= static_cast<int>(address_of.size())) continue;
      const auto h = host_part(address_of[static_cast<std::size_t>(m)]);
      if (h.empty() || what.find(h + ":") == std::string::npos) continue;
      found = m;
      ++matches;
    }
    if (matches != 1) return;
    const std::lock_guard lock(stop_mu);
    if (std::find(lost.begin(), lost.end(), found) == lost.end()) lost.push_back(found);
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
    if (grace < cfg.report_grace) note_lost(what, notes.silent);
    const std::string shape = " (" + std::to_string(count) + " x " + std::string(kft::name(t)) + ")";
    // (the ranks this one waited for, as job ranks: the aborter, else those that recorded nothing)
    auto at = site(op, seq);
    if (notes.aborter >= 0) at.waiting_for.push_back(world(notes.aborter));
    else
      for (int m : notes.silent) at.waiting_for.push_back(world(m));
    if (!notes.aborted.empty())
      throw remote_error(op + shape + " stopped: " + notes.aborted, at);
    if (what.find("Timed out") != std::string::npos)
      throw timeout_error(op + shape + " timed out after " + kft::detail::describe_duration(timeout) + " (Gloo: " + what +
                              ")" + notes.text,
                          at);
    throw transport_error(op + shape + " failed: " + what + notes.text, at);
  }

  // Runs one Gloo call `f` of collective `c` #`seq`; what Gloo throws becomes `fail`'s error.
  template <class F>
  void guarded(collective c, std::uint64_t seq, std::size_t count, dtype t, std::chrono::milliseconds timeout, F&& f) {
    const sigpipe_blocked quiet;  // a peer gone mid-write is an EPIPE error here, not the process's end
    // (a dump taken meanwhile says this rank waits in Gloo for the other members: Gloo does not
    // say which one a call is blocked on)
    trace::waiting_now waits;
    if (!others_world.empty()) waits.point(others_world.data(), static_cast<int>(others_world.size()));
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
