// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/tuning.hpp
/// @brief Which shared-memory algorithm `algo::automatic` runs: a table of crossovers, keyed by
/// (collective, ranks, oversubscribed, zero-copy input), instead of branches in code.
///
/// One-shot (every rank reads every input from the mailboxes: one synchronisation, p-fold
/// reads) wins below a crossover, two-shot (reduce-scatter + allgather through staging chunks:
/// more steps, each rank reads 1/p) above it. The default rows are medians of
/// bench/scripts/campaign.py on 2-core VMs (docs/performance.md): 2 ranks cross between 8 and 16 KiB;
/// more ranks than cores (every synchronisation may cost a yield to a peer) between 32 and
/// 64 KiB; broadcast and allgather (no reduction pass) later; a zero-copy allreduce input
/// (no copy-in for two-shot, still one for one-shot) from 2 KiB. A machine that measures
/// differently gets its own rows (`config::crossovers`), not a new branch: `bench/scripts/tune_shm.py`
/// measures a machine and writes a tuning file (`parse_tuning`), which `KFT_SHM_TUNING=FILE`
/// applies to every communicator the process groups build (`group::shm_config`).
#pragma once

#include <charconv>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/collective.hpp>
#include <kft/core/error.hpp>
#include <kft/core/options.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

/// @brief One row: for calls that match, one-shot up to `one_shot_max_bytes`, two-shot above.
struct crossover {
  collective op;
  int min_ranks = 1, max_ranks = 1 << 20;  ///< rank counts the row applies to
  int oversubscribed = -1;                 ///< 1: more local ranks than CPUs, 0: not, -1: either
  int zero_copy = -1;                      ///< 1: the input is a pool buffer, 0: it is not, -1: either
  std::size_t one_shot_max_bytes = 0;
  friend constexpr bool operator==(const crossover&, const crossover&) = default;
};

/// @brief kft's default table; the first matching row wins.
inline constexpr crossover default_crossovers[] = {
    {collective::allreduce, 1, 1 << 20, 0, 1, 2u << 10},
    {collective::allreduce, 1, 1 << 20, 1, -1, 32u << 10},
    {collective::allreduce, 1, 4, -1, -1, 8u << 10},
    {collective::allreduce, 5, 1 << 20, -1, -1, 4u << 10},
    {collective::reduce_scatter, 1, 1 << 20, 1, -1, 32u << 10},
    {collective::reduce_scatter, 1, 4, -1, -1, 8u << 10},
    {collective::reduce_scatter, 5, 1 << 20, -1, -1, 4u << 10},
    {collective::broadcast, 1, 1 << 20, 1, -1, 128u << 10},
    {collective::broadcast, 1, 4, -1, -1, 32u << 10},
    {collective::broadcast, 5, 1 << 20, -1, -1, 16u << 10},
    {collective::allgather, 1, 1 << 20, 1, -1, 64u << 10},
    {collective::allgather, 1, 4, -1, -1, 16u << 10},
    {collective::allgather, 5, 1 << 20, -1, -1, 8u << 10},
};

/// @brief The algorithm for a call of `bytes` (per rank) on `ranks` ranks. A message larger
/// than the one-shot slot (`slot_bytes`) always runs chunked (two-shot). No matching row:
/// two-shot. The barrier is one synchronisation: one-shot.
constexpr algo choose_algorithm(std::span<const crossover> table, collective c, int ranks, bool oversubscribed,
                                bool zero_copy, std::size_t bytes, std::size_t slot_bytes) {
  if (c == collective::barrier) return algo::one_shot;
  for (const auto& row : table) {
    if (row.op != c || ranks < row.min_ranks || ranks > row.max_ranks) continue;
    if (row.oversubscribed >= 0 && row.oversubscribed != static_cast<int>(oversubscribed)) continue;
    if (row.zero_copy >= 0 && row.zero_copy != static_cast<int>(zero_copy)) continue;
    const std::size_t limit = row.one_shot_max_bytes < slot_bytes ? row.one_shot_max_bytes : slot_bytes;
    return bytes <= limit ? algo::one_shot : algo::two_shot;
  }
  return algo::two_shot;
}

/// @brief What a tuning file sets: buffer sizes (unset: keep the configuration's) and crossover
/// rows, which go before the defaults (a call no row of the file matches falls back to them).
struct tuning {
  std::optional<std::size_t> staging_bytes, small_bytes, streaming_bytes, copy_streaming_bytes;
  std::vector<crossover> crossovers;
};

/// @brief `rows` in storage that lives as long as the process, for `config::crossovers` (a view,
/// so configurations stay cheap to copy); equal tables share one copy, so reading the same file
/// again keeps nothing new.
inline std::span<const crossover> keep_table(std::vector<crossover> rows) {
  static std::mutex mu;
  static std::list<std::vector<crossover>> kept;
  const std::lock_guard lock(mu);
  for (const auto& k : kept)
    if (k == rows) return k;
  kept.push_back(std::move(rows));
  return kept.back();
}

/// @brief Reads a tuning file's text. One setting per line, `#` starts a comment:
///
///     staging_bytes 1M
///     crossover allreduce ranks=2-4 oversubscribed=0 zero_copy=any one_shot_max=8K
///     crossover broadcast ranks=5-* one_shot_max=16384
///
/// Sizes are bytes with an optional K/M/G suffix; `ranks=` takes N, N-M or N-*; `oversubscribed`
/// and `zero_copy` take 0, 1 or any (the default, as `ranks`). `source` names the file in errors.
/// @throws config_error naming the source, the line and what is wrong in it
inline tuning parse_tuning(std::string_view text, const std::string& source) {
  tuning out;
  int line_no = 0;
  auto fail = [&](const std::string& what) -> void {
    throw config_error("KFT_SHM_TUNING", source, "line " + std::to_string(line_no) + ": " + what,
                       error_site::of("shm tuning"));
  };
  auto number = [&](std::string_view v, std::string_view key) -> std::size_t {
    std::size_t n = 0, mult = 1;
    if (!v.empty() && (v.back() == 'K' || v.back() == 'M' || v.back() == 'G')) {
      mult = v.back() == 'K' ? 1u << 10 : v.back() == 'M' ? 1u << 20 : 1u << 30;
      v.remove_suffix(1);
    }
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc{} || end != v.data() + v.size() || n > (std::size_t{1} << 40) / mult)
      fail(std::string(key) + " takes a byte count (e.g. 65536, 64K, 1M), not \"" + std::string(v) + "\"");
    return n * mult;
  };
  auto either = [&](std::string_view v, std::string_view key) -> int {
    if (v == "0") return 0;
    if (v == "1") return 1;
    if (v == "any") return -1;
    fail(std::string(key) + " takes 0, 1 or any, not \"" + std::string(v) + "\"");
    return -1;
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string_view> words;
    for (std::size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      const std::size_t b = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
      if (i > b) words.push_back(line.substr(b, i - b));
    }
    if (words.empty()) continue;
    const std::string_view key = words[0];
    if (key == "staging_bytes" || key == "small_bytes" || key == "streaming_bytes" || key == "copy_streaming_bytes") {
      if (words.size() != 2) fail(std::string(key) + " takes one value");
      const std::size_t v = number(words[1], key);
      if (key == "staging_bytes") {
        if (v < 4096) fail("staging_bytes must be at least 4096");
        out.staging_bytes = v;
      } else if (key == "small_bytes") {
        if (v < 64) fail("small_bytes must be at least 64");
        out.small_bytes = v;
      } else if (key == "streaming_bytes") {
        out.streaming_bytes = v;
      } else {
        out.copy_streaming_bytes = v;
      }
      continue;
    }
    if (key != "crossover")
      fail("unknown setting \"" + std::string(key) +
           "\" (staging_bytes, small_bytes, streaming_bytes, copy_streaming_bytes, crossover)");
    if (words.size() < 3) fail("crossover takes a collective and one_shot_max=BYTES");
    const auto c = collective_named(words[1]);
    if (!c || *c == collective::barrier || *c == collective::none)
      fail("unknown collective \"" + std::string(words[1]) + "\" (allreduce, reduce_scatter, broadcast, allgather)");
    crossover row{*c};
    bool have_max = false;
    for (std::size_t w = 2; w < words.size(); ++w) {
      const auto eq = words[w].find('=');
      if (eq == std::string_view::npos) fail("expected key=value, got \"" + std::string(words[w]) + "\"");
      const std::string_view k = words[w].substr(0, eq), v = words[w].substr(eq + 1);
      if (k == "ranks") {
        const auto dash = v.find('-');
        const auto lo = number(v.substr(0, dash), "ranks");
        const auto hi = dash == std::string_view::npos ? lo : v.substr(dash + 1) == "*" ? std::size_t{1} << 20
                                                                                      : number(v.substr(dash + 1), "ranks");
        if (lo < 1 || hi < lo || hi > (std::size_t{1} << 20)) fail("ranks takes N, N-M or N-* with 1 <= N <= M");
        row.min_ranks = static_cast<int>(lo);
        row.max_ranks = static_cast<int>(hi);
      } else if (k == "oversubscribed") {
        row.oversubscribed = either(v, k);
      } else if (k == "zero_copy") {
        row.zero_copy = either(v, k);
      } else if (k == "one_shot_max") {
        row.one_shot_max_bytes = number(v, k);
        have_max = true;
      } else {
        fail("unknown crossover key \"" + std::string(k) + "\" (ranks, oversubscribed, zero_copy, one_shot_max)");
      }
    }
    if (!have_max) fail("crossover needs one_shot_max=BYTES");
    out.crossovers.push_back(row);
  }
  return out;
}

}  // namespace shm
KFT_NAMESPACE_END
