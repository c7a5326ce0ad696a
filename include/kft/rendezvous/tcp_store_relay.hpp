// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/tcp_store_relay.hpp
/// @brief A node's relay to the job's store: a tcp_store_server that speaks for the clients of
/// its node over one connection (tagged requests, detail/tcp_wire.hpp), combining requests on
/// the way; what it does is in tcp_store_server::options::upstream. Its own header, so that its
/// code is compiled only where a relay is made (kftrun's agent, the scale bench, the tests).
///
///     rendezvous::tcp_store_server::options o{"127.0.0.1", 0, token, {}};
///     o.upstream = rendezvous::relay_to("10.0.0.1", 29500);  // the job's store
///     rendezvous::tcp_store_server relay(o);                  // the node's ranks connect to relay.port()
#pragma once

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kft/rendezvous/tcp_store_server.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief The relay inside a tcp_store_server (made by relay_to()'s options).
class tcp_store_relay final : public tcp_store_server::relay_base {
 public:
  /// Connects to the job's store and presents the token (in the server's constructor, before
  /// its loop starts).
  explicit tcp_store_relay(tcp_store_server& s) : s_(s) { connect_upstream(); }

  void request(tcp_store_server::client& c, wire::op o, wire::reader r) override { relay(c, o, std::move(r)); }
  void on_event(std::uint32_t ev) override { on_upstream(ev); }
  std::uint64_t sent() const noexcept override { return upstream_requests_.load(std::memory_order_relaxed); }

 private:
  using client = tcp_store_server::client;


  // Connects to the job's store and presents the token (before the loop starts).
  void connect_upstream() {
    const auto& u = s_.opt_.upstream;
    const auto deadline = detail::clock::now() + u.connect_timeout;
    const auto hello = wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str(s_.opt_.token).str(u.name).done();
    for (auto pause = std::chrono::milliseconds(20);;) {
      up_ = detail::connect_until(u.host, u.port, deadline, u.connect_timeout, {}, u.source_address);
      char buf[16];
      std::string why = detail::send_all(up_.get(), hello, deadline);
      if (why.empty()) {
        const auto got = detail::recv_at_least(up_.get(), buf, 5, sizeof buf, deadline);
        if (got.what == detail::recv_result::status::ok && got.got == 5 && wire::frame_length(buf) == 1) {
          if (static_cast<wire::status>(buf[4]) != wire::status::ok)
            throw config_error("KFT_RDZV_TOKEN", "(hidden)",
                               "was refused by the job's store at " + detail::endpoint(u.host, u.port) +
                                   " (this relay's token is not the job's)",
                               error_site::of("store relay"));
          break;
        }
        why = "no answer to the hello";
      }
      // (a store flooded with connections sheds some before their hello: again, with backoff)
      if (detail::clock::now() + pause >= deadline)
        throw transport_error("relay: cannot reach the job's store at " + detail::endpoint(u.host, u.port) + ": " + why,
                              error_site::of("store relay"), ECONNREFUSED);
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
    detail::set_nonblocking(up_.get(), true);
    detail::set_nodelay(up_.get());
    if (!s_.watch(up_.get(), EPOLL_CTL_ADD, EPOLLIN, tcp_store_server::upstream_tag))
      throw transport_error("epoll_ctl failed: " + detail::errno_text(errno), error_site::of("store relay"), errno);
    up_events_ = EPOLLIN;
  }

  // One client's request, sent up (combined with others where it can be).
  void relay(client& c, wire::op o, wire::reader r) {
    if (up_lost_) {
      s_.gone(c);
      return;
    }
    // (checked here: a malformed request sent up would end the relay's connection, every
    // client's; here it ends this client's)
    if (!well_formed(o, r)) return malformed(c, o);
    const std::string& payload = r.data();
    if (o == wire::op::add) {
      const auto key = r.str();
      const auto delta = r.i64();
      c.waiting = true;
      auto& q = adds_[key];
      q.queued.emplace_back(c.id, delta);
      if (!q.on_its_way) send_adds(key, q);
      return;
    }
    if (o == wire::op::get || o == wire::op::wait || o == wire::op::multi_get) {
      if (payload.size() < 5) return malformed(c, o);
      // Requests for the same keys share one: keyed by the payload less its timeout.
      std::string same = payload.substr(0, payload.size() - 4);
      wire::reader t(payload.substr(payload.size() - 4));
      const auto timeout = std::chrono::milliseconds(t.u32());
      const auto deadline = detail::clock::now() + timeout;
      c.waiting = true;
      if (timeout.count() > 0) {
        if (auto it = shared_.find(same); it != shared_.end() && deadline >= it->second.deadline) {
          it->second.waiters.emplace_back(c.id, deadline);
          return;
        }
        if (shared_.find(same) == shared_.end()) {
          auto& sh = shared_[same];
          sh.deadline = deadline;
          sh.waiters.emplace_back(c.id, deadline);
          send_up(payload, flight{flight::shared, 0, same, {}});
          return;
        }
      }
      send_up(payload, flight{flight::single, c.id, {}, {}});
      return;
    }
    c.waiting = true;
    send_up(payload, flight{flight::single, c.id, {}, {}});
  }

  // Whether a request (read past its op) has the fields its op calls for, and nothing more.
  static bool well_formed(wire::op o, wire::reader r) {
    switch (o) {
      case wire::op::set:
      case wire::op::set_owned:
        (void)r.str(), (void)r.str();
        break;
      case wire::op::get:
        (void)r.str(), (void)r.u32();
        break;
      case wire::op::wait:
      case wire::op::multi_get:
      case wire::op::multi_set: {
        const auto n = r.u32();
        if (!r.ok()) return false;
        if (n > wire::max_batch) return true;  // (the job's store refuses it, saying why)
        for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
          (void)r.str();
          if (o == wire::op::multi_set) (void)r.str();
        }
        if (o != wire::op::multi_set) (void)r.u32();
        break;
      }
      case wire::op::add:
        (void)r.str(), (void)r.i64();
        break;
      case wire::op::cas:
        (void)r.str(), (void)r.u8(), (void)r.str(), (void)r.str();
        break;
      case wire::op::erase:
      case wire::op::keys:
        (void)r.str();
        break;
      case wire::op::ping:
        break;
      default:  // hello (again), tagged, or no op at all
        return false;
    }
    return r.ok() && r.at_end();
  }

  void malformed(client& c, wire::op o) {
    s_.opt_.log("kft store " + s_.address() + ": dropped " + c.peer + ": malformed request (op " +
             std::to_string(static_cast<int>(o)) + ")");
    s_.gone(c);
  }

  // What a tagged request sent up is for.
  struct flight {
    enum kind_t { single, shared, adds } kind = single;
    std::uint64_t client = 0;  // single: the client it answers
    std::string key;           // shared: its entry in shared_; adds: the counter
    std::vector<std::pair<std::uint64_t, std::int64_t>> adders{};  // adds: (client, delta), in order
  };
  struct shared_wait {
    detail::clock::time_point deadline;  // the request on its way's
    std::vector<std::pair<std::uint64_t, detail::clock::time_point>> waiters;  // (client, its own deadline)
  };
  struct add_queue {
    bool on_its_way = false;
    std::vector<std::pair<std::uint64_t, std::int64_t>> queued;
  };

  void send_up(std::string_view payload, flight f) {
    const auto tag = ++next_tag_;
    in_flight_.emplace(tag, std::move(f));
    std::string frame = wire::writer().u8(static_cast<std::uint8_t>(wire::op::tagged)).u32(tag).raw(payload).done();
    if (up_out_.empty()) up_out_ = std::move(frame);
    else up_out_ += frame;
    upstream_requests_.fetch_add(1, std::memory_order_relaxed);
    flush_upstream();
  }

  // The adds queued on `key` go up as one.
  void send_adds(const std::string& key, add_queue& q) {
    std::int64_t sum = 0;
    for (const auto& [id, d] : q.queued) sum += d;
    q.on_its_way = true;
    flight f{flight::adds, 0, key, std::move(q.queued)};
    q.queued.clear();
    send_up(wire::writer().u8(static_cast<std::uint8_t>(wire::op::add)).str(key).i64(sum).done().substr(4), std::move(f));
  }

  void flush_upstream() {
    while (!up_out_.empty() && up_) {
      const ssize_t n = ::send(up_.get(), up_out_.data(), up_out_.size(), MSG_NOSIGNAL);
      if (n > 0) {
        up_out_.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return upstream_lost("sending to it failed: " + detail::errno_text(errno));
    }
    const std::uint32_t want = EPOLLIN | (up_out_.empty() ? 0u : static_cast<std::uint32_t>(EPOLLOUT));
    if (up_ && want != up_events_) {
      s_.watch(up_.get(), EPOLL_CTL_MOD, want, tcp_store_server::upstream_tag);
      up_events_ = want;
    }
  }

  void on_upstream(std::uint32_t ev) {
    if (ev & EPOLLOUT) flush_upstream();
    if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) || !up_) return;
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(up_.get(), buf, sizeof buf, 0);
      if (n > 0) {
        up_in_.append(buf, static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < sizeof buf) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return upstream_lost(n == 0 ? "it closed the connection" : detail::errno_text(errno));
    }
    std::size_t pos = 0;
    while (up_in_.size() - pos >= 4) {
      const auto n = wire::frame_length(std::string_view(up_in_).substr(pos, 4));
      if (n < 5 || n > wire::max_frame) return upstream_lost("a malformed reply");
      if (up_in_.size() - pos < 4u + n) break;
      // status (tagged), u32 tag, the inner reply
      const std::string_view frame = std::string_view(up_in_).substr(pos + 4, n);
      pos += 4u + n;
      if (static_cast<wire::status>(frame[0]) != wire::status::tagged) return upstream_lost("a reply without its tag");
      answered(wire::frame_length(frame.substr(1, 4)), std::string(frame.substr(5)));
    }
    up_in_.erase(0, pos);
    s_.serve_ready();  // (clients answered may have requests waiting behind)
  }

  // The reply to tagged request `tag` (the inner payload).
  void answered(std::uint32_t tag, std::string inner) {
    const auto it = in_flight_.find(tag);
    if (it == in_flight_.end()) return;
    flight f = std::move(it->second);
    in_flight_.erase(it);
    const auto frame = [](std::string_view p) { return wire::writer().raw(p).done(); };
    switch (f.kind) {
      case flight::single:
        deliver(f.client, frame(inner));
        return;
      case flight::adds: {
        wire::reader r(inner);
        const auto st = static_cast<wire::status>(r.u8());
        std::int64_t total = r.i64();
        if (st == wire::status::ok && r.ok()) {
          // In arrival order: the last gets the total, each earlier one the total less the deltas after it.
          for (auto k = f.adders.size(); k-- > 0;) {
            deliver(f.adders[k].first, wire::writer().u8(static_cast<std::uint8_t>(wire::status::ok)).i64(total).done());
            total -= f.adders[k].second;
          }
        } else {
          for (const auto& a : f.adders) deliver(a.first, frame(inner));
        }
        auto& q = adds_[f.key];
        q.on_its_way = false;
        if (!q.queued.empty()) send_adds(f.key, q);
        else adds_.erase(f.key);
        return;
      }
      case flight::shared: {
        const auto sit = shared_.find(f.key);
        if (sit == shared_.end()) return;
        auto waiters = std::move(sit->second.waiters);
        shared_.erase(sit);
        const bool timed_out = !inner.empty() && static_cast<wire::status>(inner[0]) == wire::status::timeout;
        const auto now = detail::clock::now();
        std::vector<std::pair<std::uint64_t, detail::clock::time_point>> again;
        for (const auto& [id, deadline] : waiters) {
          if (timed_out && deadline > now + std::chrono::milliseconds(1)) again.emplace_back(id, deadline);
          else deliver(id, frame(inner));
        }
        if (again.empty()) return;
        const auto up_again = [&](detail::clock::time_point until, flight next) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
          send_up(wire::writer().raw(f.key).u32(static_cast<std::uint32_t>(std::max<long long>(left, 1))).done().substr(4),
                  std::move(next));
        };
        if (shared_.count(f.key)) {  // (a client answered above asked again meanwhile: each goes up alone)
          for (const auto& [id, deadline] : again) up_again(deadline, flight{flight::single, id, {}, {}});
          return;
        }
        // Still within their deadline: up again, sharing the earliest.
        auto earliest = again.front().second;
        for (const auto& a : again) earliest = std::min(earliest, a.second);
        auto& sh = shared_[f.key];
        sh.deadline = earliest;
        sh.waiters = std::move(again);
        up_again(earliest, flight{flight::shared, 0, f.key, {}});
        return;
      }
    }
  }

  // A reply for a client that waits for one (gone meanwhile: dropped).
  void deliver(std::uint64_t id, std::string frame) {
    client* c = s_.find(id);
    if (!c || !c->waiting || c->closing) return;
    c->waiting = false;
    s_.reply(*c, std::move(frame));
    s_.process(*c);
  }

  // The job's store is gone: every client goes, and new ones do (they see the store lost).
  void upstream_lost(const std::string& why) {
    if (up_lost_) return;
    up_lost_ = true;
    s_.opt_.log("kft store relay " + s_.address() + ": lost the job's store at " +
             detail::endpoint(s_.opt_.upstream.host, s_.opt_.upstream.port) + ": " + why + "; closing its clients");
    if (up_) ::epoll_ctl(s_.epoll_.get(), EPOLL_CTL_DEL, up_.get(), nullptr);
    up_.reset();
    in_flight_.clear();
    shared_.clear();
    adds_.clear();
    for (auto& [id, c] : s_.clients_)
      if (c->authed && !c->parent) s_.gone(*c);
  }


  tcp_store_server& s_;
  detail::unique_fd up_;
  std::string up_in_, up_out_;
  std::uint32_t up_events_ = 0;
  bool up_lost_ = false;
  std::uint32_t next_tag_ = 0;
  std::unordered_map<std::uint32_t, flight> in_flight_;
  std::unordered_map<std::string, shared_wait> shared_;
  std::unordered_map<std::string, add_queue> adds_;
  std::atomic<std::uint64_t> upstream_requests_{0};
};

/// @brief Options that make a tcp_store_server the relay of its node to the job's store at
/// `host`:`port` (tcp_store_server::options::upstream).
inline tcp_store_server::options::upstream_store relay_to(std::string host, int port) {
  tcp_store_server::options::upstream_store u;
  u.host = std::move(host);
  u.port = port;
  u.make = [](tcp_store_server& s) -> std::unique_ptr<tcp_store_server::relay_base> {
    return std::make_unique<tcp_store_relay>(s);
  };
  return u;
}

}  // namespace rendezvous
KFT_NAMESPACE_END
