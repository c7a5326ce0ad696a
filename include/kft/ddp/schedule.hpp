// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/schedule.hpp
/// @brief A learning-rate schedule the trainer applies before every optimizer step
/// (`trainer_options::lr`): a linear warm-up to a peak, then a constant rate or a linear or
/// cosine decay to a floor, as the usual warm-up + decay recipes of language-model training.
///
///     kft::ddp::trainer_options o;
///     o.lr = {.peak = 2e-3, .warmup = 50, .total = 600, .floor = 0.1};   // cosine by default
///
/// Step s (1-based, the optimizer step about to be taken) runs at
///   peak x s / warmup                                         for s <= warmup,
///   peak x (floor + (1 - floor) x d(t)), t = (s - warmup) / (total - warmup)  up to total,
///   peak x floor                                              after total,
/// with d(t) = 1 (constant), 1 - t (linear) or (1 + cos(pi t)) / 2 (cosine); without `total`
/// (0) the rate stays at the peak after the warm-up. The rate depends on the step number only,
/// so a resumed run continues the same schedule on any number of ranks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <string>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

struct lr_schedule {
  enum class shape { constant, linear, cosine };
  double peak = 0.0;          ///< 0: no schedule (the optimizer keeps its own rate)
  std::uint64_t warmup = 0;   ///< steps of linear warm-up to the peak
  std::uint64_t total = 0;    ///< the step the decay reaches the floor (0: no decay)
  double floor = 0.0;         ///< the final rate, as a fraction of the peak
  shape decay = shape::cosine;

  bool on() const noexcept { return peak > 0.0; }

  /// @brief The rate of optimizer step s (1-based).
  double at(std::uint64_t s) const noexcept {
    if (warmup && s <= warmup) return peak * static_cast<double>(s) / static_cast<double>(warmup);
    if (!total || decay == shape::constant) return total && s > total ? peak * floor : peak;
    if (s >= total) return peak * floor;
    const double t = static_cast<double>(s - warmup) / static_cast<double>(total - warmup);
    const double d = decay == shape::linear ? 1.0 - t : 0.5 * (1.0 + std::cos(std::numbers::pi * t));
    return peak * (floor + (1.0 - floor) * d);
  }

  /// @throws usage_error naming the setting at fault
  void check() const {
    if (!on()) {
      if (peak < 0.0 || std::isnan(peak)) fail("peak " + num(peak) + " (> 0, or 0: no schedule)");
      return;
    }
    if (!std::isfinite(peak)) fail("peak " + num(peak) + " (> 0, or 0: no schedule)");
    if (!(floor >= 0.0 && floor <= 1.0)) fail("floor " + num(floor) + " (a fraction of the peak, 0..1)");
    if (total && total <= warmup)
      fail("total " + std::to_string(total) + " <= warmup " + std::to_string(warmup) +
           " (the decay ends after the warm-up; total 0: no decay)");
  }

  /// @brief In words, for the banner: "lr warm-up 50 steps to 0.002, cosine to 0.1x at step 600".
  std::string words() const {
    if (!on()) return {};
    std::string w = "lr ";
    if (warmup) w += "warm-up " + std::to_string(warmup) + " steps to " + num(peak);
    else w += num(peak);
    if (total && decay != shape::constant) {
      w += decay == shape::linear ? ", linear" : ", cosine";
      w += " to " + num(floor) + "x at step " + std::to_string(total);
    } else if (total) {
      w += ", " + num(floor) + "x after step " + std::to_string(total);
    }
    return w;
  }

 private:
  [[noreturn]] static void fail(const std::string& why) { throw usage_error("trainer: lr schedule: " + why); }
  static std::string num(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
};

}  // namespace ddp
KFT_NAMESPACE_END
