// SPDX-License-Identifier: Apache-2.0
/// @file kft/libtorch/model.hpp
/// @brief A libtorch module as a `kft::ddp::model`, so kft's trainer (sampler, checkpoints on
/// any world size, uneven inputs, deterministic mode, replica checks) trains it.
///
///     auto net = std::make_shared<Net>();
///     auto batch = [&](std::span<const std::uint32_t> idx) {          // this rank's samples
///       auto [x, y] = load(idx);
///       auto out = net->forward(x);
///       return kft::libtorch::batch_result{torch::nn::functional::cross_entropy(out, y),
///                                          correct(out, y), idx.size()};
///     };
///     kft::libtorch::module_model m(net, batch);                        // one callable for train and test
///     kft::ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
///     kft::ddp::trainer t(pg, m, opt, {.batch = 64, .epochs = 3});
///     t.fit(train_size, test_size);
///
/// The callable returns the batch's *mean* loss as a scalar tensor (with its graph when training)
/// and its number of correct predictions. For a training batch the adapter points each
/// parameter's `.grad()` at the trainer's gradient buffer (a view into the reducer's bucket),
/// zeroes it unless the trainer accumulates micro-batches, runs `loss.backward()`, and a
/// post-hook on each gradient accumulator tells the trainer the moment that gradient is final.
/// Evaluation runs the same callable under `torch::NoGradGuard`. The trainer owns the
/// parameters' values (its optimizer and checkpoints work on them in place): f32, contiguous,
/// on the CPU.
#pragma once

#if !KFT_WITH_LIBTORCH
#error "kft/libtorch/model.hpp needs the libtorch component: configure kft with KFT_WITH_LIBTORCH=ON and link kft::libtorch"
#endif

#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/libtorch/ddp.hpp>

KFT_NAMESPACE_BEGIN
namespace libtorch {

/// @brief What a batch callable returns.
struct batch_result {
  at::Tensor loss;            ///< the batch's mean loss, a scalar
  std::uint64_t correct = 0;  ///< correct predictions
  std::uint64_t count = 0;    ///< samples
};

template <class F>
concept batch_fn = requires(F& f, std::span<const std::uint32_t> idx) {
  { f(idx) } -> std::convertible_to<batch_result>;
};

/// @brief A module + its batch callable, as a `kft::ddp::model` (file comment).
template <batch_fn Batch>
class module_model {
 public:
  module_model(std::shared_ptr<torch::nn::Module> module, Batch batch) : module_(std::move(module)), batch_(std::move(batch)) {
    if (!module_) throw usage_error("no module given", error_site::of("libtorch model"));
    reg_ = trainable(*module_);
    for (std::size_t i = 0; i < reg_.tensors.size(); ++i)
      if (reg_.params[i].type != dtype::f32)
        throw usage_error("parameter '" + reg_.names[i] + "' is " + std::string(name(reg_.params[i].type)) +
                              ": kft's trainer and optimizers work on f32 parameters (distributed_data_parallel "
                              "carries the others in your own loop)",
                          error_site::of("libtorch model"));
    hooks_.emplace(reg_, [this](std::size_t i) {
      if (current_) current_->ready(i);  // (a backward pass outside the trainer's step tells no one)
    });
  }
  template <class Impl>
  module_model(const torch::nn::ModuleHolder<Impl>& holder, Batch batch)
      : module_model(std::static_pointer_cast<torch::nn::Module>(holder.ptr()), std::move(batch)) {}
  module_model(const module_model&) = delete;
  module_model& operator=(const module_model&) = delete;
  torch::nn::Module& module() { return *module_; }

  std::vector<ddp::tensor_ref> parameters() {
    std::vector<ddp::tensor_ref> out;
    for (std::size_t i = 0; i < reg_.tensors.size(); ++i)
      out.push_back({reg_.names[i], {reg_.tensors[i].data_ptr<float>(), static_cast<std::size_t>(reg_.tensors[i].numel())}});
    return out;
  }

  ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    point_gradients_at(reg_, [&](std::size_t i) { return static_cast<void*>(g[i].data()); });
    if (!g.accumulate())
      for (std::size_t i = 0; i < g.size(); ++i) std::memset(g[i].data(), 0, g[i].size_bytes());
    module_->train();
    current_ = &g;
    struct clear {
      const ddp::gradients*& c;
      ~clear() { c = nullptr; }
    } done{current_};
    batch_result r = batch_(idx);
    if (!r.loss.defined() || r.loss.numel() != 1)
      throw usage_error("the batch callable must return the batch's mean loss as a scalar tensor",
                        error_site::of("libtorch model"));
    r.loss.backward();
    return {r.loss.item<double>() * static_cast<double>(r.count), r.correct, r.count};
  }

  ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) {
    torch::NoGradGuard no_grad;
    module_->eval();
    batch_result r = batch_(idx);
    module_->train();
    return {r.loss.item<double>() * static_cast<double>(r.count), r.correct, r.count};
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  Batch batch_;
  registered reg_;
  const ddp::gradients* current_ = nullptr;
  std::optional<ready_hooks> hooks_;
};

template <class Impl, class Batch>
module_model(const torch::nn::ModuleHolder<Impl>&, Batch) -> module_model<Batch>;
template <class M, class Batch>
module_model(std::shared_ptr<M>, Batch) -> module_model<Batch>;

}  // namespace libtorch
KFT_NAMESPACE_END
