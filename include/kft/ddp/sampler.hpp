// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/sampler.hpp
/// @brief Which samples each rank trains on: PyTorch's DistributedSampler semantics, with a
/// permutation of kft's own that is written down (so any language can reproduce it) and a
/// state that is part of a checkpoint.
///
///     kft::ddp::distributed_sampler s({.size = 60000, .seed = 1});
///     s.set_epoch(e);
///     while (auto b = s.next(global_batch)) {      // positions [b->start, b->start + b->size)
///       s.rank_indices(*b, rank, world, mine);     // this rank's samples (strided, padded)
///       ...
///       s.advance(*b);
///     }
///
/// **The epoch's order.** With `shuffle`, epoch e's order is a Fisher-Yates shuffle of
/// 0..size-1 driven by splitmix64:
///
///     state = seed XOR ((e + 1) * 0xD1B54A32D192ED03)           (64-bit wrap-around)
///     next():  state += 0x9E3779B97F4A7C15; z = state;
///              z = (z XOR (z >> 30)) * 0xBF58476D1CE4E5B9;
///              z = (z XOR (z >> 27)) * 0x94D049BB133111EB;
///              return z XOR (z >> 31)
///     p = [0, 1, ..., size-1]
///     for i = size-1 down to 1:  j = (next() * (i + 1)) >> 64  (the high half of the 128-bit product);
///                                swap(p[i], p[j])
///
/// Without `shuffle` the order is 0..size-1. The order depends on (seed, epoch, size) only,
/// never on the number of ranks: resuming on another world size continues the same sequence.
///
/// **Global batches.** The epoch is cut into global batches of consecutive positions of that
/// order; the `cursor` counts positions consumed. The last global batch is shorter, or dropped
/// with `drop_last`. Inside a global batch of `n` positions rank r of N takes positions
/// r, r + N, r + 2N, ... (PyTorch's strided split); when N does not divide n the batch is
/// padded by wrapping around to the start of the epoch's order, so every rank gets
/// ceil(n / N) samples (PyTorch's padding rule). Deterministic training cuts a global batch
/// into M fixed micro-shards instead (`micro_shard`): shard j holds positions
/// [floor(j n / M), floor((j + 1) n / M)), and rank r trains shards r, r + N, ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief splitmix64 (Steele, Lea, Flood 2014), the sampler's documented generator.
struct splitmix64 {
  std::uint64_t state = 0;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// A value in [0, bound): the high half of next() * bound.
  std::uint64_t below(std::uint64_t bound) noexcept {
    __extension__ using u128 = unsigned __int128;
    return static_cast<std::uint64_t>((static_cast<u128>(next()) * bound) >> 64);
  }
};

/// @brief Epoch `epoch`'s order of `size` samples (see the file comment).
inline std::vector<std::uint32_t> permutation(std::uint64_t size, std::uint64_t seed, std::uint64_t epoch,
                                              bool shuffle = true) {
  if (size > 0xFFFFFFFFull) throw usage_error("sampler: " + std::to_string(size) + " samples: at most 2^32 - 1");
  std::vector<std::uint32_t> p(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint32_t>(i);
  if (!shuffle || size < 2) return p;
  splitmix64 g{seed ^ ((epoch + 1) * 0xD1B54A32D192ED03ull)};
  for (std::size_t i = p.size() - 1; i > 0; --i) std::swap(p[i], p[static_cast<std::size_t>(g.below(i + 1))]);
  return p;
}

/// @brief What a checkpoint keeps of a sampler.
struct sampler_state {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  ///< positions of the epoch's order already consumed (all ranks together)
  bool operator==(const sampler_state&) const = default;
};

struct sampler_options {
  std::uint64_t size = 0;  ///< samples in the dataset
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  ///< drop the epoch's last, shorter global batch
};

/// @brief One global batch: positions [start, start + size) of the epoch's order.
struct global_batch {
  std::uint64_t start = 0;
  std::uint64_t size = 0;
};

class distributed_sampler {
 public:
  explicit distributed_sampler(sampler_options o) : o_(o) {
    if (o_.size == 0) throw usage_error("sampler: the dataset is empty (sampler_options::size = 0)");
    state_.seed = o_.seed;
  }

  const sampler_options& options() const noexcept { return o_; }
  const sampler_state& state() const noexcept { return state_; }
  std::uint64_t epoch() const noexcept { return state_.epoch; }
  std::uint64_t cursor() const noexcept { return state_.cursor; }

  /// @brief Starts epoch `e` from its first sample (PyTorch's set_epoch).
  void set_epoch(std::uint64_t e) {
    state_.epoch = e;
    state_.cursor = 0;
  }
  /// @brief Continues where a checkpoint left off (any number of ranks).
  void restore(const sampler_state& s) {
    if (s.seed != o_.seed)
      throw usage_error("sampler: the checkpoint's seed " + std::to_string(s.seed) + " differs from this run's " +
                        std::to_string(o_.seed));
    if (s.cursor > o_.size)
      throw usage_error("sampler: the checkpoint's cursor " + std::to_string(s.cursor) + " is past the dataset's " +
                        std::to_string(o_.size) + " samples (another dataset?)");
    state_ = s;
  }

  /// @brief Positions of the epoch left to train on.
  std::uint64_t epoch_length() const noexcept { return o_.size; }

  /// @brief The next global batch of up to `batch` positions; none at the end of the epoch.
  std::optional<global_batch> next(std::uint64_t batch) const {
    if (batch == 0) throw usage_error("sampler: a global batch of 0 samples");
    if (state_.cursor >= o_.size) return std::nullopt;
    const std::uint64_t left = o_.size - state_.cursor;
    if (left < batch && o_.drop_last) return std::nullopt;
    return global_batch{state_.cursor, left < batch ? left : batch};
  }
  /// @brief Global batches left in the epoch.
  std::uint64_t batches_left(std::uint64_t batch) const noexcept {
    const std::uint64_t left = o_.size - state_.cursor;
    return o_.drop_last ? left / batch : (left + batch - 1) / batch;
  }
  void advance(const global_batch& b) { state_.cursor = b.start + b.size; }

  /// @brief Sample index at position `pos` of the current epoch's order.
  std::uint32_t at(std::uint64_t pos) { return order()[static_cast<std::size_t>(pos % o_.size)]; }

  /// @brief Rank `rank` of `world`'s samples of `b`: strided, padded by wrapping (file comment).
  void rank_indices(const global_batch& b, int rank, int world, std::vector<std::uint32_t>& out) {
    check_rank(rank, world);
    const auto n = static_cast<std::uint64_t>(world);
    const std::uint64_t per_rank = (b.size + n - 1) / n;
    out.clear();
    for (std::uint64_t k = 0; k < per_rank; ++k) {
      std::uint64_t pos = b.start + static_cast<std::uint64_t>(rank) + k * n;
      if (pos >= b.start + b.size) pos -= b.start + b.size;  // padding: from the start of the epoch's order
      out.push_back(at(pos));
    }
  }

  /// @brief Micro-shard j of `shards` of `b` (deterministic mode; file comment).
  void micro_shard(const global_batch& b, std::uint64_t j, std::uint64_t shards, std::vector<std::uint32_t>& out) {
    if (shards == 0 || j >= shards) throw usage_error("sampler: micro-shard " + std::to_string(j) + " of " +
                                                      std::to_string(shards));
    const std::uint64_t lo = b.start + j * b.size / shards, hi = b.start + (j + 1) * b.size / shards;
    out.clear();
    for (std::uint64_t p = lo; p < hi; ++p) out.push_back(at(p));
  }

 private:
  void check_rank(int rank, int world) const {
    if (world < 1 || rank < 0 || rank >= world)
      throw usage_error("sampler: rank " + std::to_string(rank) + " of " + std::to_string(world));
  }
  const std::vector<std::uint32_t>& order() {
    if (cached_epoch_ != state_.epoch || order_.empty()) {
      order_ = permutation(o_.size, o_.seed, state_.epoch, o_.shuffle);
      cached_epoch_ = state_.epoch;
    }
    return order_;
  }

  sampler_options o_;
  sampler_state state_;
  std::vector<std::uint32_t> order_;
  std::uint64_t cached_epoch_ = ~0ull;
};

}  // namespace ddp
KFT_NAMESPACE_END
