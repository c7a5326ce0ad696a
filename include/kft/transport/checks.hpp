// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/checks.hpp
/// @brief The argument checks and the "stopped" state every transport shares, written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <kft/core/collective.hpp>
#include <kft/core/error.hpp>
#include <kft/core/options.hpp>

KFT_NAMESPACE_BEGIN
namespace detail {

/// @brief Two element counts that must agree ("allreduce: buffer sizes do not match (4 vs 5 elements)").
inline void require_same_count(std::size_t a, std::size_t b, std::string_view what, const error_site& site) {
  if (a != b)
    throw usage_error(std::string(what) + ": buffer sizes do not match (" + std::to_string(a) + " vs " +
                          std::to_string(b) + " elements)",
                      site);
}

/// @brief A broadcast root that must be a rank of the communicator.
inline void require_root(int root, int size, const error_site& site) {
  if (root < 0 || root >= size)
    throw usage_error("broadcast root " + std::to_string(root) + " is not a rank of this communicator (size " +
                          std::to_string(size) + ")",
                      site);
}

/// @brief Whether two buffers of `bytes` share bytes without being the same buffer: neither in
/// place nor apart, which no collective can honour (a rank's output would overwrite input that
/// it, or a peer, has yet to read).
inline bool overlap_partly(const void* a, const void* b, std::size_t bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x != y && bytes != 0 && x < y + bytes && y < x + bytes;
}

/// @brief Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool ranges_overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

/// @brief An algorithm a transport does not run: a clear error, never a substitute.
[[noreturn]] inline void unsupported_algorithm(algo a, std::string_view transport, std::string_view supported,
                                               const error_site& site) {
  throw usage_error("algorithm " + std::string(name(a)) + " is not one of the " + std::string(transport) +
                        " transport's (" + std::string(supported) + ")",
                    site);
}

/// @brief Remembers the first failure; every later call is refused with it.
class failure_latch {
 public:
  void set(std::string reason) {
    if (reason_.empty()) reason_ = reason.empty() ? std::string("stopped") : std::move(reason);
  }
  bool stopped() const noexcept { return !reason_.empty(); }
  const std::string& reason() const noexcept { return reason_; }
  /// @throws usage_error naming the earlier failure
  void check(const error_site& site) const {
    if (stopped()) throw usage_error("this communicator was stopped by an earlier failure (" + reason_ + ")", site);
  }

 private:
  std::string reason_;
};

}  // namespace detail
KFT_NAMESPACE_END
