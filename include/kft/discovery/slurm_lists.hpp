// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/slurm_lists.hpp
/// @brief Slurm's compressed host lists (`node[01-03,07],gpu-a[1-2]`) and task counts
/// (`2(x3),1`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/parse.hpp>

KFT_NAMESPACE_BEGIN
namespace slurm {

/// Host lists longer than this are refused rather than expanded (a typo such as
/// `n[0-999999999]` must not exhaust memory).
inline constexpr std::size_t max_hostlist_entries = 1u << 20;
/// The expanded names' characters together: without it a long prefix before a big range
/// (`<1000 characters>[0-1048575]`) stays under the entry cap and still asks for gigabytes.
/// 64 MiB is a million names of 64 characters.
inline constexpr std::size_t max_hostlist_bytes = 64u << 20;

namespace detail {

// One bracket's content, e.g. "01-03,07", expanded to zero-padded strings.
inline std::vector<std::string> expand_ranges(std::string_view var, std::string_view whole,
                                              std::string_view ranges) {
  auto bad = [&](const std::string& why) {
    return config_error(std::string(var), std::string(whole), "is not a Slurm host list: " + why);
  };
  std::vector<std::string> out;
  for (auto piece : kft::detail::split(ranges, ',')) {
    if (piece.empty()) throw bad("empty range inside [...]");
    auto dash = piece.find('-');
    std::string_view lo_s = piece.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : piece.substr(dash + 1);
    auto digits = [](std::string_view s) {
      if (s.empty() || s.size() > 18) return false;
      for (char c : s)
        if (c < '0' || c > '9') return false;
      return true;
    };
    if (!digits(lo_s) || !digits(hi_s)) throw bad("range \"" + std::string(piece) + "\" is not N or N-M");
    std::int64_t lo = std::stoll(std::string(lo_s)), hi = std::stoll(std::string(hi_s));
    if (hi < lo) throw bad("range \"" + std::string(piece) + "\" runs backwards");
    if (static_cast<std::uint64_t>(hi - lo) + out.size() >= max_hostlist_entries)
      throw bad("more than " + std::to_string(max_hostlist_entries) + " hosts");
    const std::size_t width = lo_s.size();  // Slurm keeps the lower bound's zero padding
    for (std::int64_t v = lo; v <= hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      out.push_back(std::move(num));
    }
  }
  return out;
}

// One host expression without top-level commas, e.g. "rack[1-2]-n[01-02]". `out_bytes` is
// the characters already in `out`; sizes are checked before anything is built.
inline void expand_one(std::string_view var, std::string_view whole, std::string_view expr,
                       std::vector<std::string>& out, std::size_t& out_bytes) {
  auto bad = [&](const std::string& why) {
    return config_error(std::string(var), std::string(whole), "is not a Slurm host list: " + why);
  };
  auto too_long = [&] {
    return bad("its names add up to more than " + std::to_string(max_hostlist_bytes >> 20) + " MiB");
  };
  std::vector<std::string> partial{""};
  std::size_t partial_bytes = 0;  // characters in `partial`
  std::size_t i = 0;
  while (i < expr.size()) {
    auto open = expr.find('[', i);
    auto text = expr.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    if (text.find(']') != std::string_view::npos) throw bad("unmatched ']'");
    // Every count here is at most max_hostlist_entries (2^20) times an input length: no overflow.
    if (out_bytes + partial_bytes + partial.size() * text.size() > max_hostlist_bytes) throw too_long();
    for (auto& p : partial) p += text;
    partial_bytes += partial.size() * text.size();
    if (open == std::string_view::npos) break;
    auto close = expr.find(']', open);
    if (close == std::string_view::npos) throw bad("unmatched '['");
    auto ranges = expr.substr(open + 1, close - open - 1);
    if (ranges.find('[') != std::string_view::npos) throw bad("nested '['");
    auto values = expand_ranges(var, whole, ranges);
    if (partial.size() * values.size() + out.size() > max_hostlist_entries)
      throw bad("more than " + std::to_string(max_hostlist_entries) + " hosts");
    std::size_t value_bytes = 0;
    for (const auto& v : values) value_bytes += v.size();
    // Each partial name is repeated once per value, and each value once per partial name.
    const std::size_t next_bytes = partial_bytes * values.size() + value_bytes * partial.size();
    if (out_bytes + next_bytes > max_hostlist_bytes) throw too_long();
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial = std::move(next);
    partial_bytes = next_bytes;
    i = close + 1;
  }
  // Checked here too: a name without brackets adds an entry that no range counted.
  if (out.size() + partial.size() > max_hostlist_entries)
    throw bad("more than " + std::to_string(max_hostlist_entries) + " hosts");
  for (auto& p : partial) out.push_back(std::move(p));
  out_bytes += partial_bytes;
}

}  // namespace detail

/// @brief Expands a compressed Slurm host list, in order.
///
/// `node[01-03,07],gpu-a[1-2]` gives node01 node02 node03 node07 gpu-a1 gpu-a2. Several
/// brackets in one name expand as a product (`r[1-2]n[1-2]` = r1n1 r1n2 r2n1 r2n2).
/// @param var the variable's name, used in the error message
/// @throws config_error naming `var` and the list when it does not parse, or when it expands to
///   more than max_hostlist_entries names or max_hostlist_bytes characters
inline std::vector<std::string> expand_hostlist(std::string_view list, std::string_view var = "SLURM_STEP_NODELIST") {
  auto bad = [&](const std::string& why) {
    return config_error(std::string(var), std::string(list), "is not a Slurm host list: " + why);
  };
  if (list.empty()) throw bad("it is empty");
  std::vector<std::string> out;
  std::size_t out_bytes = 0;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw bad("unmatched ']'");
    if (c == ',' && depth == 0) {
      auto expr = list.substr(start, i - start);
      if (expr.empty()) throw bad("empty host name");
      detail::expand_one(var, list, expr, out, out_bytes);
      start = i + 1;
    }
  }
  if (depth != 0) throw bad("unmatched '['");
  for (const auto& h : out)
    if (h.empty()) throw bad("empty host name");
  return out;
}

/// @brief Expands Slurm's task-count list: `2(x3),1` gives 2 2 2 1.
/// @throws config_error naming `var` when it does not parse
inline std::vector<int> expand_tasks_per_node(std::string_view list,
                                              std::string_view var = "SLURM_STEP_TASKS_PER_NODE") {
  auto bad = [&](const std::string& why) {
    return config_error(std::string(var), std::string(list), "is not a Slurm task-count list: " + why);
  };
  if (list.empty()) throw bad("it is empty");
  std::vector<int> out;
  for (auto item : kft::detail::split(list, ',')) {
    if (item.empty()) throw bad("empty item");
    int count = 0;
    std::int64_t repeat = 1;
    auto paren = item.find('(');
    try {
      count = static_cast<int>(kft::detail::parse_integer(var, item.substr(0, paren), 0, 1 << 24, ""));
      if (paren != std::string_view::npos) {
        if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')')
          throw bad("\"" + std::string(item) + "\" is not N or N(xK)");
        repeat = kft::detail::parse_integer(var, item.substr(paren + 2, item.size() - paren - 3), 1,
                                            1 << 20, "");
      }
    } catch (const config_error& e) {
      if (e.value() == std::string(list)) throw;
      throw bad("\"" + std::string(item) + "\" is not N or N(xK)");
    }
    if (out.size() + static_cast<std::size_t>(repeat) > max_hostlist_entries) throw bad("too many nodes");
    out.insert(out.end(), static_cast<std::size_t>(repeat), count);
  }
  return out;
}

}  // namespace slurm
KFT_NAMESPACE_END
