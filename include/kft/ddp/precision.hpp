// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/precision.hpp
/// @brief The trainer's mixed precision, beside it: the f32 master weights of a model's 16-bit
/// parameters (`master_weights`) and loss scaling (`loss_scaler`, as torch.amp's GradScaler sits
/// beside DDP). docs/ddp.md, "Mixed precision".
///
///  - `master_weights`: each parameter's type (f32, bf16, f16) and its gradient's (the
///    parameter's own, f32 with `f32_gradients`, i64 fixed point in deterministic mode); an f32
///    copy of every 16-bit parameter, which is what the optimizer updates (an f32 parameter is
///    its own); `round()` writes the copies' rounding (to nearest even) back into the model's
///    16-bit values; 16-bit gradients widened for the optimizer; the types as a checkpoint
///    section, and the refusal of a checkpoint written in another precision.
///  - `loss_scaler`: the scale gradients are stored at, and the rule every rank applies to the
///    same count of ranks that saw a non-finite gradient: skip the step and multiply the scale
///    by `backoff`, or count a good step and, after `interval` of them, multiply it by `growth`.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/model.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief Loss scaling's settings (trainer_options::loss_scale).
struct loss_scaling {
  enum class mode { automatic, on, off };
  mode use = mode::automatic;  ///< automatic: on when some gradient travels in f16
  double initial = 65536.0;
  double growth = 2.0;          ///< x after `interval` steps in a row without an overflow
  double backoff = 0.5;         ///< x after a step whose gradients overflowed (the step is skipped)
  std::uint64_t interval = 2000;
};

/// @brief Loss scaling's state (see the file comment); the same on every rank.
class loss_scaler {
 public:
  /// What a step does after the ranks counted their overflows.
  enum class verdict { apply, skip, give_up };
  /// Skipped steps in a row that mean the gradients are not finite at any scale.
  static constexpr std::uint64_t max_skipped_in_row = 64;

  loss_scaler() = default;
  /// @throws usage_error naming the setting at fault
  loss_scaler(const loss_scaling& o, bool on) : o_(o), on_(on), scale_(on ? o.initial : 1.0) {
    if (!(std::isfinite(o.initial) && o.initial > 0) || !(std::isfinite(o.growth) && o.growth >= 1.0) ||
        !(o.backoff > 0.0 && o.backoff < 1.0) || o.interval == 0)
      throw usage_error("trainer: loss_scale = {initial " + num(o.initial) + ", growth " + num(o.growth) + ", backoff " +
                        num(o.backoff) + ", interval " + std::to_string(o.interval) +
                        "} (initial > 0, growth >= 1, 0 < backoff < 1, interval >= 1)");
  }
  bool on() const noexcept { return on_; }
  /// The factor gradients are stored at (1 when off).
  double scale() const noexcept { return scale_; }
  std::uint64_t skipped() const noexcept { return skipped_; }
  std::uint64_t skipped_in_row() const noexcept { return in_row_; }

  /// @brief `ranks` ranks saw a non-finite gradient this step: the rule (every rank gets the
  /// same count, so every rank decides the same).
  verdict update(std::uint64_t ranks) {
    if (!on_) return verdict::apply;
    if (ranks == 0) {
      in_row_ = 0;
      if (++good_ >= o_.interval) {
        scale_ *= o_.growth;
        good_ = 0;
      }
      return verdict::apply;
    }
    ++skipped_;
    good_ = 0;
    scale_ *= o_.backoff;
    return ++in_row_ >= max_skipped_in_row ? verdict::give_up : verdict::skip;
  }

  /// @brief The state as a checkpoint section's text: "scale good-steps skipped".
  std::string save() const {
    char b[96];
    std::snprintf(b, sizeof b, "%.17g %llu %llu", scale_, static_cast<unsigned long long>(good_),
                  static_cast<unsigned long long>(skipped_));
    return b;
  }
  /// @throws usage_error naming `what` when `text` is not a saved state
  void load(const std::string& text, const std::string& what) {
    unsigned long long good = 0, skips = 0;
    double sc = 0;
    if (std::sscanf(text.c_str(), "%lf %llu %llu", &sc, &good, &skips) != 3 || !(sc > 0) || !std::isfinite(sc))
      throw usage_error("checkpoint " + what + ": its loss scaler's state is '" + kft::detail::excerpt(text) +
                        "', not 'scale good-steps skipped'");
    scale_ = sc, good_ = good, skipped_ = skips, in_row_ = 0;
  }

 private:
  static std::string num(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
  loss_scaling o_;
  bool on_ = false;
  double scale_ = 1.0;
  std::uint64_t good_ = 0, skipped_ = 0, in_row_ = 0;
};

/// @brief The f32 master weights of a model's 16-bit parameters (see the file comment).
class master_weights {
 public:
  master_weights() = default;
  /// @throws usage_error naming a parameter of another type, or one whose values do not match its type
  master_weights(std::span<const tensor_ref> params, bool f32_gradients, bool deterministic) : params_(params.begin(), params.end()) {
    const std::size_t n = params_.size();
    grad_types_.resize(n);
    master_.resize(n);
    opt_ = params_;
    std::size_t largest = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& t = params_[i];
      const bool f32 = t.type == dtype::f32, low = t.type == dtype::bf16 || t.type == dtype::f16;
      if (!f32 && !low) throw usage_error("trainer: parameter '" + t.name + "' is " + std::string(name(t.type)) + " (f32, bf16 or f16)");
      if ((f32 && !t.bits.empty()) || (low && !t.value.empty()))
        throw usage_error("trainer: parameter '" + t.name + "' is " + std::string(name(t.type)) + " but has " +
                          (f32 ? "16-bit values (tensor_ref::bits)" : "f32 values (tensor_ref::value)") +
                          " (use tensor_ref::bf16 / ::f16 for a 16-bit parameter)");
      if (low) {
        ++low_;
        master_[i].resize(t.bits.size());
        widen(t.type, t.bits.data(), master_[i].data(), t.bits.size());
        opt_[i] = tensor_ref{t.name, std::span<float>(master_[i])};
      }
      grad_types_[i] = deterministic ? dtype::i64 : (f32 || f32_gradients) ? dtype::f32 : t.type;
      if (grad_types_[i] == dtype::bf16 || grad_types_[i] == dtype::f16) {
        low_grads_ = true;
        largest = std::max(largest, t.bits.size());
      }
      f16_grads_ |= grad_types_[i] == dtype::f16;
    }
    widened_.assign(largest, 0.0f);
  }

  /// 16-bit parameters (with master weights).
  std::size_t sixteen_bit() const noexcept { return low_; }
  /// Some gradient travels in bf16 or f16 / in f16.
  bool sixteen_bit_gradients() const noexcept { return low_grads_; }
  bool f16_gradients() const noexcept { return f16_grads_; }
  /// Parameter i's gradient type (the reducer's bucket type).
  dtype gradient_type(std::size_t i) const { return grad_types_[i]; }
  /// The tensors the optimizer updates: the f32 parameters and the 16-bit ones' master weights.
  const std::vector<tensor_ref>& optimizer_tensors() const noexcept { return opt_; }
  /// Parameter i's master weights (empty for an f32 parameter).
  std::span<const float> master(std::size_t i) const { return master_[i]; }

  /// @brief The 16-bit parameters from their master weights (round to nearest even).
  void round() {
    if (!low_) return;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& t = params_[i];
      const float* m = master_[i].data();
      std::uint16_t* b = t.bits.data();
      if (t.type == dtype::bf16) {
        for (std::size_t k = 0; k < t.bits.size(); ++k) b[k] = bfloat16::from_float(m[k]);
      } else if (t.type == dtype::f16) {
        for (std::size_t k = 0; k < t.bits.size(); ++k) b[k] = half::from_float(m[k]);
      }
    }
  }
  /// @brief Elements [offset, offset + count) of parameter i's 16-bit gradient at `data` (its
  /// whole gradient), widened to f32 (valid until the next call).
  std::span<const float> widened_gradient(std::size_t i, const void* data, std::size_t offset, std::size_t count) {
    widen(grad_types_[i], static_cast<const std::uint16_t*>(data) + offset, widened_.data(), count);
    return {widened_.data(), count};
  }
  /// @brief Whether `n` values of type `t` at `data` are all finite (f32, bf16, f16).
  static bool finite(const void* data, dtype t, std::size_t n) {
    std::uint32_t bad = 0;
    if (t == dtype::f32) {
      const auto* v = static_cast<const float*>(data);
      for (std::size_t k = 0; k < n; ++k) bad |= (std::bit_cast<std::uint32_t>(v[k]) & 0x7f800000u) == 0x7f800000u;
    } else if (t == dtype::bf16 || t == dtype::f16) {  // exponent all ones: an infinity or a NaN
      const std::uint16_t mask = t == dtype::bf16 ? 0x7f80u : 0x7c00u;
      const auto* v = static_cast<const std::uint16_t*>(data);
      for (std::size_t k = 0; k < n; ++k) bad |= (v[k] & mask) == mask;
    }
    return bad == 0;
  }

  /// @brief The parameters' types as a checkpoint section's text: "f32,bf16,...".
  std::string types() const {
    std::string s;
    for (const auto& t : params_) {  // (appends: GCC 12's -Wrestrict misfires on a + b here at -O3)
      if (!s.empty()) s += ',';
      s += name(t.type);
    }
    return s;
  }
  /// @brief Refuses a checkpoint whose parameter types (`saved`, types()'s text; none: written
  /// before the section existed, all f32) are not this model's: the values saved are f32 master
  /// weights (or f32 parameters) with their optimizer state, and a 16-bit model resumed from an
  /// f32 run (or the other way round) would continue another run's arithmetic.
  /// @throws usage_error naming the checkpoint, the first parameter and both types
  void check_types(const std::string* saved, const std::string& what) const {
    std::vector<std::string> theirs;
    if (saved) {
      std::string cur;
      for (char ch : *saved + ",") {
        if (ch != ',') cur += ch;
        else theirs.push_back(std::exchange(cur, {}));
      }
    } else {
      theirs.assign(params_.size(), "f32");
    }
    if (theirs.size() != params_.size())
      throw usage_error("checkpoint " + what + " holds " + std::to_string(theirs.size()) + " parameter types, this model has " +
                        std::to_string(params_.size()) + " parameters (another model?)");
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::string mine(name(params_[i].type));
      if (theirs[i] == mine) continue;
      throw usage_error("checkpoint " + what + " holds parameter '" + params_[i].name + "' as " + theirs[i] +
                        (saved ? "" : " (written before mixed precision, or by an f32 run)") +
                        ", with its optimizer state; this model's '" + params_[i].name + "' is " + mine +
                        (params_[i].type == dtype::f32 ? "" : " (f32 master weights)") +
                        ": resume with the precision the checkpoint was written in");
    }
  }
  /// @brief What the run does, in words ("" : every parameter f32, no loss scaling).
  std::string words(bool deterministic, bool f32_gradients, const loss_scaler& ls, double initial_scale) const {
    if (!low_ && !ls.on()) return {};
    std::size_t bf = 0, f16 = 0;
    for (const auto& t : params_) bf += t.type == dtype::bf16, f16 += t.type == dtype::f16;
    std::string w = "mixed precision: ";
    if (bf) w += std::to_string(bf) + " bf16 ";
    if (bf && f16) w += "and ";
    if (f16) w += std::to_string(f16) + " f16 ";
    if (low_) w += "tensor(s) with f32 master weights, gradients in ";
    w += deterministic ? "fixed point (deterministic)" : f32_gradients || !low_ ? "f32" : "their type";
    if (ls.on()) {
      char b[32];
      std::snprintf(b, sizeof b, "%.0f", initial_scale);
      w += std::string(", loss scaling from ") + b;
    }
    return w;
  }

 private:
  static void widen(dtype t, const std::uint16_t* src, float* dst, std::size_t n) {
    if (t == dtype::bf16) {
      for (std::size_t k = 0; k < n; ++k) dst[k] = bfloat16::to_float(src[k]);
    } else {
      for (std::size_t k = 0; k < n; ++k) dst[k] = half::to_float(src[k]);
    }
  }

  std::vector<tensor_ref> params_, opt_;
  std::vector<std::vector<float>> master_;
  std::vector<dtype> grad_types_;
  std::vector<float> widened_;
  std::size_t low_ = 0;
  bool low_grads_ = false, f16_grads_ = false;
};

}  // namespace ddp
KFT_NAMESPACE_END
