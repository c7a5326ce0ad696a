// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/optim.hpp
/// @brief Optimizers for the DDP trainer: SGD with momentum and Adam/AdamW, PyTorch's update
/// rules (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW), on f32 parameters.
///
/// An optimizer (`kft::ddp::optimizer`) is told the parameters' sizes once (`bind`), then
/// `step(i, w, g, scale)` updates parameter i from its gradient times `scale` (the trainer folds
/// its averaging corrections in here, so they cost no pass of their own) and returns false when
/// the gradient holds a NaN or an infinity (checked inside the same loop). Its state (`state()`)
/// is named buffers plus a step count: a checkpoint keeps it, the trainer broadcasts it from
/// rank 0 at the start.
#pragma once

#include <bit>
#include <cmath>
#include <cstdio>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief An optimizer's state: buffers[k][i] is buffer k ("momentum", "exp_avg", ...) of parameter i.
struct optimizer_state {
  std::uint64_t steps = 0;
  std::vector<std::string> names;
  std::vector<std::vector<std::vector<float>>> buffers;
};

/// @brief What the trainer needs of an optimizer.
template <class O>
concept optimizer = requires(O& o, const O& co, std::span<const std::size_t> sizes, std::size_t i, std::span<float> w,
                             std::span<const float> g, float scale) {
  o.bind(sizes);                                   // the parameters' sizes, once
  o.begin_step();                                  // before the step's first parameter
  { o.step(i, w, g, scale) } -> std::same_as<bool>;  // false: g held a NaN or an infinity
  { o.state() } -> std::same_as<optimizer_state&>;
  { co.name() } -> std::convertible_to<std::string>;
};

namespace detail {
// True when x is a NaN or an infinity (all exponent bits set); an integer test, so the loops
// that OR it up stay vectorised.
inline std::uint32_t not_finite(float x) noexcept {
  return static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(x) & 0x7F800000u) == 0x7F800000u);
}
inline void check_sizes(const std::vector<std::size_t>& sizes, std::size_t i, std::span<float> w,
                        std::span<const float> g, const char* who) {
  if (i >= sizes.size())
    throw usage_error(std::string(who) + ": step(" + std::to_string(i) + ") on an optimizer bound to " +
                      std::to_string(sizes.size()) + " parameters");
  if (w.size() != sizes[i] || g.size() != sizes[i])
    throw usage_error(std::string(who) + ": parameter " + std::to_string(i) + " has " + std::to_string(w.size()) +
                      " values and a gradient of " + std::to_string(g.size()) + "; it was bound with " +
                      std::to_string(sizes[i]));
}
inline std::string shortest(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}
inline void bind_state(optimizer_state& s, std::vector<std::string> names, std::span<const std::size_t> sizes) {
  s.steps = 0;
  s.names = std::move(names);
  s.buffers.assign(s.names.size(), {});
  for (auto& b : s.buffers) {
    b.resize(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) b[i].assign(sizes[i], 0.0f);
  }
}
}  // namespace detail

struct sgd_options {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

/// @brief torch.optim.SGD: d = g + wd w; b = m b + (1 - dampening) d (b = d on the first step);
/// d = nesterov ? d + m b : b; w -= lr d.
class sgd {
 public:
  explicit sgd(sgd_options o = {}) : o_(o) {
    if (!(o_.lr >= 0.0f)) throw usage_error("sgd: lr = " + std::to_string(o_.lr) + " (must be >= 0)");
    if (o_.nesterov && (o_.momentum <= 0.0f || o_.dampening != 0.0f))
      throw usage_error("sgd: nesterov needs momentum > 0 and dampening 0");
  }
  std::string name() const {
    return "sgd(lr " + detail::shortest(o_.lr) + ", momentum " + detail::shortest(o_.momentum) +
           (o_.weight_decay != 0.0f ? ", weight decay " + detail::shortest(o_.weight_decay) : std::string()) + ")";
  }
  const sgd_options& options() const noexcept { return o_; }
  void set_lr(float lr) noexcept { o_.lr = lr; }
  void bind(std::span<const std::size_t> sizes) {
    sizes_.assign(sizes.begin(), sizes.end());
    detail::bind_state(s_, o_.momentum != 0.0f ? std::vector<std::string>{"momentum"} : std::vector<std::string>{},
                       sizes);
  }
  void begin_step() { ++s_.steps; }
  bool step(std::size_t i, std::span<float> w, std::span<const float> g, float scale) {
    detail::check_sizes(sizes_, i, w, g, "sgd");
    const std::size_t n = w.size();
    const float lr = o_.lr, wd = o_.weight_decay, m = o_.momentum, damp = 1.0f - o_.dampening;
    std::uint32_t bad = 0;
    float* __restrict wp = w.data();
    const float* __restrict gp = g.data();
    if (m == 0.0f) {
      for (std::size_t k = 0; k < n; ++k) {
        const float d = gp[k] * scale + wd * wp[k];
        bad |= detail::not_finite(gp[k]);
        wp[k] -= lr * d;
      }
    } else {
      float* __restrict bp = s_.buffers[0][i].data();
      const bool first = s_.steps == 1;
      for (std::size_t k = 0; k < n; ++k) {
        const float d = gp[k] * scale + wd * wp[k];
        bad |= detail::not_finite(gp[k]);
        const float b = first ? d : m * bp[k] + damp * d;
        bp[k] = b;
        wp[k] -= lr * (o_.nesterov ? d + m * b : b);
      }
    }
    return bad == 0;
  }
  optimizer_state& state() noexcept { return s_; }

 private:
  sgd_options o_;
  optimizer_state s_;
  std::vector<std::size_t> sizes_;
};

struct adam_options {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = true;  ///< AdamW (w *= 1 - lr wd); false: Adam's L2 term (g += wd w)
};

/// @brief torch.optim.Adam / AdamW: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
class adam {
 public:
  explicit adam(adam_options o = {}) : o_(o) {
    if (!(o_.lr >= 0.0f)) throw usage_error("adam: lr = " + std::to_string(o_.lr) + " (must be >= 0)");
    if (!(o_.beta1 >= 0.0f && o_.beta1 < 1.0f && o_.beta2 >= 0.0f && o_.beta2 < 1.0f))
      throw usage_error("adam: betas (" + std::to_string(o_.beta1) + ", " + std::to_string(o_.beta2) +
                        ") must lie in [0, 1)");
  }
  std::string name() const {
    return std::string(o_.decoupled ? "adamw" : "adam") + "(lr " + detail::shortest(o_.lr) +
           (o_.weight_decay != 0.0f ? ", weight decay " + detail::shortest(o_.weight_decay) : std::string()) + ")";
  }
  const adam_options& options() const noexcept { return o_; }
  void set_lr(float lr) noexcept { o_.lr = lr; }
  void bind(std::span<const std::size_t> sizes) {
    sizes_.assign(sizes.begin(), sizes.end());
    detail::bind_state(s_, {"exp_avg", "exp_avg_sq"}, sizes);
  }
  void begin_step() {
    ++s_.steps;
    const double t = static_cast<double>(s_.steps);
    bc1_ = static_cast<float>(1.0 - std::pow(static_cast<double>(o_.beta1), t));
    bc2_sqrt_ = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(o_.beta2), t)));
  }
  bool step(std::size_t i, std::span<float> w, std::span<const float> g, float scale) {
    detail::check_sizes(sizes_, i, w, g, "adam");
    const std::size_t n = w.size();
    const float lr = o_.lr, b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, wd = o_.weight_decay;
    const float step_size = lr / bc1_, decay = o_.decoupled ? 1.0f - lr * wd : 1.0f, l2 = o_.decoupled ? 0.0f : wd;
    float* __restrict wp = w.data();
    float* __restrict mp = s_.buffers[0][i].data();
    float* __restrict vp = s_.buffers[1][i].data();
    const float* __restrict gp = g.data();
    std::uint32_t bad = 0;
    std::size_t k = 0;
#if defined(__SSE2__)
    // Four lanes at a time with the scalar loop's operations in its order (IEEE's sqrt and
    // division round the same in both), so the result keeps its bits. The scalar loop alone
    // stays scalar: its std::sqrt may set errno, which keeps the compiler from vectorising it.
    {
      const __m128 vs = _mm_set1_ps(scale), vl2 = _mm_set1_ps(l2), vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2);
      const __m128 vc1 = _mm_set1_ps(1.0f - b1), vc2 = _mm_set1_ps(1.0f - b2), vdecay = _mm_set1_ps(decay);
      const __m128 vstep = _mm_set1_ps(step_size), vbc2 = _mm_set1_ps(bc2_sqrt_), veps = _mm_set1_ps(eps);
      __m128 nonfinite = _mm_setzero_ps();
      for (; k + 4 <= n; k += 4) {
        const __m128 g4 = _mm_loadu_ps(gp + k), w4 = _mm_loadu_ps(wp + k);
        nonfinite = _mm_or_ps(nonfinite, _mm_cmpunord_ps(_mm_sub_ps(g4, g4), _mm_sub_ps(g4, g4)));
        const __m128 gk = _mm_add_ps(_mm_mul_ps(g4, vs), _mm_mul_ps(vl2, w4));
        const __m128 m = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(mp + k)), _mm_mul_ps(vc1, gk));
        const __m128 v = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(vp + k)), _mm_mul_ps(_mm_mul_ps(vc2, gk), gk));
        _mm_storeu_ps(mp + k, m);
        _mm_storeu_ps(vp + k, v);
        const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(v), vbc2), veps);
        _mm_storeu_ps(wp + k, _mm_sub_ps(_mm_mul_ps(w4, vdecay), _mm_div_ps(_mm_mul_ps(vstep, m), denom)));
      }
      bad = static_cast<std::uint32_t>(_mm_movemask_ps(nonfinite) != 0);
    }
#endif
    for (; k < n; ++k) {
      const float gk = gp[k] * scale + l2 * wp[k];
      bad |= detail::not_finite(gp[k]);
      const float m = b1 * mp[k] + (1.0f - b1) * gk;
      const float v = b2 * vp[k] + (1.0f - b2) * gk * gk;
      mp[k] = m;
      vp[k] = v;
      wp[k] = wp[k] * decay - step_size * m / (std::sqrt(v) / bc2_sqrt_ + eps);
    }
    return bad == 0;
  }
  optimizer_state& state() noexcept { return s_; }

 private:
  adam_options o_;
  optimizer_state s_;
  std::vector<std::size_t> sizes_;
  float bc1_ = 1.0f, bc2_sqrt_ = 1.0f;
};

}  // namespace ddp
KFT_NAMESPACE_END
