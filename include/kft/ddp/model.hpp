// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/model.hpp
/// @brief What the DDP trainer asks of a model (layer 1): its parameters, a forward and backward
/// pass that fills the gradients, and what a batch measured (a loss and any named metrics).
///
///     struct my_model {
///       std::vector<kft::ddp::tensor_ref> parameters();
///       std::vector<kft::ddp::metric> metrics() const { return {{"accuracy"}, {"max_error", kft::ddp::metric_op::max, false}}; }
///       kft::ddp::stats forward_backward(std::span<const std::uint32_t> samples, kft::ddp::gradients& g);
///       kft::ddp::stats evaluate(std::span<const std::uint32_t> samples);   // optional
///     };
///
/// A batch's `stats` hold the summed loss, the count it is a sum over (samples, tokens: the mean
/// loss is loss_sum / count) and one value per metric, in the order `metrics()` lists them.
/// The trainer merges them over micro-batches and steps, reduces them over the ranks by each
/// metric's `op` (sum, max, min) and reports each as value / count (`per_count`, a mean such
/// as an accuracy) or as it is (a maximum, a total). A model without `metrics()` reports its
/// loss alone (a regression, a next-token model); one without `evaluate()` trains without
/// evaluations. A classifier may still return `batch_stats` (loss, correct, count): that is
/// the metric "accuracy".
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief One parameter of a model: its name and its values.
struct tensor_ref {
  std::string name;
  std::span<float> value;
};

/// @brief How a metric is combined over batches and ranks.
enum class metric_op { sum, max, min };

/// @brief One named metric a model reports beside its loss.
struct metric {
  std::string name;               ///< a word: "accuracy", "tokens", "max_error" (logged as train_<name>, test_<name>)
  metric_op op = metric_op::sum;
  bool per_count = true;          ///< reported as value / count (a mean); false: as it is
};

/// @brief What a batch (or an epoch, or an evaluation) measured.
struct stats {
  static constexpr std::size_t max_metrics = 8;
  double loss_sum = 0.0;  ///< the loss summed over the batch
  double count = 0.0;     ///< what loss_sum (and each per_count metric) is a sum over: samples, tokens
  std::array<double, max_metrics> values{};  ///< metric k's value, in the order of metrics()
  double mean_loss() const noexcept { return count > 0 ? loss_sum / count : 0.0; }
};

/// @brief A classifier's statistics: summed loss, correct predictions, samples (the metric "accuracy").
struct batch_stats {
  double loss_sum = 0.0;
  std::uint64_t correct = 0;
  std::uint64_t count = 0;
  batch_stats& operator+=(const batch_stats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
    return *this;
  }
};

/// @brief The metrics and the combining of `stats` for one model (the same on every rank).
class metric_set {
 public:
  metric_set() = default;
  explicit metric_set(std::vector<metric> ms) : ms_(std::move(ms)) {}
  const std::vector<metric>& list() const noexcept { return ms_; }
  std::size_t size() const noexcept { return ms_.size(); }
  /// @brief Index of the metric called `name`, or size() when there is none.
  std::size_t find(std::string_view name) const {
    for (std::size_t k = 0; k < ms_.size(); ++k)
      if (ms_[k].name == name) return k;
    return ms_.size();
  }
  /// @brief Stats of nothing yet: sums 0, maxima -inf, minima +inf.
  stats empty() const {
    stats s;
    for (std::size_t k = 0; k < ms_.size(); ++k) s.values[k] = identity(ms_[k].op);
    return s;
  }
  /// @brief `into` += `b`, each metric by its op.
  void merge(stats& into, const stats& b) const {
    into.loss_sum += b.loss_sum;
    into.count += b.count;
    for (std::size_t k = 0; k < ms_.size(); ++k) {
      double& a = into.values[k];
      switch (ms_[k].op) {
        case metric_op::sum: a += b.values[k]; break;
        case metric_op::max: a = std::max(a, b.values[k]); break;
        case metric_op::min: a = std::min(a, b.values[k]); break;
      }
    }
  }
  /// @brief Metric k as reported: value / count for a per-count metric, else the value.
  double reported(const stats& s, std::size_t k) const {
    if (!ms_[k].per_count) return s.values[k];
    return s.count > 0 ? s.values[k] / s.count : 0.0;
  }
  static double identity(metric_op op) {
    switch (op) {
      case metric_op::max: return -std::numeric_limits<double>::infinity();
      case metric_op::min: return std::numeric_limits<double>::infinity();
      case metric_op::sum: break;
    }
    return 0.0;
  }
  /// @brief What must agree between ranks, as one string: each metric's name, op and per_count.
  std::string signature() const {
    std::string s;
    for (const auto& m : ms_) {
      s += m.name;
      s += ':';
      s += m.op == metric_op::sum ? "sum" : m.op == metric_op::max ? "max" : "min";
      s += m.per_count ? ":mean;" : ":value;";
    }
    return s;
  }

 private:
  std::vector<metric> ms_;
};

/// @brief Where a model's backward pass puts its gradients.
///
/// `g[i]` is parameter i's gradient buffer: overwrite it, or add into it when `accumulate()`
/// (a later micro-batch of an accumulated step). Call `ready(i)` once per parameter as soon
/// as its gradient is final: the reducer may send it while the rest of backward runs.
class gradients {
 public:
  using ready_fn = void (*)(void*, std::size_t);
  gradients(std::span<const std::span<float>> views, bool accumulate, ready_fn fn, void* ctx)
      : views_(views), accumulate_(accumulate), fn_(fn), ctx_(ctx) {}
  std::span<float> operator[](std::size_t i) const { return views_[i]; }
  std::size_t size() const noexcept { return views_.size(); }
  bool accumulate() const noexcept { return accumulate_; }
  void ready(std::size_t i) const { fn_(ctx_, i); }

 private:
  std::span<const std::span<float>> views_;
  bool accumulate_;
  ready_fn fn_;
  void* ctx_;
};

/// @brief A batch's result as a model may return it: `stats`, or a classifier's `batch_stats`.
template <class T>
concept batch_result = std::same_as<T, stats> || std::same_as<T, batch_stats>;

/// @brief What the trainer needs of a model.
///
///  - `parameters()`: every trainable tensor, in a fixed order (the same on every rank);
///  - `forward_backward(samples, g)`: trains on the samples (indices into its training set);
///    writes the gradients of the batch's *mean* loss into `g` (calling `g.ready(i)` for each)
///    and returns what the batch measured (`stats`, or `batch_stats` for a classifier);
///  - optional: `metrics()` (the named metrics in `stats::values`), `evaluate(samples)` (the
///    same statistics on evaluation samples, no gradients).
template <class M>
concept model = requires(M& m, std::span<const std::uint32_t> idx, gradients& g) {
  { m.parameters() } -> std::convertible_to<std::vector<tensor_ref>>;
  { m.forward_backward(idx, g) } -> batch_result;
};

/// @brief A model that can be evaluated (`evaluate(samples)` returning stats or batch_stats).
template <class M>
concept evaluable = model<M> && requires(M& m, std::span<const std::uint32_t> idx) {
  { m.evaluate(idx) } -> batch_result;
};

/// @brief The model's metrics: its `metrics()`, "accuracy" for a classifier, else none.
template <model M>
metric_set metrics_of(M& m) {
  if constexpr (requires { { m.metrics() } -> std::convertible_to<std::vector<metric>>; }) {
    return metric_set(m.metrics());
  } else {
    using R = decltype(m.forward_backward(std::span<const std::uint32_t>{}, std::declval<gradients&>()));
    if constexpr (std::same_as<R, batch_stats>) return metric_set({{"accuracy", metric_op::sum, true}});
    else return metric_set{};
  }
}

/// @brief A batch's result as `stats` (a classifier's correct predictions become metric 0).
inline stats as_stats(const stats& s) { return s; }
inline stats as_stats(const batch_stats& b) {
  stats s;
  s.loss_sum = b.loss_sum;
  s.count = static_cast<double>(b.count);
  s.values[0] = static_cast<double>(b.correct);
  return s;
}

/// @brief Compute threads one rank should use: the cores it may run on / ranks on its node.
inline int compute_threads(int local_ranks) {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return std::max(1, cores / std::max(1, local_ranks));
}

}  // namespace ddp
KFT_NAMESPACE_END
