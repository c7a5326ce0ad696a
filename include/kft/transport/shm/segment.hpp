/// @file kft/transport/shm/segment.hpp
/// @brief One POSIX shared-memory segment per intra-node communicator.
///
/// Rank 0 creates it (`shm_open(O_CREAT|O_EXCL, 0600)`) under an unpredictable name
/// (`/kft-<name>-<16 random hex>`) and publishes the name through the store; the others open
/// and map it. The last rank to map it unlinks it at once, so the name is gone from /dev/shm
/// while the job runs and a crash leaves nothing behind; the memory lives until the last
/// rank unmaps it.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include <kft/core/error.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

/// @brief A mapped shared-memory segment (move-only; unmaps on destruction).
class segment {
 public:
  segment() = default;

  /// @brief Collective over the `size` local ranks: rank 0 creates, everyone maps.
  /// @param key store key under which rank 0 publishes the segment's name
  /// @param mapped_counter_offset offset in the segment of a std::atomic<uint32_t>, zero at
  ///        creation, that counts the ranks that have mapped it (the last one unlinks)
  segment(rendezvous::store& store, const std::string& key, int rank, int size, std::size_t bytes,
          const std::string& label, std::size_t mapped_counter_offset, std::chrono::milliseconds timeout)
      : bytes_(bytes) {
    const error_site site = error_site::of("shm segment");
    std::string name;
    int fd = -1;
    if (rank == 0) {
      name = "/kft-" + sanitize(label) + "-" + random_token().substr(0, 16);
      fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0) fail("shm_open(" + name + ", O_CREAT)", site);
      if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
        const int e = errno;
        ::close(fd);
        ::shm_unlink(name.c_str());
        errno = e;
        fail("ftruncate(" + name + ", " + std::to_string(bytes) + " bytes; is /dev/shm big enough?)", site);
      }
      store.set(key, name);
    } else {
      name = store.get(key, timeout);
      fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) fail("shm_open(" + name + ") by local rank " + std::to_string(rank), site);
      struct stat st {};
      if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
        ::close(fd);
        throw transport_error("shared segment " + name + " has " + std::to_string(st.st_size) + " bytes, expected " +
                                  std::to_string(bytes) + " (ranks configured differently?)",
                              site);
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      if (rank == 0) ::shm_unlink(name.c_str());
      errno = map_errno;
      fail("mmap of " + std::to_string(bytes) + " bytes", site);
    }
    base_ = static_cast<unsigned char*>(p);
    name_ = name;
    auto* mapped = reinterpret_cast<std::atomic<std::uint32_t>*>(base_ + mapped_counter_offset);
    if (mapped->fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size)) {
      ::shm_unlink(name.c_str());  // everyone has it mapped: take the name away
      unlinked_ = true;
    }
    creator_ = rank == 0;
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
  const std::string& name() const noexcept { return name_; }

  /// @brief Removes the name if it is still there (rank 0 calls this when set-up fails, so a
  /// rank that never arrived cannot leave a segment in /dev/shm).
  void unlink_now() noexcept {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
    unlinked_ = true;
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
  void release() noexcept {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    if (creator_ && !unlinked_ && !name_.empty()) ::shm_unlink(name_.c_str());  // ENOENT is fine
    base_ = nullptr;
  }
  void swap(segment& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(name_, o.name_);
    std::swap(creator_, o.creator_);
    std::swap(unlinked_, o.unlinked_);
  }

  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
  bool creator_ = false;
  bool unlinked_ = false;
};

}  // namespace shm
KFT_NAMESPACE_END
