// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/barrier.cuh
/// @brief The barrier between the ranks of a CUDA IPC communicator: a one-block kernel on the
/// communicator's stream (nvcc).
///
/// Thread j of rank r stores the call's signature and the barrier's epoch into rank j's control
/// block (release, system scope), then waits until rank j's epoch has arrived in r's own
/// (acquire), backing off with `__nanosleep`. It gives up on its own past the call's deadline
/// (timed on the GPU), when a rank aborted the group (a word in every control block), or when
/// a peer's signature differs (a mismatched call); it reports which in the host-mapped status
/// word (layout.hpp), which the host reads when the call completes, and stops waiting when the
/// host asks it to (`status::stop`). Once a barrier of the communicator has failed, later ones
/// signal but do not wait.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/barrier.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/barrier.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <kft/transport/cuda_ipc/layout.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// The GPU's clock in nanoseconds.
__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Records a finding in the host-mapped status word, unless one is there already.
__device__ inline void report(status* st, unsigned int code, int peer, unsigned long long epoch,
                              unsigned long long theirs) {
  volatile status* s = st;
  if (s->code != status_fine) return;  // the first finding stands (a race between threads is harmless)
  s->peer = peer;
  s->epoch = epoch;
  s->theirs = theirs;
  __threadfence_system();
  s->code = code;
}

/// Thread j signals rank j, then waits for rank j's signal (see the file comment). Launched
/// with one block of at least `size` threads.
__global__ void barrier_kernel(peers p, int rank, int size, unsigned long long epoch, unsigned long long sig,
                               unsigned long long timeout_ns, status* st) {
  const int j = static_cast<int>(threadIdx.x);
  if (j >= size) return;
  __threadfence_system();  // what this stream wrote before (the staging) is visible first
  {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> s(p.ctl[j]->sig[epoch & 1][rank]);
    s.store(sig, cuda::memory_order_relaxed);
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> f(p.ctl[j]->flag[rank]);
    f.store(epoch, cuda::memory_order_release);
  }
  control* me = p.ctl[rank];
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> arrived(me->flag[j]);
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> aborted(me->aborted);
  const volatile status* host = st;
  if (host->code != status_fine) return;  // an earlier barrier of this communicator failed: do not wait again
  const unsigned long long start = global_ns();
  unsigned int nap = 32;
  while (arrived.load(cuda::memory_order_acquire) < epoch) {
    if (host->code != status_fine) return;  // another thread of this barrier gave up
    if (const unsigned long long a = aborted.load(cuda::memory_order_relaxed); a != 0)
      return report(st, status_aborted, static_cast<int>(a - 1), epoch, 0);
    if (host->stop != 0) return report(st, status_stopped, j, epoch, 0);
    if (global_ns() - start > timeout_ns) return report(st, status_timed_out, j, epoch, 0);
    __nanosleep(nap);
    if (nap < 2048) nap *= 2;
  }
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> theirs(me->sig[epoch & 1][j]);
  if (const unsigned long long t = theirs.load(cuda::memory_order_relaxed); t != sig)
    report(st, status_mismatch, j, epoch, t);
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
