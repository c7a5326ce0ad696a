/// @file kft/transport/nccl/staged_inter.hpp
/// @brief `kft::nccl::staged_inter`: the inter-node step of a hierarchical allreduce on device
/// buffers over MPI, staged through pinned host memory (components `kft::nccl` and `kft::mpi`).
///
///     kft::mpi::communicator rail = world.split(local_rank, rank);  // one rank per node
///     kft::nccl::staged_inter staged(rail, device);
///     kft::nccl::hierarchical_allreduce<kft::nccl::staged_inter> ar(node, staged);
///     ar(in, out, count, kft::dtype::f32, kft::op_kind::avg);
///
/// For MPI libraries that cannot read device memory (or when their device path is slower than
/// a copy): the shard goes device -> pinned host -> MPI (kft's ring by default) -> device.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/staged_inter.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif
#if !KFT_WITH_MPI
#error "kft/transport/nccl/staged_inter.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <kft/collectives/options.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/topology/cuda.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/nccl/communicator.hpp>
#include <kft/transport/nccl/hierarchical.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

/// @brief The inter-node step of a hierarchical allreduce over MPI for device buffers, for MPI
/// libraries that cannot read device memory: each call copies the shard to pinned host memory,
/// runs the MPI communicator's allreduce there (kft's ring by default) and copies the result
/// back. Both copies are synchronised, so `out` is ready when the call returns; `in` must be
/// ready when it is called (the hierarchical algorithm waits for its intra-node step first).
///
/// The pinned buffer grows to the largest shard seen and is then reused: no allocation per call
/// in steady state (`allocations()` counts them). Move-only; `comm` must outlive the adapter.
class staged_inter {
 public:
  /// @param device the CUDA device the buffers live on; -1 = the current device
  explicit staged_inter(mpi::communicator& comm, int device = -1) : comm_(&comm), device_(device) {
    if (device_ < 0) kft::detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice", site(0));
    detail::device_guard g(device_, site(0));
    kft::detail::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                            site(0));
  }
  staged_inter(staged_inter&& o) noexcept { *this = std::move(o); }
  staged_inter& operator=(staged_inter&& o) noexcept {
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
  staged_inter(const staged_inter&) = delete;
  staged_inter& operator=(const staged_inter&) = delete;
  ~staged_inter() { release(); }

  int size() const noexcept { return comm_ ? comm_->size() : 0; }
  int rank() const noexcept { return comm_ ? comm_->rank() : -1; }
  /// @brief Bytes of pinned host memory held.
  std::size_t capacity() const noexcept { return capacity_; }
  /// @brief How many times the pinned buffer was (re)allocated.
  std::size_t allocations() const noexcept { return allocations_; }

  /// @brief out (device) = in (device) reduced over the MPI communicator's ranks; in == out is
  /// in place. `o` goes to the MPI allreduce (its algorithm, deadline and tag).
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const kft::options& o = {}) {
    if (comm_ == nullptr) throw usage_error("this staged_inter was moved from", error_site::of("nccl staged allreduce"));
    if (count == 0) return;
    const std::size_t bytes = count * size_of(t);
    const std::uint64_t seq = comm_->sequence() + 1;
    reserve(bytes, seq);
    detail::device_guard g(device_, site(seq));
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
    detail::device_guard g(device_, site(seq));
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
    detail::device_guard g(device_, detail::device_guard::quiet_t{});
    if (host_ != nullptr) cudaFreeHost(host_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    host_ = nullptr;
    stream_ = nullptr;
    capacity_ = 0;
  }
  error_site site(std::uint64_t seq) const {
    error_site s;
    s.rank = rank();
    s.world_size = size();
    s.operation = "nccl staged allreduce";
    if (seq) s.sequence = seq;
    return s;
  }

  mpi::communicator* comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* host_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace nccl
KFT_NAMESPACE_END
