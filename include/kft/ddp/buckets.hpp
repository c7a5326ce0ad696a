// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/buckets.hpp
/// @brief Which parameters' gradients travel together: the bucket assignment of the DDP
/// reducer, a pure function (tested without ranks).
///
///     std::vector<kft::ddp::parameter> ps = {{784 * 256, kft::dtype::f32, "fc1.weight"}, ...};
///     auto buckets = kft::ddp::assign_buckets(ps, {.first_bucket_bytes = 1 << 20, .bucket_bytes_cap = 25 << 20});
///
/// PyTorch's rule (reducer.cpp `compute_bucket_assignment_by_size`): gradients become final
/// roughly in reverse registration order (the last layer's first), so parameters are taken from
/// the last registered to the first (or in an observed order); each dtype fills its own open
/// bucket; a bucket closes right after the parameter that makes it reach its limit (so it may
/// exceed the limit by one parameter); a dtype's first bucket has the small limit, so
/// communication starts early, the rest the cap. Buckets are numbered in the order they close,
/// then the ones still open (by their first parameter): bucket 0 holds the first gradients.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/hash.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief One trainable parameter as the reducer sees it: how many elements its gradient has,
/// their type, and a name for messages.
struct parameter {
  std::size_t count = 0;
  dtype type = dtype::f32;
  std::string name;
};

/// @brief The two limits of the assignment.
struct bucket_limits {
  std::size_t first_bucket_bytes = 1u << 20;  ///< a dtype's first bucket (PyTorch: 1 MiB)
  std::size_t bucket_bytes_cap = 25u << 20;   ///< every later bucket (PyTorch: 25 MiB)
};

/// @brief Parameter indices per bucket, in bucket order; within a bucket, in the order taken.
using bucket_assignment = std::vector<std::vector<std::size_t>>;

/// @brief Assigns every parameter to one bucket. `order`: the order to take them in (e.g. the
/// ready order observed in a step); empty = reverse registration order.
/// @throws usage_error when `order` is not a permutation of the parameters, or a limit is 0
inline bucket_assignment assign_buckets(std::span<const parameter> params, const bucket_limits& limits = {},
                                        std::span<const std::size_t> order = {}) {
  if (limits.first_bucket_bytes == 0 || limits.bucket_bytes_cap == 0)
    throw usage_error("bucket limits must be > 0 (first_bucket_bytes " + std::to_string(limits.first_bucket_bytes) +
                          ", bucket_bytes_cap " + std::to_string(limits.bucket_bytes_cap) + ")",
                      error_site::of("ddp buckets"));
  std::vector<std::size_t> seq;
  if (order.empty()) {
    for (std::size_t i = params.size(); i-- > 0;) seq.push_back(i);
  } else {
    if (order.size() != params.size())
      throw usage_error("the bucket order names " + std::to_string(order.size()) + " parameters, the model has " +
                            std::to_string(params.size()),
                        error_site::of("ddp buckets"));
    std::vector<bool> seen(params.size(), false);
    for (std::size_t i : order) {
      if (i >= params.size() || seen[i])
        throw usage_error("the bucket order is not a permutation of the parameters (index " + std::to_string(i) + ")",
                          error_site::of("ddp buckets"));
      seen[i] = true;
    }
    seq.assign(order.begin(), order.end());
  }
  struct open_bucket {
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    bool first = true;  // the dtype's first bucket: the small limit
  };
  std::map<dtype, open_bucket> open;
  bucket_assignment out;
  for (std::size_t i : seq) {
    auto& b = open[params[i].type];
    b.members.push_back(i);
    b.bytes += params[i].count * size_of(params[i].type);
    if (b.bytes >= (b.first ? limits.first_bucket_bytes : limits.bucket_bytes_cap)) {
      out.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  // Still-open buckets, in the order of their first parameter in `seq`.
  std::vector<std::pair<std::size_t, dtype>> rest;
  for (auto& [t, b] : open)
    if (!b.members.empty()) {
      std::size_t pos = 0;
      while (seq[pos] != b.members.front()) ++pos;
      rest.emplace_back(pos, t);
    }
  std::sort(rest.begin(), rest.end());
  for (const auto& [pos, t] : rest) out.push_back(std::move(open[t].members));
  return out;
}

/// @brief What a group's allreduce costs, from two measured sizes: t(bytes) = alpha + beta x bytes.
struct link_cost {
  double alpha_s = 0;          ///< fixed cost of one call, seconds
  double beta_s_per_byte = 0;  ///< seconds per byte of the buffer
};

/// @brief The bucket cap `bucket_limits::auto_cap` picks: the smallest bucket whose fixed cost
/// is at most `overhead` of its time, alpha / (alpha + beta x cap) <= overhead, so larger
/// buckets would save less than `overhead` and only delay the first launch. Rounded up to a
/// multiple of 64 KiB and clamped to [min_bytes, max_bytes]; a measurement without a positive
/// beta (noise, or a transport faster than the clock) gives max_bytes.
inline std::size_t choose_bucket_cap(link_cost c, double overhead = 0.05, std::size_t min_bytes = 256u << 10,
                                     std::size_t max_bytes = 64u << 20) {
  if (!(overhead > 0 && overhead < 1) || min_bytes == 0 || min_bytes > max_bytes)
    throw usage_error("choose_bucket_cap: overhead must be in (0, 1) and 0 < min_bytes <= max_bytes (got overhead " +
                          std::to_string(overhead) + ", min " + std::to_string(min_bytes) + ", max " +
                          std::to_string(max_bytes) + ")",
                      error_site::of("ddp buckets"));
  if (!(c.beta_s_per_byte > 0)) return max_bytes;
  const double alpha = c.alpha_s > 0 ? c.alpha_s : 0;
  const double want = alpha * (1 - overhead) / (overhead * c.beta_s_per_byte);
  if (!(want < static_cast<double>(max_bytes))) return max_bytes;
  constexpr std::size_t grain = 64u << 10;
  const std::size_t cap = (static_cast<std::size_t>(want) + grain - 1) / grain * grain;
  return std::clamp(cap, min_bytes, max_bytes);
}

/// @brief A 32-bit fingerprint of an assignment and the parameters' shapes: equal on every
/// rank exactly when the buckets are (the reducer puts it in the collectives' tag, where the
/// signature check compares it at no extra cost).
inline std::uint32_t fingerprint(std::span<const parameter> params, const bucket_assignment& buckets) {
  std::uint64_t h = kft::detail::fnv1a_u64(params.size());
  for (const auto& p : params) {
    h = kft::detail::fnv1a_u64(p.count, h);
    h = kft::detail::fnv1a_u64(static_cast<std::uint64_t>(p.type), h);
  }
  for (const auto& b : buckets) {
    h = kft::detail::fnv1a_u64(b.size() | (1ull << 63), h);
    for (std::size_t i : b) h = kft::detail::fnv1a_u64(i, h);
  }
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

}  // namespace ddp
KFT_NAMESPACE_END
