// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/nccl/options.hpp
/// @brief A NCCL communicator's settings and per-call options, the unique id, and kft's
/// types in NCCL terms (component `kft::nccl`).
#pragma once

#include <kft/config.hpp>
#include <kft/core/timeout.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/options.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/hex.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/nccl/nccl.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

using namespace std::chrono_literals;

/// @brief Settings of one communicator.
struct config {
  /// Default deadline of every collective, and of the initialisation (every rank must arrive);
  /// the process groups apply KFT_TIMEOUT.
  std::chrono::milliseconds timeout = default_job_timeout;
  /// How long the destructor lets `ncclCommFinalize` flush before it aborts instead (a
  /// destructor must neither throw nor hang on a peer that is gone).
  std::chrono::milliseconds destroy_timeout = default_timeouts.teardown;
  /// Scopes the rendezvous keys ("nccl/<name>/...") so that several communicators can meet
  /// through one store; ranks of one communicator must use the same name.
  std::string name = "kft";
  /// The stream collectives run on when a call names none. nullptr: the communicator creates
  /// (and owns) a non-blocking stream of its device.
  cudaStream_t stream = nullptr;
  group_identity identity{};  ///< where this communicator sits in the job (messages)
};

/// @brief Per-call options of a NCCL collective: kft's options plus where the call runs.
///
///     comm.allreduce_async(in, out, kft::ops::sum, kft::nccl::options{.timeout = 5s, .stream = s});
///
/// Every collective also takes a plain `kft::options` (the generic algorithms pass those).
/// `algorithm` must be `automatic`: NCCL chooses its own (NCCL_ALGO steers it); any other is a
/// usage_error.
struct options {
  algo algorithm = algo::automatic;
  std::chrono::milliseconds timeout{0};  ///< 0 = the communicator's default
  std::uint32_t tag = 0;                 ///< accepted for symmetry; NCCL does not compare signatures
  cudaStream_t stream = nullptr;         ///< nullptr = the communicator's stream
  /// Sum only: every rank's input is multiplied by this before the sum (NCCL's PreMulSum, for
  /// floating-point dtypes), e.g. 1/N for an average that a hierarchical algorithm splits over
  /// two communicators. 0 = off.
  double prescale = 0.0;
};

/// @brief `kft::options` or `kft::nccl::options`: what the collectives take.
template <class O>
concept call_options = std::same_as<O, kft::options> || std::same_as<O, options>;

/// @brief A fresh NCCL unique id (rank 0 makes it; every rank must then use the same one).
inline ncclUniqueId unique_id() {
  ncclUniqueId id{};
  check(ncclGetUniqueId(&id), "ncclGetUniqueId", error_site::of("nccl unique id"));
  return id;
}

namespace detail {

/// The unique id as text for the store (hex: every store keeps text safely).
inline std::string to_hex(const ncclUniqueId& id) { return kft::detail::to_hex(id.internal, sizeof id.internal); }

/// The unique id that rank 0 published under `key`.
/// @throws transport_error naming the key and the text when it is not one (another program
///         uses the same key?)
inline ncclUniqueId from_hex(std::string_view s, std::string_view key, const error_site& site) {
  ncclUniqueId id{};
  kft::detail::from_hex(s, id.internal, sizeof id.internal, "the NCCL unique id under '" + std::string(key) + "'",
                        site);
  return id;
}

inline ncclDataType_t datatype(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
  }
  return ncclFloat32;
}

inline bool floating(dtype t) { return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16; }

}  // namespace detail
}  // namespace nccl
KFT_NAMESPACE_END
