// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/mixed.hpp
/// @brief An f32 model with bf16 (or f16) parameters, unchanged: `kft::ddp::half_params`.
///
///     my_model m(...);                                     // an f32 model (model.hpp)
///     kft::ddp::half_params<my_model> h(m, kft::dtype::bf16);
///     kft::ddp::trainer t(pg, h, opt, o);                  // bf16 parameters, f32 master weights
///
/// The trainer's mixed precision (trainer.hpp, docs/ddp.md) asks a model for 16-bit parameters
/// (`tensor_ref::bf16`) and hands it 16-bit gradient buffers. Most CPU models compute in f32
/// (there is no bf16 GEMM in Debian's OpenBLAS); this adapter gives such a model 16-bit
/// parameters without changing it:
///  - it holds the 16-bit values (the rounding of the model's initial values) and gives them to
///    the trainer, which keeps the f32 master copy and writes the rounding of each update back;
///  - before every forward pass it widens them into the model's own f32 tensors (exactly: every
///    16-bit value is an f32 value), so the model computes with the 16-bit parameters;
///  - the model writes its gradients into f32 buffers of the adapter's; as it hands gradient i
///    over (`ready(i)`) the adapter stores it into the trainer's buffer with
///    `gradients::write` (rounded to bf16/f16 buckets, x the loss scale) and hands it on, so
///    gradients still travel while the backward pass runs.
/// `keep_f32(tensor)` names tensors to leave in f32 (layer norms, biases: small, and sensitive
/// to rounding). Memory: the 16-bit values and one f32 gradient buffer per tensor, besides the
/// model's own. With `accumulate` micro-batches the later ones add into the 16-bit buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/ddp/model.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

template <model M>
class half_params {
 public:
  /// @param type bf16 or f16
  /// @param keep_f32 tensors to leave in f32 (none by default)
  explicit half_params(M& inner, dtype type = dtype::bf16, std::function<bool(const tensor_ref&)> keep_f32 = {})
      : m_(inner), type_(type) {
    if (type != dtype::bf16 && type != dtype::f16)
      throw usage_error("half_params: type " + std::string(name(type)) + " (bf16 or f16)");
    inner_ = m_.parameters();
    const std::size_t n = inner_.size();
    bits_.resize(n);
    grads_.resize(n);
    views_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& t = inner_[i];
      if (t.type != dtype::f32)
        throw usage_error("half_params: the model's parameter '" + t.name + "' is " + std::string(name(t.type)) +
                          " already (the adapter takes an f32 model)");
      grads_[i].assign(t.value.size(), 0.0f);
      views_[i] = grads_[i];
      if (keep_f32 && keep_f32(t)) continue;
      bits_[i].resize(t.value.size());
      for (std::size_t k = 0; k < t.value.size(); ++k)
        bits_[i][k] = type == dtype::bf16 ? bfloat16::from_float(t.value[k]) : half::from_float(t.value[k]);
    }
  }

  /// @brief The 16-bit parameters (and the f32 ones kept), in the model's order.
  std::vector<tensor_ref> parameters() {
    std::vector<tensor_ref> p;
    for (std::size_t i = 0; i < inner_.size(); ++i) {
      if (bits_[i].empty() && !inner_[i].value.empty()) p.push_back(inner_[i]);
      else p.push_back({inner_[i].name, {}, std::span<std::uint16_t>(bits_[i]), type_});
    }
    return p;
  }
  std::vector<metric> metrics() const { return metrics_of(m_).list(); }

  auto forward_backward(batch_of<M> b, gradients& g) {
    widen();
    outer_ = &g;
    gradients mine(std::span<const std::span<float>>(views_), false, &on_ready, this);
    return m_.forward_backward(b, mine);
  }
  auto evaluate(batch_of<M> b)
    requires evaluable<M>
  {
    widen();
    return m_.evaluate(b);
  }

  /// @brief The model, whose f32 tensors hold the 16-bit values as of the last forward pass or
  /// sync() (call sync() after training to use the model with the final values).
  M& inner() noexcept { return m_; }
  /// @brief The 16-bit values into the model's f32 tensors (done before every forward pass).
  void sync() { widen(); }

 private:
  void widen() {
    for (std::size_t i = 0; i < inner_.size(); ++i) {
      if (bits_[i].empty()) continue;
      float* dst = inner_[i].value.data();
      const std::uint16_t* src = bits_[i].data();
      const std::size_t n = bits_[i].size();
      if (type_ == dtype::bf16) {
        for (std::size_t k = 0; k < n; ++k) dst[k] = bfloat16::to_float(src[k]);
      } else {
        for (std::size_t k = 0; k < n; ++k) dst[k] = half::to_float(src[k]);
      }
    }
  }
  static void on_ready(void* self, std::size_t i) {
    auto* h = static_cast<half_params*>(self);
    h->outer_->write(i, h->grads_[i]);
    h->outer_->ready(i);
  }

  M& m_;
  dtype type_;
  std::vector<tensor_ref> inner_;                 // the model's f32 tensors
  std::vector<std::vector<std::uint16_t>> bits_;  // the 16-bit values (empty: kept f32)
  std::vector<std::vector<float>> grads_;         // the model's f32 gradients
  std::vector<std::span<float>> views_;
  gradients* outer_ = nullptr;                    // the trainer's, during forward_backward
};

}  // namespace ddp
KFT_NAMESPACE_END
