// SPDX-License-Identifier: Apache-2.0
// What every *_perf program is told (its flags) and how it was started: shared by the harness
// and bench/collectives/backends.cpp (the communicators, compiled once for all the programs).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>

namespace kft_bench {

struct settings {
  std::size_t min_bytes = 32u << 20, max_bytes = 32u << 20, step_bytes = 1u << 20, step_factor = 1;
  int iters = 20, warmup = 1, check = 1, average = 3, root = 0;
  bool all_roots = false;
  std::vector<kft::dtype> types{kft::dtype::f32};
  std::vector<kft::op_kind> ops{kft::op_kind::sum};
  kft::algo algorithm = kft::algo::automatic;
  bool zero_copy = false, peers = true, gloo = true, latency = false, p50 = false, algos = false;
  bool memcpy_beside = false;  // --memcpy-beside: memcpy timed right after each size's calls
  double peer_budget = 2.0;
  double min_time = 0;  // --min-time: seconds of timed calls per size at least (0: exactly -n calls)
  int timeout_s = 0, latency_iters = 10000;
  std::size_t staging_bytes = 0, small_bytes = 0, latency_max = 64u << 10;
  std::size_t pool_extra = 0;  // --pool-extra: bytes added to each rank's zero-copy pool
  long long copy_streaming_bytes = -1;  // --copy-streaming-bytes (-1: kft's default or the environment's)
  std::string json_path;
  std::string backend = "auto";  // shm, mpi, group, nccl; auto = shm on one node, the multinode table across
  int device = -1;               // nccl: the CUDA device (default: local rank modulo the devices)
};

// How this process was started decides who coordinates the ranks: an MPI launcher (MPI is
// then the control plane and a peer), kftrun/torchrun (kft's store and shared memory; no MPI
// job exists), or nothing (one rank, MPI initialised as a singleton for the peer columns).
enum class launch { mpi, launcher, single };

}  // namespace kft_bench
