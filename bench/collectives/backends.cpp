// SPDX-License-Identifier: Apache-2.0
// The communicators a *_perf program measures and the shared-memory control, compiled once and
// linked into every program (the transports' templates are most of a program's compile time).
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <kft/core/environment.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/mpi.hpp>
#include <kft/group/mpi_group.hpp>
#include <kft/group/node.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/shm/communicator.hpp>
#if KFT_WITH_NCCL
#include <cuda_runtime_api.h>

#include <kft/core/cuda_error.hpp>
#include <kft/transport/nccl/communicator.hpp>
#endif

#include "backend.hpp"
#include "control.hpp"

namespace kft_bench {

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
    const auto huge = own_->huge_pages();
    return "shared-memory transport, staging " + std::to_string(cfg.staging_bytes) + " B, one-shot slot " +
           std::to_string(cfg.small_bytes) + " B, " +
           (huge.region_bytes ? std::to_string(huge.bytes >> 20) + " of " + std::to_string(huge.region_bytes >> 20) +
                                    " MiB of this rank's region in 2 MiB pages" + (huge.why.empty() ? "" : " (" + huge.why + ")") +
                                    ", regions " + std::to_string(own_->region_stride() >> 20) + " MiB apart (KFT_SHM_REGION_ALIGN)"
                              : std::string("4 KiB pages (KFT_SHM_HUGE_PAGES, config::huge_pages)"));
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
  int device_index() const override { return c_->device(); }
  // On the communicator's stream, so the collectives that read it are ordered after it: a
  // plain cudaMemcpy from pageable memory may return before the data lands, and the
  // communicator's non-blocking stream does not wait for the legacy stream (on an H200 that
  // showed as 3136 wrong elements in one validation).
  void to_device(void* dst, const void* src, std::size_t bytes) override {
    const kft::error_site site = kft::error_site::of("bench");
    kft::detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c_->stream()), "cudaMemcpyAsync", site);
    kft::detail::cuda_check(cudaStreamSynchronize(c_->stream()), "cudaStreamSynchronize", site);
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    c_->synchronize();
    kft::detail::cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", kft::error_site::of("bench"));
  }

 private:
  std::unique_ptr<kft::nccl::communicator> c_;
};
#endif


class shm_control final : public control {
 public:
  shm_control(std::shared_ptr<kft::rendezvous::store> store, int rank, int size)
      : comm_(std::make_shared<kft::rendezvous::prefix_store>(std::move(store), "bench-control/"), rank, size,
              {.name = "bench-control"}) {}
  void barrier() override { comm_.barrier(); }
  void bcast(void* data, std::size_t bytes, int root) override { comm_.broadcast(data, data, bytes, kft::dtype::u8, root); }
  void reduce(double* v, std::size_t n, kft::op_kind op) override { comm_.allreduce(v, v, n, kft::dtype::f64, op); }
  void reduce(std::int64_t* v, std::size_t n, kft::op_kind op) override { comm_.allreduce(v, v, n, kft::dtype::i64, op); }
  void gather(const char* mine, std::size_t bytes, char* all) override { comm_.allgather(mine, all, bytes, kft::dtype::u8); }
  bool mpi() const override { return false; }

 private:
  kft::shm::communicator comm_;
};

std::unique_ptr<control> make_shm_control(std::shared_ptr<kft::rendezvous::store> store, int rank, int size) {
  return std::make_unique<shm_control>(std::move(store), rank, size);
}

const kft::shm::config* shm_settings(const backend& b) {
  if (auto* shm = dynamic_cast<const shm_backend*>(&b)) return &shm->configuration();
  return nullptr;
}

// The communicator measured, made from --backend. `store` reaches this node's ranks.
std::unique_ptr<backend> make_backend(const settings& s, const std::string& which,
                                             std::shared_ptr<kft::rendezvous::store> store, launch how, int rank,
                                             int nranks, int local_rank, std::size_t buffer) {
  // --timeout, else the job's (KFT_TIMEOUT, as the process groups apply it to what they make).
  const auto timeout = s.timeout_s > 0 ? std::chrono::milliseconds(std::chrono::seconds(s.timeout_s))
                                       : kft::job_timeout(kft::environment::process());
  if (which == "shm") {
    // The environment's KFT_SHM_* (and KFT_SHM_TUNING's file) apply, as in the process groups;
    // --staging-bytes / --small-bytes / --copy-streaming-bytes win over them.
    kft::shm::config cfg = kft::group::shm_config(kft::environment::process());
    cfg.name = "bench";
    if (s.staging_bytes) cfg.staging_bytes = s.staging_bytes;
    if (s.small_bytes) cfg.small_bytes = s.small_bytes;
    if (s.copy_streaming_bytes >= 0) cfg.copy_streaming_bytes = static_cast<std::size_t>(s.copy_streaming_bytes);
    cfg.timeout = timeout;
    if (s.zero_copy) cfg.pool_bytes = 2 * ((buffer + 4095) / 4096 * 4096) + 4096 + s.pool_extra;
    return std::make_unique<shm_backend>(std::make_unique<kft::shm::communicator>(std::move(store), rank, nranks, cfg));
  }
  if (which == "nccl") {
#if KFT_WITH_NCCL
    int devices = 0;
    kft::detail::cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount", kft::error_site::of("bench"));
    const int device = s.device >= 0 ? s.device : local_rank % std::max(devices, 1);
    kft::detail::cuda_check(cudaSetDevice(device), "cudaSetDevice", kft::error_site::of("bench"));
    kft::nccl::config cfg;
    cfg.name = "bench";
    cfg.timeout = timeout;
    return std::make_unique<nccl_backend>(std::make_unique<kft::nccl::communicator>(*store, rank, nranks, device, cfg));
#else
    (void)local_rank;
    throw std::invalid_argument("--backend nccl: kft was built without NCCL (KFT_WITH_NCCL=OFF)");
#endif
  }
  if (how == launch::launcher)
    throw std::invalid_argument("--backend " + which + " needs an MPI job (mpirun, srun --mpi=pmix)");
  if (which == "mpi") {
    kft::mpi::config cfg;
    cfg.timeout = timeout;
    return std::make_unique<mpi_backend>(std::make_unique<kft::mpi::communicator>(MPI_COMM_WORLD, cfg));
  }
  return std::make_unique<group_backend>(kft::group::mpi_group());
}

}  // namespace kft_bench
