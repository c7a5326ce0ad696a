// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/device.hpp
/// @brief Where Gloo's TCP connections go (component `kft::gloo`): the network interface, the
/// TCP device on it, and kft's store seen through Gloo's rendezvous store interface.
///
///     auto nic = kft::gloo::choose_interface(env.get("KFT_SOCKET_IFNAME"), "10.0.0.1");
///     nic.describe();   // "eth0 10.0.0.2 (the route to 10.0.0.1)"
///     auto dev = kft::gloo::make_device(nic);
///
/// The interface is chosen the way NCCL and Gloo choose theirs: `KFT_SOCKET_IFNAME` names it
/// (a comma-separated list of names or name prefixes, `=eth0` for that exact name only,
/// `^docker,lo` for all but those); otherwise it is the one the kernel routes to the job's
/// master address through (on one host: the loopback interface). Only IPv4 addresses are used.
/// Gloo's device listens on that address, on a port the kernel picks; the peers learn it
/// through kft's token-checked store, the only listening socket kft itself adds.
///
/// **SIGPIPE.** Gloo writes to its sockets with `writev`, which raises SIGPIPE when the peer
/// has gone, and SIGPIPE's default action ends the process without a word (Python ignores it,
/// which is why PyTorch's gloo users never meet it; a C++ program does not). kft leaves the
/// process's signal dispositions alone and instead blocks SIGPIPE in every thread that
/// writes to Gloo's sockets: Gloo's event-loop thread (started by `make_device`, which
/// inherits the mask) and, for the length of each call, the thread running it; a SIGPIPE
/// raised there is discarded and the write fails with EPIPE, which becomes kft's error naming
/// the peer.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/device.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <arpa/inet.h>
#include <pthread.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/options.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo {

/// @brief An IPv4 interface of this host.
struct interface_address {
  std::string name;     ///< e.g. "eth0"
  std::string address;  ///< e.g. "10.0.0.2"
};

/// @brief The interface Gloo's connections use, and why.
struct interface_choice {
  std::string name;
  std::string address;
  std::string why;  ///< "the route to 10.0.0.1", "KFT_SOCKET_IFNAME=eth"
  std::string describe() const { return name + " " + address + " (" + why + ")"; }
};

/// @brief Every IPv4 address of this host's interfaces that are up, in the kernel's order.
inline std::vector<interface_address> interfaces() {
  std::vector<interface_address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (!::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) continue;
    out.push_back({i->ifa_name, text});
  }
  ::freeifaddrs(list);
  return out;
}

namespace detail {

inline std::string listing(const std::vector<interface_address>& all) {
  std::string s;
  for (const auto& a : all) s += (s.empty() ? "" : ", ") + a.name + " " + a.address;
  return s.empty() ? std::string("none") : s;
}

// One IPv4 address for a host name or dotted address.
inline std::optional<in_addr> resolve4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return std::nullopt;
  const in_addr a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

// The local address the kernel would send from to reach `to` (a UDP connect sends nothing).
inline std::optional<std::string> source_address_towards(const in_addr& to) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(9);  // "discard": any port will do
  peer.sin_addr = to;
  sockaddr_in self{};
  socklen_t len = sizeof self;
  std::optional<std::string> out;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof peer) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &self.sin_addr, text, sizeof text)) out = text;
  }
  ::close(fd);
  return out;
}

inline std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto c = s.find(',');
    std::string part(s.substr(0, c));
    if (!part.empty()) out.push_back(std::move(part));
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  return out;
}

}  // namespace detail

/// @brief The interface for Gloo's connections: by `ifname` (the value of `KFT_SOCKET_IFNAME`)
/// when given, else the one that routes to `master` (host name or address).
/// @throws config_error naming the setting and listing this host's interfaces when nothing
/// matches, or `master` when it does not resolve
inline interface_choice choose_interface(const std::optional<std::string>& ifname, const std::string& master,
                                         const std::vector<interface_address>& all = interfaces()) {
  const auto site = error_site::of("gloo interface");
  if (ifname && !ifname->empty()) {
    std::string_view spec = *ifname;
    const bool exclude = spec.front() == '^';
    const bool exact = spec.front() == '=';
    if (exclude || exact) spec.remove_prefix(1);
    const auto names = detail::split_commas(spec);
    if (names.empty()) throw config_error("KFT_SOCKET_IFNAME", *ifname, "names no interface", site);
    auto matches = [&](const std::string& n) {
      for (const auto& want : names)
        if (exact ? n == want : n.starts_with(want)) return true;
      return false;
    };
    for (const auto& a : all)
      if (matches(a.name) != exclude) return {a.name, a.address, "KFT_SOCKET_IFNAME=" + *ifname};
    throw config_error("KFT_SOCKET_IFNAME", *ifname,
                       "matches no interface with an IPv4 address here (this host has: " + detail::listing(all) + ")",
                       site);
  }
  const auto to = detail::resolve4(master);
  if (!to)
    throw config_error("MASTER_ADDR", master,
                       "does not resolve to an IPv4 address, so the interface towards it is unknown (set "
                       "KFT_SOCKET_IFNAME to choose one)",
                       site);
  const auto src = detail::source_address_towards(*to);
  if (src)
    for (const auto& a : all)
      if (a.address == *src) return {a.name, a.address, "the route to " + master};
  throw config_error("MASTER_ADDR", master,
                     "has no route from this host" + (src ? " through an interface that is up (source " + *src + ")"
                                                          : std::string()) +
                         "; set KFT_SOCKET_IFNAME (this host has: " + detail::listing(all) + ")",
                     site);
}

namespace detail {

/// @brief While alive, SIGPIPE is blocked in this thread; at the end, a SIGPIPE raised in the
/// meantime (a write to a socket whose peer has gone) is discarded and the thread's mask is
/// restored. Threads started meanwhile inherit the blocked mask (Gloo's event loop).
class sigpipe_blocked {
 public:
  sigpipe_blocked() noexcept {
    ::sigemptyset(&pipe_);
    ::sigaddset(&pipe_, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    ::sigpending(&pending);
    pending_before_ = ::sigismember(&pending, SIGPIPE) == 1;  // someone else's: not ours to discard
  }
  ~sigpipe_blocked() {
    sigset_t pending;
    if (!pending_before_ && ::sigpending(&pending) == 0 && ::sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{0, 0};
      while (::sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  sigpipe_blocked(const sigpipe_blocked&) = delete;
  sigpipe_blocked& operator=(const sigpipe_blocked&) = delete;

 private:
  sigset_t pipe_{}, old_{};
  bool pending_before_ = false;
};

}  // namespace detail

/// @brief Gloo's TCP device listening on the chosen interface's address (its event-loop
/// thread starts with SIGPIPE blocked: see the file's note).
/// @throws transport_error with Gloo's text when it cannot bind
inline std::shared_ptr<::gloo::transport::Device> make_device(const interface_choice& nic) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = nic.address;
  attr.ai_family = AF_INET;
  const detail::sigpipe_blocked quiet;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw transport_error("Gloo could not open a TCP device on " + nic.describe() + ": " + e.what(),
                          error_site::of("gloo device"));
  }
}

/// @brief kft's store as Gloo's rendezvous store: Gloo meets through it with kft's deadlines
/// (a wait past `timeout` is kft's timeout_error naming the keys).
class store_adapter final : public ::gloo::rendezvous::Store {
 public:
  store_adapter(std::shared_ptr<rendezvous::store> s, std::chrono::milliseconds timeout)
      : s_(std::move(s)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = s_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    options asked;  // Gloo's 0 is "no timeout of its own": the communicator's
    asked.timeout = timeout;
    s_->wait(keys, kft::timeout_or(asked, timeout_));
  }

 private:
  std::shared_ptr<rendezvous::store> s_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gloo
KFT_NAMESPACE_END
