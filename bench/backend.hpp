// The communicator a *_perf program measures (--backend), behind one small interface so the
// harness is written once: kft's shared-memory transport (shm), kft's MPI communicator (mpi),
// the CPU process group (group: shared memory per node + MPI between nodes) and NCCL (nccl,
// device buffers). One virtual call per collective call: a few nanoseconds against the
// ~0.2 us of the smallest call measured (docs/architecture.md's before/after table).
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/group/mpi_group.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/shm/communicator.hpp>
#if KFT_WITH_NCCL
#include <cuda_runtime_api.h>

#include <kft/transport/nccl/communicator.hpp>
#endif

namespace kft_bench {

class backend {
 public:
  virtual ~backend() = default;
  virtual std::string name() const = 0;
  /// One line for the table's header: what runs, and its settings.
  virtual std::string describe() const = 0;
  virtual void allreduce(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& o) = 0;
  virtual void broadcast(const void* in, void* out, std::size_t n, kft::dtype t, int root, const kft::options& o) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op,
                              const kft::options& o) = 0;
  virtual void allgather(const void* in, void* out, std::size_t n, kft::dtype t, const kft::options& o) = 0;
  /// Waits for what the calls enqueued (a device backend returns before the GPU is done).
  virtual void flush() {}
  /// What `automatic` runs for this call (the table's algorithm column).
  virtual kft::algo choose(kft::collective, std::size_t, bool) const { return kft::algo::automatic; }
  /// The algorithms `--algos` times after each row (forced), besides automatic.
  virtual std::vector<kft::algo> forced(kft::collective) const { return {}; }
  /// Buffers of `bytes`; `zero_copy`: inside the transport's own memory (shm's pool).
  virtual void* alloc(std::size_t bytes, bool zero_copy) = 0;
  virtual void release(void* p) = 0;
  /// Device buffers: the harness fills and checks host copies and moves them.
  virtual bool device() const { return false; }
  virtual void to_device(void*, const void*, std::size_t) {}
  virtual void to_host(void*, const void*, std::size_t) {}
};

// Host memory, page-aligned, first touched by the caller.
class host_buffers : public backend {
 public:
  void* alloc(std::size_t bytes, bool) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) override { std::free(p); }
};

template <class Comm>
class forward : public host_buffers {
 public:
  explicit forward(Comm& c) : c_(c) {}
  void allreduce(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& o) override {
    c_.allreduce(in, out, n, t, op, o);
  }
  void broadcast(const void* in, void* out, std::size_t n, kft::dtype t, int root, const kft::options& o) override {
    c_.broadcast(in, out, n, t, root, o);
  }
  void reduce_scatter(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op,
                      const kft::options& o) override {
    c_.reduce_scatter(in, out, n, t, op, o);
  }
  void allgather(const void* in, void* out, std::size_t n, kft::dtype t, const kft::options& o) override {
    c_.allgather(in, out, n, t, o);
  }

 protected:
  Comm& c_;
};

class shm_backend final : public forward<kft::shm::communicator> {
 public:
  explicit shm_backend(std::unique_ptr<kft::shm::communicator> c) : forward(*c), own_(std::move(c)) {}
  ~shm_backend() override { own_.reset(); }
  std::string name() const override { return "shm"; }
  std::string describe() const override {
    const auto& cfg = own_->configuration();
    return "shared-memory transport, staging " + std::to_string(cfg.staging_bytes) + " B, one-shot slot " +
           std::to_string(cfg.small_bytes) + " B";
  }
  kft::algo choose(kft::collective c, std::size_t bytes, bool zero_copy) const override {
    return own_->choose(c, bytes, zero_copy);
  }
  std::vector<kft::algo> forced(kft::collective) const override { return {kft::algo::one_shot, kft::algo::two_shot}; }
  void* alloc(std::size_t bytes, bool zero_copy) override {
    if (!zero_copy) return host_buffers::alloc(bytes, false);
    pool_.push_back(own_->allocate_bytes((bytes + 4095) / 4096 * 4096));
    return pool_.back();
  }
  void release(void* p) override {
    if (!in_pool(p)) host_buffers::release(p);  // pool buffers live as long as the communicator
  }
  const kft::shm::config& configuration() const { return own_->configuration(); }

 private:
  bool in_pool(void* p) const {
    for (void* q : pool_) if (q == p) return true;
    return false;
  }
  std::unique_ptr<kft::shm::communicator> own_;
  std::vector<void*> pool_;
};

class mpi_backend final : public forward<kft::mpi::communicator> {
 public:
  explicit mpi_backend(std::unique_ptr<kft::mpi::communicator> c) : forward(*c), own_(std::move(c)) {}
  std::string name() const override { return "mpi"; }
  std::string describe() const override {
    return std::string("kft::mpi::communicator (") + kft::discovery::mpi_library_name() + ")";
  }
  std::vector<kft::algo> forced(kft::collective c) const override {
    if (c == kft::collective::allreduce) return {kft::algo::ring};
    return {};
  }

 private:
  std::unique_ptr<kft::mpi::communicator> own_;
};

class group_backend final : public forward<kft::group::mpi_cpu_group> {
 public:
  explicit group_backend(std::unique_ptr<kft::group::mpi_cpu_group> g) : forward(*g), own_(std::move(g)) {}
  std::string name() const override { return "group"; }
  std::string describe() const override {
    return "CPU process group (shared memory per node + MPI between nodes): " + own_->layout().describe();
  }
  kft::algo choose(kft::collective c, std::size_t bytes, bool) const override {
    return c == kft::collective::allreduce ? own_->choose(bytes) : kft::algo::flat;
  }
  std::vector<kft::algo> forced(kft::collective c) const override {
    if (c == kft::collective::allreduce) return {kft::algo::flat, kft::algo::hierarchical};
    return {};
  }

 private:
  std::unique_ptr<kft::group::mpi_cpu_group> own_;
};

#if KFT_WITH_NCCL
// NCCL on device buffers: calls are enqueued (their work detached: stream-ordered) and the
// timed loop ends with a synchronisation, as nccl-tests times a loop of launches.
class nccl_backend final : public backend {
 public:
  explicit nccl_backend(std::unique_ptr<kft::nccl::communicator> c) : c_(std::move(c)) {}
  ~nccl_backend() override { c_.reset(); }
  std::string name() const override { return "nccl"; }
  std::string describe() const override {
    return "kft::nccl::communicator (NCCL " + kft::nccl::version() + ") on CUDA device " + std::to_string(c_->device());
  }
  void allreduce(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& o) override {
    c_->allreduce_async(in, out, n, t, op, o).detach();
  }
  void broadcast(const void* in, void* out, std::size_t n, kft::dtype t, int root, const kft::options& o) override {
    c_->broadcast_async(in, out, n, t, root, o).detach();
  }
  void reduce_scatter(const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op,
                      const kft::options& o) override {
    c_->reduce_scatter_async(in, out, n, t, op, o).detach();
  }
  void allgather(const void* in, void* out, std::size_t n, kft::dtype t, const kft::options& o) override {
    c_->allgather_async(in, out, n, t, o).detach();
  }
  void flush() override { c_->synchronize(); }
  void* alloc(std::size_t bytes, bool) override {
    void* p = nullptr;
    kft::detail::cuda_check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc", kft::error_site::of("bench"));
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  bool device() const override { return true; }
  void to_device(void* dst, const void* src, std::size_t bytes) override {
    kft::detail::cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", kft::error_site::of("bench"));
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    c_->synchronize();
    kft::detail::cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", kft::error_site::of("bench"));
  }

 private:
  std::unique_ptr<kft::nccl::communicator> c_;
};
#endif

}  // namespace kft_bench
