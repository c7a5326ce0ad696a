/// @file kft/discovery/json.hpp
/// @brief JSON form of world_info and discovery_report, through nlohmann::json.
///
/// Optional: include it where nlohmann/json is available (`nlohmann-json3-dev`). Unknown
/// fields are `null`, so a reader can tell "not known" from 0.
#pragma once

#include <nlohmann/json.hpp>

#include <kft/discovery/discover.hpp>

KFT_NAMESPACE_BEGIN

namespace detail {
template <class T>
nlohmann::json opt_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace detail

/// @brief `nlohmann::json j = info;`
inline void to_json(nlohmann::json& j, const world_info& w) {
  j = nlohmann::json{{"rank", w.rank},
                     {"world_size", w.world_size},
                     {"local_rank", detail::opt_json(w.local_rank)},
                     {"local_size", detail::opt_json(w.local_size)},
                     {"node_rank", detail::opt_json(w.node_rank)},
                     {"node_count", detail::opt_json(w.node_count)},
                     {"hostname", w.hostname},
                     {"node_name", detail::opt_json(w.node_name)},
                     {"master_addr", detail::opt_json(w.master_addr)},
                     {"master_port", detail::opt_json(w.master_port)},
                     {"backend", w.backend},
                     {"source", w.source},
                     {"notes", w.notes}};
}

inline void to_json(nlohmann::json& j, const backend_outcome& o) {
  static constexpr const char* states[] = {"not_applicable", "decided", "failed"};
  j = nlohmann::json{{"backend", o.backend},
                     {"source", o.source},
                     {"status", states[static_cast<int>(o.status)]}};
  if (o.info) {
    j["rank"] = o.info->rank;
    j["world_size"] = o.info->world_size;
  }
  if (!o.error.empty()) j["error"] = o.error;
}

inline void to_json(nlohmann::json& j, const discovery_report& r) {
  j = nlohmann::json{{"world", r.world}, {"backends", r.outcomes}, {"forced", detail::opt_json(r.forced)}};
}

KFT_NAMESPACE_END
