// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/call.cuh
/// @brief One call of a CUDA IPC communicator as its collective's steps see it (nvcc): the
/// ranks' staging, the copies and reductions it enqueues on the communicator's stream, and
/// the barriers between them, all carrying the call's signature and deadline.
///
/// A collective works per chunk of at most `staging_bytes`: copy the input into this rank's
/// staging; barrier; compute from the peers' staging; barrier (nobody refills staging while a
/// peer still reads it). Reductions combine the ranks in rank order, so every rank gets
/// bit-identical results.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/call.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/call.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/kernels/cuda_reduce.cuh>
#include <kft/transport/cuda_ipc/barrier.cuh>
#include <kft/transport/cuda_ipc/state.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

static_assert(max_ranks <= cuda_kernels::max_inputs, "one reduction kernel takes every rank's staging");
static_assert(max_ranks <= 32, "the barrier kernel's one block has a thread per rank");

/// `p` advanced by `off` elements of `es` bytes.
inline const void* at(const void* p, std::size_t off, std::size_t es) {
  return static_cast<const unsigned char*>(p) + off * es;
}
inline void* at(void* p, std::size_t off, std::size_t es) { return static_cast<unsigned char*>(p) + off * es; }

/// The call being enqueued.
struct call {
  state& s;
  unsigned long long sig;         // its signature: every barrier of the call carries it
  unsigned long long timeout_ns;  // its deadline on the GPU
  int barriers = 0;               // enqueued so far

  /// Rank `j`'s staging (mapped into this process).
  unsigned char* stage(int j) const { return s.region[static_cast<std::size_t>(j)] + control_bytes; }

  /// Enqueues a device-to-device copy (none when empty or onto itself).
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes != 0 && dst != src) s.check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s.stream), "cudaMemcpyAsync");
  }

  /// Enqueues out[0..m) = every rank's staging at byte offset `from`, reduced in rank order.
  void reduce(void* out, std::size_t from, std::size_t m, dtype t, op_kind op) const {
    std::array<const void*, max_ranks> in{};
    for (int j = 0; j < s.size; ++j) in[static_cast<std::size_t>(j)] = stage(j) + from;
    cuda_kernels::reduce(out, in.data(), s.size, m, t, op, s.stream);
  }

  /// Enqueues the next barrier (barrier.cuh).
  void sync() {
    barrier_kernel<<<1, 32, 0, s.stream>>>(s.ctl, s.rank, s.size, ++s.epoch, sig, timeout_ns, s.st_dev);
    s.check(cudaGetLastError(), "launching the barrier kernel");
    ++barriers;
  }
};

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
