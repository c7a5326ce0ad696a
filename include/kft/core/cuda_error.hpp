// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/cuda_error.hpp
/// @brief The one place where CUDA runtime return codes become kft exceptions (component
/// `kft::cuda`): topology's device queries and the NCCL transport call `cuda_check`.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/core/cuda_error.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace detail {

/// @brief Throws `transport_error("<call> failed: <name> (<text>)", site)` unless rc is cudaSuccess.
inline void cuda_check(cudaError_t rc, const char* call, error_site site = {}) {
  if (rc == cudaSuccess) return;
  throw transport_error(std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")",
                        std::move(site), static_cast<int>(rc));
}

}  // namespace detail
KFT_NAMESPACE_END
