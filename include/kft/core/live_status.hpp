// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/live_status.hpp
/// @brief A running rank's live status, on request: kftrun asks every worker of its node where
/// it is (issue 47 item 6) and shows the whole job as JSON (`kill -USR1 <kftrun>`, or
/// `kftrun status` against the job's store; docs/flight-recorder.md).
///
/// When `KFT_STATUS_DIR` is set (kftrun sets it for its workers), `make_process_group` starts one
/// thread that listens on the Unix socket `<dir>/rank<R>.sock` and, to each connection, writes
/// one JSON line and closes it:
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

/// @brief The socket a rank's status thread listens on: `<dir>/rank<R>.sock`.
inline std::string status_socket(const std::string& dir, int rank) {
  return dir + "/rank" + std::to_string(rank) + ".sock";
}

/// @brief Starts the status thread (once per process): listens on `status_socket(dir, rank)`
/// and answers each connection with `status_json()`. Throws `config_error` naming
/// KFT_STATUS_DIR when the socket cannot be made there (a path too long for a Unix socket, a
/// directory that does not exist).
inline void serve_status(const std::string& dir, int rank) {
  static std::atomic<bool> started{false};
  if (dir.empty() || started.exchange(true)) return;
  const std::string path = status_socket(dir, rank);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    started = false;
    throw config_error("KFT_STATUS_DIR", dir,
                       "is too long for a Unix socket path (" + path + ": at most " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes)");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    started = false;
    throw config_error("KFT_STATUS_DIR", dir, "status socket: " + std::string(std::strerror(errno)));
  }
  ::unlink(path.c_str());  // (a socket left by an earlier process of this rank)
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    started = false;
    throw config_error("KFT_STATUS_DIR", dir, "cannot listen on " + path + ": " + std::strerror(err));
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
