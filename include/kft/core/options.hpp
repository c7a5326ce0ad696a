// SPDX-License-Identifier: Apache-2.0
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
/// and rank count (docs/algorithms.md). The values belong to three levels, and each
/// communicator accepts its own level's (any other is a `usage_error` naming the ones it has):
///  - inside a node (the shm transport): `one_shot`, `two_shot`;
///  - across nodes (a `group::cpu_group`): `flat` (one communicator over every rank) or
///    `hierarchical` (intra-node reduce-scatter + inter-node allreduce + intra-node allgather);
///  - on an MPI communicator: `ring`, kft's bandwidth-optimal ring over point-to-point messages
///    (its `automatic` is MPI's own choice).
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

/// @brief A call's deadline: its own `options::timeout` when set, else `fallback` (the
/// communicator's configured default). Every transport and group asks this one question here.
constexpr std::chrono::milliseconds timeout_or(const options& o, std::chrono::milliseconds fallback) noexcept {
  return o.timeout.count() > 0 ? o.timeout : fallback;
}

KFT_NAMESPACE_END
