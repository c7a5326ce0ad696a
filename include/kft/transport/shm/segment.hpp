// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/segment.hpp
/// @brief One shared-memory segment per intra-node communicator, with no name on any
/// filesystem: nothing can be left behind, whichever process dies when.
///
/// Local rank 0 creates an anonymous `memfd` and maps it, listens on a Linux abstract Unix
/// socket (a name in the network namespace that disappears with the socket, never a file),
/// and publishes the socket's name and a one-time secret through the job's store. Every other
/// local rank connects, presents the secret and its local rank, and receives the descriptor
/// itself (`SCM_RIGHTS`); rank 0 also checks that the peer runs as the same user
/// (`SO_PEERCRED`), the protection a 0600 file in /dev/shm gave. Once every rank has it,
/// the socket is closed. The memory lives until the last rank unmaps it; a SIGKILL of any rank
/// at any moment (even mid set-up) leaves nothing in /dev/shm, and /dev/shm's size limit
/// (64 MB in a default Docker container) does not apply.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/backoff.hpp>
#include <kft/core/deadline.hpp>
#include <kft/core/error.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

namespace detail {

/// Closes a descriptor when it goes out of scope.
struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
  int release() noexcept { return std::exchange(fd, -1); }
};

inline sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // abstract: no file; gone when the socket closes
  const std::size_t n = std::min(name.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

// Waits for `events` on `fd` until the deadline. @return false on timeout
inline bool wait_fd(int fd, short events, const deadline& d) {
  while (true) {
    pollfd p{fd, events, 0};
    const auto left = std::min<long long>(d.left().count(), 1000);
    const int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
    if (d.passed()) return false;
  }
}

}  // namespace detail

/// @brief A mapped shared-memory segment (move-only; unmaps on destruction).
class segment {
 public:
  segment() = default;

  /// @brief Collective over the `size` local ranks: rank 0 creates and hands it out, everyone
  /// maps it. Returns when this rank has it mapped (rank 0: when every rank has received it).
  /// @param key store key under which rank 0 publishes where to get it
  /// @throws timeout_error naming the local ranks that did not come within `timeout`
  segment(rendezvous::store& store, const std::string& key, int rank, int size, std::size_t bytes,
          const std::string& label, std::chrono::milliseconds timeout)
      : bytes_(bytes) {
    const error_site site = error_site::of("shm segment");
    const auto until = deadline::after(timeout);
    name_ = "kft-" + sanitize(label);
    if (rank == 0) {
      detail::fd_guard fd(::memfd_create(name_.c_str(), MFD_CLOEXEC));
      if (fd.fd < 0) fail("memfd_create(" + name_ + ")", site);
      if (::ftruncate(fd.fd, static_cast<off_t>(bytes)) != 0)
        fail("ftruncate(" + name_ + ", " + std::to_string(bytes) + " bytes; is there enough memory, or a cgroup limit?)",
             site);
      map(fd.fd, site);
      try {
        if (size > 1) hand_out(store, key, fd.fd, size, until, timeout, site);
      } catch (...) {
        release();  // a constructor that throws runs no destructor
        throw;
      }
      fd_ = fd.release();
    } else {
      detail::fd_guard fd(receive(store, key, rank, until, timeout, site));
      struct stat st {};
      if (::fstat(fd.fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)
        throw transport_error("the shared segment " + name_ + " has " + std::to_string(st.st_size) +
                                  " bytes, expected " + std::to_string(bytes) + " (ranks configured differently?)",
                              site);
      map(fd.fd, site);
      fd_ = fd.release();
    }
  }

  segment(segment&& o) noexcept { swap(o); }
  segment& operator=(segment&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~segment() { release(); }

  unsigned char* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return bytes_; }
  /// @brief "kft-<label>", for messages (the segment has no name anywhere else).
  const std::string& name() const noexcept { return name_; }

  /// @brief The size of the pages `back_with_huge_pages` gives, and the mapping's alignment.
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  /// @brief Backs [off, off + len) of the segment (both multiples of `huge_page_bytes`) with
  /// 2 MiB pages, 2 MiB at a time: `fallocate` takes the memory from the calling process (its
  /// NUMA node, as a first touch would), then `MADV_COLLAPSE` (Linux >= 6.1) turns it into one
  /// 2 MiB page, whatever the system's shmem transparent-huge-page setting. Every process that
  /// maps the segment then maps those 2 MiB with one page-table entry.
  /// @return bytes now in 2 MiB pages; `why` says what the kernel refused, if anything
  /// @throws transport_error when the memory itself cannot be had (the node's or the cgroup's
  /// limit), naming the bytes: better here than a SIGBUS in the middle of a collective
  std::size_t back_with_huge_pages(std::size_t off, std::size_t len, std::string& why, const error_site& site) {
    std::size_t huge = 0;
    bool collapse = true;
    int refused = 0, first_errno = 0;
    for (std::size_t at = off; at < off + len; at += huge_page_bytes) {
      const std::size_t n = std::min(huge_page_bytes, off + len - at);
      if (::fallocate(fd_, 0, static_cast<off_t>(at), static_cast<off_t>(n)) != 0) {
        const int e = errno;
        if (e == ENOSPC || e == ENOMEM)
          throw transport_error("allocating " + std::to_string(len) + " bytes of the shared segment " + name_ +
                                    " (this rank's region) failed: " + std::strerror(e) +
                                    "; is there enough memory, or a cgroup limit?",
                                site, e);
        why = std::string("fallocate: ") + std::strerror(e) + "; 4 KiB pages";
        return huge;
      }
      if (!collapse || n < huge_page_bytes) continue;
      if (::madvise(base_ + at, n, madv_collapse) == 0) {
        huge += n;
        continue;
      }
      if (refused++ == 0) first_errno = errno;
      if (errno == EINVAL || errno == EPERM) collapse = false;  // not this kernel, or THP disabled here
    }
    if (refused > 0)
      why = "MADV_COLLAPSE refused " + std::to_string(refused) + " of " + std::to_string(len / huge_page_bytes) +
            " 2 MiB pages (" + std::strerror(first_errno) + (first_errno == EINVAL ? "; Linux >= 6.1 has it" : "") +
            "); 4 KiB pages there";
    return huge;
  }

 private:
  [[noreturn]] static void fail(const std::string& what, const error_site& site) {
    const int e = errno;
    throw transport_error(what + " failed: " + std::strerror(e), site, e);
  }
  static std::string sanitize(const std::string& s) {
    std::string out;
    for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
    return out.substr(0, 64);
  }

  // Mapped at a 2 MiB boundary (an address range reserved 2 MiB larger, the segment mapped over
  // its aligned part, the rest given back), so that 2 MiB of the file at a 2 MiB offset can be
  // mapped by one page-table entry in every process (state.hpp's huge pages).
  void map(int fd, const error_site& site) {
    constexpr std::size_t align = std::size_t{2} << 20;
    void* r = ::mmap(nullptr, bytes_ + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) fail("reserving " + std::to_string(bytes_) + " bytes of address space for " + name_, site);
    const auto lo = reinterpret_cast<std::uintptr_t>(r);
    const std::uintptr_t at = (lo + align - 1) / align * align;
    void* p = ::mmap(reinterpret_cast<void*>(at), bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::munmap(r, bytes_ + align);
      errno = e;
      fail("mmap of " + std::to_string(bytes_) + " bytes of " + name_, site);
    }
    if (at > lo) ::munmap(r, at - lo);
    const std::uintptr_t end = (at + bytes_ + 4095) / 4096 * 4096, reserved_end = lo + bytes_ + align;
    if (reserved_end > end) ::munmap(reinterpret_cast<void*>(end), reserved_end - end);
    base_ = static_cast<unsigned char*>(p);
  }

  // Rank 0: listen, publish, give the descriptor to every other local rank once.
  void hand_out(rendezvous::store& store, const std::string& key, int memfd, int size, const deadline& until,
                std::chrono::milliseconds timeout, const error_site& site) {
    detail::fd_guard ls(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (ls.fd < 0) fail("socket(AF_UNIX)", site);
    const std::string where = "kft-shm-" + random_token().substr(0, 24);
    socklen_t len = 0;
    const auto addr = detail::abstract_address(where, len);
    if (::bind(ls.fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) fail("bind(@" + where + ")", site);
    if (::listen(ls.fd, size) != 0) fail("listen(@" + where + ")", site);
    const std::string secret = random_token().substr(0, 32);
    store.set(key, where + " " + secret);

    std::vector<bool> served(static_cast<std::size_t>(size), false);
    served[0] = true;
    int left = size - 1;
    while (left > 0) {
      if (!detail::wait_fd(ls.fd, POLLIN, until)) {
        std::string missing;
        for (int r = 1; r < size; ++r)
          if (!served[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        throw timeout_error("local rank" + std::string(left == 1 ? " " : "s ") + missing + " of " +
                                std::to_string(size) + " did not come for the shared segment " + name_ + " within " +
                                kft::detail::describe_duration(timeout) +
                                " (not started, dead, stopped, or building a different communicator)",
                            site);
      }
      detail::fd_guard c(::accept4(ls.fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (c.fd < 0) continue;  // EAGAIN, ECONNABORTED: look again
      ucred cred{};
      socklen_t cl = sizeof cred;
      if (::getsockopt(c.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != ::geteuid()) continue;
      // "<secret> <local rank>\n", read with the deadline (a silent connection is dropped).
      timeval tv{1, 0};
      ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      char buf[96] = {};
      std::size_t got = 0;
      while (got < sizeof buf - 1 && std::memchr(buf, '\n', got) == nullptr) {
        const ssize_t n = ::recv(c.fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      const std::string hello(buf, got);
      const auto sp = hello.find(' ');
      if (sp == std::string::npos || hello.compare(0, sp, secret) != 0 || hello.back() != '\n') continue;
      int r = -1;
      try {
        r = std::stoi(hello.substr(sp + 1));
      } catch (const std::exception&) {
        continue;
      }
      if (r <= 0 || r >= size || served[static_cast<std::size_t>(r)]) continue;
      if (!send_fd(c.fd, memfd)) continue;  // it may reconnect
      served[static_cast<std::size_t>(r)] = true;
      --left;
    }
  }

  // One byte of data with room for one descriptor beside it (SCM_RIGHTS), for sendmsg/recvmsg.
  struct fd_message {
    char byte = 'k';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    fd_message() {
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
    }
    fd_message(const fd_message&) = delete;
    fd_message& operator=(const fd_message&) = delete;
  };

  static bool send_fd(int sock, int fd) {
    fd_message msg;
    msghdr& m = msg.m;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return ::sendmsg(sock, &m, MSG_NOSIGNAL) == 1;
  }

  // Other ranks: fetch where, connect, present the secret, receive the descriptor.
  int receive(rendezvous::store& store, const std::string& key, int rank, const deadline& until,
              std::chrono::milliseconds timeout, const error_site& site) {
    std::string v;
    try {
      v = store.get(key, timeout);
    } catch (const timeout_error&) {
      throw timeout_error("local rank " + std::to_string(rank) + " waited " + kft::detail::describe_duration(timeout) +
                              " for local rank 0 to create the shared segment " + name_ +
                              " (local rank 0 not started, dead, stopped, or building a different communicator)",
                          site);
    }
    const auto sp = v.find(' ');
    if (sp == std::string::npos)
      throw transport_error("local rank 0 published a malformed shared-segment address under " + key, site);
    const std::string where = v.substr(0, sp), secret = v.substr(sp + 1);
    socklen_t len = 0;
    const auto addr = detail::abstract_address(where, len);
    backoff b;
    while (true) {
      detail::fd_guard s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (s.fd < 0) fail("socket(AF_UNIX)", site);
      if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
        const int e = errno;
        if ((e == EAGAIN || e == EINTR) && !until.passed()) {  // backlog full for a moment
          b.pause();
          continue;
        }
        errno = e;
        fail("local rank " + std::to_string(rank) + " reaching local rank 0 for the shared segment " + name_ +
                 " (@" + where + "; the same host and network namespace? KFT_HOST_ID groups ranks into nodes)",
             site);
      }
      const std::string hello = secret + " " + std::to_string(rank) + "\n";
      if (::send(s.fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size()))
        fail("local rank " + std::to_string(rank) + " asking for the shared segment " + name_, site);
      if (!detail::wait_fd(s.fd, POLLIN, until))
        throw timeout_error("local rank " + std::to_string(rank) + " got no shared segment from local rank 0 within " +
                                kft::detail::describe_duration(timeout),
                            site);
      fd_message msg;
      msghdr& m = msg.m;
      const ssize_t n = ::recvmsg(s.fd, &m, MSG_CMSG_CLOEXEC);
      if (n == 0 && !until.passed()) {  // dropped (too slow with the secret?): ask again
        b.pause();
        continue;
      }
      cmsghdr* cm = n == 1 ? CMSG_FIRSTHDR(&m) : nullptr;
      if (cm == nullptr || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
        throw transport_error("local rank " + std::to_string(rank) + " was refused the shared segment " + name_ +
                                  " by local rank 0 (another user, or a stale address)",
                              site);
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cm), sizeof fd);
      return fd;
    }
  }

  void release() noexcept {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void swap(segment& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(name_, o.name_);
  }

#ifdef MADV_COLLAPSE
  static constexpr int madv_collapse = MADV_COLLAPSE;
#else
  static constexpr int madv_collapse = 25;  // Linux 6.1's value; glibc before 2.37 lacks the name
#endif

  int fd_ = -1;  // kept for back_with_huge_pages
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
};

}  // namespace shm
KFT_NAMESPACE_END
