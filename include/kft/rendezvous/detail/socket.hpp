// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/detail/socket.hpp
/// @brief Small POSIX socket helpers with deadlines (internal to the TCP store).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous::detail {

using clock = std::chrono::steady_clock;

/// Owns a file descriptor.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

inline std::string errno_text(int e) { return std::strerror(e); }

inline std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

struct addrinfo_deleter {
  void operator()(addrinfo* a) const noexcept { ::freeaddrinfo(a); }
};
using unique_addrinfo = std::unique_ptr<addrinfo, addrinfo_deleter>;

/// Resolves host:port for TCP. Throws config_error (the address is the user's input).
inline unique_addrinfo resolve(const std::string& host, int port, bool passive, const char* site = "store connect") {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    throw config_error("address", host, std::string("cannot be resolved: ") + ::gai_strerror(rc),
                       error_site::of(site));
  return unique_addrinfo(res);
}

/// resolve(), tried again with backoff (20 ms doubling to 500 ms) while the name is unknown,
/// until `deadline`: a Kubernetes pod's own name appears in its headless service's DNS a moment
/// after the pod starts, and a store bound to that name must not fail for it. A deadline
/// already passed (the default) means one try.
inline unique_addrinfo resolve_until(const std::string& host, int port, bool passive, clock::time_point deadline,
                                     const char* site) {
  auto pause = std::chrono::milliseconds(20);
  while (true) {
    try {
      return resolve(host, port, passive, site);
    } catch (const config_error&) {
      if (clock::now() + pause >= deadline) throw;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::milliseconds(500));
  }
}

inline void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Port of a bound socket.
inline int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

/// "a.b.c.d:port" of a connected socket's peer.
inline std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  }
  return endpoint(host, port);
}

/// Binds and listens on host:port (port 0 = any free port), resolving `host` until
/// `resolve_deadline` (see resolve_until; default: one try).
/// @throws config_error when `host` cannot be resolved by then
/// @throws transport_error naming the address, with a clear word for "already in use"
inline unique_fd listen_on(const std::string& host, int port, clock::time_point resolve_deadline = {}) {
  auto res = resolve_until(host, port, true, resolve_deadline, "store listen");
  int last = 0;
  for (addrinfo* a = res.get(); a != nullptr; a = a->ai_next) {
    unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // TIME_WAIT only, not a live listener
    // The longest queue of connections not yet accepted the kernel allows (it caps the number at
    // net.core.somaxconn, 4096 by default since Linux 5.4): thousands of ranks connect at once.
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 65535) != 0) {
      last = errno;
      continue;
    }
    return fd;
  }
  if (last == EADDRINUSE)
    throw transport_error("cannot listen on " + endpoint(host, port) +
                              ": address already in use (another job, or an earlier run still holding the port?)",
                          error_site::of("store listen"), last);
  throw transport_error("cannot listen on " + endpoint(host, port) + ": " + errno_text(last),
                        error_site::of("store listen"), last);
}

/// Binds a socket about to connect to the local address `source` (a numeric IPv4 or IPv6
/// address; the port is chosen at connect time).
/// @throws config_error naming the address when it cannot be bound
inline void bind_source(int fd, int family, const std::string& source) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(source.c_str(), "0", &hints, &res); rc != 0)
    throw config_error("source address", source, std::string("is not a numeric address of the store's family: ") + ::gai_strerror(rc),
                       error_site::of("store connect"));
  const unique_addrinfo owned(res);
#ifdef IP_BIND_ADDRESS_NO_PORT
  int one = 1;  // the port is picked by connect(), per destination: no ephemeral port is held per source
  ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#endif
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0)
    throw config_error("source address", source, "cannot be bound: " + errno_text(errno), error_site::of("store connect"));
}

/// Connects to host:port, retrying with backoff until `deadline`, or until `cancelled` (checked
/// between attempts, at least every 250 ms) returns true. `timeout` is what the error message
/// names (the whole wait the caller was given, which may have begun before this call). A
/// non-empty `source` binds the socket to that local address first (bind_source).
/// @throws timeout_error naming the address, the timeout and the last error
/// @throws usage_error when cancelled
/// @throws config_error when `source` cannot be bound
inline unique_fd connect_until(const std::string& host, int port, clock::time_point deadline,
                               std::chrono::milliseconds timeout, const std::function<bool()>& cancelled = {},
                               const std::string& source = {}) {
  auto pause = std::chrono::milliseconds(20);
  std::string last = "no attempt";
  while (true) {
    if (cancelled && cancelled())
      throw usage_error("connecting to the rendezvous store at " + endpoint(host, port) + " was cancelled",
                        error_site::of("store connect"));
    unique_addrinfo res;
    try {
      res = resolve(host, port, false);
    } catch (const config_error& e) {
      last = e.detail();  // DNS may come up late (Kubernetes headless services): keep trying
    }
    for (addrinfo* a = res.get(); a != nullptr; a = a->ai_next) {
      unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd) {
        last = errno_text(errno);
        continue;
      }
      if (!source.empty()) bind_source(fd.get(), a->ai_family, source);
      set_nonblocking(fd.get(), true);
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
        pollfd p{fd.get(), POLLOUT, 0};
        rc = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left.count(), 1, 1000)));
        if (rc == 1) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          rc = -1;
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        set_nonblocking(fd.get(), false);
        set_nodelay(fd.get());
        return fd;
      }
      last = errno_text(errno);
    }
    const auto now = clock::now();
    if (now >= deadline)
      throw timeout_error("could not reach the rendezvous store at " + endpoint(host, port) + " within " +
                              kft::detail::describe_duration(timeout) + " (last error: " + last + ")",
                          error_site::of("store connect"));
    std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));  // one last try at the deadline
    pause = std::min(pause * 2, std::chrono::milliseconds(cancelled ? 250 : 1000));
  }
}

/// connect_until with a deadline `timeout` from now.
inline unique_fd connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout,
                                    const std::function<bool()>& cancelled = {}, const std::string& source = {}) {
  return connect_until(host, port, clock::now() + timeout, timeout, cancelled, source);
}

/// Waits for `events` on fd until the deadline; false on timeout.
inline bool wait_for(int fd, short events, clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the read/write report the error
  }
}

/// Sends all of `data` before `deadline`. Empty on success, else why not. (It tries first and
/// waits only when the socket's buffer is full: a small request is one system call.)
inline std::string send_all(int fd, std::string_view data, clock::time_point deadline) {
  for (std::size_t sent = 0; sent < data.size();) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) return "timed out sending";
      continue;
    }
    return n == 0 ? std::string("sent nothing") : errno_text(errno);
  }
  return {};
}

/// How a `recv_exact` ended.
struct recv_result {
  enum class status { ok, timeout, closed, error } what = status::ok;
  std::size_t got = 0;  ///< bytes received before it ended
  int err = 0;          ///< errno, for status::error
};

/// Receives at least `count` and at most `capacity` bytes into `buf` before `deadline` (whatever
/// has arrived, in as few reads as it takes: a reply's header and body in one).
inline recv_result recv_at_least(int fd, char* buf, std::size_t count, std::size_t capacity, clock::time_point deadline) {
  recv_result r;
  while (r.got < count) {
    if (!wait_for(fd, POLLIN, deadline)) {
      r.what = recv_result::status::timeout;
      return r;
    }
    const ssize_t n = ::recv(fd, buf + r.got, capacity - r.got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n == 0) {
      r.what = recv_result::status::closed;
      return r;
    }
    if (n < 0) {
      r.what = recv_result::status::error;
      r.err = errno;
      return r;
    }
    r.got += static_cast<std::size_t>(n);
  }
  return r;
}

/// Receives exactly `count` bytes into `buf` before `deadline`.
inline recv_result recv_exact(int fd, char* buf, std::size_t count, clock::time_point deadline) {
  return recv_at_least(fd, buf, count, count, deadline);
}

}  // namespace rendezvous::detail
KFT_NAMESPACE_END
