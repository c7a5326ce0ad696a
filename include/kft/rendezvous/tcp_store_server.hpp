// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/tcp_store_server.hpp
/// @brief The TCP store's server: one thread, driven by epoll, serving every client of the job
/// (kftrun's node-0 agent or rank 0 hosts it). See tcp_store.hpp for the security and deadline
/// rules it keeps.
///
/// What it costs, so that tens of thousands of clients stay cheap:
///
/// - **Work per event, not per client.** epoll (level-triggered) reports the connections that
///   have something to say; nothing in the loop walks every connection. A pending `get`/`wait`/
///   `multi_get` is indexed by the keys it still misses (a write wakes exactly the waiters of its
///   key) and by its deadline (an ordered set); connections waiting for their hello are kept in
///   accept order, so the hello deadline and shedding look at the oldest ones only.
/// - **Bounded memory per idle connection.** An idle connection (authenticated or not, nothing
///   pending) holds its `client` record (at most 256 bytes, checked by a static_assert), its
///   peer's name (at most 64 bytes), its slot in the id map (about 48 bytes) and two buffers kept
///   only while their capacity is at most 512 bytes (a larger one, grown by a large request or
///   reply, is released once drained): at most about 1.5 KiB of the server's memory, about
///   400 bytes measured (bench/store/store_scale.py: the server's RSS over 16,000 idle clients),
///   plus what the kernel keeps for any TCP socket and epoll registration.
/// - **Bounded memory per busy connection.** At most one frame (64 MiB after the hello, 4 KiB
///   before) is read ahead of what was handled, and a connection with more than 1 MiB of replies
///   it has not read is neither read nor served until it reads them: a client that sends
///   requests without reading the answers stops itself, not the server.
#pragma once

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
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
class tcp_store_relay;

class tcp_store_server {
  struct client;

 public:
  /// @brief What a relay does in the server (options::upstream; tcp_store_relay.hpp).
  class relay_base {
   public:
    virtual ~relay_base() = default;
    /// An authenticated client's request (its op read).
    virtual void request(client& c, wire::op o, wire::reader r) = 0;
    /// The epoll events of the connection to the job's store.
    virtual void on_event(std::uint32_t events) = 0;
    /// Requests sent to the job's store so far.
    virtual std::uint64_t sent() const noexcept = 0;
  };
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
    /// exceed it, the hellos already arrived are read first; then the oldest silent
    /// unauthenticated connection older than `shed_grace` is dropped (so an idle crowd cannot
    /// keep the job's own clients out); when there is none, the new one is (so a burst cannot
    /// evict a client whose hello is on its way; a client whose connection is dropped before its
    /// hello was read connects again until its deadline).
    int max_unauthenticated = 0;
    /// How long a connection may wait for its hello to be read before a newer one can push it out.
    std::chrono::milliseconds shed_grace{250};
    /// How long to keep trying to resolve `host` while DNS does not know it yet (a Kubernetes
    /// pod binding its own name, which its headless service publishes a moment after the pod
    /// starts); 0 = one try.
    std::chrono::milliseconds resolve_timeout{0};
    /// A node's relay (`upstream.port` set): instead of keeping keys, this server speaks for the
    /// clients of its node to the job's store at `upstream`, over one connection (tagged
    /// requests), so the job's store holds one connection per node however many ranks a node
    /// has. Its clients see the same store (the same protocol and token; every request is the
    /// job's store's), with requests combined on the way:
    /// - adds to one key while one is on its way go up as one add of their sum, and each client
    ///   gets the value it would have got alone (the adds in arrival order);
    /// - gets, waits and multi_gets of the same keys while one is on its way share it (a client
    ///   whose deadline comes before the shared one's is sent up alone; one still within its
    ///   deadline when the shared one times out is sent up again);
    /// - everything else goes up as it came, one tagged request each.
    /// A key set with `set_owned` through a relay is owned by the relay's connection: it goes
    /// when the node's relay does, not when the rank's connection closes. When the job's store
    /// is lost, every client's connection is closed (each sees the store lost), and new ones are.
    /// Set it with relay_to() (tcp_store_relay.hpp, where the relay's code is).
    struct upstream_store {
      std::string host;
      int port = 0;                                  ///< 0: not a relay
      std::string source_address{};                  ///< the local address to connect from (numeric)
      std::chrono::milliseconds connect_timeout{30000};
      std::string name = "relay";                    ///< shown in the job's store's log when refused
      /// Makes the relay (set by relay_to(), tcp_store_relay.hpp: its code is compiled only
      /// where it is used).
      std::unique_ptr<relay_base> (*make)(tcp_store_server&) = nullptr;
    } upstream{};
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
    epoll_ = detail::unique_fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_)
      throw transport_error("epoll_create1 failed: " + detail::errno_text(errno), error_site::of("store listen"), errno);
    detail::set_nonblocking(listen_.get(), true);
    if (!watch(wake_read_.get(), EPOLL_CTL_ADD, EPOLLIN, wake_tag) || !watch(listen_.get(), EPOLL_CTL_ADD, EPOLLIN, listen_tag))
      throw transport_error("epoll_ctl failed: " + detail::errno_text(errno), error_site::of("store listen"), errno);
    if (opt_.upstream.port > 0) {
      if (!opt_.upstream.make)
        throw usage_error("tcp_store_server: options::upstream names a store to relay to, but not the relay: set it "
                          "with relay_to() (kft/rendezvous/tcp_store_relay.hpp)",
                          error_site::of("store relay"));
      relay_ = opt_.upstream.make(*this);
    }
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
  /// @brief Requests of authenticated clients handled so far (one per frame: a `multi_get` of
  /// 1,000 keys is one, as is a `wait` on them). What tests count round trips with.
  std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }
  /// @brief A relay: requests sent to the job's store so far (its clients' requests, less those
  /// combined on the way).
  std::uint64_t upstream_requests() const noexcept { return relay_ ? relay_->sent() : 0; }

  /// @brief Waits until every client has disconnected (or `timeout` passed): a process that
  /// hosts the store calls this before it exits, so no rank loses the store mid-request.
  /// @return true when all left in time
  bool drain(std::chrono::milliseconds timeout) const {
    const auto deadline = detail::clock::now() + timeout;
    for (auto pause = std::chrono::milliseconds(1); connected_.load() > 0;) {
      if (detail::clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    return true;
  }

 private:
  friend class tcp_store_relay;
  static constexpr std::uint64_t wake_tag = ~std::uint64_t{0};
  static constexpr std::uint64_t listen_tag = wake_tag - 1;
  static constexpr std::uint64_t upstream_tag = wake_tag - 2;
  /// Accepted per turn of the loop: a burst of connections does not starve the hellos and
  /// requests of those already accepted.
  static constexpr int accept_batch = 64;
  /// Replies a client may leave unread before it is no longer served (see the file comment).
  static constexpr std::size_t out_limit = 1u << 20;
  /// A buffer whose capacity is over this is released once drained.
  static constexpr std::size_t keep_capacity = 512;

  struct client {
    detail::unique_fd fd;
    std::uint64_t id = 0;  // the epoll tag, and the owner of the keys it set_owned
    std::string peer;
    std::string in, out;
    detail::clock::time_point accepted;  // when it was accepted
    detail::clock::time_point hello_by;  // unauthenticated: dropped if still silent then
    // A pending get/wait/multi_get.
    std::vector<std::string> wait_keys;
    detail::clock::time_point deadline;
    std::uint64_t wait_serial = 0;   // tells its entries in watchers_ from those of an earlier wait
    std::uint32_t unseen = 0;        // keys it watches that no write has touched since
    std::uint32_t events = 0;        // what epoll watches for it now
    std::uint32_t owned_mark = 0;    // owned.size() after the last compaction
    std::uint32_t tag = 0;           // a tagged request's: its tag
    std::uint32_t tagged_waiting = 0;  // a connection's: its tagged requests waiting now
    std::uint64_t parent = 0;        // a tagged request's: its connection (it has no socket of its own)
    wire::op wait_op = wire::op::get;
    bool authed = false;
    bool closing = false;   // close once `out` is flushed
    bool waiting = false;
    bool stranger = false;  // counted in strangers_ (unauthenticated, not closing)
    bool dirty = false;     // in dirty_: its epoll interest or its end is looked at after this turn
    std::vector<std::string> owned;  // keys it set_owned (some may have been taken over since)
  };
  static_assert(sizeof(client) <= 256, "the file comment promises at most 256 bytes per idle connection's record");

  // ---- the loop --------------------------------------------------------------------------

  // Adds or changes an epoll registration; false (errno set) when the kernel refuses.
  bool watch(int fd, int how, std::uint32_t events, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    return ::epoll_ctl(epoll_.get(), how, fd, &ev) == 0;
  }

  void run() {
    std::vector<epoll_event> events(512);
    while (!stop_.load()) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), wait_ms());
      if (n < 0 && errno != EINTR) {
        opt_.log("kft store " + address() + ": epoll_wait failed (" + detail::errno_text(errno) + "); the store stops serving");
        break;
      }
      swept_ = false;
      for (int i = 0; i < n; ++i) {
        const auto tag = events[static_cast<std::size_t>(i)].data.u64;
        if (tag == wake_tag) {
          char buf[64];
          while (::read(wake_read_.get(), buf, sizeof buf) > 0) {
          }
        } else if (tag == listen_tag) {
          accept_some();
        } else if (tag == upstream_tag) {
          if (relay_) relay_->on_event(events[static_cast<std::size_t>(i)].events);
        } else if (auto* c = find(tag)) {
          on_event(*c, events[static_cast<std::size_t>(i)].events);
        }
      }
      serve_ready();
      const auto now = detail::clock::now();
      expire_waiters(now);
      serve_ready();
      drop_silent(now);
      if (accept_paused_ && now >= accept_paused_until_) {
        accept_paused_ = false;
        watch(listen_.get(), EPOLL_CTL_MOD, EPOLLIN, listen_tag);
      }
      finish_turn();
      compact_watchers();
      connected_.store(static_cast<int>(clients_.size() - live_children_));
    }
  }

  // How long epoll may sleep: until the next wait's deadline, the oldest stranger's hello
  // deadline or the end of an accept pause, and at most 1 s.
  int wait_ms() {
    auto next = detail::clock::time_point::max();
    if (accept_paused_) next = accept_paused_until_;
    if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
    if (client* s = oldest_stranger()) next = std::min(next, s->hello_by);
    if (next == detail::clock::time_point::max()) return 1000;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - detail::clock::now());
    return static_cast<int>(std::clamp<long long>(left.count() + 1, 0, 1000));
  }

  client* find(std::uint64_t id) {
    const auto it = clients_.find(id);
    return it == clients_.end() ? nullptr : it->second.get();
  }

  // Looked at after this turn (finish_turn): its epoll interest, or closing it.
  void touch(client& c) {
    if (c.dirty) return;
    c.dirty = true;
    dirty_.push_back(c.id);
  }

  void on_event(client& c, std::uint32_t ev) {
    touch(c);
    if (c.closing && !c.fd) return;
    const bool reading = (c.events & EPOLLIN) != 0;
    if (reading && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_from(c);
    if (!reading && (ev & (EPOLLHUP | EPOLLERR))) {
      // Gone while we were not reading (a whole frame buffered behind a pending wait, or replies
      // unread): nothing more can come from it or reach it.
      gone(c);
      return;
    }
    if (!c.closing) process(c);
    if (ev & EPOLLOUT) {
      flush(c);
      if (!c.closing) process(c);  // requests held back while its replies were unread
    }
  }

  // Sets each touched client's epoll interest, and closes those that are done.
  void finish_turn() {
    for (std::size_t i = 0; i < dirty_.size(); ++i) {  // (close may not add, but keep it safe)
      const auto id = dirty_[i];
      client* c = find(id);
      if (!c) continue;
      c->dirty = false;
      if (c->closing && (c->out.empty() || !c->fd)) {
        close_client(*c);
        continue;
      }
      std::uint32_t want = 0;
      if (!c->closing && c->in.size() < input_limit(*c) && c->out.size() < out_limit) want |= EPOLLIN;
      if (!c->out.empty()) want |= EPOLLOUT;
      if (want != c->events) {
        watch(c->fd.get(), EPOLL_CTL_MOD, want, c->id);
        c->events = want;
      }
    }
    dirty_.clear();
  }

  void close_client(client& c) {
    end_wait(c);
    if (c.stranger) {
      c.stranger = false;
      --strangers_;
    }
    release(c);
    if (c.parent) {
      retire(c);
      return;
    }
    if (const auto it = children_.find(c.id); it != children_.end()) {  // its tagged requests still waiting
      const auto ids = std::move(it->second);
      children_.erase(it);
      for (const auto id : ids)
        if (client* ch = find(id); ch && ch->parent == c.id) retire(*ch);
    }
    clients_.erase(c.id);  // closes the descriptor, which leaves the epoll set with it
  }

  // A tagged request's record, answered (or its connection gone): removed.
  void retire(client& ch) {
    end_wait(ch);
    if (client* p = find(ch.parent); p && p->tagged_waiting) --p->tagged_waiting;
    --live_children_;
    clients_.erase(ch.id);
  }

  // ---- connections -----------------------------------------------------------------------

  void accept_some() {
    for (int i = 0; i < accept_batch; ++i) {
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: free one by shedding the oldest stranger past its grace, and
          // look again in a moment (the pending connection stays in the backlog).
          read_strangers();
          if (!shed_oldest("out of file descriptors")) {
            if (!warned_fds_) opt_.log("kft store " + address() + ": cannot accept: " + detail::errno_text(errno));
            warned_fds_ = true;
          }
          accept_paused_until_ = detail::clock::now() + std::chrono::milliseconds(50);
          accept_paused_ = true;
          watch(listen_.get(), EPOLL_CTL_MOD, 0, listen_tag);
        }
        return;
      }
      detail::unique_fd owned(fd);
      detail::set_nodelay(fd);
      if (strangers_ >= opt_.max_unauthenticated) {
        read_strangers();  // the hellos already here make room first
        if (strangers_ >= opt_.max_unauthenticated && !shed_oldest("too many connections without a hello")) {
          count_drop(detail::peer_name(fd), "too many connections without a hello (all of them newer than " +
                                                std::to_string(opt_.shed_grace.count()) + " ms; it may try again)");
          continue;  // (closed here: `owned` goes out of scope)
        }
      }
      auto made = std::make_unique<client>();
      client& c = *made;
      c.fd = std::move(owned);
      c.id = ++next_id_;
      c.peer = detail::peer_name(fd);
      c.accepted = detail::clock::now();
      c.hello_by = c.accepted + opt_.hello_timeout;
      if (!watch(fd, EPOLL_CTL_ADD, EPOLLIN, c.id)) {  // (the kernel's epoll watch limit: fs.epoll.max_user_watches)
        count_drop(c.peer, "cannot watch it: epoll_ctl: " + detail::errno_text(errno));
        continue;
      }
      c.stranger = true;
      ++strangers_;
      c.events = EPOLLIN;
      clients_.emplace(c.id, std::move(made));
      stranger_order_.push_back(c.id);
      // A client sends its hello as soon as it is connected: it is often here already.
      read_from(c);
      if (!c.closing) process(c);
      touch(c);
    }
  }

  // The oldest connection still waiting for its hello (stale entries at the front are dropped).
  client* oldest_stranger() {
    while (!stranger_order_.empty()) {
      client* c = find(stranger_order_.front());
      if (c && c->stranger) return c;
      stranger_order_.pop_front();
    }
    return nullptr;
  }

  // Reads the strangers whose hello has arrived but was not read yet, once per turn.
  void read_strangers() {
    if (swept_) return;
    swept_ = true;
    for (std::size_t i = 0; i < stranger_order_.size(); ++i) {
      client* c = find(stranger_order_[i]);
      if (!c || !c->stranger) continue;
      read_from(*c);
      if (!c->closing) process(*c);
      touch(*c);
    }
  }

  // Drops one unauthenticated connection, the oldest of those accepted more than `shed_grace`
  // ago that has sent nothing yet (a younger one's hello, or any one's bytes already sent, may
  // be a hello not read yet; those go by the hello deadline instead). @return false if none is
  bool shed_oldest(const char* why) {
    const auto before = detail::clock::now() - opt_.shed_grace;
    oldest_stranger();  // (drops stale entries at the front)
    for (std::size_t i = 0; i < stranger_order_.size(); ++i) {  // in accept order
      client* c = find(stranger_order_[i]);
      if (!c || !c->stranger) continue;
      if (c->accepted > before) return false;  // this one and all after it are within the grace
      if (!c->in.empty()) continue;
      char byte = 0;
      if (::recv(c->fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) continue;
      drop(*c, why);
      c->fd.reset();  // its descriptor is needed now, not after this turn
      return true;
    }
    return false;
  }

  void count_drop(const std::string& peer, const std::string& why) {
    const int n = ++dropped_;
    if (n <= 20 || n % 1000 == 0)  // a flood must not flood the log
      opt_.log("kft store " + address() + ": dropped " + peer + ": " + why +
               (n == 20 ? " (further drops are counted, one line per 1000)" : ""));
  }

  void drop(client& c, const std::string& why) {
    count_drop(c.peer, why);
    gone(c);
  }

  // Ends a connection: nothing more is read, served or sent; closed after this turn.
  void gone(client& c) {
    if (c.parent) {  // (a malformed tagged request: its connection goes)
      if (client* p = find(c.parent)) gone(*p);
    }
    c.closing = true;
    c.out.clear();
    c.in.clear();
    end_wait(c);
    if (c.stranger) {
      c.stranger = false;
      --strangers_;
    }
    touch(c);
  }

  // Unauthenticated connections silent past their hello deadline (the oldest first: the
  // deadline follows the accept order).
  void drop_silent(detail::clock::time_point now) {
    while (client* c = oldest_stranger()) {
      if (now < c->hello_by) return;
      drop(*c, "no hello within " + kft::detail::describe_duration(opt_.hello_timeout));
    }
  }

  // Reads what has arrived, never more than one frame's limit ahead of what was handled: a
  // length header over the limit ends the connection before its body is read.
  static std::size_t input_limit(const client& c) { return 4u + (c.authed ? wire::max_frame : wire::max_hello_frame); }

  void read_from(client& c) {
    if (!c.fd || c.closing) return;
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
        if (static_cast<std::size_t>(n) < want) return;  // drained (saves the recv that says EAGAIN)
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) gone(c);  // peer gone: drop its pending wait
      return;
    }
  }

  void flush(client& c) {
    while (!c.out.empty() && c.fd) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      gone(c);
      return;
    }
    if (c.out.capacity() > keep_capacity) std::string().swap(c.out);
  }

  void reply(client& c, std::string frame) {
    if (c.parent) {  // a tagged request's reply goes to its connection, with the tag
      client* p = find(c.parent);
      if (!p || p->closing) return;
      reply(*p, wire::writer()
                    .u8(static_cast<std::uint8_t>(wire::status::tagged))
                    .u32(c.tag)
                    .raw(std::string_view(frame).substr(4))
                    .done());
      return;
    }
    if (c.out.empty()) c.out = std::move(frame);
    else c.out += frame;
    flush(c);
    touch(c);
  }

  // Handles every complete frame of a client that is not waiting (and has read its replies).
  void process(client& c) {
    std::size_t pos = 0;
    while (!c.waiting && !c.closing && c.out.size() < out_limit && c.in.size() - pos >= 4) {
      const auto n = wire::frame_length(std::string_view(c.in).substr(pos, 4));
      if (n > (c.authed ? wire::max_frame : wire::max_hello_frame) || n == 0) {
        if (c.authed) {
          opt_.log("kft store " + address() + ": dropped " + c.peer + ": frame of " + std::to_string(n) + " bytes");
          gone(c);
        } else {
          drop(c, "a first frame of " + std::to_string(n) + " bytes (a hello has at most " +
                      std::to_string(wire::max_hello_frame) + ")");
        }
        return;
      }
      if (c.in.size() - pos < 4u + n) break;
      std::string payload = c.in.substr(pos + 4, n);
      pos += 4u + n;
      handle(c, std::move(payload));
    }
    if (c.closing) return;
    c.in.erase(0, pos);
    if (c.in.empty() && c.in.capacity() > keep_capacity) std::string().swap(c.in);
  }

  // ---- requests --------------------------------------------------------------------------

  void handle(client& c, std::string payload) {
    wire::reader r(std::move(payload));
    const auto o = static_cast<wire::op>(r.u8());
    if (!c.authed) {
      const std::string token = r.str();
      const std::string who = r.str();
      if (o == wire::op::hello && r.ok() && wire::same_token(token, opt_.token)) {
        c.authed = true;
        if (c.stranger) {
          c.stranger = false;
          --strangers_;
        }
        reply(c, wire::writer().u8(static_cast<std::uint8_t>(wire::status::ok)).done());
      } else {
        const int n = ++refused_;
        // `who` is whatever the peer claims: printed escaped and cut, quoted, after the address.
        if (n <= 20 || n % 1000 == 0)
          opt_.log("kft store " + address() + ": refused " + c.peer +
                   (who.empty() ? "" : " (calls itself \"" + kft::detail::excerpt(who, 80) + "\")") + ": " +
                   (o == wire::op::hello ? "wrong token" : "no hello") +
                   (n == 20 ? " (further refusals are counted, one line per 1000)" : ""));
        reply(c, wire::writer().u8(static_cast<std::uint8_t>(wire::status::denied)).done());
        c.closing = true;
        if (c.stranger) {
          c.stranger = false;
          --strangers_;
        }
      }
      return;
    }
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (relay_) {
      relay_->request(c, o, std::move(r));
      return;
    }
    wire::writer w;
    auto ok = [&]() -> wire::writer& { return w.u8(static_cast<std::uint8_t>(wire::status::ok)); };
    auto refuse = [&](const std::string& why) {
      reply(c, w.u8(static_cast<std::uint8_t>(wire::status::error)).str(why).done());
    };
    switch (o) {
      case wire::op::set:
      case wire::op::set_owned: {
        auto key = r.str();
        auto value = r.str();
        if (!r.ok()) break;
        write(c, std::move(key), std::move(value), o == wire::op::set_owned);
        reply(c, ok().done());
        return;
      }
      case wire::op::multi_set: {
        const auto count = r.u32();
        if (count > wire::max_batch) {
          refuse("a multi_set of " + std::to_string(count) + " keys (at most " + std::to_string(wire::max_batch) +
                 " in one request)");
          return;
        }
        std::vector<std::pair<std::string, std::string>> items;
        for (std::uint32_t i = 0; i < count && r.ok(); ++i) {
          auto key = r.str();
          auto value = r.str();
          items.emplace_back(std::move(key), std::move(value));
        }
        if (!r.ok()) break;
        for (auto& [key, value] : items) write(c, std::move(key), std::move(value), false);
        reply(c, ok().done());
        return;
      }
      case wire::op::get:
      case wire::op::wait:
      case wire::op::multi_get: {
        std::vector<std::string> keys;
        if (o == wire::op::get) {
          keys.push_back(r.str());
        } else {
          const auto count = r.u32();
          if (count > wire::max_batch) {
            refuse(std::string("a ") + (o == wire::op::wait ? "wait" : "multi_get") + " on " + std::to_string(count) +
                   " keys (at most " + std::to_string(wire::max_batch) + " in one request)");
            return;
          }
          for (std::uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
        }
        const auto timeout = std::chrono::milliseconds(r.u32());
        if (!r.ok()) break;
        begin_wait(c, o, std::move(keys), timeout);
        return;
      }
      case wire::op::add: {
        auto key = r.str();
        const auto delta = r.i64();
        if (!r.ok()) break;
        const auto it = data_.find(key);
        try {
          const auto v = detail::counter_add(it == data_.end() ? std::nullopt : std::optional<std::string>(it->second),
                                             key, "tcp store " + address(), delta);
          write(c, std::move(key), std::to_string(v), false);
          reply(c, ok().i64(v).done());
        } catch (const usage_error& e) {
          refuse(e.detail());
        }
        return;
      }
      case wire::op::cas: {
        auto key = r.str();
        const bool has_expected = r.u8() != 0;
        const auto expected = r.str();
        auto desired = r.str();
        if (!r.ok()) break;
        const auto it = data_.find(key);
        const bool matches = has_expected ? (it != data_.end() && it->second == expected) : it == data_.end();
        if (matches) {
          write(c, std::move(key), desired, false);
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
      case wire::op::tagged: {
        const auto tag = r.u32();
        std::string inner = r.rest();
        if (!r.ok() || inner.empty() || c.parent) break;
        const auto inner_op = static_cast<wire::op>(static_cast<unsigned char>(inner[0]));
        if (inner_op == wire::op::hello || inner_op == wire::op::tagged) break;
        requests_.fetch_sub(1, std::memory_order_relaxed);  // (the inner request is the one counted)
        auto made = std::make_unique<client>();
        client& ch = *made;
        ch.id = ++next_id_;
        ch.parent = c.id;
        ch.tag = tag;
        ch.authed = true;
        clients_.emplace(ch.id, std::move(made));
        ++live_children_;
        if (c.tagged_waiting >= wire::max_tagged_pending) {
          reply(ch, w.u8(static_cast<std::uint8_t>(wire::status::error))
                        .str("more than " + std::to_string(wire::max_tagged_pending) +
                             " tagged requests of one connection waiting at once")
                        .done());
        } else {
          handle(ch, std::move(inner));
        }
        if (ch.waiting && !ch.closing) {  // answered later (serve_ready, expire_waiters)
          ++c.tagged_waiting;
          auto& kids = children_[c.id];
          kids.push_back(ch.id);
          if (kids.size() > 2u * c.tagged_waiting + 16u)  // (ids of answered ones dropped now and then)
            std::erase_if(kids, [&](std::uint64_t id) { return find(id) == nullptr; });
        } else {
          end_wait(ch);
          --live_children_;
          clients_.erase(ch.id);
        }
        return;
      }
      case wire::op::hello:
        break;
    }
    opt_.log("kft store " + address() + ": dropped " + c.peer + ": malformed request (op " +
             std::to_string(static_cast<int>(o)) + ")");
    gone(c);
  }

  // Every write of a key (set, set_owned, add, a compare_set that swapped, multi_set): records
  // its owner and wakes the waiters of that key.
  void write(client& by, std::string key, std::string value, bool owned) {
    if (owned) {
      client* p = by.parent ? find(by.parent) : nullptr;
      client& c = p ? *p : by;  // (a tagged request's keys are its connection's)
      owners_.insert_or_assign(key, c.id);
      c.owned.push_back(key);
      if (c.owned.size() > 2u * c.owned_mark + 16u) compact_owned(c);
    } else {
      owners_.erase(key);
    }
    const auto w = watchers_.find(key);
    data_.insert_or_assign(std::move(key), std::move(value));
    if (w == watchers_.end()) return;
    const auto list = std::move(w->second);
    watchers_.erase(w);
    watch_entries_ -= list.size();
    for (const auto& [id, serial] : list) {
      client* waiter = find(id);
      if (!waiter || !waiter->waiting || waiter->wait_serial != serial) continue;
      --live_watches_;
      if (--waiter->unseen == 0) ready_.push_back(id);
    }
  }

  // The keys a client owns, without those taken over or erased since and without repeats.
  void compact_owned(client& c) {
    std::sort(c.owned.begin(), c.owned.end());
    c.owned.erase(std::unique(c.owned.begin(), c.owned.end()), c.owned.end());
    std::erase_if(c.owned, [&](const std::string& k) {
      const auto it = owners_.find(k);
      return it == owners_.end() || it->second != c.id;
    });
    c.owned_mark = static_cast<std::uint32_t>(c.owned.size());
  }

  // A closed connection's owned keys go with it.
  void release(client& c) {
    for (const auto& k : c.owned) {
      const auto it = owners_.find(k);
      if (it == owners_.end() || it->second != c.id) continue;
      data_.erase(k);
      owners_.erase(it);
    }
    c.owned.clear();
  }

  // ---- waits -----------------------------------------------------------------------------

  bool present(const std::string& key) const { return data_.find(key) != data_.end(); }

  void begin_wait(client& c, wire::op o, std::vector<std::string> keys, std::chrono::milliseconds timeout) {
    if (std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return present(k); })) {
      answer(c, o, keys);
      return;
    }
    if (timeout.count() == 0) {
      answer_timeout(c, keys);
      return;
    }
    c.waiting = true;
    c.wait_op = o;
    c.wait_keys = std::move(keys);
    c.deadline = detail::clock::now() + timeout;
    deadlines_.emplace(c.deadline, c.id);
    watch_missing(c);
  }

  // Indexes the wait under each key it misses.
  void watch_missing(client& c) {
    c.wait_serial = ++wait_serial_;
    c.unseen = 0;
    for (const auto& k : c.wait_keys) {
      if (present(k)) continue;
      watchers_[k].emplace_back(c.id, c.wait_serial);
      ++watch_entries_;
      ++c.unseen;
    }
    live_watches_ += c.unseen;
  }

  void end_wait(client& c) {
    if (!c.waiting) return;
    c.waiting = false;
    deadlines_.erase({c.deadline, c.id});
    live_watches_ -= c.unseen;
    c.unseen = 0;
    std::vector<std::string>().swap(c.wait_keys);
  }

  // The answer to a get, wait or multi_get whose keys are all present.
  void answer(client& c, wire::op o, const std::vector<std::string>& keys) {
    wire::writer w;
    if (o == wire::op::multi_get) {
      std::size_t bytes = 5;
      for (const auto& k : keys) bytes += 4 + data_.find(k)->second.size();
      if (bytes > wire::max_frame) {
        w.u8(static_cast<std::uint8_t>(wire::status::error))
            .str("a multi_get of " + std::to_string(keys.size()) + " keys whose values come to " + std::to_string(bytes) +
                 " bytes, over a reply's " + std::to_string(wire::max_frame >> 20) + " MiB: ask for fewer keys at once");
        reply(c, w.done());
        return;
      }
      w.u8(static_cast<std::uint8_t>(wire::status::ok)).u32(static_cast<std::uint32_t>(keys.size()));
      for (const auto& k : keys) w.str(data_.find(k)->second);
    } else {
      w.u8(static_cast<std::uint8_t>(wire::status::ok));
      if (o == wire::op::get) w.str(data_.find(keys.front())->second);
    }
    reply(c, w.done());
  }

  void answer_timeout(client& c, const std::vector<std::string>& keys) {
    std::vector<const std::string*> miss;
    for (const auto& k : keys)
      if (!present(k)) miss.push_back(&k);
    wire::writer w;
    w.u8(static_cast<std::uint8_t>(wire::status::timeout)).u32(static_cast<std::uint32_t>(miss.size()));
    for (const auto* k : miss) w.str(*k);
    reply(c, w.done());
  }

  // Answers the waiters every watched key of which was written, then serves what they sent
  // meanwhile (which may wake others: repeated until none is left).
  void serve_ready() {
    while (!ready_.empty()) {
      auto batch = std::move(ready_);
      ready_.clear();
      for (const auto id : batch) {
        client* c = find(id);
        if (!c || !c->waiting || c->unseen != 0) continue;
        const bool all = std::all_of(c->wait_keys.begin(), c->wait_keys.end(), [&](const std::string& k) { return present(k); });
        if (!all) {  // some were erased again since: watch those
          watch_missing(*c);
          continue;
        }
        const auto keys = std::move(c->wait_keys);
        const auto o = c->wait_op;
        end_wait(*c);
        answer(*c, o, keys);
        if (c->parent) retire(*c);
        else process(*c);
      }
    }
  }

  // Answers "timeout" to the waits whose deadline passed.
  void expire_waiters(detail::clock::time_point now) {
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      client* c = find(deadlines_.begin()->second);
      if (!c || !c->waiting) {  // (cannot happen: end_wait erases the entry; kept safe)
        deadlines_.erase(deadlines_.begin());
        continue;
      }
      const auto keys = std::move(c->wait_keys);
      end_wait(*c);
      answer_timeout(*c, keys);
      if (c->parent) retire(*c);
      else process(*c);
    }
  }

  // Entries of waits that ended (by timeout or a closed connection) stay in watchers_ until
  // their key is written; swept when they outnumber the live ones (amortised O(1) per wait).
  void compact_watchers() {
    if (watch_entries_ <= 2 * live_watches_ + 1024) return;
    watch_entries_ = 0;
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      std::erase_if(it->second, [&](const std::pair<std::uint64_t, std::uint64_t>& e) {
        client* c = find(e.first);
        return !c || !c->waiting || c->wait_serial != e.second;
      });
      if (it->second.empty()) {
        it = watchers_.erase(it);
      } else {
        watch_entries_ += it->second.size();
        ++it;
      }
    }
  }

  options opt_;
  detail::unique_fd listen_, wake_read_, wake_write_, epoll_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::atomic<int> connected_{0};
  std::atomic<int> dropped_{0};
  std::atomic<std::uint64_t> requests_{0};
  // Everything below is touched by the server thread only.
  std::unordered_map<std::uint64_t, std::unique_ptr<client>> clients_;  // connections, and tagged requests waiting
  std::size_t live_children_ = 0;  // tagged requests among clients_
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> children_;  // connection -> its tagged requests (some answered)
  std::vector<std::uint64_t> dirty_;
  std::deque<std::uint64_t> stranger_order_;  // unauthenticated connections in accept order (some stale)
  int strangers_ = 0;                         // live ones among them
  bool swept_ = false;                        // read_strangers ran this turn
  detail::clock::time_point accept_paused_until_{};
  bool accept_paused_ = false;
  bool warned_fds_ = false;
  std::map<std::string, std::string, std::less<>> data_;
  std::unordered_map<std::string, std::uint64_t> owners_;  // set_owned keys -> their connection's id
  // Pending waits: by key missed (client id, wait serial) and by deadline.
  std::unordered_map<std::string, std::vector<std::pair<std::uint64_t, std::uint64_t>>> watchers_;
  std::set<std::pair<detail::clock::time_point, std::uint64_t>> deadlines_;
  std::vector<std::uint64_t> ready_;  // waits whose keys have all been written
  std::size_t watch_entries_ = 0, live_watches_ = 0;
  std::uint64_t wait_serial_ = 0;
  std::uint64_t next_id_ = 0;
  std::unique_ptr<relay_base> relay_;  // options::upstream: the relay (tcp_store_relay.hpp)
  std::thread thread_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
