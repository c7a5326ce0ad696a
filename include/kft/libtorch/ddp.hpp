// SPDX-License-Identifier: Apache-2.0
/// @file kft/libtorch/ddp.hpp
/// @brief DistributedDataParallel for libtorch (PyTorch's C++ frontend), which has none: a
/// `torch::nn::Module`'s gradients live in kft's reducer buckets and are averaged across the
/// ranks while `loss.backward()` still runs.
///
///     auto pg = kft::group::make_process_group(me, store.client);
///     auto net = std::make_shared<Net>();                          // any torch::nn::Module
///     kft::libtorch::distributed_data_parallel ddp(pg, net);        // collective: rank 0's weights everywhere
///     torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
///     for (...) {
///       ddp.zero_grad();                                            // zeroes the buckets (views stay)
///       auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
///       loss.backward();                                            // buckets travel during backward;
///       opt.step();                                                 // when it returns, grads are averaged
///     }
///
/// What it does, as PyTorch's DDP does in Python (docs/libtorch.md):
///  - parameters that require a gradient are registered with kft's reducer in the module's
///    order (`named_parameters()`), and each one's `.grad()` becomes a tensor *view* into its
///    bucket's storage (PyTorch's `gradient_as_bucket_view=True`): autograd accumulates straight
///    into the bucket, nothing is copied in or out;
///  - a post-hook on each parameter's gradient accumulator (the node that writes `.grad()`)
///    calls `mark_ready`, so a bucket is launched as soon as its last gradient is final, while
///    the rest of the backward pass runs; the first hook of a backward pass queues the
///    reducer's `finish()` on the autograd engine, so `backward()` returns with averaged
///    gradients and an error (a rank that died, a model that differs) is raised by it;
///  - construction is collective: the reducer checks that every rank registered the same
///    tensors (count, dtype, order; the first difference is named), then rank 0's parameters
///    and buffers are broadcast; `sync_buffers()` repeats the buffers' broadcast on demand;
///  - `no_sync()` (gradient accumulation: backward passes under it only add into the buckets)
///    and the reducer's options (bucket caps, unused parameters, compression hooks).
///
/// Rules: the module's tensors are contiguous, on the CPU, f32/f64/f16/bf16, and stay where
/// they are (no `.to()` after wrapping); the wrapper must outlive every backward pass through the
/// module and is neither copied nor moved (the hooks point at it). Zero the gradients with
/// `zero_grad()` or libtorch 1.13's `optimizer.zero_grad()` (which zeroes in place); never set
/// them to undefined (libtorch >= 2.0's `zero_grad()` does unless given `false`).
#pragma once

#if !KFT_WITH_LIBTORCH
#error "kft/libtorch/ddp.hpp needs the libtorch component: configure kft with KFT_WITH_LIBTORCH=ON and link kft::libtorch"
#endif

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/ddp/hooks.hpp>
#include <kft/ddp/reducer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/transport/concepts.hpp>

KFT_NAMESPACE_BEGIN
namespace libtorch {

/// @brief kft's dtype of a tensor the reducer can carry.
/// @throws usage_error naming the tensor when it is not f32, f64, f16 or bf16 on the CPU,
/// contiguous
inline dtype dtype_of(const at::Tensor& t, const std::string& what) {
  auto refuse = [&](const std::string& why) {
    throw usage_error(what + " " + why, error_site::of("libtorch ddp"));
  };
  if (!t.defined()) refuse("is an undefined tensor");
  if (!t.device().is_cpu())
    refuse("is on " + t.device().str() + ": kft's libtorch DDP runs CPU modules (a GPU module needs the NCCL group)");
  if (!t.is_contiguous()) refuse("is not contiguous: its gradient could not be a view into a bucket");
  switch (t.scalar_type()) {
    case at::kFloat: return dtype::f32;
    case at::kDouble: return dtype::f64;
    case at::kHalf: return dtype::f16;
    case at::kBFloat16: return dtype::bf16;
    default: refuse(std::string("has dtype ") + c10::toString(t.scalar_type()) + " (f32, f64, f16 or bf16 are carried)");
  }
  return dtype::f32;  // not reached
}

/// @brief A module's trainable tensors in its order, as the reducer sees them.
struct registered {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  std::vector<ddp::parameter> params;
};

inline registered trainable(const torch::nn::Module& m) {
  registered r;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!t.requires_grad()) continue;  // frozen tensors are not reduced (PyTorch's DDP skips them too)
    const dtype d = dtype_of(t, "parameter '" + item.key() + "'");
    r.names.push_back(item.key());
    r.tensors.push_back(t);
    r.params.push_back({static_cast<std::size_t>(t.numel()), d, item.key()});
  }
  if (r.params.empty()) throw usage_error("the module has no parameter that requires a gradient", error_site::of("libtorch ddp"));
  return r;
}

/// @brief Rank 0's values of `tensors` on every rank, one broadcast per dtype (collective).
template <async_communicator Group>
void broadcast_from_rank0(Group& g, const std::vector<at::Tensor>& tensors, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (dtype d : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    std::vector<at::Tensor> same;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (dtype_of(tensors[i], what + " " + std::to_string(i)) == d) same.push_back(tensors[i]);
    if (same.empty()) continue;
    std::vector<at::Tensor> flat;
    for (const auto& t : same) flat.push_back(t.reshape({-1}));
    at::Tensor packed = torch::cat(flat);
    g.broadcast(packed.data_ptr(), packed.data_ptr(), static_cast<std::size_t>(packed.numel()), d, 0, options{});
    std::int64_t at_ = 0;
    for (auto& t : same) {
      t.view({-1}).copy_(packed.narrow(0, at_, t.numel()));
      at_ += t.numel();
    }
  }
}

/// @brief Post-hooks on the gradient accumulators of `r`'s tensors: `on_ready(i)` runs inside the
/// autograd engine right after tensor i's gradient was written. Removed again on destruction.
class ready_hooks {
 public:
  template <class F>
  ready_hooks(const registered& r, F on_ready) {
    for (std::size_t i = 0; i < r.tensors.size(); ++i) {
      // The accumulator lives as long as someone holds it: hold it, or each forward makes a new one.
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(r.tensors[i]);
      if (!acc)
        throw usage_error("parameter '" + r.names[i] + "' has no gradient accumulator (is it a leaf tensor?)",
                          error_site::of("libtorch ddp"));
      const auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [on_ready, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            on_ready(i);
            return outputs;
          }));
      hooks_.emplace_back(std::move(acc), key);
    }
  }
  ready_hooks(const ready_hooks&) = delete;
  ready_hooks& operator=(const ready_hooks&) = delete;
  ~ready_hooks() {
    for (auto& [node, key] : hooks_) node->del_post_hook(key);
  }

 private:
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

/// @brief Points each of `r`'s tensors' `.grad()` at `data(i)` (a view: autograd accumulates there).
template <class Data>
void point_gradients_at(registered& r, Data data) {
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    at::Tensor& p = r.tensors[i];
    void* d = data(i);
    if (!p.grad().defined() || p.grad().data_ptr() != d)
      p.mutable_grad() = torch::from_blob(d, p.sizes(), p.options().requires_grad(false));
  }
}

struct ddp_options {
  ddp::reducer_options reducer{};  ///< bucket limits, unused parameters, deterministic layout, timeline
  /// Queue the reducer's finish() on the autograd engine from the first gradient of each
  /// backward pass, so backward() returns with averaged gradients (PyTorch's behaviour). Off:
  /// call finish() yourself after backward().
  bool finish_in_backward = true;
  bool broadcast_buffers = true;  ///< rank 0's buffers (batch-norm statistics, ...) at construction
};

/// @brief Wraps a module for data-parallel training over a kft process group (file comment).
template <async_communicator Group = group::process_group, ddp::comm_hook<Group> Hook = ddp::allreduce_avg>
class distributed_data_parallel {
 public:
  /// @brief Collective over the group (see the file comment).
  distributed_data_parallel(Group& g, std::shared_ptr<torch::nn::Module> module, ddp_options o = {}, Hook hook = {})
      : g_(g), module_(std::move(module)), o_(o) {
    if (!module_) throw usage_error("no module given", error_site::of("libtorch ddp"));
    reg_ = trainable(*module_);
    reducer_.emplace(g_, reg_.params, o_.reducer, std::move(hook));  // checks the model across ranks first
    broadcast_from_rank0(g_, reg_.tensors, "parameter");
    if (o_.broadcast_buffers) sync_buffers();
    point_gradients();
    hooks_.emplace(reg_, [this](std::size_t i) { ready(i); });
  }
  /// @brief A `torch::nn::ModuleHolder` (torch::nn::Linear, Sequential, TORCH_MODULE types).
  template <class Impl>
  distributed_data_parallel(Group& g, const torch::nn::ModuleHolder<Impl>& holder, ddp_options o = {}, Hook hook = {})
      : distributed_data_parallel(g, std::static_pointer_cast<torch::nn::Module>(holder.ptr()), o, std::move(hook)) {}

  distributed_data_parallel(const distributed_data_parallel&) = delete;
  distributed_data_parallel& operator=(const distributed_data_parallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  ddp::reducer<Group, Hook>& reducer() { return *reducer_; }
  /// @brief The registered parameters' names, in the reducer's order.
  const std::vector<std::string>& names() const { return reg_.names; }

  /// @brief Zeroes every gradient in place (their bucket views stay).
  void zero_grad() { reducer_->zero_grad(); }

  /// @brief While the guard lives, backward passes only accumulate into the buckets; the next
  /// backward pass outside it averages the sum (PyTorch's `with ddp.no_sync():`).
  auto no_sync() { return reducer_->no_sync(); }

  /// @brief Waits for every bucket of this backward pass (only with finish_in_backward off;
  /// otherwise backward() has done it). Harmless when nothing was marked.
  void finish() {
    if (!marked_) return;
    finish_step();
  }

  /// @brief Rank 0's buffers on every rank (collective).
  void sync_buffers() {
    std::vector<at::Tensor> bufs;
    for (const auto& b : module_->buffers(/*recurse=*/true))
      if (b.defined() && b.numel() > 0 && b.is_floating_point()) bufs.push_back(b);
    if (!bufs.empty()) broadcast_from_rank0(g_, bufs, "buffer");
  }

 private:
  // Each parameter's .grad() is a view into its bucket (again after the one rebuild).
  void point_gradients() {
    point_gradients_at(reg_, [this](std::size_t i) { return reducer_->gradient_data(i); });
    layout_ = reducer_->layout_version();
  }

  // Runs inside the autograd engine right after parameter i's gradient was accumulated.
  void ready(std::size_t i) {
    if (!marked_) {
      marked_ = true;
      if (o_.finish_in_backward)
        torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_step(); });
    }
    try {
      reducer_->mark_ready(i);
    } catch (...) {
      marked_ = false;
      throw;
    }
  }

  void finish_step() {
    marked_ = false;
    reducer_->finish();
    if (reducer_->layout_version() != layout_) point_gradients();
  }

  Group& g_;
  std::shared_ptr<torch::nn::Module> module_;
  ddp_options o_;
  registered reg_;
  std::optional<ddp::reducer<Group, Hook>> reducer_;
  std::optional<ready_hooks> hooks_;  // last: removed first
  std::uint64_t layout_ = 0;
  bool marked_ = false;
};

}  // namespace libtorch
KFT_NAMESPACE_END
