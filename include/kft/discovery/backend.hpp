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

}  // namespace detail

KFT_NAMESPACE_END
