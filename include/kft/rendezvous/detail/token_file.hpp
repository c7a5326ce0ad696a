// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/detail/token_file.hpp
/// @brief Handing a job's store token from rank 0 to the other ranks of a single-host job
/// through a file only this user can read (internal to `connect_store`).
///
/// The file lives in `$XDG_RUNTIME_DIR/kft` or `/tmp/kft-<uid>` (created 0700; refused when it
/// is a symlink, not owned by this user, or open to others), is written 0600 with O_EXCL and
/// renamed into place, and holds `<token> <pid of rank 0>`. A reader takes it only when that
/// pid is alive, so a file left by a killed earlier run with the same key is never used.
/// Rank 0 removes it when its store handle goes away.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/hash.hpp>
#include <kft/core/hex.hpp>
#include <kft/core/token.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous::detail {

/// The private directory (created if missing).
/// @throws config_error when it exists but is not private to this user
inline std::string private_dir(const environment& env) {
  const auto uid = ::getuid();
  std::string dir;
  if (auto x = env.get("XDG_RUNTIME_DIR"); x && !x->empty() && x->front() == '/')
    dir = *x + "/kft";
  else
    dir = "/tmp/kft-" + std::to_string(uid);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw transport_error("cannot create " + dir + ": " + std::strerror(errno), error_site::of("store token"), errno);
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0)
    throw config_error("", "",
                       dir + " is not a directory private to this user (uid " + std::to_string(uid) +
                           ", mode 0700): refusing to hand the job's token through it; remove it or set KFT_RDZV_TOKEN",
                       error_site::of("store token"));
  return dir;
}

/// A file name for the job: FNV-1a of what identifies it (run id, rendezvous address, round),
/// its eight bytes in memory order as hex.
inline std::string token_file_name(const std::string& job_key) {
  const std::uint64_t h = kft::detail::fnv1a(job_key);
  return "rdzv-" + kft::detail::to_hex(&h, sizeof h) + ".token";
}

/// Rank 0: writes a fresh token and returns it. The file replaces any earlier one atomically.
inline std::string publish_token(const std::string& path) {
  const std::string token = random_token();
  const std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw transport_error("cannot create " + tmp + ": " + std::strerror(errno), error_site::of("store token"), errno);
  const std::string body = token + " " + std::to_string(::getpid()) + "\n";
  const bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw transport_error("cannot write " + path + ": " + std::strerror(e), error_site::of("store token"), e);
  }
  return token;
}

/// Other ranks: waits until rank 0's file exists (and its writer is alive), returns the token.
/// @throws timeout_error naming the file after `timeout`
inline std::string read_token(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(2);
  while (true) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st{};
      char buf[128] = {};
      const bool mine = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::getuid() && (st.st_mode & 077) == 0;
      const ssize_t n = mine ? ::read(fd, buf, sizeof buf - 1) : -1;
      ::close(fd);
      if (n > 0) {
        const std::string body(buf, static_cast<std::size_t>(n));
        const auto sp = body.find(' ');
        if (sp != std::string::npos && sp > 0) {
          const long pid = std::strtol(body.c_str() + sp + 1, nullptr, 10);
          if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) return body.substr(0, sp);
        }
      }
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw timeout_error("rank 0 did not hand over the job's store token (" + path + ") within " +
                              kft::detail::describe_duration(timeout) +
                              ": is rank 0 running on this host? A job on several hosts needs KFT_RDZV_TOKEN set to "
                              "one secret on every rank",
                          error_site::of("store connect"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace rendezvous::detail
KFT_NAMESPACE_END
