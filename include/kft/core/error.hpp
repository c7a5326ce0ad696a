// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/error.hpp
/// @brief kft's one exception hierarchy.
///
/// Every kft failure is a `kft::error`, which knows where it happened: the rank and world
/// size (when known), the operation, the operation's sequence number on this communicator
/// and, for backend failures, the backend's own return code. Messages read like
///
///     kft: rank 3/8 allreduce #41: timed out after 30 s waiting for rank 5
///     kft: rank 5/8 (rail 1, rank 1/2) mpi allreduce #41: ...   (a communicator inside the job)
///     kft: discover (torchrun): RANK="abc" is not an integer ...
///
/// so a log line alone says which layer to look at (see docs/errors.md).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief Where a communicator sits in the job, for its messages: the global rank and size of
/// this process and a label of the group ("rail 1", "node 0"). Transports take it in their
/// config; the process groups that build them fill it in. Defaults: the communicator is the job.
struct group_identity {
  int world_rank = -1;  ///< this process's rank in the job, -1 = the communicator's own rank
  int world_size = -1;  ///< ranks in the job, -1 = the communicator's own size
  std::string label;    ///< what the group is, e.g. "rail 1"; empty for the whole job
};

/// @brief Where an error happened. Unknown fields stay at their defaults.
struct error_site {
  int rank = -1;        ///< global rank, -1 when not yet known (e.g. during discovery)
  int world_size = -1;  ///< world size, -1 when not yet known
  std::string operation;                ///< "discover", "allreduce", ...
  std::optional<std::uint64_t> sequence;  ///< the operation's sequence number
  std::string group;  ///< e.g. "rail 1, rank 1/2" when the communicator is part of the job
  /// The job ranks this rank was waiting for when the call failed (a deadline), or the rank that
  /// failed it (one that died, aborted or disagreed); empty when unknown. The flight recorder's
  /// dump keeps it, and `kft-trace` follows these links from rank to rank to the one at fault.
  std::vector<int> waiting_for;

  /// @brief A site that only knows its operation (e.g. "discover" before ranks are known).
  static error_site of(std::string op) {
    error_site s;
    s.operation = std::move(op);
    return s;
  }
  /// @brief The site of a call on a communicator: `rank`/`size` in the communicator, placed in
  /// the job by `id`. Every transport builds its sites here. `seq` 0 = no call yet.
  static error_site in(const group_identity& id, int rank, int size, std::string op, std::uint64_t seq = 0) {
    error_site s;
    const bool part = id.world_size > 0 && !(id.world_size == size && id.world_rank == rank && id.label.empty());
    s.rank = part ? id.world_rank : rank;
    s.world_size = part ? id.world_size : size;
    if (part) s.group = (id.label.empty() ? std::string("group") : id.label) + ", rank " + std::to_string(rank) + "/" +
                        std::to_string(size);
    s.operation = std::move(op);
    if (seq) s.sequence = seq;
    return s;
  }
};

/// @brief Base of every exception kft throws.
class error : public std::runtime_error {
 public:
  error(const std::string& detail, error_site site = {}, int backend_code = 0)
      : std::runtime_error(format(detail, site)),
        detail_(detail),
        site_(std::move(site)),
        backend_code_(backend_code) {}

  /// @brief The message without the "kft: rank r/n op #seq:" prefix.
  const std::string& detail() const noexcept { return detail_; }
  int rank() const noexcept { return site_.rank; }
  int world_size() const noexcept { return site_.world_size; }
  /// @brief The group within the job ("rail 1, rank 1/2"), empty when the job itself.
  const std::string& group() const noexcept { return site_.group; }
  const std::string& operation() const noexcept { return site_.operation; }
  std::optional<std::uint64_t> sequence() const noexcept { return site_.sequence; }
  /// @brief The backend's own error code (MPI, NCCL, CUDA, errno), 0 when none.
  int backend_code() const noexcept { return backend_code_; }
  /// @brief The job ranks this rank was waiting for, or the one that failed the call
  /// (`error_site::waiting_for`); empty when unknown.
  const std::vector<int>& waiting_for() const noexcept { return site_.waiting_for; }

 private:
  static std::string format(const std::string& detail, const error_site& s) {
    // (Built by appends: GCC 12's -Wrestrict misfires on "/" + std::string at -O3.)
    std::string m = "kft: ";
    if (s.rank >= 0) {
      m += "rank ";
      m += std::to_string(s.rank);
      if (s.world_size > 0) {
        m += '/';
        m += std::to_string(s.world_size);
      }
      m += ' ';
      if (!s.group.empty()) {
        m += '(';
        m += s.group;
        m += ") ";
      }
    }
    if (!s.operation.empty()) m += s.operation;
    if (s.sequence) {
      m += " #";
      m += std::to_string(*s.sequence);
    }
    if (s.rank >= 0 || !s.operation.empty()) m += ": ";
    return m + detail;
  }

  std::string detail_;
  error_site site_;
  int backend_code_;
};

namespace detail {
/// "30 s", "1.5 s" or "300 ms", for messages about waits.
inline std::string describe_duration(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

/// @brief Untrusted or user text made safe to print on one line: control bytes (newline,
/// carriage return, escape sequences) become `\n`, `\r`, `\xNN`, and text longer than `max`
/// bytes is cut, saying how long it was. A forged log line or a 10 MB value in a message
/// cannot get through.
inline std::string excerpt(std::string_view text, std::size_t max = 200) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  std::size_t n = std::min(text.size(), max);
  while (n < text.size() && n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;  // not half a UTF-8 character
  out.reserve(n + 32);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}
}  // namespace detail

/// @brief The caller used the API wrongly (bad argument, wrong state).
class usage_error : public error {
  using error::error;
};

/// @brief The job's configuration or environment is malformed or inconsistent.
///
/// Names the variable (or option) and the offending value, e.g. `RANK="abc"`.
class config_error : public error {
 public:
  config_error(std::string variable, std::string value, const std::string& detail,
               error_site site = error_site::of("discover"))
      : error(describe(variable, value, detail), std::move(site)),
        variable_(std::move(variable)),
        value_(std::move(value)) {}

  /// @brief The variable or option at fault (may be empty for whole-configuration errors).
  const std::string& variable() const noexcept { return variable_; }
  /// @brief Its value as seen.
  const std::string& value() const noexcept { return value_; }

 private:
  static std::string describe(const std::string& var, const std::string& val,
                              const std::string& detail) {
    if (var.empty()) return detail;
    return var + "=\"" + detail::excerpt(val) + "\" " + detail;
  }
  std::string variable_;
  std::string value_;
};

/// @brief A wait ran past its deadline.
class timeout_error : public error {
  using error::error;
};

/// @brief Ranks disagree about which collective they are in (op, dtype, count, root, sequence).
class mismatch_error : public error {
  using error::error;
};

/// @brief The transport underneath failed (socket, shared memory, MPI, NCCL, CUDA).
class transport_error : public error {
  using error::error;
};

/// @brief Another rank failed or aborted the group; this rank stops instead of hanging.
class remote_error : public error {
  using error::error;
};

KFT_NAMESPACE_END
