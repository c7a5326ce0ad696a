// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/atomic_file.hpp
/// @brief All-or-nothing file writes: a reader sees the old file, or the whole new one, never a
/// torn one, whatever kills the writer.
///
/// The bytes go to a temporary file next to the target (`.<name>.tmp-<pid>`), which is
/// fsynced and renamed over the target; the directory is then fsynced so the rename itself
/// survives a power cut. On any failure the temporary file is removed and nothing else changed.
/// Checkpoints, the DDP timeline, `kft-info --output` and `kft-manifest -o` all write this way.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

/// @brief Called while a file is written: (bytes written, bytes in all).
using write_progress = std::function<void(std::size_t, std::size_t)>;

/// @brief Writes `bytes` to `path` atomically. The directory must exist.
/// @param what names the writer in errors ("checkpoint", "kft-info --output")
/// @throws transport_error naming `what`, the path and errno's text; nothing is left behind
inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, std::string_view what,
                                  const write_progress& progress = {}) {
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const auto tmp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  // "kft: checkpoint: cannot write d/ckpt-1.kft (creating d/.ckpt-1.kft.tmp-7): No such file or directory"
  auto fail = [&](const char* step, int err) {
    throw transport_error("cannot write " + path.string() + " (" + step + " " + tmp.string() + "): " + std::strerror(err),
                          error_site::of(std::string(what)), err);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating", errno);
  auto abandon = [&](const char* step) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(step, e);
  };
  constexpr std::size_t chunk = std::size_t{1} << 20;  // progress at least every MiB
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t w = ::write(fd, bytes.data() + done, std::min(chunk, bytes.size() - done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      abandon("writing");
    }
    done += static_cast<std::size_t>(w);
    if (progress) progress(done, bytes.size());
  }
  if (bytes.empty() && progress) progress(0, 0);
  if (::fsync(fd) != 0) abandon("syncing");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("closing", e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("renaming", e);
  }
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
}

KFT_NAMESPACE_END
