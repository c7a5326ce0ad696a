/// @file kft/transport/shm/config.hpp
/// @brief Sizes and limits of a shared-memory communicator, fixed at construction.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include <kft/core/error.hpp>
#include <kft/core/timeout.hpp>
#include <kft/transport/shm/tuning.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

using namespace std::chrono_literals;

/// @brief Sizes and limits of a communicator, fixed at construction (all ranks must agree).
/// The transport reads no environment variable: `kft::group::shm_config(env)` applies
/// `KFT_SHM_*` for programs that want them (as the process groups do).
struct config {
  std::size_t staging_bytes = 256u << 10;  ///< per rank, per half of the double buffer (chunk size; both halves fit L2)
  std::size_t small_bytes = 32u << 10;     ///< per rank, per parity: the one-shot slot
  std::size_t pool_bytes = 0;              ///< room for symmetric zero-copy buffers (`allocate`)
  std::size_t streaming_bytes = 16u << 20;  ///< outputs from this size on bypass the caches
  std::chrono::milliseconds timeout = job_timeout();  ///< default deadline of every wait (KFT_TIMEOUT)
  std::string name = "kft";                  ///< goes into the segment's name (e.g. the run id)
  group_identity identity{};                 ///< where this node's group sits in the job (messages)
  /// What algo::automatic runs, by size (tuning.hpp), first matching row first; a machine measured
  /// differently brings its own rows (`KFT_SHM_TUNING`, written by `bench/tune_shm.py`; `keep_table`).
  std::span<const crossover> crossovers = default_crossovers;
};

}  // namespace shm
KFT_NAMESPACE_END
