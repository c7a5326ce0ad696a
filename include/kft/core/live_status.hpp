// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/live_status.hpp
/// @brief A running rank's live status, on request: kftrun asks every worker of its node where
/// it is (issue 47 item 6) and shows the whole job as JSON (`kill -USR1 <kftrun>`, or
/// `kftrun status` against the job's store; docs/flight-recorder.md).
///
/// When `KFT_STATUS_NAME` is set (kftrun sets it for its workers), `make_process_group` starts
/// one thread that listens on the abstract Unix socket `@<name>/rank<R>` (Linux's abstract
/// namespace: no file, so nothing is left behind whatever ends the job; reachable from the
/// same network namespace, as kftrun is) and, to each connection, writes one JSON line and
/// closes it:
///
///     {"rank":3,"world_size":8,"host":"node1","pid":4242,"step":1200,"now_ns":...,
///      "calls":[{"group_id":"job","generation":0,"seq":5101,"op":"allreduce","dtype":"f32",
///                "count":1024,"state":"completed","start_ns":...,"end_ns":...,"calls":5101}]}
///
/// `step` is the trainer's step (`trace::note_step`; -1 when the program has none), `calls` the
/// newest call of each of the process's flight recorders. The thread sleeps in accept() between
/// requests: nothing is added to a collective's path. A stopped process (SIGSTOP) does not
/// answer; kftrun says so from the process's state.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include <kft/core/error.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace trace {

/// @brief This process's status line (no newline): what the status thread answers.
inline std::string status_json() {
  const auto& r = detail::the_registry();
  std::string out = "{";
  out += r.identity[0] ? std::string(r.identity) + "," : std::string();
  out += "\"pid\":" + std::to_string(::getpid()) + ",\"step\":" + std::to_string(r.step.load(std::memory_order_relaxed)) +
         ",\"now_ns\":" + std::to_string(now_ns()) + ",\"calls\":[";
  const double per_tick = ns_per_tick();
  bool first = true;
  for_each_recorder([&](const recorder& rec) {
    const auto c = rec.last_call_json(per_tick);
    if (c.empty()) return;
    out += (first ? "" : ",") + c;
    first = false;
  });
  return out + "]}";
}

/// @brief The abstract socket a rank's status thread listens on: `<name>/rank<R>` (its address
/// is a 0 byte, then this).
inline std::string status_socket(const std::string& name, int rank) { return name + "/rank" + std::to_string(rank); }

/// @brief `addr` for the abstract socket `name`; returns the address's length, 0 when `name` is
/// too long.
inline socklen_t abstract_address(const std::string& name, sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof addr.sun_path) return 0;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // (sun_path[0] = 0: abstract)
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

/// @brief Starts the status thread (once per process): listens on `status_socket(name, rank)`
/// and answers each connection with `status_json()`. Throws `config_error` naming
/// KFT_STATUS_NAME when the socket cannot be made (a name too long, one taken).
inline void serve_status(const std::string& name, int rank) {
  static std::atomic<bool> started{false};
  if (name.empty() || started.exchange(true)) return;
  const std::string path = status_socket(name, rank);
  sockaddr_un addr{};
  const socklen_t len = abstract_address(path, addr);
  if (len == 0) {
    started = false;
    throw config_error("KFT_STATUS_NAME", name,
                       "is too long for a Unix socket's name (" + path + ": at most " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes)");
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    started = false;
    throw config_error("KFT_STATUS_NAME", name, "status socket: " + std::string(std::strerror(errno)));
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    started = false;
    throw config_error("KFT_STATUS_NAME", name, "cannot listen on @" + path + ": " + std::strerror(err));
  }
  std::thread([fd] {
    for (;;) {
      const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // (the socket is gone: no status from now on)
      }
      std::string line;
      try {
        line = status_json() + "\n";
      } catch (...) {
        line = "{\"error\":\"the status could not be built\"}\n";
      }
      // (a reader that does not read is cut off after 1 s: the thread serves the next one)
      timeval t{1, 0};
      ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
      std::size_t done = 0;
      while (done < line.size()) {
        const ssize_t w = ::send(c, line.data() + done, line.size() - done, MSG_NOSIGNAL);
        if (w <= 0) break;
        done += static_cast<std::size_t>(w);
      }
      ::close(c);
    }
  }).detach();
}

}  // namespace trace
KFT_NAMESPACE_END
