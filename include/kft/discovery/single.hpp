// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/single.hpp
/// @brief The fallback: no launcher, so this process is the whole job.
#pragma once

#include <optional>

#include <kft/discovery/backend.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Always applies: rank 0 of 1, on node 0 of 1. Reported as such, never silently.
struct single_process {
  static constexpr std::string_view name = "single";
  static constexpr std::string_view source = "no launcher variables found: a single process";

  static std::optional<world_info> detect(const environment& env) {
    auto w = detail::start_world<single_process>(env);
    w.rank = 0;
    w.world_size = 1;
    w.local_rank = 0;
    w.local_size = 1;
    w.node_rank = 0;
    w.node_count = 1;
    return w;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
