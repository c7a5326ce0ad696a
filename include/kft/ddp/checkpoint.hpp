// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/checkpoint.hpp
/// @brief Checkpoint files: named sections, a checksum, written atomically, found by step.
///
/// A file is `ckpt-<step, 12 digits>.kft` in the checkpoint directory:
///
///     "KFTCKPT1"                              8 bytes
///     sections: u32 name length, name, u64 payload length, payload     (little-endian)
///     u64 hash64 of every byte before it, then "KFTEND01"
///
/// `write_atomic` writes `.ckpt-<step>.kft.tmp-<pid>`, fsyncs it, renames it over the final
/// name and fsyncs the directory: a reader sees the old state or the new one, never a torn
/// file; a writer killed half-way leaves only a temporary file no reader opens.
/// `latest_checkpoint` takes the highest step whose file parses and whose checksum holds, and
/// says which newer files it skipped and why.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <kft/core/atomic_file.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/ddp/sampler.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief A 64-bit hash of bytes (multiply-rotate over 8-byte words, then a final avalanche):
/// checkpoint checksums and the trainer's replica comparison. Not cryptographic.
inline std::uint64_t hash64(const void* data, std::size_t bytes, std::uint64_t seed = 0) noexcept {
  constexpr std::uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h[4] = {seed + k1, seed ^ k2, seed - k1, ~seed};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = std::rotl(h[l] + w * k2, 31) * k1;
    }
  std::uint64_t r = std::rotl(h[0], 1) + std::rotl(h[1], 7) + std::rotl(h[2], 12) + std::rotl(h[3], 18) + bytes;
  for (; i < bytes; ++i) r = std::rotl(r ^ (p[i] * k1), 11) * k2;
  r ^= r >> 33;
  r *= k2;
  r ^= r >> 29;
  r *= 0x165667B19E3779F9ull;
  return r ^ (r >> 32);
}

/// @brief Builds a checkpoint's bytes.
class checkpoint_writer {
 public:
  checkpoint_writer() { raw("KFTCKPT1", 8); }
  void put(std::string_view name, const void* data, std::size_t bytes) {
    u32(static_cast<std::uint32_t>(name.size()));
    raw(name.data(), name.size());
    u64(bytes);
    raw(data, bytes);
  }
  void put_u64(std::string_view name, std::uint64_t v) { put(name, &v, sizeof v); }
  void put_floats(std::string_view name, std::span<const float> v) { put(name, v.data(), v.size_bytes()); }
  void put_string(std::string_view name, std::string_view v) { put(name, v.data(), v.size()); }
  /// @brief The finished file's bytes (checksum and end marker appended).
  std::vector<unsigned char> finish() {
    const std::uint64_t h = hash64(buf_.data(), buf_.size());
    u64(h);
    raw("KFTEND01", 8);
    return std::move(buf_);
  }

 private:
  void raw(const void* p, std::size_t n) {
    const std::size_t at = buf_.size();
    buf_.resize(at + n);
    if (n) std::memcpy(buf_.data() + at, p, n);
  }
  void u32(std::uint32_t v) { raw(&v, 4); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  std::vector<unsigned char> buf_;
};

/// @brief A checkpoint's sections, checked on construction.
class checkpoint_reader {
 public:
  /// @throws usage_error describing what is wrong (`what` names the file in the message)
  checkpoint_reader(std::vector<unsigned char> bytes, std::string what) : bytes_(std::move(bytes)), what_(std::move(what)) {
    static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian");
    if (bytes_.size() < 32 || std::memcmp(bytes_.data(), "KFTCKPT1", 8) != 0) fail("not a kft checkpoint (no KFTCKPT1 header)");
    const std::size_t end = bytes_.size() - 16;
    if (std::memcmp(bytes_.data() + end + 8, "KFTEND01", 8) != 0) fail("truncated (no end marker)");
    std::uint64_t stored;
    std::memcpy(&stored, bytes_.data() + end, 8);
    if (stored != hash64(bytes_.data(), end)) fail("checksum mismatch (the file is corrupt)");
    hash_ = stored;
    std::size_t at = 8;
    while (at < end) {
      std::uint32_t len;
      if (at + 4 > end) fail("section header past the end");
      std::memcpy(&len, bytes_.data() + at, 4);
      at += 4;
      if (at + len + 8 > end) fail("section name past the end");
      std::string name(reinterpret_cast<const char*>(bytes_.data() + at), len);
      at += len;
      std::uint64_t n;
      std::memcpy(&n, bytes_.data() + at, 8);
      at += 8;
      if (n > end - at) fail("section '" + name + "' past the end");
      sections_[name] = {bytes_.data() + at, static_cast<std::size_t>(n)};
      at += static_cast<std::size_t>(n);
    }
  }
  /// @brief The checksum stored in the file (equal files, equal values).
  std::uint64_t checksum() const noexcept { return hash_; }
  bool has(const std::string& name) const { return sections_.count(name) != 0; }
  std::span<const unsigned char> get(const std::string& name) const {
    auto it = sections_.find(name);
    if (it == sections_.end()) fail("no section '" + name + "'");
    return it->second;
  }
  std::uint64_t get_u64(const std::string& name) const {
    auto s = get(name);
    if (s.size() != 8) fail("section '" + name + "' has " + std::to_string(s.size()) + " bytes, not 8");
    std::uint64_t v;
    std::memcpy(&v, s.data(), 8);
    return v;
  }
  std::string get_string(const std::string& name) const {
    auto s = get(name);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }
  /// @brief Copies float section `name` into `out`, which must have exactly its size.
  void get_floats(const std::string& name, std::span<float> out) const {
    auto s = get(name);
    if (s.size() != out.size_bytes())
      fail("section '" + name + "' holds " + std::to_string(s.size() / 4) + " floats, the model has " +
           std::to_string(out.size()));
    std::memcpy(out.data(), s.data(), s.size());
  }
  const std::string& what() const noexcept { return what_; }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw usage_error("checkpoint " + what_ + ": " + why, error_site::of("checkpoint load"));
  }
  std::vector<unsigned char> bytes_;
  std::string what_;
  std::map<std::string, std::span<const unsigned char>> sections_;
  std::uint64_t hash_ = 0;
};

/// @brief `ckpt-000000000123.kft`
inline std::string checkpoint_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 12) digits.insert(0, 12 - digits.size(), '0');
  return "ckpt-" + digits + ".kft";
}

/// @brief Called while a checkpoint is written: (bytes written, bytes in all).
using write_progress = kft::write_progress;

/// @brief Writes `bytes` to `dir`/`name` atomically (kft/core/atomic_file.hpp: temporary file,
/// fsync, rename, fsync of the directory). @throws transport_error naming the path and errno's text
inline void write_atomic(const std::filesystem::path& dir, const std::string& name, std::span<const unsigned char> bytes,
                         const write_progress& progress = {}) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // a failure shows as the write below failing
  write_file_atomically(dir / name, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                        "checkpoint", progress);
}

/// @brief The step of a checkpoint file name, none for other names (temporary files included).
inline std::optional<std::uint64_t> checkpoint_step(const std::string& file) {
  if (file.size() != 21 || file.rfind("ckpt-", 0) != 0 || file.substr(17) != ".kft") return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 5; i < 17; ++i) {
    if (file[i] < '0' || file[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(file[i] - '0');
  }
  return v;
}

/// @brief The steps of the checkpoint files in `dir`, highest first.
inline std::vector<std::uint64_t> checkpoint_steps(const std::filesystem::path& dir) {
  std::vector<std::uint64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (auto s = checkpoint_step(e.path().filename().string())) steps.push_back(*s);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

/// @brief Removes the temporary files of checkpoint writes in `dir` other than this process's
/// (`.ckpt-<step>.kft.tmp-<pid>`): a writer lost mid-write (SIGKILL, a lost host) leaves one.
/// Call it from the job's one writer (rank 0), after its own write. @return how many went
inline std::size_t remove_stale_temporaries(const std::filesystem::path& dir) {
  const std::string mine = ".tmp-" + std::to_string(::getpid());
  std::vector<std::filesystem::path> stale;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const auto tmp = f.rfind(".tmp-");
    if (f.rfind(".ckpt-", 0) != 0 || tmp == std::string::npos || !checkpoint_step(f.substr(1, tmp - 1))) continue;
    if (f.substr(tmp) != mine) stale.push_back(e.path());
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
  return stale.size();
}

inline std::vector<unsigned char> read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  if (!in) throw usage_error("checkpoint: cannot open " + p.string(), error_site::of("checkpoint load"));
  // One read into a buffer of the file's size (byte by byte through istreambuf_iterator took
  // 0.64 s for 256 MiB in the page cache, this 0.22 s).
  const std::streamoff size = in.tellg();
  std::vector<unsigned char> bytes(size > 0 ? static_cast<std::size_t>(size) : 0);
  in.seekg(0);
  if (!bytes.empty() && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    throw usage_error("checkpoint: cannot read " + p.string() + " (" + std::to_string(bytes.size()) + " bytes expected)",
                      error_site::of("checkpoint load"));
  return bytes;
}

/// @brief The newest valid checkpoint in `dir`.
struct found_checkpoint {
  std::uint64_t step = 0;
  std::filesystem::path path;
  std::vector<unsigned char> bytes;
};
/// `skipped` (when given) receives the newer files that did not verify, with the reason.
inline std::optional<found_checkpoint> latest_checkpoint(const std::filesystem::path& dir,
                                                         std::vector<std::string>* skipped = nullptr) {
  found_checkpoint f;
  for (std::uint64_t s : checkpoint_steps(dir)) {
    const auto p = dir / checkpoint_name(s);
    try {
      auto bytes = read_file_bytes(p);
      checkpoint_reader check(bytes, p.string());  // verifies
      f.step = s;
      f.path = p;
      f.bytes = std::move(bytes);
      return f;
    } catch (const error& e) {
      if (skipped) skipped->push_back(e.detail());
    }
  }
  return std::nullopt;
}

/// @brief A trainer's checkpoint beyond its tensors: where training stands, in the sections
/// "step", "sampler.seed", "sampler.epoch", "sampler.cursor", "world_size", "rng", "optimizer"
/// (the optimizer's name) and "optimizer.steps"; the tensors are in "param/<name>" and
/// "optimizer/<buffer>/<name>" (`parameter_key`, `optimizer_key`).
struct trainer_state {
  std::uint64_t step = 0;
  sampler_state sampler;
  std::uint64_t world_size = 0;  ///< the ranks that wrote it (a resume may have others)
  std::uint64_t rng = 0;         ///< the trainer's RNG
  std::string optimizer;
  std::uint64_t optimizer_steps = 0;

  void write(checkpoint_writer& w) const {
    w.put_u64("step", step);
    w.put_u64("sampler.seed", sampler.seed);
    w.put_u64("sampler.epoch", sampler.epoch);
    w.put_u64("sampler.cursor", sampler.cursor);
    w.put_u64("world_size", world_size);
    w.put_u64("rng", rng);
    w.put_string("optimizer", optimizer);
    w.put_u64("optimizer.steps", optimizer_steps);
  }
  /// @throws usage_error naming the file and the missing section
  static trainer_state read(const checkpoint_reader& c) {
    trainer_state s;
    s.step = c.get_u64("step");
    s.sampler = {c.get_u64("sampler.seed"), c.get_u64("sampler.epoch"), c.get_u64("sampler.cursor")};
    s.world_size = c.get_u64("world_size");
    s.rng = c.get_u64("rng");
    s.optimizer = c.get_string("optimizer");
    s.optimizer_steps = c.get_u64("optimizer.steps");
    return s;
  }
  static std::string parameter_key(std::string_view name) { return "param/" + std::string(name); }
  static std::string optimizer_key(std::string_view buffer, std::string_view name) {
    return "optimizer/" + std::string(buffer) + "/" + std::string(name);
  }
};

}  // namespace ddp
KFT_NAMESPACE_END
