// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/cuda.hpp
/// @brief The DDP reducer over a GPU communicator (any with `device_buffers`, `stream()` and
/// `device()`: kft::nccl::communicator): bucket storage in device memory, each bucket's
/// allreduce on the communicator's own stream, ordered after the gradients by CUDA events.
///
///     #include <kft/transport/nccl/communicator.hpp>
///     #include <kft/ddp/cuda.hpp>
///     kft::nccl::communicator comm(store, rank, size, local_rank);
///     kft::ddp::reducer<kft::nccl::communicator> r(comm, params, {.stream = compute_stream});
///     // backward kernels on compute_stream write into r.gradient<float>(i) (device pointers)
///     r.mark_ready(i);       // records an event on compute_stream; the comm stream waits for it
///     r.finish();            // the compute stream waits for the comm stream; errors are raised here
///
/// No host synchronisation per bucket: `mark_ready` only records an event and enqueues the
/// allreduce; `finish()` waits (host) for the last bucket once per step, with the group's
/// deadline, so a peer that never arrives is an error at the step where it happens, then makes
/// the compute stream wait for the communication. Hooks must work on device buffers: the
/// default `allreduce_avg` does (NCCL's ncclAvg); the host-side compression hooks refuse to
/// compile for device groups; `find_unused_parameters` is not available on device yet (usage_error).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/ddp/cuda.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>

#include <kft/core/cuda_error.hpp>
#include <kft/ddp/memory.hpp>
#include <kft/ddp/reducer.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

template <class Group>
  requires(device_buffers_v<Group> && requires(const Group& g) {
    { g.stream() } -> std::convertible_to<cudaStream_t>;
    { g.device() } -> std::convertible_to<int>;
  })
struct bucket_memory<Group> {
  static constexpr bool on_device = true;

  bucket_memory(Group& g, void* stream)
      : compute_(static_cast<cudaStream_t>(stream)), comm_(g.stream()), device_(g.device()) {
    kft::detail::cuda_check(cudaSetDevice(device_), "cudaSetDevice", error_site::of("ddp reducer"));
    kft::detail::cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate",
                            error_site::of("ddp reducer"));
    if (cudaEventCreateWithFlags(&done_, cudaEventDisableTiming) != cudaSuccess) {
      cudaEventDestroy(ready_);
      throw transport_error("cudaEventCreate failed", error_site::of("ddp reducer"));
    }
  }
  bucket_memory(const bucket_memory&) = delete;
  bucket_memory& operator=(const bucket_memory&) = delete;
  ~bucket_memory() {
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
  }

  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    kft::detail::cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (bucket storage)", error_site::of("ddp reducer"));
    zero(p, bytes);
    kft::detail::cuda_check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize", error_site::of("ddp reducer"));
    return p;
  }
  static void release(void* p) noexcept { cudaFree(p); }
  void zero(void* p, std::size_t bytes) {
    kft::detail::cuda_check(cudaMemsetAsync(p, 0, bytes, compute_), "cudaMemsetAsync", error_site::of("ddp zero_grad"));
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    kft::detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_), "cudaMemcpyAsync",
                            error_site::of("ddp rebuild"));
  }
  // Host <-> device copies ordered after everything enqueued on the compute stream (the
  // legacy stream's cudaMemcpy does not wait for a non-blocking stream), complete on return.
  void upload(void* dst, const void* host, std::size_t bytes) {
    kft::detail::cuda_check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize", error_site::of("ddp reducer"));
    kft::detail::cuda_check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", error_site::of("ddp reducer"));
  }
  void download(void* host, const void* src, std::size_t bytes) const {
    kft::detail::cuda_check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize", error_site::of("ddp reducer"));
    kft::detail::cuda_check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", error_site::of("ddp reducer"));
  }
  // Everything enqueued on the compute stream so far (the gradients) precedes what the comm
  // stream does next.
  void before_launch() {
    kft::detail::cuda_check(cudaEventRecord(ready_, compute_), "cudaEventRecord", error_site::of("ddp mark_ready"));
    kft::detail::cuda_check(cudaStreamWaitEvent(comm_, ready_, 0), "cudaStreamWaitEvent", error_site::of("ddp mark_ready"));
  }
  // The reduced gradients precede what the compute stream does next (the optimizer).
  void after_finish() {
    kft::detail::cuda_check(cudaEventRecord(done_, comm_), "cudaEventRecord", error_site::of("ddp finish"));
    kft::detail::cuda_check(cudaStreamWaitEvent(compute_, done_, 0), "cudaStreamWaitEvent", error_site::of("ddp finish"));
  }

 private:
  cudaStream_t compute_, comm_;
  int device_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

}  // namespace ddp
KFT_NAMESPACE_END
