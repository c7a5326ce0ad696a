// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/zero.hpp
/// @brief ZeRO stage 1 as a wrapper of an optimizer, outside the reducer (as PyTorch keeps
/// ZeroRedundancyOptimizer outside DDP): each rank holds the optimizer state of its slice of
/// every gradient bucket only, updates that slice, and the ranks allgather the parameters.
///
///     kft::ddp::reducer r(g, params, {.rebuild_buckets = false, .bucket_multiple = N}, reduce_scatter_hook);
///     kft::ddp::zero1 z(adam);
///     z.bind(r, g.rank(), g.size());             // the reducer says which pieces are this rank's
///     ... r.finish();                             // rank r holds the reduction of its slices
///     z.step(params, [&](const auto& piece) { return averaged gradient of the piece; }, scale);
///     z.gather_parameters(g, params);             // every rank's slices, everywhere
///
/// Memory: the inner optimizer's state for about 1/N of the parameters, and one bucket of
/// staging for the allgathers. The layout must not change after bind() (no bucket rebuild).
/// A checkpoint holds the whole state (`whole_state`, collective), so it resumes on any number
/// of ranks, sharded or not (`load_state` keeps this rank's pieces of a whole one).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/namespace.hpp>
#include <kft/core/options.hpp>
#include <kft/ddp/model.hpp>
#include <kft/ddp/optim.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

template <optimizer O>
class zero1 {
 public:
  /// @brief One parameter's piece of this rank's slice of a bucket.
  struct piece {
    std::size_t param = 0;   ///< the parameter
    std::size_t offset = 0;  ///< its first element in the piece
    std::size_t count = 0;
    std::size_t bucket = 0;  ///< the index into this wrapper's gradient buckets
    std::size_t at = 0;      ///< the piece's first element within the bucket
  };

  explicit zero1(O& inner) : inner_(inner) {}

  /// @brief Takes this rank's shard of the reducer `r`'s gradient buckets (`r.shard`) and
  /// binds the inner optimizer to its pieces.
  template <class Reducer>
  void bind(const Reducer& r, int rank, int ranks) {
    rank_ = static_cast<std::size_t>(rank);
    ranks_ = static_cast<std::size_t>(ranks);
    buckets_.clear();
    pieces_.clear();
    std::vector<std::size_t> index(r.buckets().size(), 0);  // reducer bucket -> ours
    std::size_t largest = 0;
    for (std::size_t k = 0; k < r.buckets().size(); ++k) {
      if (!r.holds_gradients(k)) continue;
      index[k] = buckets_.size();
      bucket b;
      b.elements = r.bucket_elements(k);
      for (std::size_t i : r.buckets()[k])
        if (i < r.parameters()) b.members.push_back({i, r.offset_in_bucket(i), r.param(i).count});
      largest = std::max(largest, b.elements);
      buckets_.push_back(std::move(b));
    }
    std::vector<std::size_t> sizes;
    for (const auto& s : r.shard(rank, ranks)) {
      pieces_.push_back({s.param, s.offset, s.count, index[s.bucket], s.at});
      sizes.push_back(s.count);
    }
    staging_.assign(largest, 0.0f);
    inner_.bind(sizes);
  }

  const std::vector<piece>& pieces() const noexcept { return pieces_; }
  O& inner() noexcept { return inner_; }
  /// @brief The optimizer state this rank holds, in bytes.
  std::size_t state_bytes() const {
    std::size_t b = 0;
    for (const auto& buf : inner_.state().buffers)
      for (const auto& v : buf) b += v.size() * sizeof(float);
    return b;
  }

  /// @brief Updates this rank's pieces of `params`: `grad(piece)` is the averaged gradient of
  /// the piece (a span of piece.count floats), `scale` multiplies it (the inner optimizer's).
  /// Returns the first piece whose gradient held a NaN or an infinity, or pieces().size().
  template <class Grad>
  std::size_t step(std::span<const tensor_ref> params, Grad&& grad, float scale) {
    inner_.begin_step();
    std::size_t bad = pieces_.size();
    for (std::size_t j = 0; j < pieces_.size(); ++j) {
      const piece& pc = pieces_[j];
      const bool ok = inner_.step(j, params[pc.param].value.subspan(pc.offset, pc.count), grad(pc), scale);
      if (!ok && bad == pieces_.size()) bad = j;
    }
    return bad;
  }

  /// @brief Collective over `g`: every rank's updated pieces into every rank's parameters.
  template <class G>
  void gather_parameters(G& g, std::span<const tensor_ref> params) {
    gather(
        g, [&](const piece& pc) { return std::span<const float>(params[pc.param].value.subspan(pc.offset, pc.count)); },
        [&](std::size_t i, std::span<const float> all) { std::copy(all.begin(), all.end(), params[i].value.begin()); });
  }

  /// @brief Collective over `g`: state buffer `b` (optimizer_state::names) of every parameter,
  /// whole (`sizes[i]` elements each), returned where `keep` (e.g. on the rank that writes a
  /// checkpoint; empty elsewhere, so no other rank holds the whole state).
  template <class G>
  std::vector<std::vector<float>> whole_state(G& g, std::size_t b, std::span<const std::size_t> sizes, bool keep) {
    std::vector<std::vector<float>> whole(keep ? sizes.size() : 0);
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i].assign(sizes[i], 0.0f);
    const auto& st = inner_.state();
    std::size_t j = 0;
    gather(
        g, [&](const piece&) { return std::span<const float>(st.buffers[b][j++]); },
        [&](std::size_t i, std::span<const float> all) {
          if (keep) std::copy(all.begin(), all.end(), whole[i].begin());
        });
    return whole;
  }

  /// @brief Keeps this rank's pieces of parameter `i`'s whole state buffer `b`.
  void load_state(std::size_t b, std::size_t i, std::span<const float> whole) {
    auto& st = inner_.state();
    for (std::size_t j = 0; j < pieces_.size(); ++j)
      if (pieces_[j].param == i)
        std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(pieces_[j].offset), pieces_[j].count,
                    st.buffers[b][j].begin());
  }

 private:
  struct member {
    std::size_t param, offset, count;  // offset: within the bucket
  };
  struct bucket {
    std::size_t elements = 0;
    std::vector<member> members;
  };

  // For every gradient bucket: this rank's pieces (`mine(piece)`) packed into its slice of a
  // bucket-sized buffer, allgathered, and each parameter's whole range handed to `take`.
  template <class G, class Mine, class Take>
  void gather(G& g, Mine mine, Take take) {
    std::size_t j = 0;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      const std::size_t per = buckets_[k].elements / ranks_;
      float* buf = staging_.data();
      std::fill(buf + rank_ * per, buf + (rank_ + 1) * per, 0.0f);
      for (; j < pieces_.size() && pieces_[j].bucket == k; ++j) {
        const auto v = mine(pieces_[j]);
        std::copy(v.begin(), v.end(), buf + pieces_[j].at);
      }
      g.allgather(buf + rank_ * per, buf, per, dtype::f32, options{});
      for (const auto& m : buckets_[k].members) take(m.param, std::span<const float>(buf + m.offset, m.count));
    }
  }

  O& inner_;
  std::size_t rank_ = 0, ranks_ = 1;
  std::vector<bucket> buckets_;
  std::vector<piece> pieces_;
  std::vector<float> staging_;
};

}  // namespace ddp
KFT_NAMESPACE_END
