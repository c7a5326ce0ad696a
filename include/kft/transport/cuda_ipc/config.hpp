// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/config.hpp
/// @brief A CUDA IPC communicator's settings (component `kft::cuda`; no kernels here: any C++
/// compiler reads it, so host code can fill one in).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/config.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <string>

#include <kft/core/error.hpp>
#include <kft/core/timeout.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc {

/// The most ranks one communicator holds: the inputs one reduction kernel takes
/// (`cuda_kernels::max_inputs`; call.cuh checks that they agree).
inline constexpr int max_ranks = 8;

/// @brief Settings; every field has a default.
struct config {
  /// Every call's deadline unless its options give one, and the set-up's. A constant: code
  /// that makes the communicator from the job's settings applies KFT_TIMEOUT to it.
  std::chrono::milliseconds timeout = default_job_timeout;
  /// Staging per rank: a call moves at most this much per chunk.
  std::size_t staging_bytes = std::size_t{32} << 20;
  /// allreduce (auto): one-shot below this chunk size, two-shot from it.
  std::size_t one_shot_bytes = std::size_t{256} << 10;
  /// The store keys' prefix: communicators made over one store need different names.
  std::string name = "cuda_ipc";
  /// A stream to enqueue on instead of the communicator's own.
  cudaStream_t stream = nullptr;
  /// Where the communicator sits in the job (error messages).
  group_identity identity;
};

}  // namespace cuda_ipc
KFT_NAMESPACE_END
