// SPDX-License-Identifier: Apache-2.0
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
#include <kft/rendezvous/store.hpp>
#include <kft/transport/shm/config.hpp>

#include "settings.hpp"

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
  /// The CUDA device the buffers live on (-1: host memory), for the header's device column.
  virtual int device_index() const { return -1; }
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

// The communicator measured, made from --backend (bench/collectives/backends.cpp, compiled once for every
// program). `store` reaches this node's ranks.
std::unique_ptr<backend> make_backend(const settings& s, const std::string& which,
                                      std::shared_ptr<kft::rendezvous::store> store, launch how, int rank, int nranks,
                                      int local_rank, std::size_t buffer);
/// The shared-memory transport's settings when `b` measures it, else nullptr (the table's header).
const kft::shm::config* shm_settings(const backend& b);

}  // namespace kft_bench
