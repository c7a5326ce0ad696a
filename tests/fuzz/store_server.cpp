// SPDX-License-Identifier: Apache-2.0
// The TCP store server (kft/rendezvous/tcp_store_server.hpp) against fuzzed connections.
//
// One server per process (127.0.0.1, any port, token "t", log discarded). Per input: connect;
// if bit 0 of byte 0 is set, send a valid hello first (the token, as tcp_store's client does);
// send the rest of the input; read replies until the server closes, goes quiet for a moment or
// 200 ms pass; shut down our write side; read until EOF (or 200 ms more); close. Then a real
// tcp_store client connects, sets and gets one key: the server must still answer, else abort.
// The same client then erases every key, so each input starts from an empty store and a crash
// input replays alone as it ran.
//
// Expected: the server never crashes, never throws out of its thread and keeps serving; replies
// are well-formed frames. Bytes after a malformed frame may be dropped (the server closes the
// connection), that is its right.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/tcp_store_server.hpp>

#include "fuzz_common.hpp"

namespace {

namespace rdzv = kft::rendezvous;
namespace wire = kft::rendezvous::wire;
using clock_type = std::chrono::steady_clock;

constexpr const char* token = "t";

rdzv::tcp_store_server& server() {
  // Never destroyed: its thread serves until the process exits.
  static auto* s = new rdzv::tcp_store_server({.host = "127.0.0.1", .port = 0, .token = token,
                                               .log = [](const std::string&) {}});
  return *s;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) kft_fuzz::fail("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // libFuzzer's timer (SIGALRM, for -timeout) may interrupt a blocking connect(); the connection
  // then goes on in the background (EINTR), so wait for it to finish rather than call it failed.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINTR) kft_fuzz::fail(std::string("cannot connect to the store: ") + std::strerror(errno));
    const auto deadline = clock_type::now() + std::chrono::seconds(5);
    while (true) {
      pollfd p{fd, POLLOUT, 0};
      const int rc = ::poll(&p, 1, 100);
      if (rc == 1) break;
      if ((rc < 0 && errno != EINTR) || clock_type::now() >= deadline)
        kft_fuzz::fail("connecting to the store did not finish within 5 s after an interrupted connect()");
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) kft_fuzz::fail(std::string("cannot connect to the store: ") + std::strerror(err));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Sends what the server will take; it may close early (after a malformed frame), which is fine.
void send_some(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Reads until EOF, an error, `quiet` without a byte, or `deadline`. True on EOF.
bool read_replies(int fd, std::string& got, std::chrono::milliseconds quiet, clock_type::time_point deadline) {
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min(left, quiet).count()));
    if (rc == 0) return false;
    if (rc < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno != EINTR && errno != EAGAIN;  // ECONNRESET: closed too
    got.append(buf, static_cast<std::size_t>(n));
    if (got.size() > (1u << 24)) kft_fuzz::fail("the server sent more than 16 MiB for a few KiB of requests");
  }
}

// Whatever came back must be whole frames of a known status, maybe cut at the end.
void check_replies(std::string_view got) {
  while (got.size() >= 4) {
    const auto n = wire::frame_length(got);
    kft_fuzz::check(n >= 1 && n <= wire::max_frame, "a reply frame has a status byte and fits the limit");
    if (got.size() < 4u + n) return;
    const auto status = static_cast<unsigned char>(got[4]);
    kft_fuzz::check(status <= static_cast<unsigned char>(wire::status::error), "a reply starts with a known status");
    got.remove_prefix(4u + n);
  }
}

void health_check(int port, std::uint64_t round) {
  const std::string value = "alive " + std::to_string(round);
  try {
    rdzv::tcp_store client({.host = "127.0.0.1", .port = port, .token = token,
                            .connect_timeout = std::chrono::seconds(10), .io_timeout = std::chrono::seconds(10),
                            .name = "fuzz health check"});
    client.set("kft-fuzz/alive", value);
    const auto back = client.get("kft-fuzz/alive", std::chrono::seconds(10));
    if (back != value) kft_fuzz::fail("the store answered \"" + back + "\" for \"" + value + "\"");
    for (const auto& k : client.keys("")) client.erase(k);
    if (!client.keys("").empty()) kft_fuzz::fail("the store still has keys after erasing them all");
  } catch (const std::exception& e) {
    kft_fuzz::fail(std::string("the store stopped serving after this input: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::uint64_t round = 0;
  const std::string_view input = kft_fuzz::text(data, size);
  if (input.empty()) return 0;
  const bool hello = (static_cast<unsigned char>(input[0]) & 1) != 0;
  const int port = server().port();

  const int fd = connect_to(port);
  std::string got;
  if (hello)
    send_some(fd, wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str(token).str("fuzz").done());
  send_some(fd, input.substr(1));
  const auto deadline = clock_type::now() + std::chrono::milliseconds(200);
  if (!read_replies(fd, got, std::chrono::milliseconds(5), deadline)) {
    ::shutdown(fd, SHUT_WR);  // the server must notice and drop the connection (and its pending wait)
    (void)read_replies(fd, got, std::chrono::milliseconds(200), clock_type::now() + std::chrono::milliseconds(200));
  }
  ::close(fd);
  check_replies(got);
  if (hello && got.size() >= 5) kft_fuzz::check(got[4] == 0, "a valid hello is answered ok");

  health_check(port, ++round);
  return 0;
}
