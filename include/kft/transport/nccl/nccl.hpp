// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/nccl/nccl.hpp
/// @brief NCCL basics (component `kft::nccl`): error translation and version.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/nccl.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <nccl.h>

#include <string>
#include <utility>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

/// @brief The one place where NCCL return codes become kft exceptions.
inline void check(ncclResult_t rc, const char* call, error_site site = {}) {
  if (rc == ncclSuccess) return;
  std::string msg = std::string(call) + " failed: " + ncclGetErrorString(rc);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  throw transport_error(msg, std::move(site), static_cast<int>(rc));
}

/// @brief NCCL's runtime version as major*10000 + minor*100 + patch (ncclGetVersion, NCCL >= 2.9).
inline int version_code() {
  int v = 0;
  check(ncclGetVersion(&v), "ncclGetVersion", error_site::of("nccl"));
  return v;
}

/// @brief NCCL's runtime version as "major.minor.patch" (from ncclGetVersion).
inline std::string version() {
  const int v = version_code();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace nccl
KFT_NAMESPACE_END
