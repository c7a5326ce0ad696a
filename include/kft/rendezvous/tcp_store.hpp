/// @file kft/rendezvous/tcp_store.hpp
/// @brief The TCP store: one server (in kftrun's node-0 agent, or in rank 0), any number of
/// clients on any host.
///
/// Security: the server binds to the address it is given (the rendezvous address, not
/// 0.0.0.0 unless asked), and every connection must first present the job's token (128
/// random bits made by the launcher, or `KFT_RDZV_TOKEN`); a wrong token is refused, logged
/// by the server and reported to the client.
///
/// Waits are timed on both sides: the server answers a `get`/`wait` with "timeout" when the
/// client's deadline passes, so every request gets exactly one reply; the client also gives
/// up if the server goes silent, and reports the store as lost.
///
/// Wire format (little-endian): a frame is `u32 length` + payload; a payload is `u8 op` (or
/// `u8 status` in replies) followed by fields, strings as `u32 length` + bytes.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <kft/rendezvous/detail/socket.hpp>
#include <kft/rendezvous/memory_store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

namespace wire {

enum class op : std::uint8_t { hello = 1, set, get, wait, add, cas, erase, ping, keys };
enum class status : std::uint8_t { ok = 0, denied = 1, timeout = 2, error = 3 };

/// Largest frame accepted after authentication, and before it.
inline constexpr std::uint32_t max_frame = 64u << 20;
inline constexpr std::uint32_t max_hello_frame = 4096;

/// Builds one frame.
class writer {
 public:
  writer() : buf_(4, '\0') {}
  writer& u8(std::uint8_t v) {
    buf_ += static_cast<char>(v);
    return *this;
  }
  writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  writer& i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_ += static_cast<char>((u >> (8 * i)) & 0xff);
    return *this;
  }
  writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_ += s;
    return *this;
  }
  /// The frame, length prefix filled in.
  std::string done() {
    const auto n = static_cast<std::uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

/// Reads the fields of one payload (which it owns); `ok()` turns false on a short or
/// malformed payload.
class reader {
 public:
  explicit reader(std::string data) : data_(std::move(data)) {}
  std::uint8_t u8() { return need(1) ? static_cast<std::uint8_t>(data_[pos_++]) : 0; }
  std::uint32_t u32() {
    if (!need(4)) return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(data_[pos_++])) << (8 * i);
    return v;
  }
  std::int64_t i64() {
    if (!need(8)) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data_[pos_++])) << (8 * i);
    return static_cast<std::int64_t>(v);
  }
  std::string str() {
    const auto n = u32();
    if (!need(n)) return {};
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return pos_ == data_.size(); }

 private:
  bool need(std::size_t n) {
    if (!ok_ || data_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  std::string data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

inline std::uint32_t frame_length(std::string_view four) {
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(four[static_cast<std::size_t>(i)])) << (8 * i);
  return n;
}

/// Token comparison that does not stop at the first differing byte.
inline bool same_token(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace wire

/// @brief The store server. Listens on construction (so "port in use" is thrown there) and
/// serves from a background thread until destroyed.
class tcp_store_server {
 public:
  struct options {
    std::string host = "127.0.0.1";  ///< address to bind; "0.0.0.0" or "::" only if you mean it
    int port = 0;                    ///< 0 = any free port (see port())
    std::string token;               ///< clients must present it; must not be empty
    /// Where refusals and protocol errors are reported (default: stderr, one line each).
    std::function<void(const std::string&)> log;
  };

  explicit tcp_store_server(options opt) : opt_(std::move(opt)) {
    if (opt_.token.empty())
      throw usage_error("a TCP store needs a token (KFT_RDZV_TOKEN, or kft::random_token())",
                        error_site::of("store listen"));
    if (!opt_.log) opt_.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    listen_ = detail::listen_on(opt_.host, opt_.port);
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
    // A pending get/wait.
    bool waiting = false;
    wire::op wait_op = wire::op::get;
    std::vector<std::string> wait_keys;
    detail::clock::time_point deadline;
  };

  void run() {
    std::vector<std::unique_ptr<client>> clients;
    std::vector<pollfd> fds;
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      auto next_deadline = detail::clock::time_point::max();
      for (auto& c : clients) {
        short ev = POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        fds.push_back({c->fd.get(), ev, 0});
        if (c->waiting) next_deadline = std::min(next_deadline, c->deadline);
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
        if (!c.closing) process(c);
        if (re & POLLOUT) flush(c);
      }
      expire_waiters(clients);
      std::erase_if(clients, [](const std::unique_ptr<client>& c) { return c->closing && c->out.empty(); });
      connected_.store(static_cast<int>(clients.size()));
    }
  }

  void accept_all(std::vector<std::unique_ptr<client>>& clients) {
    while (true) {
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      detail::set_nodelay(fd);
      auto c = std::make_unique<client>();
      c->fd = detail::unique_fd(fd);
      c->peer = detail::peer_name(fd);
      clients.push_back(std::move(c));
    }
  }

  void read_from(client& c) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.size() > wire::max_frame + 4u) break;
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
        opt_.log("kft store " + address() + ": dropped " + c.peer + ": frame of " + std::to_string(n) + " bytes");
        c.closing = true;
        c.out.clear();
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
        opt_.log("kft store " + address() + ": refused " + c.peer + (who.empty() ? "" : " (" + who + ")") +
                 ": " + (o == wire::op::hello ? "wrong token" : "no hello"));
        reply(c, wire::writer().u8(static_cast<std::uint8_t>(wire::status::denied)).done());
        c.closing = true;
      }
      return;
    }
    wire::writer w;
    auto ok = [&]() -> wire::writer& { return w.u8(static_cast<std::uint8_t>(wire::status::ok)); };
    switch (o) {
      case wire::op::set: {
        auto key = r.str();
        auto value = r.str();
        if (!r.ok()) break;
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
          const auto v =
              detail::counter_value(it == data_.end() ? std::nullopt : std::optional<std::string>(it->second), key,
                                    "tcp store " + address()) +
              delta;
          data_.insert_or_assign(key, std::to_string(v));
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
  std::map<std::string, std::string, std::less<>> data_;  // only touched by the server thread
  std::thread thread_;
};

/// @brief A client of a tcp_store_server. Thread-safe (one request at a time).
class tcp_store final : public store {
 public:
  struct options {
    std::string host;
    int port = 0;
    std::string token;
    std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);  ///< retry until then
    std::chrono::milliseconds io_timeout = std::chrono::seconds(30);  ///< a non-waiting request
    std::string name;  ///< shown in the server's log when refused, e.g. "node 1 agent"
  };

  /// @brief Connects (retrying with backoff) and authenticates.
  /// @throws timeout_error naming the address when it cannot connect in time
  /// @throws config_error when the server refuses the token
  explicit tcp_store(options opt) : opt_(std::move(opt)) {
    fd_ = detail::connect_with_retry(opt_.host, opt_.port, opt_.connect_timeout);
    auto r = request(wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str(opt_.token).str(opt_.name).done(),
                     opt_.io_timeout, "hello");
    if (static_cast<wire::status>(r.u8()) != wire::status::ok) {
      fd_.reset();
      throw config_error("KFT_RDZV_TOKEN", "(hidden)",
                         "was refused by the rendezvous store at " + address() +
                             ": this process's token is not the job's (every agent and rank must share one)",
                         error_site::of("store connect"));
    }
  }

  std::string address() const { return detail::endpoint(opt_.host, opt_.port); }
  std::string describe() const override { return "tcp store " + address(); }

  void set(std::string_view key, std::string_view value) override {
    expect_ok(call(wire::writer().u8(op(wire::op::set)).str(key).str(value), "set"), "set");
  }
  std::optional<std::string> try_get(std::string_view key) override {
    auto r = call(wire::writer().u8(op(wire::op::get)).str(key).u32(0), "get");
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) return std::nullopt;
    check(s, r, "get");
    return r.str();
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    auto r = call(wire::writer().u8(op(wire::op::get)).str(key).u32(ms(timeout)), "get", timeout);
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) {
      const std::string k(key);
      throw detail::wait_timeout("get", std::span(&k, 1), timeout, describe());
    }
    check(s, r, "get");
    return r.str();
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    wire::writer w;
    w.u8(op(wire::op::wait)).u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    auto r = call(w.u32(ms(timeout)), "wait", timeout);
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) {
      std::vector<std::string> missing(r.u32());
      for (auto& k : missing) k = r.str();
      throw detail::wait_timeout("wait", missing, timeout, describe());
    }
    check(s, r, "wait");
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    auto r = call(wire::writer().u8(op(wire::op::add)).str(key).i64(delta), "add");
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::error) throw usage_error(r.str(), error_site::of("store add"));
    check(s, r, "add");
    return r.i64();
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    auto r = call(wire::writer().u8(op(wire::op::cas)).str(key).u8(expected ? 1 : 0).str(expected.value_or("")).str(desired),
                  "compare_set");
    check(static_cast<wire::status>(r.u8()), r, "compare_set");
    cas_result out;
    out.swapped = r.u8() != 0;
    const bool has = r.u8() != 0;
    auto cur = r.str();
    if (has) out.current = std::move(cur);
    return out;
  }
  bool erase(std::string_view key) override {
    auto r = call(wire::writer().u8(op(wire::op::erase)).str(key), "erase");
    check(static_cast<wire::status>(r.u8()), r, "erase");
    return r.u8() != 0;
  }
  std::vector<std::string> keys(std::string_view prefix) override {
    auto r = call(wire::writer().u8(op(wire::op::keys)).str(prefix), "keys");
    check(static_cast<wire::status>(r.u8()), r, "keys");
    std::vector<std::string> out(r.u32());
    for (auto& k : out) k = r.str();
    return out;
  }
  /// @brief A round trip; throws when the store is gone.
  void ping() { expect_ok(call(wire::writer().u8(op(wire::op::ping)), "ping"), "ping"); }

 private:
  static std::uint8_t op(wire::op o) { return static_cast<std::uint8_t>(o); }
  static std::uint32_t ms(std::chrono::milliseconds d) {
    return static_cast<std::uint32_t>(std::clamp<long long>(d.count(), 0, 0x7fffffff));
  }

  // One request, one reply. `wait_time` is how long the server may legitimately hold it.
  wire::reader call(wire::writer w, const char* what, std::chrono::milliseconds wait_time = std::chrono::milliseconds(0)) {
    return request(w.done(), wait_time + opt_.io_timeout, what);
  }

  wire::reader request(const std::string& frame, std::chrono::milliseconds timeout, const char* what) {
    std::lock_guard lock(mu_);
    if (!fd_) lost(what, "an earlier request failed");
    const auto deadline = detail::clock::now() + timeout;
    if (auto why = detail::send_all(fd_.get(), frame, deadline); !why.empty()) lost(what, why);
    auto read_exact = [&](std::size_t count) {
      std::string buf(count, '\0');
      using st = detail::recv_result::status;
      const auto r = detail::recv_exact(fd_.get(), buf.data(), count, deadline);
      if (r.what == st::timeout) lost(what, "no reply within " + kft::detail::describe_duration(timeout));
      if (r.what == st::closed) lost(what, "the store closed the connection (did its host process end?)");
      if (r.what == st::error) lost(what, detail::errno_text(r.err));
      return buf;
    };
    const auto header = read_exact(4);
    const auto n = wire::frame_length(header);
    if (n == 0 || n > wire::max_frame) lost(what, "malformed reply");
    return wire::reader(read_exact(n));
  }

  [[noreturn]] void lost(const char* what, const std::string& why) {
    fd_.reset();
    throw transport_error("lost the rendezvous store at " + address() + ": " + why,
                          error_site::of(std::string("store ") + what));
  }
  void check(wire::status s, const wire::reader& r, const char* what) {
    if (s != wire::status::ok || !r.ok()) {
      std::lock_guard lock(mu_);
      lost(what, "unexpected reply");
    }
  }
  void expect_ok(wire::reader r, const char* what) { check(static_cast<wire::status>(r.u8()), r, what); }

  options opt_;
  std::mutex mu_;
  detail::unique_fd fd_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
