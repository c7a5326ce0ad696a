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
/// A model trains on one of two kinds of data. An *indexed* model is given sample indices into
/// a data set of known size it holds itself (`fit(train_size, test_size)`). A *streaming* model
/// is given `record_batch`es instead: fixed-size records read from files by a `record_source`
/// (records.hpp; `fit(train_records, test_records)`), each rank reading only its share:
///
///       kft::ddp::stats forward_backward(const kft::ddp::record_batch& b, kft::ddp::gradients& g);
///       kft::ddp::stats evaluate(const kft::ddp::record_batch& b);          // optional
///
/// A record batch may carry padding rows (the epoch's ragged end, `record_batch::padding`): the
/// model leaves them out of its loss, its count and its metrics.
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
#include <type_traits>
#include <utility>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief One parameter of a model: its name and its values, f32 (`value`) or, for mixed
/// precision, bf16 or f16 (`bits`, with `type`): the trainer then keeps an f32 master copy that
/// the optimizer updates, and writes its rounding back into `bits` after every step.
///
///     std::vector<kft::bfloat16> w(n);
///     return {{"b", b}, kft::ddp::tensor_ref::bf16("w", w)};
struct tensor_ref {
  std::string name;
  std::span<float> value;             ///< an f32 parameter's values (empty for bf16 / f16)
  std::span<std::uint16_t> bits = {};  ///< a bf16 or f16 parameter's values, as stored
  dtype type = dtype::f32;            ///< f32, bf16 or f16

  static tensor_ref bf16(std::string name, std::span<bfloat16> v) {
    return {std::move(name), {}, {reinterpret_cast<std::uint16_t*>(v.data()), v.size()}, dtype::bf16};
  }
  static tensor_ref f16(std::string name, std::span<half> v) {
    return {std::move(name), {}, {reinterpret_cast<std::uint16_t*>(v.data()), v.size()}, dtype::f16};
  }
  /// @brief Elements.
  std::size_t size() const noexcept { return type == dtype::f32 ? value.size() : bits.size(); }
  /// @brief Bytes of the values as stored.
  std::size_t bytes() const noexcept { return type == dtype::f32 ? value.size_bytes() : bits.size_bytes(); }
  /// @brief The stored values' address (for hashes and broadcasts).
  void* data() const noexcept { return type == dtype::f32 ? static_cast<void*>(value.data()) : static_cast<void*>(bits.data()); }
};
static_assert(sizeof(bfloat16) == 2 && sizeof(half) == 2, "16-bit storage types");

/// @brief One rank's share of a global batch of records (records.hpp), as a streaming model gets it.
struct record_batch {
  std::size_t rows = 0;           ///< records in the share, padding included (ceil(n / N) for every rank)
  std::size_t real = 0;           ///< rows that are not padding
  std::size_t record_tokens = 0;  ///< tokens per row
  std::vector<std::uint32_t> tokens;  ///< rows x record_tokens, row after row, widened to u32
  std::vector<std::uint32_t> ids;     ///< each row's record number (across the files, in their order)
  std::vector<std::uint8_t> padding;  ///< 1: a padding row (a repeat), to leave out of losses and counts

  std::span<const std::uint32_t> row(std::size_t i) const {
    return {tokens.data() + i * record_tokens, record_tokens};
  }
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

/// @brief A gradient buffer of any floating type (mixed precision: bf16 or f16 buckets).
struct grad_view {
  void* data = nullptr;
  std::size_t size = 0;
  dtype type = dtype::f32;
};

/// @brief Where a model's backward pass puts its gradients.
///
/// `g[i]` is parameter i's gradient buffer (f32): overwrite it, or add into it when
/// `accumulate()` (a later micro-batch of an accumulated step). Call `ready(i)` once per
/// parameter as soon as its gradient is final: the reducer may send it while the rest of
/// backward runs.
///
/// **Mixed precision**: a bf16 or f16 parameter's gradient travels in its own type unless
/// `trainer_options::f32_gradients`; `type(i)` says which, and `as<kft::bfloat16>(i)` (or
/// `half`, `float`) is the buffer. `write(i, f32_gradient)` does it all: multiplies by the
/// loss scale, rounds to the buffer's type and assigns or adds. A model that computes in f16
/// itself multiplies its loss by `loss_scale()` instead (the trainer divides it out again
/// before the optimizer step and skips a step whose gradients overflowed).
class gradients {
 public:
  using ready_fn = void (*)(void*, std::size_t);
  /// @brief f32 gradients.
  gradients(std::span<const std::span<float>> views, bool accumulate, ready_fn fn, void* ctx)
      : f32_(views), accumulate_(accumulate), fn_(fn), ctx_(ctx) {}
  /// @brief Gradients of any floating type, with a loss scale (mixed precision).
  gradients(std::span<const grad_view> views, bool accumulate, ready_fn fn, void* ctx, float loss_scale = 1.0f)
      : typed_(views), accumulate_(accumulate), fn_(fn), ctx_(ctx), scale_(loss_scale) {}
  /// @brief Parameter i's f32 gradient buffer. @throws usage_error when it is bf16 or f16
  std::span<float> operator[](std::size_t i) const {
    if (typed_.empty()) return f32_[i];
    return as<float>(i);
  }
  /// @brief Parameter i's gradient buffer as T (float, kft::bfloat16 or kft::half: its type(i)).
  template <class T>
  std::span<T> as(std::size_t i) const {
    const dtype have = type(i);
    if (have != dtype_of<T>::value)
      throw usage_error("gradients: parameter " + std::to_string(i) + "'s gradient buffer is " +
                        std::string(name(have)) + ", asked for as " + std::string(name(dtype_of<T>::value)) +
                        " (use gradients::type(i), or write(i, values))");
    if (typed_.empty()) return {reinterpret_cast<T*>(f32_[i].data()), f32_[i].size()};
    return {static_cast<T*>(typed_[i].data), typed_[i].size};
  }
  /// @brief The type parameter i's gradient travels in.
  dtype type(std::size_t i) const { return typed_.empty() ? dtype::f32 : typed_[i].type; }
  std::size_t size() const noexcept { return typed_.empty() ? f32_.size() : typed_.size(); }
  bool accumulate() const noexcept { return accumulate_; }
  /// @brief The factor a model computing in f16 multiplies its loss by (1 without loss scaling).
  float loss_scale() const noexcept { return scale_; }
  /// @brief Parameter i's gradient from f32 values: x loss_scale(), rounded to the buffer's
  /// type, assigned (or added when accumulate()). Does not call ready(i).
  void write(std::size_t i, std::span<const float> v) const {
    const dtype t = type(i);
    const std::size_t n = typed_.empty() ? f32_[i].size() : typed_[i].size;
    if (v.size() != n)
      throw usage_error("gradients: write(" + std::to_string(i) + ") of " + std::to_string(v.size()) +
                        " values into a gradient of " + std::to_string(n));
    const float s = scale_;
    const bool add = accumulate_;
    if (t == dtype::f32) {
      auto g = as<float>(i);
      for (std::size_t k = 0; k < n; ++k) g[k] = add ? g[k] + s * v[k] : s * v[k];
    } else if (t == dtype::bf16) {
      auto g = as<bfloat16>(i);
      for (std::size_t k = 0; k < n; ++k) g[k] = bfloat16(add ? static_cast<float>(g[k]) + s * v[k] : s * v[k]);
    } else {
      auto g = as<half>(i);
      for (std::size_t k = 0; k < n; ++k) g[k] = half(add ? static_cast<float>(g[k]) + s * v[k] : s * v[k]);
    }
  }
  void ready(std::size_t i) const { fn_(ctx_, i); }

 private:
  std::span<const std::span<float>> f32_;
  std::span<const grad_view> typed_;
  bool accumulate_;
  ready_fn fn_;
  void* ctx_;
  float scale_ = 1.0f;
};

/// @brief A batch's result as a model may return it: `stats`, or a classifier's `batch_stats`.
template <class T>
concept batch_result = std::same_as<T, stats> || std::same_as<T, batch_stats>;

/// @brief What the trainer needs of a model.
///
///  - `parameters()`: every trainable tensor, in a fixed order (the same on every rank);
///  - `forward_backward(batch, g)`: trains on the batch (an indexed model: sample indices into
///    its training set; a streaming model: a `record_batch`); writes the gradients of the
///    batch's *mean* loss into `g` (calling `g.ready(i)` for each) and returns what the batch
///    measured (`stats`, or `batch_stats` for a classifier);
///  - optional: `metrics()` (the named metrics in `stats::values`), `evaluate(batch)` (the
///    same statistics on evaluation data, no gradients).
template <class M>
concept indexed_model = requires(M& m, std::span<const std::uint32_t> idx, gradients& g) {
  { m.parameters() } -> std::convertible_to<std::vector<tensor_ref>>;
  { m.forward_backward(idx, g) } -> batch_result;
};

/// @brief A model that trains on streamed records (`forward_backward(const record_batch&, g)`).
template <class M>
concept streaming_model = requires(M& m, const record_batch& b, gradients& g) {
  { m.parameters() } -> std::convertible_to<std::vector<tensor_ref>>;
  { m.forward_backward(b, g) } -> batch_result;
};

/// @brief An indexed or a streaming model (one of the two: the trainer refuses a model that is both).
template <class M>
concept model = indexed_model<M> || streaming_model<M>;

/// @brief What a model's forward_backward takes: sample indices, or a record batch.
template <model M>
using batch_of = std::conditional_t<streaming_model<M> && !indexed_model<M>, const record_batch&,
                                    std::span<const std::uint32_t>>;

/// @brief A model that can be evaluated (`evaluate(batch)` returning stats or batch_stats).
template <class M>
concept evaluable = model<M> && requires(M& m, batch_of<M> b) {
  { m.evaluate(b) } -> batch_result;
};

/// @brief The model's metrics: its `metrics()`, "accuracy" for a classifier, else none.
template <model M>
metric_set metrics_of(M& m) {
  if constexpr (requires { { m.metrics() } -> std::convertible_to<std::vector<metric>>; }) {
    return metric_set(m.metrics());
  } else {
    using R = decltype(m.forward_backward(std::declval<batch_of<M>>(), std::declval<gradients&>()));
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
