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
/// Set-up: each rank allocates one device region (a control block and `staging_bytes` of
/// staging), publishes its `cudaIpcMemHandle_t` under `<name>/<rank>` in the store, and opens
/// every other rank's (`cudaIpcMemLazyEnablePeerAccess`: NVLink or PCIe peer access between
/// GPUs, or the same GPU shared by several processes). Up to 8 ranks.
///
/// A call, per chunk of at most `staging_bytes`: copy the input into this rank's staging;
/// barrier; compute from the peers' staging; barrier (nobody refills staging while a peer
/// still reads it). allreduce is one-shot below `one_shot_bytes` (every rank reduces the whole
/// chunk from every staging) and two-shot from there (rank r reduces slice r in place in its
/// own staging; barrier; every rank gathers the slices), or as `options::algorithm` says.
/// Reductions combine the ranks in rank order, so every rank gets bit-identical results.
///
/// The barrier is a one-block kernel: rank r stores the call's signature and the barrier's
/// epoch into every rank's control block (release, system scope), then waits until every
/// rank's epoch has arrived in its own (acquire), backing off with `__nanosleep`. It gives up
/// on its own past the call's deadline (timed on the GPU), when a rank aborted the group (a
/// word in every control block), or when a peer's signature differs (a mismatched call); it
/// reports which in a host-mapped status word that the host reads when the call completes,
/// and the call throws timeout_error, remote_error or mismatch_error naming the rank. The
/// host also waits with a deadline: past it, it tells the kernel to stop. After a failure the
/// communicator aborts the group and refuses further calls.
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

#include <cuda/atomic>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <kft/async/work.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/cuda_error.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/core/timeout.hpp>
#include <kft/kernels/cuda_reduce.cuh>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc {

/// The most ranks one communicator holds (the inputs one reduction kernel takes).
inline constexpr int max_ranks = cuda_kernels::max_inputs;

/// @brief Settings; every field has a default.
struct config {
  /// Every call's deadline unless its options give one (KFT_TIMEOUT's default).
  std::chrono::milliseconds timeout = job_timeout();
  /// Staging per rank: a call moves at most this much per chunk.
  std::size_t staging_bytes = std::size_t{32} << 20;
  /// allreduce (auto): one-shot below this chunk size, two-shot from it.
  std::size_t one_shot_bytes = std::size_t{256} << 10;
  /// The store keys' prefix: communicators made over one store need different names.
  std::string name = "cuda_ipc";
  /// A stream to enqueue on instead of the communicator's own.
  cudaStream_t stream = nullptr;
  /// Where the communicator sits in the job (error messages).
  group_identity identity;
};

namespace detail {

// The first bytes of every rank's region; peers write into it through their IPC mapping.
struct control {
  unsigned long long flag[max_ranks];    // flag[j]: the last barrier epoch rank j signalled here
  unsigned long long sig[2][max_ranks];  // sig[e & 1][j]: rank j's call signature at epoch e
  unsigned long long aborted;            // nonzero: rank aborted - 1 aborted the group
};
inline constexpr std::size_t control_bytes = 4096;  // staging starts here (16-byte aligned and more)
static_assert(sizeof(control) <= control_bytes);

// Host-mapped: what the barrier kernel found, and the host's request to stop waiting.
struct status {
  unsigned int code;  // 0 fine, 1 timed out, 2 group aborted, 3 mismatch, 4 stopped by the host
  int peer;           // the rank at fault
  unsigned long long epoch;
  unsigned long long theirs;  // the peer's signature (mismatch)
  unsigned int stop;          // set by the host: give up waiting
};

struct peers {
  control* ctl[max_ranks];
};

__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline void report(status* st, unsigned int code, int peer, unsigned long long epoch,
                              unsigned long long theirs) {
  volatile status* s = st;
  if (s->code != 0) return;  // the first finding stands (a race between threads is harmless)
  s->peer = peer;
  s->epoch = epoch;
  s->theirs = theirs;
  __threadfence_system();
  s->code = code;
}

// Thread j signals rank j, then waits for rank j's signal (see the file comment).
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
  if (host->code != 0) return;  // an earlier barrier of this communicator failed: do not wait again
  const unsigned long long start = global_ns();
  unsigned int nap = 32;
  while (arrived.load(cuda::memory_order_acquire) < epoch) {
    if (host->code != 0) return;  // another thread of this barrier gave up
    if (const unsigned long long a = aborted.load(cuda::memory_order_relaxed); a != 0)
      return report(st, 2, static_cast<int>(a - 1), epoch, 0);
    if (host->stop != 0) return report(st, 4, j, epoch, 0);
    if (global_ns() - start > timeout_ns) return report(st, 1, j, epoch, 0);
    __nanosleep(nap);
    if (nap < 2048) nap *= 2;
  }
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> theirs(me->sig[epoch & 1][j]);
  if (const unsigned long long t = theirs.load(cuda::memory_order_relaxed); t != sig) report(st, 3, j, epoch, t);
}

inline std::string hex(const void* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}
inline bool unhex(std::string_view s, void* p, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : (c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1); };
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(p)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

// FNV-1a over what must agree between ranks: collective, count, dtype, op, root, tag, algorithm.
// The chunking settings count too: ranks that cut a call differently would meet at different barriers.
inline unsigned long long signature(collective c, std::size_t count, dtype t, op_kind op, int root, std::uint32_t tag,
                                    algo a, std::size_t staging_bytes, std::size_t one_shot_bytes) {
  unsigned long long h = 1469598103934665603ull;
  auto mix = [&h](unsigned long long v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<unsigned long long>(c));
  mix(count);
  mix(static_cast<unsigned long long>(t));
  mix(static_cast<unsigned long long>(op));
  mix(static_cast<unsigned long long>(root + 1));
  mix(tag);
  mix(static_cast<unsigned long long>(a));
  mix(staging_bytes);
  mix(one_shot_bytes);
  return h | 1;  // never 0 (a control block's initial value)
}

// Everything the communicator and its outstanding work share.
struct state {
  int rank = 0, size = 1, device = 0;
  config cfg;
  std::uint64_t seq = 0;
  unsigned long long epoch = 0;
  unsigned char* base = nullptr;                     // this rank's region
  std::array<unsigned char*, max_ranks> region{};    // every rank's region (this rank's = base)
  peers ctl{};
  status* st_host = nullptr;  // host-mapped
  status* st_dev = nullptr;
  cudaStream_t stream = nullptr, side = nullptr;
  bool own_stream = false;
  std::string broken;  // why calls are refused (empty while healthy)
  bool ready = false;  // set-up done: every rank's region mapped
  rendezvous::store* store = nullptr;

  error_site site(std::string op, std::uint64_t s = 0) const {
    return error_site::in(cfg.identity, rank, size, "cuda_ipc " + std::move(op), s);
  }

  // Tells every rank's barrier kernels to stop (noexcept: used on the way out of failures).
  void abort_group(std::string_view why) noexcept {
    try {
      if (store != nullptr) store->set(cfg.name + "/abort", std::string(why));
    } catch (...) {
    }
    if (st_host != nullptr) reinterpret_cast<volatile status*>(st_host)->stop = 1;
    static thread_local unsigned long long word = 0;
    word = static_cast<unsigned long long>(rank) + 1;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    for (int j = 0; j < size; ++j)
      if (region[static_cast<std::size_t>(j)] != nullptr)
        cudaMemcpyAsync(region[static_cast<std::size_t>(j)] + offsetof(control, aborted), &word, sizeof word,
                        cudaMemcpyHostToDevice, side);
    cudaStreamSynchronize(side);
    if (prev >= 0) cudaSetDevice(prev);
  }
};

}  // namespace detail

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
  std::string broken() const { return s_ ? s_->broken : std::string("moved from"); }
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
    if (o.algorithm != algo::automatic && o.algorithm != algo::one_shot && o.algorithm != algo::two_shot)
      throw usage_error("cuda_ipc allreduce: algorithm " + std::string(name(o.algorithm)) +
                            " is not implemented here (auto, one_shot, two_shot)",
                        s_->site("allreduce", s_->seq + 1));
    return launch(collective::allreduce, n, t, op, -1, o, [&](std::uint64_t sig) {
      auto& s = *s_;
      const std::size_t es = size_of(t), k = static_cast<std::size_t>(s.size);
      const std::size_t chunk = s.cfg.staging_bytes / es;
      for (std::size_t off = 0; off < n; off += chunk) {
        const std::size_t m = std::min(chunk, n - off);
        const bool two = o.algorithm == algo::two_shot ||
                         (o.algorithm == algo::automatic && m * es >= s.cfg.one_shot_bytes && s.size > 1);
        copy(stage(s.rank), at(in, off, es), m * es);
        sync(sig);
        if (!two) {
          reduce(at(out, off, es), 0, m, t, op);
        } else {
          // Slices of whole 16-byte vectors; rank r reduces slice r in place in its staging.
          const std::size_t v = 16 / es, per = ((m + k - 1) / k + v - 1) / v * v;
          const std::size_t lo = std::min(m, per * static_cast<std::size_t>(s.rank)), hi = std::min(m, lo + per);
          if (hi > lo) reduce(stage(s.rank) + lo * es, lo * es, hi - lo, t, op);
          sync(sig);
          for (int j = 0; j < s.size; ++j) {
            const std::size_t jl = std::min(m, per * static_cast<std::size_t>(j)), jh = std::min(m, jl + per);
            if (jh > jl) copy(at(out, off + jl, es), stage(j) + jl * es, (jh - jl) * es);
          }
        }
        sync(sig);
      }
    });
  }

  async::work broadcast_async(const void* in, void* out, std::size_t n, dtype t, int root, const options& o = {}) {
    if (root < 0 || root >= s_->size)
      throw usage_error("cuda_ipc broadcast: root " + std::to_string(root) + " is not a rank of " +
                            std::to_string(s_->size),
                        s_->site("broadcast", s_->seq + 1));
    refuse_algorithm(o, "broadcast");
    return launch(collective::broadcast, n, t, op_kind::sum, root, o, [&](std::uint64_t sig) {
      auto& s = *s_;
      const std::size_t es = size_of(t), chunk = s.cfg.staging_bytes / es;
      for (std::size_t off = 0; off < n; off += chunk) {
        const std::size_t m = std::min(chunk, n - off);
        if (s.rank == root) copy(stage(root), at(in, off, es), m * es);
        sync(sig);
        if (s.rank != root || in != out) copy(at(out, off, es), stage(root), m * es);
        sync(sig);
      }
    });
  }

  async::work reduce_scatter_async(const void* in, void* out, std::size_t n, dtype t, op_kind op,
                                   const options& o = {}) {
    refuse_algorithm(o, "reduce_scatter");
    return launch(collective::reduce_scatter, n, t, op, -1, o, [&](std::uint64_t sig) {
      auto& s = *s_;
      const std::size_t es = size_of(t), k = static_cast<std::size_t>(s.size);
      const std::size_t chunk = std::max<std::size_t>(1, s.cfg.staging_bytes / es / k / (16 / es) * (16 / es));
      for (std::size_t off = 0; off < n; off += chunk) {
        const std::size_t m = std::min(chunk, n - off);
        // Staging holds this chunk of every rank's slice: slice j at j x m.
        check(cudaMemcpy2DAsync(stage(s.rank), m * es, at(in, off, es), n * es, m * es, k, cudaMemcpyDeviceToDevice,
                                s.stream),
              "cudaMemcpy2DAsync");
        sync(sig);
        reduce(at(out, off, es), static_cast<std::size_t>(s.rank) * m * es, m, t, op);
        sync(sig);
      }
    });
  }

  async::work allgather_async(const void* in, void* out, std::size_t n, dtype t, const options& o = {}) {
    refuse_algorithm(o, "allgather");
    return launch(collective::allgather, n, t, op_kind::sum, -1, o, [&](std::uint64_t sig) {
      auto& s = *s_;
      const std::size_t es = size_of(t), chunk = s.cfg.staging_bytes / es;
      for (std::size_t off = 0; off < n; off += chunk) {
        const std::size_t m = std::min(chunk, n - off);
        copy(stage(s.rank), at(in, off, es), m * es);
        sync(sig);
        for (int j = 0; j < s.size; ++j) copy(at(out, static_cast<std::size_t>(j) * n + off, es), stage(j), m * es);
        sync(sig);
      }
    });
  }

  async::work barrier_async(const options& o = {}) {
    refuse_algorithm(o, "barrier");
    return launch(collective::barrier, 0, dtype::u8, op_kind::sum, -1, o, [](std::uint64_t) {});
  }

  /// @brief Group-scoped stop: every rank's current or next call fails with remote_error
  /// naming `reason`; this communicator refuses further calls. Returns.
  void abort(std::string_view reason) noexcept {
    if (!s_) return;
    try {
      if (s_->broken.empty()) s_->broken = "aborted here: " + std::string(reason);
    } catch (...) {
    }
    s_->abort_group("rank " + std::to_string(s_->rank) + " aborted: " + std::string(reason));
  }

 private:
  std::shared_ptr<detail::state> s_;
  // During one call: its deadline on the GPU.
  unsigned long long timeout_ns_ = 0;

  void check(cudaError_t rc, const char* call) const {
    kft::detail::cuda_check(rc, call, s_->site("call", s_->seq));
  }
  static const void* at(const void* p, std::size_t off, std::size_t es) {
    return static_cast<const unsigned char*>(p) + off * es;
  }
  static void* at(void* p, std::size_t off, std::size_t es) { return static_cast<unsigned char*>(p) + off * es; }
  unsigned char* stage(int j) const { return s_->region[static_cast<std::size_t>(j)] + detail::control_bytes; }

  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0 && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_->stream), "cudaMemcpyAsync");
  }
  // out[0..m) = every rank's staging at byte offset `from`, reduced in rank order.
  void reduce(void* out, std::size_t from, std::size_t m, dtype t, op_kind op) {
    std::array<const void*, max_ranks> in{};
    for (int j = 0; j < s_->size; ++j) in[static_cast<std::size_t>(j)] = stage(j) + from;
    cuda_kernels::reduce(out, in.data(), s_->size, m, t, op, s_->stream);
  }
  void sync(unsigned long long sig) {
    auto& s = *s_;
    detail::barrier_kernel<<<1, 32, 0, s.stream>>>(s.ctl, s.rank, s.size, ++s.epoch, sig, timeout_ns_, s.st_dev);
    check(cudaGetLastError(), "launching the barrier kernel");
  }

  static void refuse_algorithm(const options& o, const char* op) {
    if (o.algorithm != algo::automatic)
      throw usage_error(std::string("cuda_ipc ") + op + ": algorithm " + std::string(name(o.algorithm)) +
                            " is not implemented here (auto only)",
                        error_site::of(std::string("cuda_ipc ") + op));
  }

  template <class Body>
  async::work launch(collective c, std::size_t n, dtype t, op_kind op, int root, const options& o, Body&& body) {
    if (!s_) throw usage_error("this cuda_ipc communicator is empty (moved from)", error_site::of("cuda_ipc"));
    auto& s = *s_;
    const std::string what(name(c));
    if (!s.broken.empty())
      throw transport_error("this communicator refuses calls after a failure: " + s.broken, s.site(what, s.seq + 1));
    const std::uint64_t seq = ++s.seq;
    const auto timeout = o.timeout.count() > 0 ? o.timeout : s.cfg.timeout;
    timeout_ns_ = static_cast<unsigned long long>(timeout.count()) * 1000000ull;
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != s.device) check(cudaSetDevice(s.device), "cudaSetDevice");
    cudaEvent_t ev = nullptr;
    try {
      const auto sig = detail::signature(c, n, t, op, root, o.tag, o.algorithm, s.cfg.staging_bytes, s.cfg.one_shot_bytes);
      body(sig);
      if (n == 0 || c == collective::barrier) sync(sig);  // a call that moves nothing still meets
      check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(ev, s.stream), "cudaEventRecord");
    } catch (...) {
      if (ev != nullptr) cudaEventDestroy(ev);
      if (prev >= 0 && prev != s.device) cudaSetDevice(prev);
      throw;
    }
    if (prev >= 0 && prev != s.device) cudaSetDevice(prev);

    auto w = std::make_shared<async::work_state>();
    w->op = c;
    w->seq = seq;
    w->timeout = timeout + std::chrono::seconds(5);  // the GPU gives up first, at `timeout`
    const std::string desc = what + " (" + std::to_string(n) + " x " + std::string(kft::name(t)) + ")";
    w->name = "cuda_ipc " + desc;
    auto st = s_;
    auto done = std::make_shared<bool>(false);
    auto finish = [st, ev, seq, what, desc, timeout, done]() {
      if (*done) return;
      *done = true;
      cudaEventDestroy(ev);
      const volatile detail::status& v = *st->st_host;
      detail::status r{};
      r.code = v.code;
      r.peer = v.peer;
      r.epoch = v.epoch;
      r.theirs = v.theirs;
      if (r.code == 0) return;
      const std::string peer = "rank " + std::to_string(r.peer);
      std::string msg;
      auto site = st->site(what, seq);
      if (r.code == 1) {
        msg = desc + " timed out after " + kft::detail::describe_duration(timeout) + " on CUDA device " +
              std::to_string(st->device) + " waiting for " + peer + " (barrier " + std::to_string(r.epoch) + ")";
        st->broken = msg;
        st->abort_group("rank " + std::to_string(st->rank) + ": " + msg);
        throw timeout_error(msg + "; the group was aborted", site);
      }
      if (r.code == 3) {
        msg = desc + ": " + peer + " is in a different call (signature " + detail::hex(&r.theirs, 8) +
              "; its collective, count, dtype, op, root, tag or algorithm differ)";
        st->broken = msg;
        st->abort_group("rank " + std::to_string(st->rank) + ": " + msg);
        throw mismatch_error(msg, site);
      }
      std::string why;
      try {
        why = st->store->try_get(st->cfg.name + "/abort").value_or("");
      } catch (...) {
      }
      if (r.code == 4) {
        msg = desc + " was stopped on this rank" + (why.empty() ? std::string() : ": " + why);
        st->broken = msg;
        throw remote_error(msg, site);
      }
      msg = desc + ": the group was aborted by " + peer + (why.empty() ? std::string() : " (" + why + ")");
      st->broken = msg;
      throw remote_error(msg, site);
    };
    w->progress = [ev, finish, st, seq, what]() {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaErrorNotReady) return false;
      if (e != cudaSuccess) {
        st->broken = std::string("cudaEventQuery: ") + cudaGetErrorString(e);
        kft::detail::cuda_check(e, "cudaEventQuery", st->site(what, seq));
      }
      finish();
      return true;
    };
    w->on_timeout = [ev, done, st, seq, what, desc, timeout]() -> std::exception_ptr {
      // The GPU's own deadline did not end it (kernels queued behind other work, or a hung
      // device): tell the barrier kernels to stop, give them a moment, then fail.
      reinterpret_cast<volatile detail::status*>(st->st_host)->stop = 1;
      for (int i = 0; i < 200 && cudaEventQuery(ev) == cudaErrorNotReady; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!*done) {
        *done = true;
        cudaEventDestroy(ev);  // released once the device is past it
      }
      const std::string msg = desc + " did not complete within " + kft::detail::describe_duration(timeout) +
                              " + 5 s on CUDA device " + std::to_string(st->device);
      st->broken = msg;
      st->abort_group("rank " + std::to_string(st->rank) + ": " + msg);
      return std::make_exception_ptr(timeout_error(msg + "; the group was aborted", st->site(what, seq)));
    };
    return async::work(std::move(w));
  }

  void init() {
    auto& s = *s_;
    check(cudaSetDevice(s.device), "cudaSetDevice");
    const std::size_t bytes = detail::control_bytes + s.cfg.staging_bytes;
    void* mem = nullptr;
    check(cudaMalloc(&mem, bytes), "cudaMalloc (cuda_ipc staging)");
    s.base = static_cast<unsigned char*>(mem);
    check(cudaMemset(s.base, 0, detail::control_bytes), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    void* host = nullptr;
    check(cudaHostAlloc(&host, sizeof(detail::status), cudaHostAllocMapped), "cudaHostAlloc (status)");
    s.st_host = static_cast<detail::status*>(host);
    std::memset(s.st_host, 0, sizeof(detail::status));
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
    s.st_dev = static_cast<detail::status*>(dev);
    if (s.cfg.stream != nullptr) {
      s.stream = s.cfg.stream;
    } else {
      check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      s.own_stream = true;
    }
    check(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");

    cudaIpcMemHandle_t mine{};
    check(cudaIpcGetMemHandle(&mine, s.base), "cudaIpcGetMemHandle");
    const std::string key = s.cfg.name + "/";
    s.store->set(key + std::to_string(s.rank), detail::hex(&mine, sizeof mine) + " " + std::to_string(::getpid()) +
                                                   " " + std::to_string(s.device));
    std::vector<std::string> keys;
    for (int j = 0; j < s.size; ++j) keys.push_back(key + std::to_string(j));
    try {
      s.store->wait(keys, s.cfg.timeout);
    } catch (const timeout_error& e) {
      std::string missing;
      for (int j = 0; j < s.size; ++j)
        if (!s.store->try_get(keys[static_cast<std::size_t>(j)])) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      throw timeout_error("set-up timed out after " + kft::detail::describe_duration(s.cfg.timeout) +
                              " waiting for rank(s) " + missing + " to publish their CUDA IPC handle under '" + key +
                              "<rank>' in " + s.store->describe(),
                          s.site("init"));
    }
    for (int j = 0; j < s.size; ++j) {
      auto& r = s.region[static_cast<std::size_t>(j)];
      if (j == s.rank) {
        r = s.base;
      } else {
        const std::string v = s.store->get(keys[static_cast<std::size_t>(j)], s.cfg.timeout);
        cudaIpcMemHandle_t h{};
        const auto sp = v.find(' ');
        if (sp == std::string::npos || !detail::unhex(std::string_view(v).substr(0, sp), &h, sizeof h))
          throw transport_error("rank " + std::to_string(j) + "'s entry '" + keys[static_cast<std::size_t>(j)] +
                                    "' is not a CUDA IPC handle: '" + v.substr(0, 80) + "'",
                                s.site("init"));
        void* p = nullptr;
        const cudaError_t rc = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
        if (rc != cudaSuccess)
          throw transport_error("cannot open rank " + std::to_string(j) + "'s CUDA IPC handle (process and device: " +
                                    v.substr(sp + 1) + "; this rank is on device " + std::to_string(s.device) +
                                    "): " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) +
                                    "); the ranks of a cuda_ipc communicator must be distinct processes of one node "
                                    "whose GPUs have peer access (cudaDeviceCanAccessPeer)",
                                s.site("init"), static_cast<int>(rc));
        r = static_cast<unsigned char*>(p);
      }
      s.ctl.ctl[j] = reinterpret_cast<detail::control*>(r);
    }
    // Everyone has mapped everyone before anyone's first call writes into a peer.
    barrier();
    s.seq = 0;  // the set-up's barrier is not a user call
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
    if (s.broken.empty() && s.ready) {
      try {
        barrier(options{.timeout = std::min<std::chrono::milliseconds>(s.cfg.timeout, std::chrono::seconds(10))});
      } catch (...) {
      }
    }
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(s.device);
    if (s.stream != nullptr) cudaStreamSynchronize(s.stream);
    for (int j = 0; j < s.size; ++j)
      if (j != s.rank && s.region[static_cast<std::size_t>(j)] != nullptr) cudaIpcCloseMemHandle(s.region[static_cast<std::size_t>(j)]);
    if (s.base != nullptr) cudaFree(s.base);
    if (s.st_host != nullptr) cudaFreeHost(s.st_host);
    if (s.own_stream && s.stream != nullptr) cudaStreamDestroy(s.stream);
    if (s.side != nullptr) cudaStreamDestroy(s.side);
    if (prev >= 0) cudaSetDevice(prev);
    s_.reset();
  }
};

static_assert(async_communicator<communicator>);

}  // namespace cuda_ipc
KFT_NAMESPACE_END
