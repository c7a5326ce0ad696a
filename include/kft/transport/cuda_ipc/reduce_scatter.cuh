// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/reduce_scatter.cuh
/// @brief The CUDA IPC reduce-scatter (nvcc), per chunk of every rank's slice: each rank copies
/// that chunk of all the slices of its input into its staging (slice j at j x chunk); barrier;
/// rank r reduces chunk r from every rank's staging into its output; barrier.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/reduce_scatter.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/reduce_scatter.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <algorithm>
#include <cstddef>

#include <kft/transport/cuda_ipc/call.cuh>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// `n`: the elements each rank receives (its input holds `n` x size).
inline void reduce_scatter(call& k, const void* in, void* out, std::size_t n, dtype t, op_kind op) {
  state& s = k.s;
  const std::size_t es = size_of(t), p = static_cast<std::size_t>(s.size);
  // Every rank's chunk fits the staging at once, in whole 16-byte vectors.
  const std::size_t chunk = std::max<std::size_t>(1, s.cfg.staging_bytes / es / p / (16 / es) * (16 / es));
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    // Staging holds this chunk of every rank's slice: slice j at j x m.
    s.check(cudaMemcpy2DAsync(k.stage(s.rank), m * es, at(in, off, es), n * es, m * es, p, cudaMemcpyDeviceToDevice,
                              s.stream),
            "cudaMemcpy2DAsync");
    k.sync();
    k.reduce(at(out, off, es), static_cast<std::size_t>(s.rank) * m * es, m, t, op);
    k.sync();
  }
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
