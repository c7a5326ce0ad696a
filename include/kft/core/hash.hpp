// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/hash.hpp
/// @brief kft's one non-cryptographic hash: 64-bit FNV-1a, over bytes and over integers, at
/// compile time or run time. It names things that must come out the same on every rank and
/// every run (the token file of a job, the DDP buckets' fingerprint, a CUDA IPC call's
/// signature); nothing relies on it against an adversary.
///
///     std::uint64_t h = kft::detail::fnv1a("job key");
///     h = kft::detail::fnv1a_u64(count, h);  // continues from h
#pragma once

#include <cstdint>
#include <string_view>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace detail {

/// FNV's 64-bit prime.
inline constexpr std::uint64_t fnv1a_prime = 1099511628211ull;

/// The value every kft hash starts from. It is not FNV's published offset basis
/// (14695981039346656037) but that number without its last digit, as kft has always used it:
/// the token files' names and the bucket fingerprints derive from it, so it stays (any other
/// would rename the files and change the fingerprints). The hash is FNV-1a in every other way.
inline constexpr std::uint64_t fnv1a_basis = 1469598103934665603ull;

/// @brief FNV-1a of `bytes`, continuing from `h`.
constexpr std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = fnv1a_basis) noexcept {
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * fnv1a_prime;
  return h;
}

/// @brief FNV-1a of the eight bytes of `v`, least significant first (so the same on every
/// byte order), continuing from `h`.
constexpr std::uint64_t fnv1a_u64(std::uint64_t v, std::uint64_t h = fnv1a_basis) noexcept {
  for (int k = 0; k < 8; ++k) h = (h ^ ((v >> (8 * k)) & 0xff)) * fnv1a_prime;
  return h;
}

}  // namespace detail
KFT_NAMESPACE_END
