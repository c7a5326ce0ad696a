// SPDX-License-Identifier: Apache-2.0
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

#include <kft/core/cuda_error.hpp>
#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

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

/// @brief Makes local rank `local_rank`'s GPU current: device local_rank % visible devices (each
/// rank of a node gets its own GPU when there are as many as ranks). Returns the device index.
/// @throws usage_error when no device is visible, transport_error when CUDA fails
inline int select_device(int local_rank) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw usage_error("no CUDA device visible to local rank " + std::to_string(local_rank) +
                          " (check CUDA_VISIBLE_DEVICES and the driver)",
                      error_site::of("topology"));
  }
  const int dev = local_rank % n;
  kft::detail::cuda_check(cudaSetDevice(dev), "cudaSetDevice", error_site::of("topology"));
  return dev;
}

/// @brief Which visible devices can read each other's memory directly (NVLink or PCIe P2P),
/// and the driver's relative performance rank of each link (lower is faster; -1 = no access).
struct peer_matrix {
  std::vector<std::vector<int>> access;  ///< access[i][j] = 1 when device i can access j
  std::vector<std::vector<int>> rank;    ///< cudaDevP2PAttrPerformanceRank, -1 when no access
};

/// @brief The peer-access matrix of the visible devices (empty when there are none).
inline peer_matrix query_peer_matrix() {
  peer_matrix m;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return m;
  }
  const auto un = static_cast<std::size_t>(n);
  m.access.assign(un, std::vector<int>(un, 0));
  m.rank.assign(un, std::vector<int>(un, -1));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      auto& a = m.access[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
      if (i == j) {
        a = 1;
        continue;
      }
      kft::detail::cuda_check(cudaDeviceCanAccessPeer(&a, i, j), "cudaDeviceCanAccessPeer", error_site::of("topology"));
      if (a)
        kft::detail::cuda_check(cudaDeviceGetP2PAttribute(&m.rank[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)],
                                                          cudaDevP2PAttrPerformanceRank, i, j),
                                "cudaDeviceGetP2PAttribute", error_site::of("topology"));
    }
  return m;
}

}  // namespace topology
KFT_NAMESPACE_END
