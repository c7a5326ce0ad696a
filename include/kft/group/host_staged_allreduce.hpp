// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/host_staged_allreduce.hpp
/// @brief `kft::group::host_staged_allreduce`: the inter-node step of a hierarchical allreduce
/// on device buffers over MPI, staged through pinned host memory (components `kft::nccl` and
/// `kft::mpi`).
///
///     kft::mpi::communicator rail = world.split(local_rank, rank, "rail");  // one rank per node
///     kft::group::host_staged_allreduce staged(rail, device);
///     kft::group::nccl_hierarchical_allreduce<kft::group::host_staged_allreduce> ar(node, staged);
///     ar(in, out, count, kft::dtype::f32, kft::op_kind::avg);
///
/// For MPI libraries that cannot read device memory (or when their device path is slower than
/// a copy): the shard goes device -> pinned host -> MPI (kft's ring by default) -> device.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/group/host_staged_allreduce.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif
#if !KFT_WITH_MPI
#error "kft/group/host_staged_allreduce.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <kft/core/options.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/cuda_error.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/nccl/communicator.hpp>
#include <kft/group/nccl_hierarchical.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief The inter-node step of a hierarchical allreduce over MPI for device buffers, for MPI
/// libraries that cannot read device memory: each call copies the shard to pinned host memory,
/// runs the MPI communicator's allreduce there (kft's ring by default) and copies the result
/// back. Both copies are synchronised, so `out` is ready when the call returns; `in` must be
/// ready when it is called (the hierarchical algorithm waits for its intra-node step first).
///
/// The pinned buffer grows to the largest shard seen and is then reused: no allocation per call
/// in steady state (`allocations()` counts them). Move-only; `comm` must outlive the adapter.
class host_staged_allreduce {
 public:
  /// @param device the CUDA device the buffers live on; -1 = the current device
  explicit host_staged_allreduce(mpi::communicator& comm, int device = -1) : comm_(&comm), device_(device) {
    if (device_ < 0) kft::detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice", site(0));
    nccl::detail::device_guard g(device_, site(0));
    kft::detail::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                            site(0));
  }
  host_staged_allreduce(host_staged_allreduce&& o) noexcept { *this = std::move(o); }
  host_staged_allreduce& operator=(host_staged_allreduce&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      device_ = o.device_;
      stream_ = std::exchange(o.stream_, nullptr);
      host_ = std::exchange(o.host_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
      allocations_ = std::exchange(o.allocations_, 0);
    }
    return *this;
  }
  host_staged_allreduce(const host_staged_allreduce&) = delete;
  host_staged_allreduce& operator=(const host_staged_allreduce&) = delete;
  ~host_staged_allreduce() { release(); }

  int size() const noexcept { return comm_ ? comm_->size() : 0; }
  int rank() const noexcept { return comm_ ? comm_->rank() : -1; }
  /// @brief Bytes of pinned host memory held.
  std::size_t capacity() const noexcept { return capacity_; }
  /// @brief How many times the pinned buffer was (re)allocated.
  std::size_t allocations() const noexcept { return allocations_; }

  /// @brief out (device) = in (device) reduced over the MPI communicator's ranks; in == out is
  /// in place. `o` goes to the MPI allreduce (its algorithm, deadline and tag).
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const kft::options& o = {}) {
    if (comm_ == nullptr) throw usage_error("this host_staged_allreduce was moved from", error_site::of("nccl staged allreduce"));
    if (count == 0) return;
    const std::size_t bytes = count * size_of(t);
    const std::uint64_t seq = comm_->sequence() + 1;
    reserve(bytes, seq);
    nccl::detail::device_guard g(device_, site(seq));
    kft::detail::cuda_check(cudaMemcpyAsync(host_, in, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync",
                            site(seq));
    kft::detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", site(seq));
    comm_->allreduce(host_, host_, count, t, op, o);
    kft::detail::cuda_check(cudaMemcpyAsync(out, host_, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync",
                            site(seq));
    kft::detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", site(seq));
  }

 private:
  void reserve(std::size_t bytes, std::uint64_t seq) {
    if (bytes <= capacity_) return;
    const std::size_t grain = 64u << 10;  // whole 64 KiB: a slightly larger shard reuses it
    const std::size_t want = (bytes + grain - 1) / grain * grain;
    nccl::detail::device_guard g(device_, site(seq));
    if (host_ != nullptr) {
      cudaFreeHost(host_);
      host_ = nullptr;
      capacity_ = 0;
    }
    kft::detail::cuda_check(cudaMallocHost(&host_, want), "cudaMallocHost", site(seq));
    capacity_ = want;
    ++allocations_;
  }
  void release() noexcept {
    if (host_ == nullptr && stream_ == nullptr) return;
    nccl::detail::device_guard g(device_, nccl::detail::device_guard::quiet_t{});
    if (host_ != nullptr) cudaFreeHost(host_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    host_ = nullptr;
    stream_ = nullptr;
    capacity_ = 0;
  }
  error_site site(std::uint64_t seq) const {
    return comm_ ? error_site::in(comm_->configuration().identity, rank(), size(), "host-staged allreduce", seq)
                 : error_site::of("host-staged allreduce");
  }

  mpi::communicator* comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* host_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace group
KFT_NAMESPACE_END
