// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/fixed_point.hpp
/// @brief The deterministic mode's arithmetic: float gradients turned into 64-bit fixed point
/// (2^-fraction_bits resolution), summed as integers (exact, so in any order and over any
/// number of ranks), and turned back into a float mean.
///
/// Each value is rounded to the nearest multiple of 2^-fraction_bits (round half to even) and
/// clamped to +-2^62 / terms, where `terms` is how many values a sum may add (shards x
/// accumulated micro-batches), so no sum of them overflows. A value beyond that range, or a
/// NaN or an infinity, is reported to the caller, which stops the step by name.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <kft/core/namespace.hpp>
#include <kft/ddp/optim.hpp>  // detail::not_finite

KFT_NAMESPACE_BEGIN
namespace ddp {

class fixed_point {
 public:
  /// `fraction_bits` 8..48 (checked by the trainer), `terms` >= 1.
  fixed_point(int fraction_bits, std::uint64_t terms)
      : bits_(fraction_bits),
        scale_(std::ldexp(1.0, fraction_bits)),
        limit_(std::ldexp(1.0, 62) / static_cast<double>(std::max<std::uint64_t>(terms, 1))) {}

  int fraction_bits() const noexcept { return bits_; }

  /// @brief What a conversion found: a NaN or infinity, and the largest magnitude (in units of
  /// 2^-fraction_bits) before clamping.
  struct verdict {
    bool not_finite = false;
    double worst = 0.0;
  };
  bool in_range(const verdict& v) const noexcept { return !v.not_finite && v.worst < limit_; }
  /// @brief The largest magnitude seen, as a float value (for a message).
  double magnitude(const verdict& v) const noexcept { return v.worst / scale_; }

  /// @brief `q` = fixed(g) when `assign`, else `q` += fixed(g).
  verdict add(std::span<const float> g, std::span<std::int64_t> q, bool assign) const {
    std::uint32_t bad = 0;
    double worst = 0.0;
    for (std::size_t e = 0; e < g.size(); ++e) {
      const double v = static_cast<double>(g[e]) * scale_;
      bad |= detail::not_finite(g[e]);
      worst = std::max(worst, std::fabs(v));
      const auto iv = static_cast<std::int64_t>(std::nearbyint(std::clamp(v, -limit_, limit_)));
      q[e] = assign ? iv : q[e] + iv;
    }
    return {bad != 0, worst};
  }

  /// @brief `out` = q x 2^-fraction_bits / `divide` (the mean of `divide` summed terms).
  void mean(std::span<const std::int64_t> q, std::span<float> out, std::uint64_t divide) const {
    const double k = std::ldexp(1.0, -bits_) / static_cast<double>(divide);
    for (std::size_t e = 0; e < out.size(); ++e) out[e] = static_cast<float>(static_cast<double>(q[e]) * k);
  }

 private:
  int bits_;
  double scale_, limit_;
};

/// @brief The deterministic mode's gradients beside the reducer's i64 buckets: the model writes
/// one shard's float gradients into `local(i)`; `convert` turns them into fixed point, assigned
/// or added into the bucket; after the reduction `mean` turns a bucket's sum back into the
/// float mean the optimizer reads (kept here, so the step allocates nothing).
class fixed_point_gradients {
 public:
  fixed_point_gradients(int fraction_bits, std::uint64_t terms, std::span<const std::size_t> sizes)
      : fp_(fraction_bits, terms) {
    local_.reserve(sizes.size());
    for (std::size_t n : sizes) local_.emplace_back(n, 0.0f);
    avg_ = local_;
  }
  const fixed_point& arithmetic() const noexcept { return fp_; }
  std::span<float> local(std::size_t i) noexcept { return local_[i]; }

  /// @brief Parameter i's shard gradient into `q` (assigned when `first`, else added); the
  /// verdict says whether it was finite and in range (fixed_point::in_range).
  fixed_point::verdict convert(std::size_t i, std::span<std::int64_t> q, bool first) const {
    return fp_.add(local_[i], q, first);
  }
  /// @brief The mean of `contributions` terms summed into `q`, elements [offset, offset + q.size())
  /// of parameter i.
  std::span<const float> mean(std::size_t i, std::span<const std::int64_t> q, std::uint64_t contributions,
                              std::size_t offset = 0) {
    auto out = std::span<float>(avg_[i]).subspan(offset, q.size());
    fp_.mean(q, out, contributions);
    return out;
  }
  /// @brief True when parameter i's shard gradient holds a NaN or an infinity.
  bool not_finite(std::size_t i) const noexcept {
    std::uint32_t bad = 0;
    for (float v : local_[i]) bad |= detail::not_finite(v);
    return bad != 0;
  }

 private:
  fixed_point fp_;
  std::vector<std::vector<float>> local_, avg_;  // one shard's gradients; the means
};

}  // namespace ddp
KFT_NAMESPACE_END
