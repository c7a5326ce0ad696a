// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/allgather.cuh
/// @brief The CUDA IPC allgather (nvcc), per staging chunk: every rank copies its input into
/// its staging; barrier; every rank copies every rank's staging into its block of the output;
/// barrier. And the barrier, which moves nothing and meets once.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/allgather.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/allgather.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <algorithm>
#include <cstddef>

#include <kft/transport/cuda_ipc/call.cuh>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// `n`: the elements each rank sends (the output holds `n` x size, rank j's block at j x n).
inline void allgather(call& k, const void* in, void* out, std::size_t n, dtype t) {
  state& s = k.s;
  const std::size_t es = size_of(t), chunk = s.cfg.staging_bytes / es;
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    k.copy(k.stage(s.rank), at(in, off, es), m * es);
    k.sync();
    for (int j = 0; j < s.size; ++j) k.copy(at(out, static_cast<std::size_t>(j) * n + off, es), k.stage(j), m * es);
    k.sync();
  }
}

inline void barrier(call& k) { k.sync(); }

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
