// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/broadcast.cuh
/// @brief The CUDA IPC broadcast (nvcc), per staging chunk: the root copies its input into its
/// staging; barrier; every other rank (and the root out of place) copies it out; barrier.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/broadcast.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/broadcast.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <algorithm>
#include <cstddef>

#include <kft/transport/cuda_ipc/call.cuh>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

inline void broadcast(call& k, const void* in, void* out, std::size_t n, dtype t, int root) {
  state& s = k.s;
  const std::size_t es = size_of(t), chunk = s.cfg.staging_bytes / es;
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    if (s.rank == root) k.copy(k.stage(root), at(in, off, es), m * es);
    k.sync();
    if (s.rank != root || in != out) k.copy(at(out, off, es), k.stage(root), m * es);
    k.sync();
  }
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
