// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/communicator.cuh
/// @brief Collectives between the processes of one node over CUDA IPC (component `kft::cuda`,
/// compiled by nvcc): every rank maps the others' staging memory, ranks meet at barriers whose
/// flags live in device memory, and the reductions are kft's CUDA kernels
/// (kft/kernels/cuda_reduce.cuh). The intra-node level for GPU buffers, beside NCCL.
///
///     kft::rendezvous::file_store store(dir);                       // or any kft store
///     kft::cuda_ipc::communicator comm(store, local_rank, local_size, device);
///     comm.allreduce(d_in, d_out, n, kft::dtype::bf16, kft::op_kind::avg);
///     comm.allreduce(std::span<const float>(d_g, n), std::span<float>(d_g, n), kft::ops::sum);  // typed
///
/// The facade. The pieces, one concern per file: `config.hpp` (sizes, timeout, identity),
/// `layout.hpp` (the control block every rank's region starts with, the status word, a call's
/// signature), `barrier.cuh` (the barrier kernel), `state.hpp` (set-up: each rank publishes its
/// region's `cudaIpcMemHandle_t` in the store and maps the others'; stopping the group),
/// `call.cuh` (a call's copies, reductions and barriers), `launch.cuh` (numbering a call,
/// enqueueing it, its work handle and errors), and one file per collective (`allreduce.cuh`:
/// one-shot and two-shot; `broadcast.cuh`, `reduce_scatter.cuh`, `allgather.cuh` with the
/// barrier). Up to 8 ranks.
///
/// Failures: the barrier kernel gives up on its own past the call's deadline (timed on the GPU),
/// when a rank aborted the group, or when a peer is in a different call, and the call throws
/// timeout_error, remote_error or mismatch_error naming the rank. The host also waits with a
/// deadline: past it, it tells the kernel to stop. After a failure the communicator aborts the
/// group and refuses further calls (usage_error naming the failure).
///
/// Streams: every call is enqueued on the communicator's own non-blocking stream (or
/// `config::stream`) and the plain forms wait for it; like NCCL's, a call does not wait for
/// other streams: finish writing the input (e.g. cudaStreamSynchronize) first.
///
/// Not thread-safe: one thread uses one communicator at a time.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/communicator.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/communicator.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <kft/async/work.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/core/timeout.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/cuda_ipc/allgather.cuh>
#include <kft/transport/cuda_ipc/allreduce.cuh>
#include <kft/transport/cuda_ipc/broadcast.cuh>
#include <kft/transport/cuda_ipc/config.hpp>
#include <kft/transport/cuda_ipc/launch.cuh>
#include <kft/transport/cuda_ipc/reduce_scatter.cuh>
#include <kft/transport/cuda_ipc/state.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc {

/// @brief Collectives over CUDA IPC between the processes (or GPUs) of one node.
class communicator : public typed_collectives<communicator> {
  using typed = typed_collectives<communicator>;

 public:
  KFT_TYPED_COLLECTIVES(typed);
  /// Buffers are device pointers (the generic hierarchical allreduce refuses avg on them, as it
  /// would divide on the host; kft::ddp picks device bucket storage).
  static constexpr bool device_buffers = true;
  /// @brief Collective: every rank of the group constructs it with its rank, the group's size
  /// and its CUDA device. Waits (until `cfg.timeout`) for the others' handles in `store`.
  /// @throws usage_error on a bad place or config, timeout_error when a rank does not come,
  ///         transport_error when a handle cannot be opened (not on this node, no peer access)
  communicator(rendezvous::store& store, int rank, int size, int device, config cfg = {}) {
    if (size < 1 || size > max_ranks || rank < 0 || rank >= size || device < 0)
      throw usage_error("cuda_ipc: rank " + std::to_string(rank) + " of " + std::to_string(size) + " on CUDA device " +
                            std::to_string(device) + " is not a valid place (1.." + std::to_string(max_ranks) +
                            " ranks)",
                        error_site::of("cuda_ipc init"));
    if (cfg.staging_bytes < 4096 || cfg.staging_bytes % 256 != 0)
      throw usage_error("cuda_ipc: staging_bytes " + std::to_string(cfg.staging_bytes) +
                            " must be a multiple of 256 and at least 4096",
                        error_site::of("cuda_ipc init"));
    s_ = std::make_shared<detail::state>();
    auto& s = *s_;
    s.rank = rank;
    s.size = size;
    s.device = device;
    s.cfg = std::move(cfg);
    s.store = &store;
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      release();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() { release(); }

  int rank() const { return s_ ? s_->rank : -1; }
  int size() const { return s_ ? s_->size : 0; }
  int device() const { return s_ ? s_->device : -1; }
  std::uint64_t sequence() const { return s_ ? s_->seq : 0; }
  /// @brief Why calls are refused (empty while healthy).
  std::string broken() const { return s_ ? s_->failed.reason() : std::string("moved from"); }
  /// @brief The stream calls are enqueued on.
  cudaStream_t stream() const { return s_ ? s_->stream : nullptr; }
  /// @brief Where the next call of `c` would fail (for the typed forms' size checks).
  error_site next_site(collective c) const {
    return s_ ? s_->site(std::string(name(c)), s_->seq + 1) : error_site::of("cuda_ipc " + std::string(name(c)));
  }

  // ---- the contract's collectives (device buffers) --------------------------------------------
  void allreduce(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    allreduce_async(in, out, n, t, op, o).wait();
  }
  void broadcast(const void* in, void* out, std::size_t n, dtype t, int root, const options& o = {}) {
    broadcast_async(in, out, n, t, root, o).wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    reduce_scatter_async(in, out, n, t, op, o).wait();
  }
  void allgather(const void* in, void* out, std::size_t n, dtype t, const options& o = {}) {
    allgather_async(in, out, n, t, o).wait();
  }
  void barrier(const options& o = {}) { barrier_async(o).wait(); }

  async::work allreduce_async(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {}) {
    require_algorithm(o, collective::allreduce);
    return detail::launch(s_, collective::allreduce, n, t, op, -1, o,
                          [&](detail::call& k) { detail::allreduce(k, in, out, n, t, op, o.algorithm); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t n, dtype t, int root, const options& o = {}) {
    kft::detail::require_root(root, live().size, next_site(collective::broadcast));
    require_algorithm(o, collective::broadcast);
    return detail::launch(s_, collective::broadcast, n, t, op_kind::sum, root, o,
                          [&](detail::call& k) { detail::broadcast(k, in, out, n, t, root); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t n, dtype t, op_kind op,
                                   const options& o = {}) {
    require_algorithm(o, collective::reduce_scatter);
    return detail::launch(s_, collective::reduce_scatter, n, t, op, -1, o,
                          [&](detail::call& k) { detail::reduce_scatter(k, in, out, n, t, op); });
  }
  async::work allgather_async(const void* in, void* out, std::size_t n, dtype t, const options& o = {}) {
    require_algorithm(o, collective::allgather);
    return detail::launch(s_, collective::allgather, n, t, op_kind::sum, -1, o,
                          [&](detail::call& k) { detail::allgather(k, in, out, n, t); });
  }
  async::work barrier_async(const options& o = {}) {
    require_algorithm(o, collective::barrier);
    return detail::launch(s_, collective::barrier, 0, dtype::u8, op_kind::sum, -1, o,
                          [](detail::call& k) { detail::barrier(k); });
  }

  /// @brief Group-scoped stop: every rank's current or next call fails with remote_error
  /// naming `reason`; this communicator refuses further calls. Returns.
  void abort(std::string_view reason) noexcept {
    if (!s_) return;
    try {
      s_->failed.set("aborted here: " + std::string(reason));
    } catch (...) {
    }
    s_->abort_group("rank " + std::to_string(s_->rank) + " aborted: " + std::string(reason));
  }

 private:
  std::shared_ptr<detail::state> s_;

  detail::state& live() const {
    if (!s_) throw usage_error("this cuda_ipc communicator is empty (moved from)", error_site::of("cuda_ipc"));
    return *s_;
  }

  // allreduce runs one_shot and two_shot besides auto; every other collective auto only.
  void require_algorithm(const options& o, collective c) const {
    live();
    const bool shots = c == collective::allreduce && (o.algorithm == algo::one_shot || o.algorithm == algo::two_shot);
    if (o.algorithm != algo::automatic && !shots)
      kft::detail::unsupported_algorithm(
          o.algorithm, "cuda_ipc",
          c == collective::allreduce ? "auto, one_shot, two_shot" : "auto; one_shot and two_shot are allreduce's",
          next_site(c));
  }

  // The constructor's steps; the set-up's barrier is not a user call.
  void init() {
    auto& s = *s_;
    s.allocate();
    s.publish_and_wait();
    s.open_peers();
    // Everyone has mapped everyone before anyone's first call writes into a peer.
    barrier();
    s.seq = 0;
    s.ready = true;
  }

  void release() noexcept {
    if (!s_ || s_.use_count() > 1) {
      s_.reset();
      return;
    }
    auto& s = *s_;
    // Peers write into this rank's control block until their last barrier: meet once more
    // (healthy groups only; bounded) before the region goes.
    if (!s.failed.stopped() && s.ready) {
      try {
        barrier(options{.timeout = derived_timeouts::from(s.cfg.timeout).teardown});
      } catch (...) {
      }
    }
    s.free_all();
    s_.reset();
  }
};

static_assert(async_communicator<communicator>);

}  // namespace cuda_ipc
KFT_NAMESPACE_END
