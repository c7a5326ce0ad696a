// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/collective.hpp
/// @brief The collectives every communicator provides, as named in messages, signatures and
/// work handles.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief A collective operation. `none` marks work that is not one collective (a bucket's
/// hook, a group's composite step).
enum class collective : std::uint8_t { allreduce, broadcast, reduce_scatter, allgather, barrier, none };

inline constexpr int collective_count = 5;  ///< the real collectives (without `none`)

constexpr std::string_view name(collective c) {
  constexpr std::string_view names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather", "barrier", "work"};
  return names[static_cast<int>(c)];
}

/// @brief The collective named `s` ("allreduce", ...), or nullopt.
constexpr std::optional<collective> collective_named(std::string_view s) {
  for (int i = 0; i < collective_count; ++i)
    if (name(static_cast<collective>(i)) == s) return static_cast<collective>(i);
  return std::nullopt;
}

KFT_NAMESPACE_END
