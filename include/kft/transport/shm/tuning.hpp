/// @file kft/transport/shm/tuning.hpp
/// @brief Which shared-memory algorithm `algo::automatic` runs: a table of crossovers, keyed by
/// (collective, ranks, oversubscribed, zero-copy input), instead of branches in code.
///
/// One-shot (every rank reads every input from the mailboxes: one synchronisation, p-fold
/// reads) wins below a crossover, two-shot (reduce-scatter + allgather through staging chunks:
/// more steps, each rank reads 1/p) above it. The default rows are medians of
/// bench/campaign.py on 2-core VMs (docs/performance.md): 2 ranks cross between 8 and 16 KiB;
/// more ranks than cores (every synchronisation may cost a yield to a peer) between 32 and
/// 64 KiB; broadcast and allgather (no reduction pass) later; a zero-copy allreduce input
/// (no copy-in for two-shot, still one for one-shot) from 2 KiB. A machine that measures
/// differently gets its own rows (`config::crossovers`), not a new branch.
#pragma once

#include <cstddef>
#include <span>

#include <kft/core/collective.hpp>
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

}  // namespace shm
KFT_NAMESPACE_END
