// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/data_parallel.hpp
/// @brief A model's gradients, kept in one process (`local_gradients`) or averaged over the
/// job's ranks while the backward pass runs (`data_parallel`): the two have one interface, so a
/// single-process training loop becomes a DDP one by changing what holds its gradients, as
/// `DDP(model)` does in PyTorch (examples/10-single-to-ddp, docs/ddp.md).
///
///     kft::ddp::local_gradients grads(params);             // one process
///     kft::ddp::data_parallel grads(job.group(), params);  // every rank (collective)
///     for (...) {
///       model.forward_backward(batch, grads.step());        // the model writes its gradients
///       grads.finish();                                      // (DDP: averaged over the ranks)
///       opt.begin_step();
///       for (std::size_t i = 0; i < params.size(); ++i) opt.step(i, params[i].value, grads[i], 1.0f);
///     }
///
/// `data_parallel` is the reducer (reducer.hpp) with the parameters' values broadcast from
/// rank 0 at the start (after the reducer checked that every rank has the same tensors) and
/// every gradient marked as the model hands it over. It adds nothing the trainer (trainer.hpp)
/// lacks: the trainer is this plus the sampler, accumulation, uneven inputs, checkpoints,
/// verification and reporting.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/namespace.hpp>
#include <kft/ddp/model.hpp>
#include <kft/ddp/reducer.hpp>
#include <kft/group/process_group.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

namespace detail {
// These helpers take f32 tensors; mixed precision (bf16 / f16 parameters) is the trainer's.
inline void only_f32(std::span<const tensor_ref> params, const char* who) {
  for (const auto& p : params)
    if (p.type != dtype::f32)
      throw usage_error(std::string(who) + ": parameter '" + p.name + "' is " + std::string(name(p.type)) +
                        "; f32 parameters only here (kft::ddp::trainer handles bf16 and f16 parameters with f32 "
                        "master weights)");
}
}  // namespace detail

/// @brief A model's gradient buffers in one process.
class local_gradients {
 public:
  explicit local_gradients(std::span<const tensor_ref> params) {
    detail::only_f32(params, "local_gradients");
    for (const auto& p : params) buffers_.emplace_back(p.value.size(), 0.0f);
    for (auto& b : buffers_) views_.emplace_back(b);
  }
  /// @brief Where the next backward pass writes (it overwrites every gradient).
  gradients& step() {
    g_.emplace(views_, false, [](void*, std::size_t) {}, nullptr);
    return *g_;
  }
  /// @brief Nothing to wait for in one process.
  void finish() {}
  std::span<const float> operator[](std::size_t i) const { return buffers_.at(i); }
  std::size_t size() const noexcept { return buffers_.size(); }

 private:
  std::vector<std::vector<float>> buffers_;
  std::vector<std::span<float>> views_;
  std::optional<gradients> g_;
};

/// @brief A model's gradients averaged over the ranks of `Group` as the backward pass hands
/// them over (the reducer's buckets are the gradients).
template <class Group = group::process_group>
class data_parallel {
 public:
  /// @brief Collective: the reducer checks that every rank has the same tensors (names the first
  /// difference), then rank 0's parameter values are broadcast to every rank.
  data_parallel(Group& g, std::span<const tensor_ref> params, reducer_options o = {}) : g_(g), r_(g, as_parameters(params), o) {
    for (const auto& p : params) g_.broadcast(p.value.data(), p.value.data(), p.value.size(), dtype::f32, 0, options{});
    views_.resize(params.size());
  }
  /// @brief Where the next backward pass writes: views into the reducer's buckets; a gradient
  /// handed over (`ready(i)`) may travel while the rest of the backward pass runs.
  gradients& step() {
    for (std::size_t i = 0; i < views_.size(); ++i) views_[i] = r_.template gradient<float>(i);
    g_step_.emplace(views_, false, [](void* self, std::size_t i) { static_cast<data_parallel*>(self)->r_.mark_ready(i); },
                    this);
    return *g_step_;
  }
  /// @brief Waits for every bucket: afterwards operator[] is the average over the ranks.
  void finish() { r_.finish(); }
  std::span<const float> operator[](std::size_t i) { return r_.template gradient<float>(i); }
  std::size_t size() const noexcept { return views_.size(); }
  const reducer<Group>& reduction() const noexcept { return r_; }

 private:
  static std::vector<parameter> as_parameters(std::span<const tensor_ref> params) {
    detail::only_f32(params, "data_parallel");
    std::vector<parameter> ps;
    for (const auto& p : params) ps.push_back({p.value.size(), dtype::f32, p.name});
    return ps;
  }

  Group& g_;
  reducer<Group> r_;
  std::vector<std::span<float>> views_;
  std::optional<gradients> g_step_;
};

}  // namespace ddp
KFT_NAMESPACE_END
