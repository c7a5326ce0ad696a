// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/file_store.hpp
/// @brief A store in a directory, for processes on one host (or a shared file system with
/// working flock, which many are not: prefer the TCP store across hosts).
///
/// One file per key (named by the key's hex encoding), written to a temporary file and
/// renamed into place, so readers never see half a value. `add` and `compare_set` hold an
/// exclusive flock on a lock file; a process that dies holding it releases it. Waits poll
/// with backoff.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <kft/core/backoff.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/memory_store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

class file_store final : public store {
 public:
  /// @brief Uses (and creates, mode 0700) `directory`.
  /// @throws transport_error when it cannot be created
  explicit file_store(std::filesystem::path directory) : dir_(std::move(directory)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) fail("cannot create directory " + dir_.string() + ": " + ec.message());
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, ec);
  }

  void set(std::string_view key, std::string_view value) override { write_atomically(key, value); }
  std::optional<std::string> try_get(std::string_view key) override { return read(key); }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    backoff b;
    while (true) {
      if (auto v = read(key)) return *v;
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string k(key);
        throw detail::wait_timeout("get", std::span(&k, 1), timeout, describe());
      }
      b.pause();
    }
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    backoff b;
    while (true) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!std::filesystem::exists(path_of(k))) missing.push_back(k);
      if (missing.empty()) return;
      if (std::chrono::steady_clock::now() >= deadline) throw detail::wait_timeout("wait", missing, timeout, describe());
      b.pause();
    }
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    lock_guard lock(*this);
    const auto v = detail::counter_add(read(key), key, describe(), delta);
    write_atomically(key, std::to_string(v));
    return v;
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    lock_guard lock(*this);
    cas_result r;
    r.current = read(key);
    const bool matches = expected ? (r.current && *r.current == *expected) : !r.current;
    if (matches) {
      write_atomically(key, desired);
      r.swapped = true;
      r.current = std::string(desired);
    }
    return r;
  }
  bool erase(std::string_view key) override {
    std::error_code ec;
    return std::filesystem::remove(path_of(key), ec);
  }
  std::vector<std::string> keys(std::string_view prefix) override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      const auto name = entry.path().filename().string();
      if (!name.starts_with("k.")) continue;
      auto key = decode(name.substr(2));
      if (key.starts_with(prefix)) out.push_back(std::move(key));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string describe() const override { return "file store " + dir_.string(); }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw transport_error(what, error_site::of("file store"), errno);
  }
  static std::string encode(std::string_view key) { return kft::detail::to_hex(key); }
  static std::string decode(std::string_view h) {
    auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    std::string s;
    for (std::size_t i = 0; i + 1 < h.size(); i += 2) s += static_cast<char>(nib(h[i]) * 16 + nib(h[i + 1]));
    return s;
  }
  std::filesystem::path path_of(std::string_view key) const { return dir_ / ("k." + encode(key)); }

  std::optional<std::string> read(std::string_view key) const {
    std::ifstream in(path_of(key), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void write_atomically(std::string_view key, std::string_view value) const {
    const auto final_path = path_of(key);
    const auto tmp = dir_ / ("t." + random_token());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) fail("cannot write " + tmp.string());
    }
    std::error_code ec;
    std::filesystem::rename(tmp, final_path, ec);
    if (ec) {
      std::filesystem::remove(tmp, ec);
      fail("cannot rename into " + final_path.string());
    }
  }

  struct lock_guard {
    explicit lock_guard(const file_store& s) {
      fd = ::open((s.dir_ / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) s.fail("cannot open lock file in " + s.dir_.string() + ": " + std::strerror(errno));
      while (::flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
          ::close(fd);
          s.fail(std::string("flock failed: ") + std::strerror(errno));
        }
      }
    }
    ~lock_guard() { ::close(fd); }  // closing releases the flock
    lock_guard(const lock_guard&) = delete;
    lock_guard& operator=(const lock_guard&) = delete;
    int fd = -1;
  };

  std::filesystem::path dir_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
