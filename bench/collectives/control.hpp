// SPDX-License-Identifier: Apache-2.0
// The ranks' own coordination in a *_perf program (barriers, combined times, gathered lines),
// apart from the communicator being measured.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include <kft/core/ops.hpp>
#include <kft/rendezvous/store.hpp>

namespace kft_bench {

// Barriers, combining per-rank times and gathering lines between the bench's ranks: MPI under
// an MPI launcher; under kftrun or torchrun (no MPI job exists there) a second shared-memory
// communicator, apart from the one being measured, over the launcher's store. The MPI peer
// columns exist only in the first case.
class control {
 public:
  virtual ~control() = default;
  virtual void barrier() = 0;
  virtual void bcast(void* data, std::size_t bytes, int root) = 0;
  virtual void reduce(double* v, std::size_t n, kft::op_kind op) = 0;  // in place, every rank gets it
  virtual void reduce(std::int64_t* v, std::size_t n, kft::op_kind op) = 0;
  virtual void gather(const char* mine, std::size_t bytes, char* all) = 0;  // rank r's bytes at all + r * bytes
  virtual bool mpi() const = 0;  // MPI_COMM_WORLD is the bench's world (MPI peers can run)
};

class mpi_control final : public control {
 public:
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void bcast(void* data, std::size_t bytes, int root) override {
    MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
  }
  void reduce(double* v, std::size_t n, kft::op_kind op) override {
    MPI_Allreduce(MPI_IN_PLACE, v, static_cast<int>(n), MPI_DOUBLE, mpi_op(op), MPI_COMM_WORLD);
  }
  void reduce(std::int64_t* v, std::size_t n, kft::op_kind op) override {
    MPI_Allreduce(MPI_IN_PLACE, v, static_cast<int>(n), MPI_INT64_T, mpi_op(op), MPI_COMM_WORLD);
  }
  void gather(const char* mine, std::size_t bytes, char* all) override {
    MPI_Allgather(mine, static_cast<int>(bytes), MPI_CHAR, all, static_cast<int>(bytes), MPI_CHAR, MPI_COMM_WORLD);
  }
  bool mpi() const override { return true; }

 private:
  static MPI_Op mpi_op(kft::op_kind op) {
    return op == kft::op_kind::min ? MPI_MIN : op == kft::op_kind::max ? MPI_MAX : MPI_SUM;
  }
};


/// The shared-memory control over the launcher's store (kftrun, torchrun): bench/collectives/backends.cpp.
std::unique_ptr<control> make_shm_control(std::shared_ptr<kft::rendezvous::store> store, int rank, int size);

}  // namespace kft_bench
