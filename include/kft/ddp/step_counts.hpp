// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/step_counts.hpp
/// @brief The trainer's own three numbers per step, carried in the reducer's trailer: how many
/// micro-batches (or deterministic shards) contributed over all ranks, how many ranks saw a
/// non-finite loss, how many saw a non-finite gradient under loss scaling.
///
/// They ride with the gradients (the trailer travels in the bucket finish() launches last), so
/// a step costs no collective of its own for them. The trailer's type follows the mode:
///   - i64 in deterministic mode (its buckets are summed);
///   - f64 under ZeRO-1 (a type no gradient has: the counts get a bucket of their own, which is
///     allreduced while the gradient buckets are reduce-scattered);
///   - f32 otherwise, and on devices (averaged: sum / N of small integers, exact after x N and
///     rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include <kft/core/dtype.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief One step's counts over all ranks.
struct step_counts {
  std::uint64_t contributions = 0;  ///< micro-batches (or shards) that went into the gradients
  std::uint64_t bad = 0;            ///< ranks whose loss was NaN or infinite
  std::uint64_t overflow = 0;       ///< ranks that saw a non-finite gradient under loss scaling
};

/// @brief Writes and reads the counts in a reducer's trailer (3 values of `type()`).
/// `OnDevice`: the trailer lives in device memory (f32, through the reducer's upload/download).
template <bool OnDevice>
class step_counters {
 public:
  step_counters() = default;
  step_counters(bool zero_stage_1, bool deterministic)
      : type_(OnDevice ? dtype::f32 : zero_stage_1 ? dtype::f64 : deterministic ? dtype::i64 : dtype::f32) {}
  /// @brief The trailer's type (reducer_options::trailer_type).
  dtype type() const noexcept { return type_; }
  static constexpr std::size_t size = 3;  ///< reducer_options::trailer

  /// @brief This rank's counts, before the reduction (i.e. before finish() of the last bucket).
  template <class Reducer>
  void write(Reducer& r, const step_counts& c) const {
    if constexpr (OnDevice) {
      const float v[3] = {static_cast<float>(c.contributions), static_cast<float>(c.bad), static_cast<float>(c.overflow)};
      r.upload(r.trailer_data(), v, sizeof v);
    } else {
      auto put = [&](auto t) {
        using T = typename decltype(t)::value_type;
        t[0] = static_cast<T>(c.contributions);
        t[1] = static_cast<T>(c.bad);
        t[2] = static_cast<T>(c.overflow);
      };
      if (type_ == dtype::i64) put(r.template trailer<std::int64_t>());
      else if (type_ == dtype::f64) put(r.template trailer<double>());
      else put(r.template trailer<float>());
    }
  }

  /// @brief Every rank's counts summed, after the reduction; `ranks`: the group's size.
  template <class Reducer>
  step_counts read(Reducer& r, int ranks) const {
    double c[3] = {0, 0, 0};
    if constexpr (OnDevice) {
      float f[3] = {0.0f, 0.0f, 0.0f};
      r.download(f, r.trailer_data(), sizeof f);
      for (int k = 0; k < 3; ++k) c[k] = f[k];
    } else if (type_ == dtype::i64) {  // summed already
      auto t = r.template trailer<std::int64_t>();
      return {static_cast<std::uint64_t>(t[0]), static_cast<std::uint64_t>(t[1]), static_cast<std::uint64_t>(t[2])};
    } else if (type_ == dtype::f64) {
      auto t = r.template trailer<double>();
      for (std::size_t k = 0; k < 3; ++k) c[k] = t[k];
    } else {
      auto t = r.template trailer<float>();
      for (std::size_t k = 0; k < 3; ++k) c[k] = t[k];
    }
    const auto n = static_cast<double>(ranks);  // averaged: x N
    return {static_cast<std::uint64_t>(std::llround(c[0] * n)), static_cast<std::uint64_t>(std::llround(c[1] * n)),
            static_cast<std::uint64_t>(std::llround(c[2] * n))};
  }

 private:
  dtype type_ = dtype::f32;
};

}  // namespace ddp
KFT_NAMESPACE_END
