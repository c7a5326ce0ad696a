// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/backend.hpp
/// @brief The concept every discovery backend satisfies, and the checks they share.
///
/// A backend is a small policy type:
///
///     struct my_backend {
///       static constexpr std::string_view name = "slurm";    // what KFT_DISCOVERY selects
///       static constexpr std::string_view source = "SLURM_* step environment";
///       static std::optional<world_info> detect(const environment& env);
///     };
///
/// `detect` returns nullopt when its launcher's marker variables are absent (the backend
/// does not apply), a world_info when they are present and consistent, and throws
/// `config_error` when they are present but malformed or contradictory.
#pragma once

#include <concepts>
#include <optional>
#include <string>
#include <string_view>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/parse.hpp>
#include <kft/discovery/world_info.hpp>

KFT_NAMESPACE_BEGIN

/// @brief A discovery backend: a name, a description of its source and `detect(env)`.
template <class B>
concept discovery_backend = requires(const environment& env) {
  { B::name } -> std::convertible_to<std::string_view>;
  { B::source } -> std::convertible_to<std::string_view>;
  { B::detect(env) } -> std::same_as<std::optional<world_info>>;
};

namespace detail {

/// Throws unless 0 <= index < count, naming both variables.
inline void require_below(std::string_view index_var, int index, std::string_view count_var,
                          int count, std::string_view context) {
  if (index >= count)
    throw config_error(std::string(index_var), std::to_string(index),
                       "is not below " + std::string(count_var) + "=" + std::to_string(count) +
                           context_suffix(context));
}

/// Throws unless part <= whole (a local or node count cannot exceed the world).
inline void require_at_most(std::string_view part_var, int part, std::string_view whole_var,
                            int whole, std::string_view context) {
  if (part > whole)
    throw config_error(std::string(part_var), std::to_string(part),
                       "exceeds " + std::string(whole_var) + "=" + std::to_string(whole) +
                           context_suffix(context));
}

/// A world_info stamped with backend B's name and source and this host's name.
template <class B>
world_info start_world(const environment& env) {
  world_info w;
  w.backend = std::string(B::name);
  w.source = std::string(B::source);
  w.hostname = env.hostname();
  return w;
}

/// The variable names one launcher uses for rank, size and the local view.
struct rank_variables {
  std::string_view rank, size, local_rank, local_size;
};

inline constexpr int max_ranks = 1 << 24;

/// Reads rank and size (required) and the local view (optional) and checks that
/// rank < size, local_rank < local_size <= size.
inline void read_ranks(world_info& w, const environment& env, const rank_variables& v, std::string_view ctx) {
  w.world_size = env_int_required(env, v.size, 1, max_ranks, ctx);
  w.rank = env_int_required(env, v.rank, 0, max_ranks, ctx);
  require_below(v.rank, w.rank, v.size, w.world_size, ctx);
  w.local_size = env_int(env, v.local_size, 1, max_ranks, ctx);
  w.local_rank = env_int(env, v.local_rank, 0, max_ranks, ctx);
  if (w.local_size) require_at_most(v.local_size, *w.local_size, v.size, w.world_size, ctx);
  if (w.local_rank && w.local_size)
    require_below(v.local_rank, *w.local_rank, v.local_size, *w.local_size, ctx);
  else if (w.local_rank)
    require_below(v.local_rank, *w.local_rank, v.size, w.world_size, ctx);
}

/// When every rank is local there is one node: node 0 of 1. A node count that says
/// otherwise (`count_var`) is a contradiction.
inline void one_node_if_all_local(world_info& w, std::string_view count_var, std::string_view ctx) {
  if (!w.local_size || *w.local_size != w.world_size) return;
  if (w.node_count && *w.node_count != 1)
    throw config_error(std::string(count_var), std::to_string(*w.node_count),
                       "contradicts a local size equal to the world size " + std::to_string(w.world_size) +
                           " (all ranks on one node)" + context_suffix(ctx));
  w.node_rank = 0;
  w.node_count = 1;
}

}  // namespace detail

KFT_NAMESPACE_END
