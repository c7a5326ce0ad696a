// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/tcp_store_server.hpp
/// @brief The TCP store's server: one thread, poll-driven, serving every client of the job
/// (kftrun's node-0 agent or rank 0 hosts it). See tcp_store.hpp for the security and
/// deadline rules it keeps.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kft/core/log.hpp>
#include <kft/rendezvous/detail/socket.hpp>
#include <kft/rendezvous/detail/tcp_wire.hpp>
#include <kft/rendezvous/memory_store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief The store server. Listens on construction (so "port in use" is thrown there) and
/// serves from a background thread until destroyed.
///
/// Keys set with `set_owned` are bound to the connection that set them and erased when it
/// closes (for whatever reason: the process ended, it was killed, the client gave up), unless a
/// later write took the key over: kftrun's agents tell a peer whose process is gone from one
/// that is alive but silent this way.
class tcp_store_server {
 public:
  struct options {
    std::string host = "127.0.0.1";  ///< address to bind; "0.0.0.0" or "::" only if you mean it
    int port = 0;                    ///< 0 = any free port (see port())
    std::string token;               ///< clients must present it; must not be empty
    /// Where refusals and protocol errors are reported (default: a `kft WARN:` line on stderr
    /// through kft::log, shown unless KFT_LOG_LEVEL is `error`).
    /// Text that came from a client is escaped and cut (detail::excerpt): one line per event.
    std::function<void(const std::string&)> log;
    /// A connection that has not presented its hello by then is dropped.
    std::chrono::milliseconds hello_timeout{5000};
    /// Most connections waiting for their hello at once; 0 = a quarter of the file
    /// descriptors this process may open (at least 8, at most 1024). When a new one would
    /// exceed it, the oldest silent unauthenticated connection older than `shed_grace` is
    /// dropped (so an idle crowd cannot keep the job's own clients out); when there is none, the
    /// new one is (so a burst cannot evict a client whose hello is on its way; a client whose
    /// connection is dropped before its hello was read connects again until its deadline).
    int max_unauthenticated = 0;
    /// How long a connection may wait for its hello to be read before a newer one can push it out.
    std::chrono::milliseconds shed_grace{250};
    /// How long to keep trying to resolve `host` while DNS does not know it yet (a Kubernetes
    /// pod binding its own name, which its headless service publishes a moment after the pod
    /// starts); 0 = one try.
    std::chrono::milliseconds resolve_timeout{0};
  };

  explicit tcp_store_server(options opt) : opt_(std::move(opt)) {
    if (opt_.token.empty())
      throw usage_error("a TCP store needs a token (KFT_RDZV_TOKEN, or kft::random_token())",
                        error_site::of("store listen"));
    if (!opt_.log) opt_.log = [](const std::string& line) { log::warn("kft", line); };
    if (opt_.max_unauthenticated <= 0) {
      rlimit lim{};
      const rlim_t fds = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : 1024;
      opt_.max_unauthenticated = static_cast<int>(std::clamp<rlim_t>(fds / 4, 8, 1024));
    }
    listen_ = detail::listen_on(opt_.host, opt_.port,
                                opt_.resolve_timeout.count() > 0 ? detail::clock::now() + opt_.resolve_timeout
                                                                 : detail::clock::time_point{});
    port_ = detail::local_port(listen_.get());
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0)
      throw transport_error("pipe2 failed: " + detail::errno_text(errno), error_site::of("store listen"), errno);
    wake_read_ = detail::unique_fd(pipefd[0]);
    wake_write_ = detail::unique_fd(pipefd[1]);
    detail::set_nonblocking(listen_.get(), true);
    thread_ = std::thread([this] { run(); });
  }
  ~tcp_store_server() {
    stop_.store(true);
    const char c = 'x';
    (void)!::write(wake_write_.get(), &c, 1);
    if (thread_.joinable()) thread_.join();
  }
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  const std::string& host() const noexcept { return opt_.host; }
  int port() const noexcept { return port_; }
  std::string address() const { return detail::endpoint(opt_.host, port_); }
  /// @brief Connections refused for a wrong token so far.
  int refused() const noexcept { return refused_.load(); }
  /// @brief Clients connected right now.
  int connected() const noexcept { return connected_.load(); }
  /// @brief Unauthenticated connections dropped so far: silent past the hello deadline,
  /// shed for newer ones, or sending more than a hello may hold.
  int dropped() const noexcept { return dropped_.load(); }

  /// @brief Waits until every client has disconnected (or `timeout` passed): a process that
  /// hosts the store calls this before it exits, so no rank loses the store mid-request.
  /// @return true when all left in time
  bool drain(std::chrono::milliseconds timeout) const {
    const auto deadline = detail::clock::now() + timeout;
    while (connected_.load() > 0) {
      if (detail::clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

 private:
  struct client {
    detail::unique_fd fd;
    std::string peer;
    std::string in, out;
    bool authed = false;
    bool closing = false;  // close once `out` is flushed
    detail::clock::time_point accepted;  // when it was accepted
    detail::clock::time_point hello_by;  // unauthenticated: dropped if still silent then
    // A pending get/wait.
    bool waiting = false;
    wire::op wait_op = wire::op::get;
    std::vector<std::string> wait_keys;
    detail::clock::time_point deadline;
    std::uint64_t id = 0;  // for the keys it owns (set_owned)
  };

  void run() {
    std::vector<std::unique_ptr<client>> clients;
    std::vector<pollfd> fds;
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      // After a failed accept (out of file descriptors) the listener stays readable: pause it
      // briefly instead of spinning on it.
      if (detail::clock::now() >= accept_paused_until_) fds[1].events = POLLIN;
      else fds[1].events = 0;
      auto next_deadline = accept_paused_until_ > detail::clock::now() ? accept_paused_until_
                                                                        : detail::clock::time_point::max();
      for (auto& c : clients) {
        // A client with a whole frame's limit buffered (waiting for its reply) is not read
        // until it is handled: no unbounded buffer, and no poll that returns at once forever.
        short ev = c->in.size() >= input_limit(*c) ? 0 : POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        fds.push_back({c->fd.get(), ev, 0});
        if (c->waiting) next_deadline = std::min(next_deadline, c->deadline);
        if (!c->authed && !c->closing) next_deadline = std::min(next_deadline, c->hello_by);
      }
      int timeout_ms = 1000;
      if (next_deadline != detail::clock::time_point::max()) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - detail::clock::now());
        timeout_ms = static_cast<int>(std::clamp<long long>(left.count() + 1, 0, 1000));
      }
      const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) accept_all(clients);
      for (std::size_t i = 0; i + 2 < fds.size() && i < clients.size(); ++i) {
        auto& c = *clients[i];
        const short re = fds[i + 2].revents;
        if (re & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if ((re & (POLLHUP | POLLERR)) && c.in.size() >= input_limit(c)) {  // gone, with a full buffer
          c.closing = true;
          c.out.clear();
          c.waiting = false;
        }
        if (!c.closing) process(c);
        if (re & POLLOUT) flush(c);
      }
      expire_waiters(clients);
      drop_silent(clients);
      std::erase_if(clients, [this](const std::unique_ptr<client>& c) {
        if (!c->closing || !c->out.empty()) return false;
        release(*c);
        return true;
      });
      connected_.store(static_cast<int>(clients.size()));
    }
  }

  void accept_all(std::vector<std::unique_ptr<client>>& clients) {
    while (true) {
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: free one by shedding the oldest stranger past its grace, and
          // look again in a moment (the pending connection stays in the backlog).
          if (!shed_oldest(clients, "out of file descriptors")) {
            if (!warned_fds_) opt_.log("kft store " + address() + ": cannot accept: " + detail::errno_text(errno));
            warned_fds_ = true;
          }
          accept_paused_until_ = detail::clock::now() + std::chrono::milliseconds(50);
        }
        return;
      }
      detail::set_nodelay(fd);
      int strangers = 0;
      for (const auto& c : clients) strangers += !c->authed && !c->closing;
      auto c = std::make_unique<client>();
      c->fd = detail::unique_fd(fd);
      c->peer = detail::peer_name(fd);
      c->accepted = detail::clock::now();
      c->id = ++next_id_;
      c->hello_by = c->accepted + opt_.hello_timeout;
      if (strangers >= opt_.max_unauthenticated && !shed_oldest(clients, "too many connections without a hello")) {
        drop(*c, "too many connections without a hello (all of them newer than " +
                     std::to_string(opt_.shed_grace.count()) + " ms; it may try again)");
        continue;  // (closed here: c goes out of scope)
      }
      clients.push_back(std::move(c));
    }
  }

  // Drops one unauthenticated connection, the oldest of those accepted more than `shed_grace`
  // ago that has sent nothing yet (a younger one's hello, or any one's bytes already sent, may
  // be a hello not read yet; those go by the hello deadline instead). @return false if none is
  bool shed_oldest(std::vector<std::unique_ptr<client>>& clients, const char* why) {
    const auto before = detail::clock::now() - opt_.shed_grace;
    for (auto& c : clients) {  // in accept order
      if (c->authed || c->closing || c->accepted > before || !c->in.empty()) continue;
      char byte = 0;
      if (::recv(c->fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) continue;
      drop(*c, why);
      c->fd.reset();  // its descriptor is needed now, not after the next poll
      return true;
    }
    return false;
  }

  void drop(client& c, const std::string& why) {
    ++dropped_;
    if (dropped_.load() <= 20 || dropped_.load() % 1000 == 0)  // a flood must not flood the log
      opt_.log("kft store " + address() + ": dropped " + c.peer + ": " + why +
               (dropped_.load() == 20 ? " (further drops are counted, one line per 1000)" : ""));
    c.closing = true;
    c.out.clear();
    c.in.clear();
    c.waiting = false;
  }

  // Unauthenticated connections silent past their hello deadline.
  void drop_silent(std::vector<std::unique_ptr<client>>& clients) {
    const auto now = detail::clock::now();
    for (auto& c : clients)
      if (!c->authed && !c->closing && now >= c->hello_by)
        drop(*c, "no hello within " + kft::detail::describe_duration(opt_.hello_timeout));
  }

  // Reads what has arrived, never more than one frame's limit ahead of what was handled: a
  // length header over the limit ends the connection before its body is read.
  static std::size_t input_limit(const client& c) { return 4u + (c.authed ? wire::max_frame : wire::max_hello_frame); }

  void read_from(client& c) {
    if (!c.fd) return;
    char buf[65536];
    while (true) {
      const std::size_t limit = input_limit(c);
      if (c.in.size() >= 4) {
        const auto n = wire::frame_length(c.in);
        if (n == 0 || n > limit - 4u) return;  // process() reports and drops it
      }
      if (c.in.size() >= limit) return;  // a whole frame is waiting to be handled
      const std::size_t want = std::min(sizeof buf, limit - c.in.size());
      const ssize_t n = ::recv(c.fd.get(), buf, want, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.closing = true;  // peer gone: drop its pending wait, nothing more to send
        c.out.clear();
        c.waiting = false;
      }
      return;
    }
  }

  void flush(client& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      c.closing = true;
      c.out.clear();
      return;
    }
  }

  void reply(client& c, std::string frame) {
    c.out += frame;
    flush(c);
  }

  // Handles every complete frame of a client that is not waiting.
  void process(client& c) {
    while (!c.waiting && !c.closing && c.in.size() >= 4) {
      const auto n = wire::frame_length(c.in);
      if (n > (c.authed ? wire::max_frame : wire::max_hello_frame) || n == 0) {
        if (c.authed) {
          opt_.log("kft store " + address() + ": dropped " + c.peer + ": frame of " + std::to_string(n) + " bytes");
          c.closing = true;
          c.out.clear();
        } else {
          drop(c, "a first frame of " + std::to_string(n) + " bytes (a hello has at most " +
                      std::to_string(wire::max_hello_frame) + ")");
        }
        return;
      }
      if (c.in.size() < 4u + n) return;
      const std::string payload = c.in.substr(4, n);
      c.in.erase(0, 4u + n);
      handle(c, payload);
    }
  }

  void handle(client& c, const std::string& payload) {
    wire::reader r(payload);
    const auto o = static_cast<wire::op>(r.u8());
    if (!c.authed) {
      const std::string token = r.str();
      const std::string who = r.str();
      if (o == wire::op::hello && r.ok() && wire::same_token(token, opt_.token)) {
        c.authed = true;
        reply(c, wire::writer().u8(static_cast<std::uint8_t>(wire::status::ok)).done());
      } else {
        ++refused_;
        // `who` is whatever the peer claims: printed escaped and cut, quoted, after the address.
        if (refused_.load() <= 20 || refused_.load() % 1000 == 0)
          opt_.log("kft store " + address() + ": refused " + c.peer +
                   (who.empty() ? "" : " (calls itself \"" + kft::detail::excerpt(who, 80) + "\")") + ": " +
                   (o == wire::op::hello ? "wrong token" : "no hello") +
                   (refused_.load() == 20 ? " (further refusals are counted, one line per 1000)" : ""));
        reply(c, wire::writer().u8(static_cast<std::uint8_t>(wire::status::denied)).done());
        c.closing = true;
      }
      return;
    }
    wire::writer w;
    auto ok = [&]() -> wire::writer& { return w.u8(static_cast<std::uint8_t>(wire::status::ok)); };
    switch (o) {
      case wire::op::set:
      case wire::op::set_owned: {
        auto key = r.str();
        auto value = r.str();
        if (!r.ok()) break;
        if (o == wire::op::set_owned) owners_.insert_or_assign(key, c.id);
        else owners_.erase(key);
        data_.insert_or_assign(std::move(key), std::move(value));
        reply(c, ok().done());
        return;
      }
      case wire::op::get:
      case wire::op::wait: {
        std::vector<std::string> keys;
        if (o == wire::op::get) {
          keys.push_back(r.str());
        } else {
          const auto count = r.u32();
          for (std::uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
        }
        const auto timeout = std::chrono::milliseconds(r.u32());
        if (!r.ok()) break;
        c.waiting = true;
        c.wait_op = o;
        c.wait_keys = std::move(keys);
        c.deadline = detail::clock::now() + timeout;
        return;  // answered by serve_waiters / expire_waiters
      }
      case wire::op::add: {
        const auto key = r.str();
        const auto delta = r.i64();
        if (!r.ok()) break;
        auto it = data_.find(key);
        try {
          const auto v = detail::counter_add(it == data_.end() ? std::nullopt : std::optional<std::string>(it->second),
                                             key, "tcp store " + address(), delta);
          data_.insert_or_assign(key, std::to_string(v));
          owners_.erase(key);
          reply(c, ok().i64(v).done());
        } catch (const usage_error& e) {
          reply(c, w.u8(static_cast<std::uint8_t>(wire::status::error)).str(e.detail()).done());
        }
        return;
      }
      case wire::op::cas: {
        const auto key = r.str();
        const bool has_expected = r.u8() != 0;
        const auto expected = r.str();
        const auto desired = r.str();
        if (!r.ok()) break;
        auto it = data_.find(key);
        const bool matches = has_expected ? (it != data_.end() && it->second == expected) : it == data_.end();
        if (matches) {
          data_.insert_or_assign(key, desired);
          owners_.erase(key);
          reply(c, ok().u8(1).u8(1).str(desired).done());
        } else if (it != data_.end()) {
          reply(c, ok().u8(0).u8(1).str(it->second).done());
        } else {
          reply(c, ok().u8(0).u8(0).str("").done());
        }
        return;
      }
      case wire::op::erase: {
        const auto key = r.str();
        if (!r.ok()) break;
        owners_.erase(key);
        reply(c, ok().u8(data_.erase(key) ? 1 : 0).done());
        return;
      }
      case wire::op::ping:
        reply(c, ok().done());
        return;
      case wire::op::keys: {
        const auto prefix = r.str();
        if (!r.ok()) break;
        std::vector<const std::string*> found;
        for (auto it = data_.lower_bound(prefix); it != data_.end() && it->first.starts_with(prefix); ++it)
          found.push_back(&it->first);
        ok().u32(static_cast<std::uint32_t>(found.size()));
        for (const auto* k : found) w.str(*k);
        reply(c, w.done());
        return;
      }
      case wire::op::hello:
        break;
    }
    opt_.log("kft store " + address() + ": dropped " + c.peer + ": malformed request (op " +
             std::to_string(static_cast<int>(o)) + ")");
    c.closing = true;
    c.out.clear();
  }

  // A closed connection's owned keys go with it.
  void release(const client& c) {
    for (auto it = owners_.begin(); it != owners_.end();) {
      if (it->second == c.id) {
        data_.erase(it->first);
        it = owners_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::vector<std::string> missing(const client& c) const {
    std::vector<std::string> m;
    for (const auto& k : c.wait_keys)
      if (data_.find(k) == data_.end()) m.push_back(k);
    return m;
  }

  // Answers waiters whose keys are all present, and those whose deadline passed.
  void expire_waiters(std::vector<std::unique_ptr<client>>& clients) {
    bool answered = true;
    while (answered) {  // an answer may unblock queued requests of the same client
      answered = false;
      const auto now = detail::clock::now();
      for (auto& cp : clients) {
        auto& c = *cp;
        if (!c.waiting) continue;
        auto miss = missing(c);
        wire::writer w;
        if (miss.empty()) {
          w.u8(static_cast<std::uint8_t>(wire::status::ok));
          if (c.wait_op == wire::op::get) w.str(data_.find(c.wait_keys.front())->second);
        } else if (now >= c.deadline) {
          w.u8(static_cast<std::uint8_t>(wire::status::timeout)).u32(static_cast<std::uint32_t>(miss.size()));
          for (const auto& k : miss) w.str(k);
        } else {
          continue;
        }
        c.waiting = false;
        c.wait_keys.clear();
        reply(c, w.done());
        process(c);
        answered = true;
      }
    }
  }

  options opt_;
  detail::unique_fd listen_, wake_read_, wake_write_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::atomic<int> connected_{0};
  std::atomic<int> dropped_{0};
  detail::clock::time_point accept_paused_until_{};  // only touched by the server thread
  bool warned_fds_ = false;
  std::map<std::string, std::string, std::less<>> data_;  // only touched by the server thread
  std::map<std::string, std::uint64_t> owners_;  // set_owned keys -> their connection's id (server thread)
  std::uint64_t next_id_ = 0;  // (server thread)
  std::thread thread_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
