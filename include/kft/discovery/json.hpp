// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/json.hpp
/// @brief JSON form of world_info and discovery_report, through nlohmann::json.
///
/// Optional: include it where nlohmann/json is available (`nlohmann-json3-dev`). Unknown
/// fields are `null`, so a reader can tell "not known" from 0. Text from the environment
/// (hostnames, values echoed in notes and errors) is not always UTF-8, which JSON requires and
/// `dump()` enforces by throwing: each byte that is not part of valid UTF-8 becomes U+FFFD, so the
/// JSON form always dumps.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <kft/discovery/discover.hpp>

KFT_NAMESPACE_BEGIN

namespace detail {

/// `s` with every byte that does not belong to a well-formed UTF-8 sequence (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF) replaced by U+FFFD.
inline std::string valid_utf8(std::string_view s) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  auto cont = [&](std::size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < s.size() && byte(i) >= lo && byte(i) <= hi;
  };
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = byte(i);
    std::size_t n = 0;  // length of the valid sequence starting at i, 0 if none
    if (c < 0x80) n = 1;
    else if (c >= 0xC2 && c <= 0xDF) n = cont(i + 1) ? 2 : 0;
    else if (c == 0xE0) n = cont(i + 1, 0xA0) && cont(i + 2) ? 3 : 0;
    else if (c == 0xED) n = cont(i + 1, 0x80, 0x9F) && cont(i + 2) ? 3 : 0;  // no surrogates
    else if (c >= 0xE1 && c <= 0xEF) n = cont(i + 1) && cont(i + 2) ? 3 : 0;
    else if (c == 0xF0) n = cont(i + 1, 0x90) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    else if (c >= 0xF1 && c <= 0xF3) n = cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    else if (c == 0xF4) n = cont(i + 1, 0x80, 0x8F) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

inline nlohmann::json text_json(std::string_view s) { return valid_utf8(s); }

inline nlohmann::json text_json(const std::vector<std::string>& v) {
  auto a = nlohmann::json::array();
  for (const auto& s : v) a.push_back(valid_utf8(s));
  return a;
}

template <class T>
nlohmann::json opt_json(const std::optional<T>& v) {
  if constexpr (std::is_same_v<T, std::string>) return v ? text_json(*v) : nlohmann::json(nullptr);
  else return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
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
                     {"hostname", detail::text_json(w.hostname)},
                     {"node_name", detail::opt_json(w.node_name)},
                     {"master_addr", detail::opt_json(w.master_addr)},
                     {"master_port", detail::opt_json(w.master_port)},
                     {"backend", detail::text_json(w.backend)},
                     {"source", detail::text_json(w.source)},
                     {"notes", detail::text_json(w.notes)}};
}

inline void to_json(nlohmann::json& j, const backend_outcome& o) {
  static constexpr const char* states[] = {"not_applicable", "decided", "failed"};
  j = nlohmann::json{{"backend", detail::text_json(o.backend)},
                     {"source", detail::text_json(o.source)},
                     {"status", states[static_cast<int>(o.status)]}};
  if (o.info) {
    j["rank"] = o.info->rank;
    j["world_size"] = o.info->world_size;
  }
  if (!o.error.empty()) j["error"] = detail::text_json(o.error);
}

inline void to_json(nlohmann::json& j, const discovery_report& r) {
  j = nlohmann::json{{"world", r.world}, {"backends", r.outcomes}, {"forced", detail::opt_json(r.forced)}};
}

KFT_NAMESPACE_END
