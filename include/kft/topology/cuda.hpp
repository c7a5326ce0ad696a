/// @file kft/topology/cuda.hpp
/// @brief CUDA devices visible to this process (component `kft::cuda`, CUDA runtime API).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/topology/cuda.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

namespace detail {
/// The one place where CUDA runtime return codes become kft exceptions.
inline void cuda_check(cudaError_t rc, const char* call, error_site site = {}) {
  if (rc == cudaSuccess) return;
  throw transport_error(std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")",
                        std::move(site), static_cast<int>(rc));
}
}  // namespace detail

namespace topology {

/// @brief One CUDA device.
struct cuda_device {
  int index = 0;
  std::string name;
  std::size_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::string pci_bus_id;
};

/// @brief The CUDA devices this process sees, or why it sees none.
struct cuda_inventory {
  int runtime_version = 0;  ///< e.g. 13000
  int driver_version = 0;   ///< 0 when no driver is installed
  std::vector<cuda_device> devices;
  std::string status;  ///< "ok", or the reason there are no devices
};

/// @brief Lists the visible CUDA devices. Never throws for "no driver" or "no device":
/// those are normal on CPU machines and end up in `status`.
inline cuda_inventory query_cuda_devices() {
  cuda_inventory inv;
  cudaRuntimeGetVersion(&inv.runtime_version);
  cudaDriverGetVersion(&inv.driver_version);
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    inv.status = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
    cudaGetLastError();  // consume the error so later runtime calls do not report it again
    return inv;
  }
  inv.status = n == 0 ? "no CUDA device visible" : "ok";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    kft::detail::cuda_check(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties", error_site::of("topology"));
    char bus[32] = {};
    kft::detail::cuda_check(cudaDeviceGetPCIBusId(bus, sizeof bus, i), "cudaDeviceGetPCIBusId", error_site::of("topology"));
    inv.devices.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor, bus});
  }
  return inv;
}

}  // namespace topology
KFT_NAMESPACE_END
