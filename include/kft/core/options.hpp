/// @file kft/core/options.hpp
/// @brief Per-call options of collectives: `comm.allreduce(in, out, kft::ops::sum, {.algorithm =
/// kft::algo::two_shot, .timeout = 30s})`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief Which algorithm a collective runs. `automatic` lets the communicator choose by size
/// and rank count (docs/algorithms.md).
///
/// `one_shot` and `two_shot` are intra-node algorithms (shm); `flat` and `hierarchical` choose
/// how a job that spans nodes runs (one communicator over all ranks, or intra-node
/// reduce-scatter + inter-node allreduce + intra-node allgather).
/// `ring` is kft's bandwidth-optimal ring (reduce-scatter + allgather over point-to-point
/// messages) on an MPI communicator, whose `automatic` is MPI's own choice.
enum class algo : std::uint8_t { automatic, one_shot, two_shot, flat, hierarchical, ring };

constexpr std::string_view name(algo a) {
  constexpr std::string_view names[] = {"auto", "one_shot", "two_shot", "flat", "hierarchical", "ring"};
  return names[static_cast<int>(a)];
}

/// @brief Options every collective takes; all have defaults.
struct options {
  algo algorithm = algo::automatic;
  /// 0 = the communicator's default timeout.
  std::chrono::milliseconds timeout{0};
  /// Part of the collective's signature: ranks calling with different tags are a mismatch.
  std::uint32_t tag = 0;
};

KFT_NAMESPACE_END
