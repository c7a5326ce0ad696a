// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/trainer.hpp
/// @brief The generic DDP trainer: your model and optimizer (layer 1) on kft's reducer and
/// process group (layer 2), the way wrapping a model in DDP and a DistributedSampler does in
/// Python.
///
///     auto pg = kft::group::make_process_group(me, store.client);
///     my_model m(...);                               // kft::ddp::model (below)
///     kft::ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
///     kft::ddp::trainer t(pg, m, opt, {.batch = 64, .epochs = 3});
///     t.fit(train_size, test_size);                 // or t.step(indices) ... t.join() in your own loop
///     t.fit(train_records, test_records);           // a streaming model: record sources (records.hpp)
///
/// What it does (docs/ddp.md):
///  - **start**: the model's parameters must match on every rank (the reducer names the first
///    difference); parameters and optimizer state are broadcast from rank 0; with `resume`,
///    every rank loads the newest valid checkpoint rank 0 found and proves it loaded the same.
///  - **data**: an indexed model is given this rank's sample indices of each global batch
///    (`distributed_sampler`); a streaming model the records of its share, read from files by a
///    `record_source` (records.hpp) whose position is checkpointed and resumes exactly, also on
///    another number of ranks. A share that is all padding (the ragged end of an epoch, more
///    ranks than records left) is not trained on and counts as no contribution.
///  - **steps**: this rank's share of each global batch, forward and
///    backward through the model, whose gradients are views into the reducer's buckets and
///    travel while the backward pass still runs; `accumulate` micro-batches per optimizer step
///    (all but the last under `no_sync`).
///  - **uneven inputs** (`step` + `join` in your own loop): a rank that runs dry shadows the
///    others' steps with zero gradients until every rank has; the count of contributing
///    micro-batches rides in the last bucket (no collective of its own), and the optimizer
///    step divides by it, so the final model is the same on every rank.
///  - **deterministic mode**: a global batch is cut into `micro_shards` fixed shards; each
///    shard's gradient is turned into 64-bit fixed point and the shards are summed as integers,
///    which is exact in any order, so the parameters are bit-identical for any number of ranks
///    that divides `micro_shards`, any bucket cap and any arrival order (fixed_point.hpp: the
///    arithmetic and the shard gradients beside the reducer's i64 buckets).
///  - **the trainer's own counts** (contributions, ranks with a non-finite loss or gradient)
///    ride in the reducer's trailer, in the bucket reduced last (step_counts.hpp).
///  - **checks, always on**: every `verify_every` steps and at every checkpoint the ranks
///    compare a hash of every parameter (`desync_error` names the first parameter and the
///    ranks that differ: a layer-2 fault); a NaN or infinite loss or gradient stops every rank
///    at that step (`numerics_error` names the rank, the step and the first bad parameter: a
///    layer-1 fault).
///  - **checkpoints** (checkpoint.hpp): model, optimizer state, sampler (seed, epoch, cursor),
///    step and the trainer's RNG, written atomically by rank 0.
///  - **any task**: the model reports a loss and any named metrics (model.hpp); they are
///    merged over micro-batches, reduced over the ranks and reported; evaluation is optional.
///  - **mixed precision** beside the trainer (precision.hpp): bf16 / f16 parameters with f32
///    master weights that the optimizer updates, gradients in 16 bits or f32, loss scaling for
///    f16 (an overflow on any rank skips the step on every rank); mixed.hpp's half_params gives
///    an f32 model 16-bit parameters.
///  - **a learning-rate schedule** (schedule.hpp) applied before every step, and
///    `stop_at_target` to end fit() at the first evaluation that reaches the target.
///  - **reporting** beside the trainer (report.hpp): observers told of the start, each step,
///    each evaluation and epoch, and the summary; the default one prints on rank 0 (a live
///    line on a terminal, a table of epochs, `quiet`, a JSON-lines log).
///  - **stragglers** (stragglers.hpp): each rank's own work per step (its step less the time
///    blocked in the step's collectives) is summed over windows of `stragglers.every` steps
///    and allgathered (one allgather of two f64 per rank per window); a rank `threshold` above
///    the others' median for `sustain` windows is named on rank 0's console and JSON log and to
///    every observer (`on_straggler`), once, and once again when it recovers.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <concepts>
#include <limits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/fixed_point.hpp>
#include <kft/ddp/step_counts.hpp>
#include <kft/ddp/model.hpp>
#include <kft/ddp/optim.hpp>
#include <kft/ddp/precision.hpp>
#include <kft/ddp/records.hpp>
#include <kft/ddp/reducer.hpp>
#include <kft/ddp/schedule.hpp>
#include <kft/ddp/report.hpp>
#include <kft/ddp/stragglers.hpp>
#include <kft/ddp/sampler.hpp>
#include <kft/ddp/zero.hpp>
#include <kft/group/process_group.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief Layer 1 went wrong: a NaN or infinite loss or gradient.
class numerics_error : public error {
  using error::error;
};
/// @brief Layer 2 went wrong: replicas that should be identical are not.
class desync_error : public mismatch_error {
  using mismatch_error::mismatch_error;
};

/// @brief The trainer's reductions: float buckets averaged, integer buckets summed (the
/// deterministic mode's fixed point and the contribution counts). With ZeRO stage 1 (`sharded`)
/// every gradient bucket is reduce-scattered instead: rank r gets the reduction of its slice
/// [r c/N, (r + 1) c/N) only; the trainer's own counters (their own f64 bucket then) are
/// still allreduced, since every rank needs them.
struct trainer_hook {
  bool sharded = false;
  template <class G>
  auto launch(G& g, bucket_view& b) {
    const bool floating = b.type == dtype::f32 || b.type == dtype::f64 || b.type == dtype::f16 || b.type == dtype::bf16;
    const op_kind op = floating ? op_kind::avg : op_kind::sum;
    if (!sharded || b.type == dtype::f64) return g.allreduce_async(b.data, b.data, b.count, b.type, op, b.opts);
    const std::size_t per = b.count / static_cast<std::size_t>(g.size()), bytes = size_of(b.type);
    auto* base = static_cast<unsigned char*>(b.data);
    std::memset(base + b.used * bytes, 0, (b.count - b.used) * bytes);  // the padding adds nothing
    return g.reduce_scatter_async(b.data, base + static_cast<std::size_t>(g.rank()) * per * bytes, per, b.type, op,
                                  b.opts);
  }
  void complete(bucket_view&) {}
};

struct trainer_options {
  std::uint64_t batch = 64;       ///< samples per rank per micro-batch
  std::uint64_t epochs = 1;
  std::uint64_t accumulate = 1;   ///< micro-batches per optimizer step
  std::uint64_t seed = 0;         ///< the sampler's (and the trainer RNG's) seed
  bool shuffle = true;
  bool drop_last = false;         ///< drop each epoch's last, shorter global batch
  /// Bit-identical results for any number of ranks dividing `micro_shards` (file comment).
  bool deterministic = false;
  std::uint64_t global_batch = 0;  ///< deterministic: samples per micro-batch over all ranks (0: batch x ranks)
  std::uint64_t micro_shards = 0;  ///< deterministic: fixed shards per global batch (0: the number of ranks)
  int fraction_bits = 32;          ///< deterministic: fixed point with 2^-fraction_bits resolution
  std::uint64_t verify_every = 100;  ///< steps between replica comparisons (0: only at checkpoints)
  std::filesystem::path checkpoint_dir;  ///< empty: no checkpoints
  std::uint64_t checkpoint_every = 0;    ///< steps (0: at the end of each epoch)
  std::uint64_t keep_checkpoints = 2;
  bool resume = false;                   ///< start from the newest valid checkpoint, if any
  write_progress checkpoint_progress;    ///< called while rank 0 writes a checkpoint
  std::uint64_t max_steps = 0;           ///< stop after this many optimizer steps (0: no limit)
  /// Called on every rank after each optimizer step of fit() with the step's number (learning
  /// rate schedules, custom logging); runs before that step's evaluation and checkpoint.
  std::function<void(std::uint64_t)> on_step;
  /// The learning rate of every optimizer step (schedule.hpp: warm-up, then constant, linear or
  /// cosine decay), set through the optimizer's set_lr before the step; peak 0: the optimizer's own.
  lr_schedule lr;
  std::uint64_t eval_every = 0;          ///< steps between evaluations (0: at the end of each epoch)
  std::uint64_t eval_batch = 1000;
  /// What to report the time to: the first evaluation whose `metric` ("loss" or one of the
  /// model's metrics) is >= `value` (`at_most`: <=). Needs evaluate() and a test set.
  struct goal {
    std::string metric;  ///< "" : no target
    double value = 0.0;
    bool at_most = false;
  } target;
  double target_accuracy = 0.0;          ///< shorthand for target {"accuracy", value}
  bool stop_at_target = false;           ///< end fit() at the first evaluation that reaches the target
  reducer_options reducer{};
  /// Going on without a lost rank (group/shrink.hpp; issue 46): with a store, fit() answers a
  /// rank's death (a remote_error from the group) by shrinking the group (the survivors agree
  /// through this store), rebuilding the reducer over it and agreeing on where training stands:
  /// a step no survivor finished is redone, its global batch shared by the survivors (each
  /// sample is still seen once per epoch); a step some survivor finished is taken from it.
  /// Evaluations, each epoch's statistics, checkpoints and the run's summary are survived the
  /// same way (redone, or taken from a survivor that finished them; a checkpoint whose writer
  /// was lost is said and skipped, never half-written).
  /// Without a store the error ends fit() (a restart from a checkpoint). Needs a
  /// process_group that can shrink (a node's shared memory, the Gloo group across nodes), the
  /// same group for gradients and control, no ZeRO; deterministic mode also needs micro_shards
  /// to stay a multiple of the size.
  ///
  /// Growing back (healing): while the group has lost ranks, rank 0 asks the store at every
  /// step boundary whether ranks wait to join (a worker kftrun restarted under
  /// `--on-failure heal`, which builds its group with `process_group::join` or, across nodes,
  /// `join_rebuilt`); if so the group
  /// admits them and a survivor sends them its parameters, optimizer state, step, sampler
  /// position and RNG over the group (no checkpoint file). A trainer built on a joined group
  /// (`newcomer()`) receives that state in its constructor (a streaming model's: when its fit()
  /// starts, after its records are compared with the members') and trains on from that step. Costs
  /// one store call and one 8-byte broadcast per step, only while ranks are missing.
  std::shared_ptr<rendezvous::store> shrink_store;
  group::shrink_options shrink;
  /// ZeRO stage 1 (0: off): the optimizer state is sharded across the ranks. Gradients are
  /// reduce-scattered, each rank updates its slice of every bucket (parameters and optimizer
  /// state) and the parameters are allgathered: the bytes of one allreduce, 1/N of the
  /// optimizer's memory and compute. Checkpoints hold the whole state (gathered when written),
  /// so a run resumes on any number of ranks, sharded or not. Buckets keep their first layout
  /// (no rebuild: the shards would move).
  int zero_stage = 0;
  /// Mixed precision (bf16 / f16 parameters, tensor_ref::bf16 and ::f16; file comment): their
  /// gradients travel in f32 buckets instead of the parameter's own type.
  bool f32_gradients = false;
  /// Loss scaling (precision.hpp, as torch.amp's GradScaler): the gradients are stored x scale,
  /// an overflow (a non-finite gradient on any rank) skips the step on every rank and multiplies
  /// the scale by `backoff`; `interval` steps in a row without one multiply it by `growth`.
  using loss_scaling = ddp::loss_scaling;
  loss_scaling loss_scale;
  // Reporting (rank 0).
  bool quiet = false;                    ///< rank 0 prints only the summary line (and what a lost rank changed)
  std::string log_json;                  ///< JSON-lines log file ("" = none)
  int threads = 0;                       ///< compute threads per rank, for the report (0: not reported)
  double baseline_samples_per_s = 0.0;   ///< one rank's rate, for the weak-scaling efficiency
  std::string label;                     ///< what is trained, for the banner
  /// Naming a slow rank (stragglers.hpp): windows of `every` steps (0: off), `threshold` above
  /// the other ranks' median work per step, `sustain` windows in a row.
  straggler_options stragglers;
  /// Told what the run does (report.hpp), besides the default console report; they outlive the trainer.
  std::vector<observer*> observers;
};

template <class M, optimizer O, class Group = group::process_group, class Control = Group>
class trainer {
  // (M is checked here rather than in the template head: an indexed or a streaming model is a
  // disjunction, whose failure the compiler reports without saying which part is missing.)
  static_assert(model<M>,
                "kft::ddp::trainer<M>: M is not a kft::ddp::model (model.hpp): it needs parameters() returning "
                "std::vector<tensor_ref>, and forward_backward(std::span<const std::uint32_t>, gradients&) (an indexed "
                "model) or forward_backward(const record_batch&, gradients&) (a streaming one) returning "
                "kft::ddp::stats or batch_stats (the concept batch_result)");

 public:
  /// True when the gradients, parameters and optimizer live on a device (a GPU group: the
  /// model's tensors are device memory, the optimizer a device one such as `cuda_sgd`).
  static constexpr bool on_device = device_buffers_v<Group>;
  static_assert(!device_buffers_v<Control>, "the trainer's control group carries host arrays: pass a host group");
  /// True when the model trains on streamed records (model.hpp's streaming_model).
  static constexpr bool streams = streaming_model<M>;
  static_assert(!(streams && indexed_model<M>),
                "a model takes either sample indices or record batches in forward_backward, not both");
  /// What one micro-batch of this rank holds: sample indices, or records.
  using batch_type = std::conditional_t<streams, record_batch, std::vector<std::uint32_t>>;
  static_assert(!on_device || requires(O& o) {
    { o.end_step() } -> std::convertible_to<std::size_t>;
  }, "a trainer over a device group needs a device optimizer (end_step(): e.g. kft::ddp::cuda_sgd, <kft/ddp/cuda_optim.cuh>)");

  /// @brief Collective: builds the reducer, resumes when asked, broadcasts rank 0's state and
  /// verifies the replicas.
  trainer(Group& g, M& m, O& opt, trainer_options o = {})
    requires(std::same_as<Group, Control>)
      : trainer(g, g, m, opt, std::move(o)) {}

  /// @brief The same over two groups: `g` carries the gradients (a device group: buckets in
  /// device memory, the model's tensors on the device) and `control` the trainer's own small
  /// host collectives (statistics, replica hashes, counters), e.g. the job's shared-memory
  /// process group beside a CUDA IPC or NCCL communicator. Both span the same ranks.
  trainer(Group& g, Control& control, M& m, O& opt, trainer_options o = {})
      : g_(g), c_(control), m_(m), opt_(opt), o_(std::move(o)), tensors_(m_.parameters()), rng_{o_.seed ^ 0x6B667472ull} {
    if (tensors_.empty()) throw usage_error("trainer: the model has no parameters", site("ddp trainer"));
    if (c_.size() != g_.size() || c_.rank() != g_.rank())
      throw usage_error("trainer: the control group is rank " + std::to_string(c_.rank()) + " of " +
                            std::to_string(c_.size()) + " but the gradient group rank " + std::to_string(g_.rank()) +
                            " of " + std::to_string(g_.size()) + " (both must span the same ranks, in the same order)",
                        site("ddp trainer"));
    if constexpr (on_device) refuse_on_device();
    if (o_.batch == 0 || o_.accumulate == 0 || o_.eval_batch == 0)
      throw usage_error("trainer: batch, accumulate and eval_batch must be >= 1", site("ddp trainer"));
    const auto n = static_cast<std::uint64_t>(g_.size());
    if (o_.deterministic) {
      if (!o_.global_batch) o_.global_batch = o_.batch * n;
      if (!o_.micro_shards) o_.micro_shards = n;
      if (o_.micro_shards % n != 0)
        throw usage_error("trainer: deterministic mode needs micro_shards (" + std::to_string(o_.micro_shards) +
                              ") to be a multiple of the number of ranks (" + std::to_string(n) + ")",
                          site("ddp trainer"));
      if (o_.fraction_bits < 8 || o_.fraction_bits > 48)
        throw usage_error("trainer: fraction_bits = " + std::to_string(o_.fraction_bits) + " (8..48)",
                          site("ddp trainer"));
    } else {
      o_.global_batch = o_.batch * n;
    }
    try {
      o_.lr.check();
    } catch (const usage_error& e) {
      throw usage_error(e.detail(), site("ddp trainer"));
    }
    if constexpr (!requires { opt_.set_lr(1.0f); })
      if (o_.lr.on())
        throw usage_error("trainer: a learning-rate schedule (trainer_options::lr) needs an optimizer with set_lr(float); " +
                              opt_.name() + " has none",
                          site("ddp trainer"));
    if (o_.zero_stage != 0 && o_.zero_stage != 1)
      throw usage_error("trainer: zero_stage = " + std::to_string(o_.zero_stage) + " (0: replicated optimizer state, "
                            "1: ZeRO stage 1)",
                        site("ddp trainer"));
    if (o_.shrink_store) refuse_unshrinkable();
    try {
      strag_ = straggler_detector(o_.stragglers);
    } catch (const usage_error& e) {
      throw usage_error(e.detail(), site("ddp trainer"));
    }
    restart_straggler_windows();
    set_up_metrics();
    console_.emplace(g_.rank(), g_.size(), o_.quiet, o_.log_json);
    observers_.push_back(&*console_);
    for (observer* x : o_.observers)
      if (x) observers_.push_back(x);
    // The reducer: the model's parameters, and the trainer's own two values (contributing
    // micro-batches, ranks with a non-finite loss) as the reducer's trailer, which travels in
    // the bucket finish() launches last.
    set_up_precision();
    std::vector<parameter> ps;
    counters_ = step_counters<on_device>(o_.zero_stage == 1, o_.deterministic);  // the trailer's type (step_counts.hpp)
    sizes_.reserve(tensors_.size());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      ps.push_back({tensors_[i].size(), mw_.gradient_type(i), tensors_[i].name});
      sizes_.push_back(tensors_[i].size());
    }
    reducer_options ro = o_.reducer;
    ro.trailer = counters_.size;
    ro.trailer_type = counters_.type();
    if (o_.deterministic) ro.deterministic = true;
    if constexpr (requires { m_.stream(); })  // a device model's stream: the gradients' order
      if (ro.stream == nullptr) ro.stream = static_cast<void*>(m_.stream());
    if (!ro.trace) {  // KFT_TIMELINE=dir: the trainer's own timeline (buckets, comm, its compute spans)
      auto tl = std::make_unique<timeline>(timeline::from(environment::process(), g_.rank()));
      if (tl->on()) tl_ = std::move(tl);
      ro.trace = tl_.get();
    }
    if (o_.zero_stage) {
      ro.rebuild_buckets = false;
      ro.bucket_multiple = static_cast<std::size_t>(g_.size());
      ro.find_unused_parameters = false;
    }
    params_ = ps;
    ro_ = ro;
    r_.emplace(g_, std::move(ps), ro, trainer_hook{o_.zero_stage == 1});
    if (typed_grads_) typed_views_.resize(tensors_.size());
    if (o_.zero_stage) {
      zero_.emplace(opt_);
      zero_->bind(*r_, g_.rank(), g_.size());
    } else {
      opt_.bind(sizes_);
    }
    views_.resize(tensors_.size());
    if (o_.deterministic) fixed_.emplace(o_.fraction_bits, o_.micro_shards * o_.accumulate, sizes_);
    verify_metrics();
    if (joined_running_group()) {  // a restarted worker: the members' state, over the group
      // (a streaming model's when its fit() starts: the records are compared first, and the
      // members wait for it there)
      stateless_ = true;
      if constexpr (streams) {
        welcome_pending_ = true;
      } else {
        tell([&](observer& x) { x.on_membership(joiner_point()); });
        (void)welcome_phase();
      }
      return;
    }
    if (o_.resume && !o_.checkpoint_dir.empty()) resume();
    broadcast_state();
    verify_replicas("start");
  }

  const trainer_options& settings() const noexcept { return o_; }
  std::uint64_t step_count() const noexcept { return step_; }
  std::uint64_t epoch() const noexcept {
    if constexpr (streams) return src_ ? src_->epoch() : epoch_;
    else return sampler_ ? sampler_->epoch() : epoch_;
  }
  const reducer<Group, trainer_hook>& reduction() const { return *r_; }
  /// @brief The trainer's RNG (seeded from the options, kept in checkpoints): for dropout and the like.
  splitmix64& rng() noexcept { return rng_; }
  /// @brief A hash of every parameter's bits (equal models, equal values).
  std::uint64_t parameters_hash() const {
    std::uint64_t h = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) h = tensor_hash(i, h);
    return h;
  }
  /// @brief Exposed communication so far: seconds waiting in the reducer's finish().
  double exposed_comm_seconds() const noexcept { return comm_s_; }
  /// @brief Seconds spent in the optimizer's update loops so far (this rank's shard with ZeRO-1).
  double optimizer_seconds() const noexcept { return opt_s_; }
  /// @brief The straggler detection (trainer_options::stragglers): who stands named, the last
  /// window's verdicts.
  const straggler_detector& stragglers() const noexcept { return strag_; }
  /// @brief The optimizer state this rank holds, in bytes (with ZeRO-1 about 1/N of the whole).
  std::size_t optimizer_state_bytes() {
    if constexpr (requires { opt_.state_bytes(); }) return opt_.state_bytes();  // a device optimizer's
    std::size_t b = 0;
    for (const auto& buf : opt_.state().buffers)
      for (const auto& v : buf) b += v.size() * sizeof(float);
    return b;
  }

  /// @brief The model's metrics (the order of stats::values).
  const metric_set& metrics() const noexcept { return ms_; }

  /// @brief One optimizer step on this rank's samples `indices` (your own loop; accumulate = 1).
  /// Every rank calls step() until it runs out of data, then join(). Returns this rank's
  /// statistics of the step.
  stats step(std::span<const std::uint32_t> indices)
    requires(!streams)
  {
    own_loop_step();
    next_micro().assign(indices.begin(), indices.end());
    auto s = run_step();
    after_step();
    return s;
  }
  /// @brief The same for a streaming model: this rank's records (`record_source::read`).
  stats step(const record_batch& records)
    requires streams
  {
    own_loop_step();
    next_micro() = records;  // reuses the slot's buffers once warm
    auto s = run_step();
    after_step();
    return s;
  }

  /// @brief This rank has no more data: shadow the others' steps (zero gradients, the same
  /// optimizer updates) until every rank has joined. Returns the steps shadowed.
  std::uint64_t join() {
    std::uint64_t shadowed = 0;
    for (;;) {
      auto& r = *r_;
      r.zero_grad();
      for (std::size_t i = 0; i < tensors_.size(); ++i) r.mark_ready(i);  // the counts stay 0
      timed_finish();
      const auto [contributions, bad, overflow] = counters_.read(*r_, g_.size());
      if (contributions == 0) break;  // every rank has joined
      check_loss(bad, false);
      if (!overflowed(overflow)) apply(contributions);
      ++step_;
      trace::note_step(static_cast<std::int64_t>(step_));
      ++shadowed;
      after_step();
    }
    return shadowed;
  }

  /// @brief Trains on samples 0..train_size-1 and evaluates on 0..test_size-1 (the model's
  /// sets; test_size 0: no evaluations) for `epochs` epochs, or until `max_steps`.
  fit_summary fit(std::uint64_t train_size, std::uint64_t test_size = 0)
    requires(!streams)
  {
    if (test_size > 0 && !evaluable<M>)
      throw usage_error("trainer: fit() was given " + std::to_string(test_size) +
                            " test samples but the model has no evaluate(samples)",
                        site("ddp fit"));
    if (!target_.metric.empty() && test_size == 0)
      throw usage_error("trainer: a target (" + target_words() + ") needs evaluations: pass fit() a test set",
                        site("ddp fit"));
    sampler_.emplace(sampler_options{train_size, o_.seed, o_.shuffle, o_.drop_last});
    test_size_ = test_size;
    return run_fit(train_size, test_size);
  }

  /// @brief A streaming model: trains on `train`'s records (each rank reading its share) and
  /// evaluates on all of `test`'s, if given, for `epochs` epochs or until `max_steps`.
  /// Collective: first checks that every rank has the same sources (verify_same_source).
  /// The sources' own seed, shuffle and drop_last apply (trainer_options' are the indexed
  /// sampler's); `train`'s position is part of the checkpoints and resumes exactly.
  fit_summary fit(record_source& train, record_source* test = nullptr)
    requires streams
  {
    if (test && !evaluable<M>)
      throw usage_error("trainer: fit() was given test records but the model has no evaluate(const record_batch&)",
                        site("ddp fit"));
    if (!target_.metric.empty() && !test)
      throw usage_error("trainer: a target (" + target_words() + ") needs evaluations: pass fit() test records",
                        site("ddp fit"));
    if (test == &train)
      throw usage_error("trainer: the test records are the training source itself (pass another record_source; "
                            "evaluating moves its position)",
                        site("ddp fit"));
    if (welcome_pending_) {  // a rank that joined a running group: the members' state now
      welcome_pending_ = false;
      src_ = &train;
      test_src_ = test;
      tell([&](observer& x) { x.on_membership(joiner_point()); });
      (void)welcome_phase();
    } else {
      verify_same_source(c_, train, options{});
      if (test) verify_same_source(c_, *test, options{});
    }
    if (restored_ && !joined_) {
      const auto theirs = record_fingerprint::decode(restored_records_);
      const std::string diff =
          theirs ? difference(*theirs, "the checkpoint", train.fingerprint(), "this run's records", false)
                 : std::string("its records fingerprint does not decode");
      if (!diff.empty())
        throw usage_error("trainer: checkpoint " + restored_what_ + " was written for other records: " + diff,
                          site("ddp fit"));
    }
    src_ = &train;
    test_src_ = test;
    test_size_ = test ? test->size() : 0;
    return run_fit(train.size(), test_size_);
  }

 private:
  // The data's position: the indexed sampler, or the record source.
  auto& feed() {
    if constexpr (streams) return *src_;
    else return *sampler_;
  }
  const auto& feed() const {
    if constexpr (streams) return *src_;
    else return *sampler_;
  }
  void own_loop_step() {
    if (o_.deterministic)
      throw usage_error("trainer: step() is the normal mode's; deterministic training runs through fit()",
                        site("ddp step"));
    micro_n_ = 0;
  }

  fit_summary run_fit(std::uint64_t train_size, std::uint64_t test_size) {
    auto& data = feed();
    if (restored_) {
      data.restore(*restored_);
      if (!data.next(o_.global_batch)) {  // saved at an epoch's very end: the next one starts
        restored_->epoch += 1;
        restored_->cursor = 0;
        data.restore(*restored_);
      }
    } else {
      data.set_epoch(epoch_);
    }
    fit_summary sum;
    sum.resumed_from = resumed_step_;
    sum.target = target_words();
    tell([&](observer& x) { x.on_start(run_description(train_size, test_size)); });
    const auto t_start = clk::now();
    const std::uint64_t first_epoch = data.epoch();
    bool stop = false;
    for (std::uint64_t e = first_epoch; e < o_.epochs && !stop; ++e) {
      if (e != first_epoch || !restored_) data.set_epoch(e);
      restored_.reset();
      epoch_ = e;
      stats es = ms_.empty();
      std::uint64_t epoch_samples = 0, my_samples = 0;
      const double comm0 = comm_s_;
      const auto te = clk::now();
      double eval_s = 0.0;
      const std::uint64_t steps_in_epoch = (data.batches_left(o_.global_batch) + o_.accumulate - 1) / o_.accumulate;
      std::uint64_t k = 0;
      while (!stop) {
        // (a step follows: they join at it; a change of the group starts the boundary again)
        if (o_.shrink_store && data.next(o_.global_batch) && admit_joiners()) continue;
        const auto position = data.state();  // (a few integers: where a redone step starts)
        const std::uint64_t step_before = step_;
        const auto t_data = clk::now();
        if (!gather_micro_batches()) break;
        work_s_ += seconds(t_data, clk::now());  // (reading this rank's share is its own work)
        try {
          const stats st = run_step();
          after_step();
          for (const auto& mb : micro()) my_samples += rows_of(mb);
          ms_.merge(es, st);
        } catch (const error& lost) {
          if (!o_.shrink_store || !a_loss(lost)) throw;
          if (go_on_without_lost_ranks(lost, phase::step, step_before) == recovery::redo) {
            data.restore(position);  // this rank redoes the step with the others, shares re-cut
            continue;
          }
        }
        ++phases_;
        last_phase_ = phase::step;
        if (o_.on_step) o_.on_step(step_);
        ++k;
        sum.samples += last_samples_;
        epoch_samples += last_samples_;
        const progress_point pp{e + 1, o_.epochs, k, steps_in_epoch, &es, seconds(te, clk::now()), my_samples};
        tell([&](observer& x) { x.on_progress(pp); });
        if (test_size_ && o_.eval_every && step_ % o_.eval_every == 0) {
          const auto t0 = clk::now();
          record_eval(sum, seconds(t_start, t0) - eval_total_);
          eval_s += seconds(t0, clk::now());
          eval_total_ += seconds(t0, clk::now());
        }
        if (o_.checkpoint_every && step_ % o_.checkpoint_every == 0) checkpoint_phase(false);
        if (o_.max_steps && step_ >= o_.max_steps) stop = true;
        if (o_.stop_at_target && sum.seconds_to_target) stop = sum.stopped_at_target = true;  // (the same on every rank)
      }
      // The epoch's training statistics over every rank.
      es = survive(phase::epoch_statistics, [&] {
        stats s = es;
        reduce(s);
        return s;
      });
      const double train_s = seconds(te, clk::now()) - eval_s;
      if (test_size_ && (!o_.eval_every || sum.evals.empty() || sum.evals.back().step != step_)) {
        const auto t0 = clk::now();
        record_eval(sum, seconds(t_start, t0) - eval_total_);
        eval_total_ += seconds(t0, clk::now());
        if (o_.stop_at_target && sum.seconds_to_target) stop = sum.stopped_at_target = true;
      }
      const bool epoch_done = !data.next(o_.global_batch);
      if (!o_.checkpoint_dir.empty() && !o_.checkpoint_every && epoch_done) checkpoint_phase(epoch_done);
      epoch_point ep;
      ep.epoch = e + 1;
      ep.loss = es.mean_loss();
      ep.metrics = reported(es);
      ep.seconds = train_s;
      ep.samples_per_s = train_s > 0 ? static_cast<double>(epoch_samples) / train_s : 0.0;
      ep.exposed_comm_seconds = comm_s_ - comm0;
      ep.eval = sum.evals.empty() ? nullptr : &sum.evals.back();
      tell([&](observer& x) { x.on_epoch(ep); });
      if (epoch_done && e + 1 < o_.epochs) data.set_epoch(e + 1);
    }
    sum.steps = step_;
    if constexpr (requires { g_.close_joins(o_.shrink_store); })
      if (o_.shrink_store) g_.close_joins(o_.shrink_store);  // a worker still waiting to join leaves
    sum.wall_seconds = seconds(t_start, clk::now());
    sum.train_seconds = sum.wall_seconds - eval_total_;
    sum.exposed_comm_seconds = comm_s_;
    // The run's summary, a phase of its own (a rank lost here: the others redo it). The slowest
    // rank's optimizer time: the step waits for it (with ZeRO-1 the shards differ). Then the
    // replicas are compared a last time.
    double opt_s = opt_s_;
    survive_plain(
        phase::summary,
        [&] {
          opt_s = opt_s_;
          c_.allreduce(&opt_s, &opt_s, 1, dtype::f64, op_kind::max, options{});
          verify_replicas("the end of training");
        },
        [] {});
    sum.optimizer_seconds = opt_s;
    if (!sum.evals.empty()) {
      sum.final_accuracy = sum.evals.back().accuracy;
      sum.final_loss = sum.evals.back().loss;
      sum.final_metrics = sum.evals.back().metrics;
    }
    sum.samples_per_s = sum.train_seconds > 0 ? static_cast<double>(sum.samples) / sum.train_seconds : 0.0;
    if (o_.baseline_samples_per_s > 0)
      sum.weak_scaling_efficiency = sum.samples_per_s / (o_.baseline_samples_per_s * static_cast<double>(g_.size()));
    sum.parameters_hash = parameters_hash();
    sum.optimizer_state_bytes = optimizer_state_bytes();
    sum.zero_stage = o_.zero_stage;
    sum.skipped_steps = scaler_.skipped();
    sum.loss_scale = scaler_.on() ? scaler_.scale() : 0.0;
    sum.stragglers = stragglers_named_;
    tell([&](observer& x) { x.on_summary(sum); });
    // KFT_TIMELINE: written now (a job that dies later still leaves this fit's trace); a failure
    // to write is said, not thrown: the training itself is done.
    if (tl_) {
      try {
        tl_->write();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kft: rank %d: the KFT_TIMELINE trace was not written: %s\n", g_.rank(), e.what());
      }
    }
    return sum;
  }

 public:
  /// @brief Evaluation statistics over every rank (rank r evaluates samples r, r + N, ...),
  /// reduced: the same on every rank.
  stats evaluate(std::uint64_t test_size)
    requires(evaluable<M> && !streams)
  {
    auto span = traced("evaluate");
    stats s = ms_.empty();
    const auto n = static_cast<std::uint64_t>(g_.size()), me = static_cast<std::uint64_t>(g_.rank());
    std::vector<std::uint32_t> idx;
    for (std::uint64_t p = me; p < test_size;) {
      idx.clear();
      for (; p < test_size && idx.size() < o_.eval_batch; p += n) idx.push_back(static_cast<std::uint32_t>(p));
      ms_.merge(s, as_stats(m_.evaluate(idx)));
    }
    reduce(s);
    return s;
  }
  /// @brief The same for a streaming model: all of `test`'s records, each rank reading its
  /// share in global batches of eval_batch x ranks (its position is reset to the start).
  stats evaluate(record_source& test)
    requires(evaluable<M> && streams)
  {
    auto span = traced("evaluate");
    stats s = ms_.empty();
    const std::uint64_t gb = o_.eval_batch * static_cast<std::uint64_t>(g_.size());
    test.set_epoch(0);
    while (auto b = test.next(gb)) {
      test.read(*b, g_.rank(), g_.size(), eval_records_);
      if (eval_records_.real) ms_.merge(s, as_stats(m_.evaluate(std::as_const(eval_records_))));
      test.advance(*b);
    }
    reduce(s);
    return s;
  }

  /// @brief Writes a checkpoint now (collective: the replicas are verified first; rank 0 writes).
  void save_checkpoint(bool epoch_done = false) {
    if (o_.checkpoint_dir.empty()) throw usage_error("trainer: no checkpoint_dir", site("ddp checkpoint"));
    if constexpr (on_device)
      throw usage_error("trainer: checkpoints of a device group's model are not available yet", site("ddp checkpoint"));
    verify_replicas("a checkpoint");
    // ZeRO-1: the whole optimizer state, gathered from the shards (collective), so the file is
    // the same as an unsharded run's and resumes on any number of ranks.
    std::vector<std::vector<std::vector<float>>> whole;
    if (zero_)
      for (std::size_t b = 0; b < opt_.state().buffers.size(); ++b) whole.push_back(zero_->whole_state(g_, b, sizes_, g_.rank() == 0));
    if (g_.rank() != 0) return;
    write_checkpoint(epoch_done, whole);
  }

 private:
  // Rank 0 writes the checkpoint of this step (no collective): `whole` is ZeRO-1's gathered
  // optimizer state (empty without ZeRO).
  void write_checkpoint(bool epoch_done, const std::vector<std::vector<std::vector<float>>>& whole) {
    checkpoint_writer w;
    sampler_state ss = has_feed() ? feed().state() : sampler_state{o_.seed, epoch_, 0};
    if (epoch_done) {  // the next run starts the next epoch
      ss.epoch += 1;
      ss.cursor = 0;
    }
    const auto& st = opt_.state();
    trainer_state{step_, ss, static_cast<std::uint64_t>(g_.size()), rng_.state, opt_.name(), st.steps}.write(w);
    if constexpr (streams)  // which records the position counts in (the position is trainer_state's)
      if (src_) w.put_string(records_key, src_->fingerprint().encode());
    // Mixed precision: the parameters' types (the values saved are the f32 master weights) and
    // the loss scaler's state.
    w.put_string(types_key, mw_.types());
    if (scaler_.on()) w.put_string(scaler_key, scaler_.save());
    for (const auto& t : mw_.optimizer_tensors()) w.put_floats(trainer_state::parameter_key(t.name), t.value);
    for (std::size_t b = 0; b < st.names.size(); ++b)
      for (std::size_t i = 0; i < tensors_.size(); ++i)
        w.put_floats(trainer_state::optimizer_key(st.names[b], tensors_[i].name), zero_ ? whole[b][i] : st.buffers[b][i]);
    const auto bytes = w.finish();
    write_atomic(o_.checkpoint_dir, checkpoint_name(step_), bytes, o_.checkpoint_progress);
    // Keep the newest `keep_checkpoints`.
    const auto steps = checkpoint_steps(o_.checkpoint_dir);
    for (std::size_t i = std::max<std::uint64_t>(o_.keep_checkpoints, 1); i < steps.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove(o_.checkpoint_dir / checkpoint_name(steps[i]), ec);
    }
    remove_stale_temporaries(o_.checkpoint_dir);  // (a writer lost mid-write; only rank 0 writes)
    tell([&](observer& x) { x.on_checkpoint(step_, checkpoint_name(step_), bytes.size()); });
  }

 public:
  /// @brief Compares a hash of every parameter across the ranks. @throws desync_error
  void verify_replicas(const char* when) {
    const std::size_t p = tensors_.size();
    hashes_.resize(p);
    for (std::size_t i = 0; i < p; ++i) hashes_[i] = tensor_hash(i, 0);
    all_hashes_.resize(p * static_cast<std::size_t>(g_.size()));
    c_.allgather(hashes_.data(), all_hashes_.data(), p, dtype::i64, options{});
    for (std::size_t i = 0; i < p; ++i) {
      std::string differ;
      for (int r = 1; r < g_.size(); ++r)
        if (all_hashes_[static_cast<std::size_t>(r) * p + i] != all_hashes_[i])
          differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      if (!differ.empty())
        throw desync_error("replicas differ at " + std::string(when) + " (step " + std::to_string(step_) +
                               "): parameter '" + tensors_[i].name + "' (index " + std::to_string(i) +
                               ") on rank(s) " + differ + " is not rank 0's; a gradient desync (layer 2)",
                           site("ddp verify", step_));
    }
  }

 private:
  using clk = std::chrono::steady_clock;
  static double seconds(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  error_site site(std::string op, std::uint64_t seq = 0) const { return error_site::in({}, g_.rank(), g_.size(), std::move(op), seq); }

  // This rank's micro-batches of the next optimizer step (false at the end of the epoch).
  // The next micro-batch's index list (the lists are kept between steps: no allocation once warm).
  batch_type& next_micro() {
    if (micro_n_ == micro_.size()) micro_.emplace_back();
    return micro_[micro_n_++];
  }
  std::span<const batch_type> micro() const { return {micro_.data(), micro_n_}; }
  // The samples (records that are not padding) in a micro-batch.
  static std::size_t rows_of(const batch_type& b) {
    if constexpr (streams) return b.real;
    else return b.size();
  }
  bool has_feed() const noexcept {
    if constexpr (streams) return src_ != nullptr;
    else return sampler_.has_value();
  }
  // A streaming run's checkpoint section: the fingerprint of the records its position counts in.
  static constexpr const char* records_key = "trainer.records";
  static constexpr const char* types_key = "trainer.types";        // the parameters' types, in order
  static constexpr const char* scaler_key = "trainer.loss_scale";  // "scale good-steps skipped"

  bool gather_micro_batches() {
    micro_n_ = 0;
    last_samples_ = 0;
    for (std::uint64_t k = 0; k < o_.accumulate; ++k) {
      auto& data = feed();
      auto b = data.next(o_.global_batch);
      if (!b) break;
      last_samples_ += b->size;
      if (o_.deterministic) {
        const auto n = static_cast<std::uint64_t>(g_.size());
        for (std::uint64_t j = static_cast<std::uint64_t>(g_.rank()); j < o_.micro_shards; j += n) {
          if constexpr (streams) data.read_shard(*b, j, o_.micro_shards, next_micro(), g_.rank(), g_.size());
          else data.micro_shard(*b, j, o_.micro_shards, next_micro());
        }
      } else {
        if constexpr (streams) data.read(*b, g_.rank(), g_.size(), next_micro());
        else data.rank_indices(*b, g_.rank(), g_.size(), next_micro());
      }
      data.advance(*b);
    }
    return micro_n_ != 0;
  }

  static void on_ready(void* self, std::size_t i) {
    auto* t = static_cast<trainer*>(self);
    if (t->o_.deterministic) {
      if (t->last_micro_) {
        t->to_fixed(i, t->first_micro_);
        t->r_->mark_ready(i);
      }
    } else {
      if (t->check_overflow_ && !t->finite_gradient(i)) t->overflow_ = 1;
      t->r_->mark_ready(i);
    }
  }

  // One optimizer step over micro_ (this rank's micro-batches or deterministic shards).
  stats run_step() {
    const auto t0 = clk::now();
    const double blocked0 = comm_s_ + blocked_s_;
    stats s = ms_.empty();
    std::uint64_t bad = 0;
    overflow_ = 0;
    if (o_.deterministic) fixed_point_micro_steps(s, bad);
    else micro_steps(s, bad);
    check_overflow_ = false;
    const auto [contributions, bad_ranks, overflow_ranks] = counters_.read(*r_, g_.size());
    if (bad_ranks) {
      local_bad_ = bad != 0;
      check_loss(bad_ranks, true);
    }
    if (!overflowed(overflow_ranks)) apply(contributions);
    ++step_;
    trace::note_step(static_cast<std::int64_t>(step_));  // (kftrun's live status: one relaxed store)
    // This rank's own work in the step: all of it but the time blocked in its collectives.
    work_s_ += seconds(t0, clk::now()) - (comm_s_ + blocked_s_ - blocked0);
    ++work_steps_;
    return s;
  }

  // The deterministic mode's micro-steps: every shard's gradient becomes fixed point and is
  // added (exactly) into the reducer's i64 buckets; the last shard's conversions happen as its
  // gradients become final (on_ready).
  void fixed_point_micro_steps(stats& s, std::uint64_t& bad) {
    auto& r = *r_;
    for (std::size_t i = 0; i < tensors_.size(); ++i) views_[i] = fixed_->local(i);
    std::size_t nonempty = 0;
    for (const auto& mb : micro()) nonempty += rows_of(mb) != 0;
    std::size_t done = 0;
    if (nonempty == 0) {
      r.zero_grad();
      for (std::size_t i = 0; i < tensors_.size(); ++i) r.mark_ready(i);
    }
    for (const auto& mb : micro()) {
      if (rows_of(mb) == 0) continue;
      first_micro_ = done == 0;
      last_micro_ = done + 1 == nonempty;
      gradients gs(views_, false, &on_ready, this);
      auto bs = [&] {
        auto span = traced("backward");
        return m_.forward_backward(mb, gs);
      }();
      bad |= !std::isfinite(bs.loss_sum);
      ms_.merge(s, as_stats(bs));
      if (!last_micro_)
        for (std::size_t i = 0; i < tensors_.size(); ++i) to_fixed(i, first_micro_);
      ++done;
    }
    counters_.write(r, {nonempty, bad, 0});
    timed_finish();
  }

  // The normal mode's micro-steps: the model writes (or adds) its gradients straight into the
  // reducer's buckets, which are reduced as they fill on the last micro-batch (no_sync before it).
  void micro_steps(stats& s, std::uint64_t& bad) {
    auto& r = *r_;
    std::uint64_t contributed = 0;
    const std::size_t k = micro_n_;
    for (std::size_t m = 0; m < k; ++m) {
      const bool last = m + 1 == k;
      std::optional<typename reducer<Group, trainer_hook>::sync_guard> quiet;
      if (!last) (void)quiet.emplace(r.no_sync());  // (void): nvcc flags the discarded nodiscard reference
      check_overflow_ = scaler_.on() && last;
      if (rows_of(micro_[m]) == 0) {  // all padding (streamed records): no contribution
        if (contributed == 0) r.zero_grad();  // (else: the earlier micro-batches' sum stays)
        if (last) {
          for (std::size_t i = 0; i < tensors_.size(); ++i) overflow_ |= check_overflow_ && !finite_gradient(i);
          counters_.write(r, {contributed, bad, overflow_});
          for (std::size_t i = 0; i < tensors_.size(); ++i) r.mark_ready(i);
        }
        timed_finish();
        continue;
      }
      auto gs = typed_grads_ ? [&] {
        for (std::size_t i = 0; i < tensors_.size(); ++i)
          typed_views_[i] = {r.gradient_data(i), sizes_[i], mw_.gradient_type(i)};
        return gradients(std::span<const grad_view>(typed_views_), contributed > 0, &on_ready, this,
                         static_cast<float>(scaler_.scale()));
      }()
                             : [&] {
                                 for (std::size_t i = 0; i < tensors_.size(); ++i)
                                   views_[i] = r.template gradient<float>(i);
                                 return gradients(std::span<const std::span<float>>(views_), contributed > 0,
                                                  &on_ready, this);
                               }();
      auto bs = [&] {
        auto span = traced("backward");
        return m_.forward_backward(std::as_const(micro_[m]), gs);
      }();
      bad |= !std::isfinite(bs.loss_sum);
      ms_.merge(s, as_stats(bs));
      ++contributed;
      if (last) counters_.write(r, {contributed, bad, overflow_});
      timed_finish();
    }
  }

  // Parameter i's float gradient (one shard's) into fixed point, assigned or added into the bucket.
  void to_fixed(std::size_t i, bool first) {
    const auto v = fixed_->convert(i, r_->template gradient<std::int64_t>(i), first);
    if (fixed_->arithmetic().in_range(v)) return;
    const std::string why =
        v.not_finite ? "gradient of '" + tensors_[i].name + "' holds a NaN or an infinity (layer 1: the model's numbers)"
                     : "gradient of '" + tensors_[i].name + "' reaches " + std::to_string(fixed_->arithmetic().magnitude(v)) +
                           ", beyond deterministic mode's fixed-point range (lower trainer_options::fraction_bits)";
    abort_all(why);
    throw numerics_error(why, site("ddp step", step_ + 1));
  }

  // Loss scaling: `ranks` ranks saw a non-finite gradient this step; every rank gets the same
  // count and makes the same decision. True: skip the step.
  bool overflowed(std::uint64_t ranks) {
    const auto v = scaler_.update(ranks);
    if (v != loss_scaler::verdict::give_up) return v == loss_scaler::verdict::skip;
    const std::string first = first_bad_gradient();
    throw numerics_error(std::to_string(scaler_.skipped_in_row()) + " steps in a row skipped for non-finite gradients on " +
                             std::to_string(ranks) + " rank(s) (loss scale now " + num(scaler_.scale(), 9) +
                             "): they are not finite at any scale (layer 1: the model's numbers)" +
                             (first.empty() ? std::string() : "; here the first is '" + first + "'"),
                         site("ddp step", step_ + 1));
  }

  void timed_finish() {
    auto span = traced("finish");
    const auto t0 = clk::now();
    r_->finish();
    comm_s_ += seconds(t0, clk::now());
  }
  // A compute span of the timeline (KFT_TIMELINE); names fit the string's inline buffer, so an
  // off timeline allocates nothing.
  timeline::scope traced(const char* name) { return timeline::scope(tl_.get(), name); }

  // Some rank's loss was not finite: every rank stops at this step, each saying what it knows.
  void check_loss(std::uint64_t bad_ranks, bool participated) {
    if (!bad_ranks) return;
    std::string first = first_bad_gradient();
    std::string msg;
    if (participated && local_bad_)
      msg = "the loss is NaN or infinite on this rank in step " + std::to_string(step_ + 1) +
            (first.empty() ? "" : "; first parameter with a non-finite gradient: '" + first + "'") +
            " (layer 1: the model's numbers; " + std::to_string(bad_ranks) + " rank(s) affected)";
    else
      msg = std::to_string(bad_ranks) + " other rank(s) had a NaN or infinite loss in step " + std::to_string(step_ + 1) +
            " (their messages name them); training stops on every rank";
    throw numerics_error(msg, site("ddp step", step_ + 1));
  }
  std::string first_bad_gradient() {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      std::uint32_t bad = 0;
      if (o_.deterministic) {
        bad = fixed_->not_finite(i);
      } else if constexpr (on_device) {
        scratch_.resize(tensors_[i].value.size());
        r_->download(scratch_.data(), r_->gradient_data(i), scratch_.size() * sizeof(float));
        for (float v : scratch_) bad |= detail::not_finite(v);
      } else {
        bad = !finite_gradient(i);
      }
      if (bad) return tensors_[i].name;
    }
    return {};
  }

  // The optimizer step from the averaged gradients; `contributions` micro-batches (or shards)
  // went into them over all ranks.
  void apply(std::uint64_t contributions) {
    auto span = traced("optimizer");
    if constexpr (requires { opt_.set_lr(1.0f); })
      if (o_.lr.on()) opt_.set_lr(static_cast<float>(o_.lr.at(step_ + 1)));
    if (o_.zero_stage) return apply_sharded(contributions);
    const auto t0 = clk::now();
    opt_.begin_step();
    std::size_t bad = tensors_.size();
    if (o_.deterministic) {
      for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const auto mean = fixed_->mean(i, r_->template gradient<std::int64_t>(i), contributions);
        if (!opt_.step(i, mw_.optimizer_tensors()[i].value, mean, 1.0f) && bad == tensors_.size()) bad = i;
      }
    } else {
      // The buckets hold sum / N of the ranks' micro-batch means (x the loss scale): x N /
      // contributions / scale is the mean.
      const float scale = gradient_scale(contributions);
      for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const std::span<const float> gr =
            mw_.gradient_type(i) == dtype::f32 ? std::span<const float>(r_->template gradient<float>(i)) : widened_gradient(i, 0, sizes_[i]);
        if (!opt_.step(i, mw_.optimizer_tensors()[i].value, gr, scale) && bad == tensors_.size()) bad = i;
      }
    }
    mw_.round();
    if constexpr (requires { opt_.end_step(); }) {  // a device optimizer: its kernels' verdict (waits for them)
      const std::size_t first = opt_.end_step();
      if (first < bad) bad = first;
    }
    opt_s_ += seconds(t0, clk::now());
    if (bad != tensors_.size())
      throw numerics_error("the averaged gradient of '" + tensors_[bad].name + "' (index " + std::to_string(bad) +
                               ") holds a NaN or an infinity in step " + std::to_string(step_ + 1) +
                               " although every rank's loss was finite (layer 1: the model's backward pass)",
                           site("ddp step", step_ + 1));
  }

  // ---- ZeRO stage 1 (zero.hpp) ----
  // The wrapper updates this rank's pieces from the reduce-scattered buckets, then the
  // parameters are allgathered.
  void apply_sharded(std::uint64_t contributions) {
    const auto t0 = clk::now();
    const float scale = gradient_scale(contributions);
    const auto& pieces = zero_->pieces();
    const std::size_t bad = zero_->step(
        mw_.optimizer_tensors(),
        [&](const typename zero1<O>::piece& pc) -> std::span<const float> {
          if (!o_.deterministic && mw_.gradient_type(pc.param) != dtype::f32) return widened_gradient(pc.param, pc.offset, pc.count);
          if (!o_.deterministic) return r_->template gradient<float>(pc.param).subspan(pc.offset, pc.count);
          return fixed_->mean(pc.param, r_->template gradient<std::int64_t>(pc.param).subspan(pc.offset, pc.count),
                              contributions, pc.offset);
        },
        o_.deterministic ? 1.0f : scale);
    opt_s_ += seconds(t0, clk::now());
    if (bad != pieces.size()) {  // only this rank saw it: the others learn it from the abort
      const auto& pc = pieces[bad];
      const std::string why = "the averaged gradient of '" + tensors_[pc.param].name + "' (index " +
                              std::to_string(pc.param) + ", elements " + std::to_string(pc.offset) + ".." +
                              std::to_string(pc.offset + pc.count - 1) + ", this rank's ZeRO shard) holds a NaN or an " +
                              "infinity in step " + std::to_string(step_ + 1) +
                              " although every rank's loss was finite (layer 1: the model's backward pass)";
      abort_all(why);
      throw numerics_error(why, site("ddp step", step_ + 1));
    }
    const auto tg = clk::now();
    zero_->gather_parameters(g_, mw_.optimizer_tensors());
    blocked_s_ += seconds(tg, clk::now());
    mw_.round();
  }

  // ---- mixed precision (precision.hpp) ----
  // The parameters' and gradients' types, the master weights, loss scaling: checked before
  // anything collective.
  void set_up_precision() {
    try {
      mw_ = master_weights(tensors_, o_.f32_gradients, o_.deterministic);
      using mode = loss_scaling::mode;
      const bool on = o_.loss_scale.use == mode::on || (o_.loss_scale.use == mode::automatic && mw_.f16_gradients());
      if (on && o_.deterministic)
        throw usage_error("trainer: loss scaling (loss_scale.use = on) in deterministic mode, whose gradients are f32 "
                          "turned into fixed point: nothing to scale (set loss_scale.use = off)");
      scaler_ = loss_scaler(o_.loss_scale, on);
    } catch (const usage_error& e) {
      throw usage_error(e.detail(), site("ddp trainer"));
    }
    typed_grads_ = mw_.sixteen_bit_gradients() || scaler_.on();
  }
  // x N / contributions (the buckets average the ranks' means), / the loss scale.
  float gradient_scale(std::uint64_t contributions) const {
    return static_cast<float>(static_cast<double>(g_.size()) / static_cast<double>(contributions) / scaler_.scale());
  }
  // Whether parameter i's gradient in its bucket is finite.
  bool finite_gradient(std::size_t i) {
    return master_weights::finite(r_->gradient_data(i), mw_.gradient_type(i), sizes_[i]);
  }
  // Elements [offset, offset + count) of parameter i's 16-bit gradient, widened to f32.
  std::span<const float> widened_gradient(std::size_t i, std::size_t offset, std::size_t count) {
    return mw_.widened_gradient(i, r_->gradient_data(i), offset, count);
  }

  // Parameter i's bits hashed (device tensors are copied to the host first).
  // (A 16-bit parameter: its master weights and its values.)
  std::uint64_t tensor_hash(std::size_t i, std::uint64_t seed) const {
    const auto& v = tensors_[i].value;
    if constexpr (on_device) {
      scratch_.resize(v.size());
      r_->download(scratch_.data(), v.data(), v.size_bytes());
      return hash64(scratch_.data(), v.size_bytes(), seed);
    } else {
      if (tensors_[i].type != dtype::f32) seed = hash64(mw_.master(i).data(), mw_.master(i).size_bytes(), seed);
      return hash64(tensors_[i].data(), tensors_[i].bytes(), seed);
    }
  }

  // What the device path does not have yet, refused by name before anything is built.
  void refuse_on_device() const {
    auto refuse = [&](const std::string& what) {
      throw usage_error("trainer over a device group: " + what + " is not available on device buffers yet",
                        site("ddp trainer"));
    };
    if (o_.deterministic) refuse("deterministic mode (trainer_options::deterministic)");
    if (o_.zero_stage) refuse("ZeRO stage 1 (trainer_options::zero_stage)");
    if (!o_.checkpoint_dir.empty() || o_.resume) refuse("checkpointing (trainer_options::checkpoint_dir / resume)");
    if (o_.reducer.find_unused_parameters) refuse("reducer_options::find_unused_parameters");
    for (const auto& t : tensors_)
      if (t.type != dtype::f32) refuse("mixed precision (parameter '" + t.name + "' is " + std::string(name(t.type)) + ")");
    if (o_.loss_scale.use == trainer_options::loss_scaling::mode::on) refuse("loss scaling");
  }

  // Stops every rank: the gradient group, and the control group when it is another one.
  void abort_all(const std::string& why) {
    g_.abort(why);
    if constexpr (!std::same_as<Group, Control>) c_.abort(why);
  }

  // ---- going on without a lost rank (trainer_options::shrink_store) ----
  void refuse_unshrinkable() const {
    auto refuse = [&](const std::string& why) {
      throw usage_error("trainer: trainer_options::shrink_store (going on without a lost rank) " + why,
                        site("ddp trainer"));
    };
    if constexpr (!requires(Group& g) { g.shrink(o_.shrink_store, o_.shrink); })
      refuse("needs a group that can shrink (kft::group::process_group)");
    if (static_cast<const void*>(&g_) != static_cast<const void*>(&c_))
      refuse("needs one group for the gradients and the control values");
    if (o_.zero_stage) refuse("and ZeRO-1 (zero_stage = 1) together: a lost rank takes its shard of the state");
    if constexpr (on_device) refuse("on a device group");
  }

  // ---- the collective phases of fit(), survived ----
  // fit() is a sequence of collective phases: steps, evaluations, the epoch's statistics.
  // `phases_` counts those this rank finished. When a rank dies in one, the survivors may
  // stand one phase apart: a survivor that finished phase n (its last collective of it
  // completed) fails in phase n + 1 while the others fail in phase n. After the shrink they
  // compare their counts: the ones behind take phase n's outcome from the lowest rank that
  // finished it (a step: parameters, optimizer state, step; an evaluation or the epoch's
  // statistics: the reduced statistics) and go on; the ones ahead, or everyone when all stand
  // together, redo the phase they were in.
  //
  // A join is one of them too (`welcome`): the members and the joiners count it, and a rank
  // lost while the state is being sent is survived like a rank lost in a step. A joiner holds
  // no state until it is sent (`stateless_`): it takes no part in the counts, and is always
  // behind.
  enum class phase : std::int64_t { step = 1, evaluation = 2, epoch_statistics = 3, checkpoint = 4, summary = 5, welcome = 6 };
  enum class recovery { redo, caught_up };
  static const char* name_of(phase k) {
    switch (k) {
      case phase::step: return "step";
      case phase::evaluation: return "evaluation";
      case phase::epoch_statistics: return "epoch's statistics";
      case phase::checkpoint: return "checkpoint";
      case phase::welcome: return "join";
      case phase::summary: break;
    }
    return "run's summary";
  }

  // What a lost rank looks like from the survivors: a peer's process gone or its group stopped
  // (remote_error), a connection cut (transport_error: Gloo between nodes), or a rank silent
  // past the deadline (timeout_error: stopped, or cut off). Bad arguments and mismatches are not.
  // A grow given up because ranks shrinking after a loss met it (group::generation_void_error)
  // is one too: the ranks that were growing shrink with the others.
  static bool a_loss(const error& e) {
    return dynamic_cast<const remote_error*>(&e) || dynamic_cast<const transport_error*>(&e) ||
           dynamic_cast<const timeout_error*>(&e) || dynamic_cast<const group::generation_void_error*>(&e);
  }

  // A phase whose outcome is reduced statistics, survived (trainer_options::shrink_store).
  template <class F>
  stats survive(phase k, F&& run) {
    while (true) {
      try {
        stats out = run();
        last_phase_ = k;
        last_outcome_ = out;
        ++phases_;
        return out;
      } catch (const error& lost) {
        if (!o_.shrink_store || !a_loss(lost)) throw;
        if (go_on_without_lost_ranks(lost, k, step_) == recovery::caught_up) {
          ++phases_;
          return last_outcome_;  // (received from a rank that finished the phase)
        }
      }
    }
  }

  // A phase with no outcome to share (a checkpoint, the run's summary), survived: redone by
  // the survivors that were in it; those behind the ones that finished it count it done.
  // `caught_up` runs on those (a checkpoint: the new rank 0 writes the file when it is one of
  // them, as it stands exactly where the checkpoint was taken).
  template <class F, class G>
  void survive_plain(phase k, F&& run, G&& caught_up) {
    while (true) {
      try {
        run();
        last_phase_ = k;
        ++phases_;
        return;
      } catch (const error& lost) {
        if (!o_.shrink_store || !a_loss(lost)) throw;
        if (go_on_without_lost_ranks(lost, k, step_) == recovery::caught_up) {
          ++phases_;
          caught_up();
          return;
        }
      }
    }
  }

  // A checkpoint as a phase of fit(): its collectives (the replica check) are redone after a
  // shrink; a survivor behind one that finished it counts it done.
  void checkpoint_phase(bool epoch_done) {
    survive_plain(
        phase::checkpoint, [&] { save_checkpoint(epoch_done); },
        [&] {
          std::error_code ec;
          if (g_.rank() == 0 && !std::filesystem::exists(o_.checkpoint_dir / checkpoint_name(step_), ec))
            write_checkpoint(epoch_done, {});
        });
  }

  // A rank died during phase `k` (`e`): shrink, rebuild the reducer, and agree on where training
  // stands (above).
  recovery go_on_without_lost_ranks(const error& e, phase k, std::uint64_t step_before) {
    if constexpr (requires(Group& g) { g.shrink(o_.shrink_store, o_.shrink); }) {
      const int before = g_.size();
      r_.reset();  // its work on the failed group ends with the group's error
      const auto m = g_.shrink(o_.shrink_store, o_.shrink);
      members_now_ = m;
      const std::string who = "rank(s) " + group::membership::list(m.lost());
      if (o_.deterministic && o_.micro_shards % static_cast<std::uint64_t>(m.size()) != 0)
        throw usage_error("trainer: after losing " + who + ", deterministic mode cannot go on with " +
                              std::to_string(m.size()) + " ranks: micro_shards (" + std::to_string(o_.micro_shards) +
                              ") is not a multiple of it (restart from a checkpoint, or pick micro_shards with more "
                              "divisors); the step's error was: " + e.what(),
                          site("ddp shrink", step_ + 1));
      r_.emplace(g_, params_, ro_, trainer_hook{false});
      console_->set_rank(g_.rank());  // (a lost rank 0: the new one reports)
      tell([&](observer& x) { x.on_membership(membership_of(m, stateless_)); });
      // (a joiner not sent the state yet counts nothing: it is behind whoever holds the state)
      std::int64_t lo = stateless_ ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(phases_);
      std::int64_t high[2] = {stateless_ ? std::int64_t{-1} : static_cast<std::int64_t>(phases_), stateless_ ? 1 : 0};
      g_.allreduce(&lo, &lo, 1, dtype::i64, op_kind::min, options{});
      g_.allreduce(high, high, 2, dtype::i64, op_kind::max, options{});
      const std::int64_t hi = high[0];
      // Joiners still without the state (none of the members finished the join): they redo it
      // with the members, which compares the replicas; not before.
      const bool joiners_wait = high[1] > 0 && lo == hi;
      if (hi < 0)
        throw group::membership_error("trainer: after losing " + who + ", no rank left holds the training state (the "
                                   "ranks left had joined and were still being sent it); restart the job from a "
                                   "checkpoint; the error was: " + e.what(),
                               site("ddp join", step_ + 1));
      // (a joiner is behind when some finished the join; when none did, it redoes it with them)
      const bool behind = stateless_ ? lo != hi : static_cast<std::int64_t>(phases_) < hi;
      if (lo != hi) {
        // The lowest new rank among those that finished phase `hi` gives its outcome.
        std::int64_t src = behind ? std::numeric_limits<std::int64_t>::max() : g_.rank();
        g_.allreduce(&src, &src, 1, dtype::i64, op_kind::min, options{});
        const int root = static_cast<int>(src);
        std::int64_t head[2] = {static_cast<std::int64_t>(last_phase_), static_cast<std::int64_t>(step_)};
        g_.broadcast(head, head, 2, dtype::i64, root, options{});
        if (behind && head[0] != static_cast<std::int64_t>(k))
          throw desync_error("trainer: after losing " + who + ", rank " + std::to_string(root) + " finished a " +
                                 name_of(static_cast<phase>(head[0])) + " where this rank was in a " + name_of(k) +
                                 " (the ranks ran different phases of fit())",
                             site("ddp shrink", step_ + 1));
        if (static_cast<phase>(head[0]) == phase::step) {
          broadcast_state(root);
          step_ = static_cast<std::uint64_t>(head[1]);
        } else if (static_cast<phase>(head[0]) == phase::welcome) {
          send_state(root, stateless_);  // (what the join sends: a joiner takes it; the members have it)
          if (behind) last_phase_ = k;
        } else if (static_cast<phase>(head[0]) == phase::checkpoint || static_cast<phase>(head[0]) == phase::summary) {
          if (behind) last_phase_ = k;  // (no outcome to take: a checkpoint's file is rank 0's, below)
        } else {
          double v[2 + stats::max_metrics];
          v[0] = last_outcome_.loss_sum;
          v[1] = last_outcome_.count;
          std::copy(last_outcome_.values.begin(), last_outcome_.values.end(), v + 2);
          g_.broadcast(v, v, 2 + stats::max_metrics, dtype::f64, root, options{});
          if (behind) {
            last_outcome_.loss_sum = v[0];
            last_outcome_.count = v[1];
            std::copy(v + 2, v + 2 + stats::max_metrics, last_outcome_.values.begin());
            last_phase_ = k;
          }
        }
      }
      ++shrinks_;
      if (g_.rank() == 0) {  // (also when quiet: the job changed shape)
        const bool finished = k == phase::step ? step_ > step_before : behind;
        const std::string then = finished ? std::string("the ") + name_of(k) + " was finished by a survivor"
                                          : std::string("redoing the ") + name_of(k);
        std::fprintf(stderr,
                     "kft: step %llu: lost %s of %d (%s); going on with %d rank(s) (members %s, generation %llu), %s\n",
                     static_cast<unsigned long long>(step_before + (k == phase::step || k == phase::welcome ? 1 : 0)),
                     who.c_str(), before,
                     e.what(), m.size(), m.describe().c_str(), static_cast<unsigned long long>(m.generation),
                     then.c_str());
      }
      if (g_.rank() == 0 && !o_.deterministic && o_.global_batch % static_cast<std::uint64_t>(m.size()) != 0)
        std::fprintf(stderr,
                     "kft: the global batch of %llu does not divide among %d ranks: their shares are padded by "
                     "wrapping, as DistributedSampler pads, so a few samples are seen twice an epoch (a global batch "
                     "divisible by the sizes the job may shrink to, or deterministic mode, sees each exactly once)\n",
                     static_cast<unsigned long long>(o_.global_batch), m.size());
      restart_straggler_windows();
      if (!joiners_wait) verify_replicas("a shrink");
      // This rank finished a checkpoint phase and failed in the next one: rank 0 wrote the file
      // after the phase's collectives, unless the rank writing it was lost (no file, or a
      // temporary one the next checkpoint removes). Training goes on; the next one is written.
      if (g_.rank() == 0 && last_phase_ == phase::checkpoint && k != phase::checkpoint && !o_.checkpoint_dir.empty()) {
        std::error_code ec;
        if (!std::filesystem::exists(o_.checkpoint_dir / checkpoint_name(step_), ec))
          std::fprintf(stderr,
                       "kft: step %llu: the checkpoint of step %llu was not written: the rank writing it was lost; "
                       "the next one is written as planned\n",
                       static_cast<unsigned long long>(step_ + 1), static_cast<unsigned long long>(step_));
      }
      if (k == phase::step) return step_ > step_before ? recovery::caught_up : recovery::redo;
      return behind ? recovery::caught_up : recovery::redo;
    } else {
      (void)e, (void)k, (void)step_before;
      std::rethrow_exception(std::current_exception());  // (called from the handler: the error as thrown)
    }
  }

  // True for a trainer built on a group that joined a running job (process_group::join).
  bool joined_running_group() const {
    if constexpr (requires(const Group& g) { g.newcomer(); }) {
      if (!g_.newcomer()) return false;
      if (!o_.shrink_store)
        throw usage_error("trainer: this rank joined a running group (process_group::join, KFT_JOIN) but "
                              "trainer_options::shrink_store is not set (the members admit joiners through it)",
                          site("ddp join"));
      return true;
    } else {
      return false;
    }
  }

  // At a step boundary while the group has lost ranks: admits the ranks waiting to join (one
  // store call on rank 0, one broadcast) and sends them the state. True when the group changed
  // (grown, or shrunk by a rank lost meanwhile): the caller starts the boundary again, as the
  // joiners start theirs once they hold the state.
  bool admit_joiners() {
    if constexpr (requires(Group& g) { g.grow(o_.shrink_store, o_.shrink); }) {
      if (g_.size() >= g_.founding_size()) return false;
      const auto t0 = clk::now();
      const int before = g_.size();
      group::membership m;
      try {
        if (g_.waiting_to_join(o_.shrink_store) == 0) return false;
        r_.reset();
        m = g_.grow(o_.shrink_store, o_.shrink);
        members_now_ = m;
      } catch (const error& lost) {
        // A rank lost at the boundary, before the group grew: the survivors shrink (a grow that
        // met them is given up) and the joiners wait to be admitted again.
        if (!a_loss(lost)) throw;
        (void)go_on_without_lost_ranks(lost, phase::step, step_);
        return true;
      }
      if (o_.deterministic && o_.micro_shards % static_cast<std::uint64_t>(m.size()) != 0)
        throw usage_error("trainer: after rank(s) " + group::membership::list(m.joined()) + " joined, deterministic "
                              "mode cannot go on with " + std::to_string(m.size()) + " ranks: micro_shards (" +
                              std::to_string(o_.micro_shards) + ") is not a multiple of it",
                          site("ddp join", step_));
      r_.emplace(g_, params_, ro_, trainer_hook{false});
      console_->set_rank(g_.rank());  // (founding rank 0 back: it reports again)
      verify_metrics();  // (what a newcomer's constructor does after building its reducer)
      tell([&](observer& x) { x.on_membership(membership_of(m, false)); });
      const int sender = welcome_phase();
      // "step N": the first step the newcomers take part in, as the loss line names the step it
      // happened in (a join before the redo of step 200 and the loss in step 200 both say 200).
      // (a rank lost while the state was sent: the survivors' membership, and who of the
      // joiners is still there)
      const auto& now = members_now_.members;
      const auto in_now = [&](int r) { return std::find(now.begin(), now.end(), r) != now.end(); };
      std::vector<int> joined, lost;
      for (int r : m.joined())
        if (in_now(r)) joined.push_back(r);
      for (int r : m.before)  // (a member that never came to the grow, or was lost in the join)
        if (!in_now(r)) lost.push_back(r);
      if (sender >= 0 && g_.rank() == sender && !joined.empty())  // (the lowest-ranked member: rank 0 may be a newcomer)
        std::fprintf(stderr,
                     "kft: step %llu: rank(s) %s joined%s; going on with %d rank(s) (was %d; members %s, generation "
                     "%llu; state sent in %.3f s)\n",
                     static_cast<unsigned long long>(step_ + 1), group::membership::list(joined).c_str(),
                     lost.empty() ? "" : (", rank(s) " + group::membership::list(lost) + " lost").c_str(), g_.size(),
                     before, members_now_.describe().c_str(), static_cast<unsigned long long>(members_now_.generation),
                     seconds(t0, clk::now()));
      return true;
    } else {
      return false;
    }
  }

  // What a joiner's observers are told before it is sent the state.
  membership_point joiner_point() const {
    membership_point p;
    if constexpr (requires(const Group& g) { g.generation(); }) p.generation = g_.generation();
    p.rank = g_.rank();
    p.newcomer = true;
    return p;
  }

  // What observer::on_membership is told.
  static membership_point membership_of(const group::membership& m, bool newcomer) {
    membership_point p;
    p.generation = m.generation;
    p.members = m.members;
    p.joined = m.joined();
    p.lost = m.lost();
    p.rank = m.rank;
    p.newcomer = newcomer;
    return p;
  }

  // Collective over a group that just grew: the lowest-ranked member that was there before
  // sends its parameters, optimizer state, loss scale, step, sampler position and RNG; the
  // newcomers (`stateless_`: this rank is one) take them, then the replicas are compared.
  // Returns the sender's rank. A phase of fit() (`welcome_phase`): a rank lost in it is survived.
  int welcome_newcomers() {
    std::int64_t src = stateless_ ? std::numeric_limits<std::int64_t>::max() : g_.rank();
    c_.allreduce(&src, &src, 1, dtype::i64, op_kind::min, options{});
    if (src == std::numeric_limits<std::int64_t>::max())
      throw usage_error("trainer: no rank of the group holds state to send (every rank joined as a newcomer: start "
                        "the job without KFT_JOIN)",
                        site("ddp join"));
    const int root = static_cast<int>(src);
    if constexpr (streams) {
      // Every rank's record sources (training, and test or none) against rank 0's, as fit()
      // compares them when it starts: a joiner with other records fails here on every rank.
      verify_same_source(c_, *src_, options{});
      detail::check_record_blobs(
          c_, test_src_ ? test_src_->fingerprint().encode() : std::string("!its fit() was given no test records"),
          options{});
    }
    const bool newcomer = stateless_;
    send_state(root, stateless_);
    restart_straggler_windows();
    verify_replicas(newcomer ? "a join (newcomer)" : "a join");
    return root;
  }

  // The state a join sends, from `root`; `take`: this rank is a joiner and takes the position
  // with it (the members hold it already).
  void send_state(int root, bool take) {
    broadcast_state(root);
    const sampler_state ss = has_feed() ? feed().state() : sampler_state{o_.seed, epoch_, 0};
    std::uint64_t pos[9] = {step_, ss.epoch, ss.cursor, ss.seed, rng_.state, o_.global_batch, o_.micro_shards, 0, phases_};
    std::string scale = scaler_.on() ? scaler_.save() : std::string();
    pos[7] = scale.size();
    c_.broadcast(pos, pos, 9, dtype::i64, root, options{});
    scale.resize(static_cast<std::size_t>(pos[7]));
    if (pos[7]) c_.broadcast(scale.data(), scale.data(), scale.size(), dtype::u8, root, options{});
    if (!take) return;
    // (a streaming model's position carries its records' seed, compared with the records above)
    if (!streams && pos[3] != o_.seed)
      throw usage_error("trainer: the group this rank joined trains with seed " + std::to_string(pos[3]) +
                            ", this rank's options say " + std::to_string(o_.seed),
                        site("ddp join"));
    step_ = resumed_step_ = pos[0];
    phases_ = pos[8];
    restored_ = sampler_state{pos[3], pos[1], pos[2]};
    epoch_ = pos[1];
    rng_.state = pos[4];
    o_.global_batch = pos[5];
    if (o_.deterministic && pos[6] != o_.micro_shards) {
      o_.micro_shards = pos[6];
      fixed_.emplace(o_.fraction_bits, o_.micro_shards * o_.accumulate, sizes_);
    }
    if (!scale.empty()) scaler_.load(scale, "the loss scale sent by rank " + std::to_string(root));
    joined_ = true;
    stateless_ = false;
    note("joined the running group at step " + std::to_string(step_) + " (epoch " + std::to_string(epoch_ + 1) +
         ", sample " + std::to_string(pos[2]) + "): state from rank " + std::to_string(root));
  }

  // The join as a phase of fit(), on the members and the joiners alike: a rank lost while the
  // state is sent (a member, the joiner) is survived; the survivors shrink and send it again
  // (or a joiner behind one that finished takes it from that one). Returns the sender's rank,
  // -1 when the state came in a recovery.
  int welcome_phase() {
    int root = -1;
    if (!o_.shrink_store) return welcome_newcomers();
    survive_plain(phase::welcome, [&] { root = welcome_newcomers(); }, [] {});
    return root;
  }

  void after_step() {
    if (o_.verify_every && step_ % o_.verify_every == 0) verify_replicas("a periodic check");
    if (o_.stragglers.every && step_ % o_.stragglers.every == 0) exchange_work();
  }

  // ---- stragglers (stragglers.hpp) ----
  // Every `stragglers.every` steps, in the step (a rank lost in it is survived as the step's
  // replica check is): the ranks allgather their work sums and steps, and every rank runs the
  // same detection on the same bytes. The first window of a membership also gathers the hosts.
  void exchange_work() {
    const int n = c_.size();
    if (n < 2) return;  // (nobody to compare with; the same on every rank)
    const auto un = static_cast<std::size_t>(n);
    if (!hosts_sent_) {
      constexpr std::size_t len = 64;
      std::string mine = straggler_detector::this_host();
      mine.resize(len, '\0');
      std::string all(len * un, '\0');
      c_.allgather(mine.data(), all.data(), len, dtype::u8, options{});
      for (std::size_t r = 0; r < un; ++r) strag_.set_host(static_cast<int>(r), all.substr(r * len, len).c_str());
      hosts_sent_ = true;
    }
    const double mine[2] = {work_s_, static_cast<double>(work_steps_)};
    work_all_.resize(2 * un);
    c_.allgather(mine, work_all_.data(), 2, dtype::f64, options{});
    work_s_ = 0.0;
    work_steps_ = 0;
    work_sums_.resize(un);
    work_counts_.resize(un);
    for (std::size_t r = 0; r < un; ++r) work_sums_[r] = work_all_[2 * r], work_counts_[r] = work_all_[2 * r + 1];
    for (const auto& e : strag_.window(step_, work_sums_, work_counts_)) {
      stragglers_named_ += !e.recovered;
      tell([&](observer& x) { x.on_straggler(e); });
    }
  }
  // A new membership (the start, a shrink, a join): the windows start again.
  void restart_straggler_windows() {
    strag_.reset(g_.size());
    work_s_ = 0.0;
    work_steps_ = 0;
    hosts_sent_ = false;
  }

  void broadcast_state(int root = 0) {
    for (const auto& t : mw_.optimizer_tensors())
      g_.broadcast(t.value.data(), t.value.data(), t.value.size(), dtype::f32, root, options{});
    mw_.round();
    auto& st = opt_.state();
    std::uint64_t steps = st.steps;
    c_.broadcast(&steps, &steps, 1, dtype::i64, root, options{});
    st.steps = steps;
    if (o_.zero_stage) return;  // each rank holds (and loaded) its own shard
    for (auto& b : st.buffers)  // host state (a device optimizer keeps its own, zero at the start)
      for (auto& v : b) c_.broadcast(v.data(), v.data(), v.size(), dtype::f32, root, options{});
  }

  // Rank 0 picks the newest valid checkpoint and broadcasts its bytes; every rank loads them
  // and the ranks compare what they loaded.
  void resume() {
    std::uint64_t head[2] = {0, 0};  // step + 1 (0: none), bytes
    std::vector<unsigned char> bytes;
    std::vector<std::string> skipped;
    if (g_.rank() == 0) {
      // Temporary files of a writer that died (no writer runs now): never loaded, now removed.
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(o_.checkpoint_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(".ckpt-", 0) == 0 && n.find(".kft.tmp-") != std::string::npos) {
          std::filesystem::remove(e.path(), ec);
          note("removed " + n + ", a partial checkpoint its writer did not finish");
        }
      }
      if (auto f = latest_checkpoint(o_.checkpoint_dir, &skipped)) {
        head[0] = f->step + 1;
        head[1] = f->bytes.size();
        bytes = std::move(f->bytes);
      }
      for (const auto& s : skipped) note("skipped " + s);
    }
    c_.broadcast(head, head, 2, dtype::i64, 0, options{});
    if (head[0] == 0) return;
    bytes.resize(static_cast<std::size_t>(head[1]));
    c_.broadcast(bytes.data(), bytes.data(), bytes.size(), dtype::u8, 0, options{});
    const std::string what = (o_.checkpoint_dir / checkpoint_name(head[0] - 1)).string();
    checkpoint_reader c(std::move(bytes), what);
    const trainer_state ts = trainer_state::read(c);
    std::uint64_t mine[2] = {c.checksum(), ts.step};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(g_.size()));
    c_.allgather(mine, all.data(), 2, dtype::i64, options{});
    for (int r = 1; r < g_.size(); ++r)
      if (all[2 * static_cast<std::size_t>(r)] != all[0] || all[2 * static_cast<std::size_t>(r) + 1] != all[1])
        throw desync_error("rank " + std::to_string(r) + " loaded another checkpoint than rank 0 (" + what + ")",
                           site("ddp resume"));
    if constexpr (streams) {  // the records' fingerprint (seed included) is compared in fit()
      if (!c.has(records_key))
        throw usage_error("checkpoint " + what + " holds no record position (written by a run over indexed samples, "
                              "or before fit()); this model streams records",
                          site("ddp resume"));
      restored_records_ = c.get_string(records_key);
      restored_what_ = what;
    } else {
      if (c.has(records_key))
        throw usage_error("checkpoint " + what + " was written by a run over streamed records; this model takes "
                              "sample indices",
                          site("ddp resume"));
      if (ts.sampler.seed != o_.seed)
        throw usage_error("checkpoint " + what + " was written with seed " + std::to_string(ts.sampler.seed) +
                              ", this run has seed " + std::to_string(o_.seed) + " (the sample order would change)",
                          site("ddp resume"));
    }
    try {
      const std::string saved = c.has(types_key) ? c.get_string(types_key) : std::string();
      mw_.check_types(c.has(types_key) ? &saved : nullptr, what);
    } catch (const usage_error& e) {
      throw usage_error(e.detail(), site("ddp resume"));
    }
    for (const auto& t : mw_.optimizer_tensors()) {
      const std::string key = trainer_state::parameter_key(t.name);
      if (!c.has(key))
        throw usage_error("checkpoint " + what + " has no parameter '" + t.name + "' (another model?)", site("ddp resume"));
      c.get_floats(key, t.value);
    }
    if (scaler_.on() && c.has(scaler_key)) {
      try {
        scaler_.load(c.get_string(scaler_key), what);
      } catch (const usage_error& e) {
        throw usage_error(e.detail(), site("ddp resume"));
      }
    }
    auto& st = opt_.state();
    st.steps = ts.optimizer_steps;
    for (std::size_t b = 0; b < st.names.size(); ++b)
      for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const std::string key = trainer_state::optimizer_key(st.names[b], tensors_[i].name);
        if (!c.has(key))
          throw usage_error("checkpoint " + what + " has no optimizer state '" + key + "' (written by " + ts.optimizer +
                                "; this run uses " + opt_.name() + ")",
                            site("ddp resume"));
        if (!zero_) {
          c.get_floats(key, st.buffers[b][i]);
          continue;
        }
        std::vector<float> whole(sizes_[i]);  // ZeRO-1: keep this rank's pieces of the whole
        c.get_floats(key, whole);
        zero_->load_state(b, i, whole);
      }
    step_ = ts.step;
    rng_.state = ts.rng;
    restored_ = ts.sampler;
    epoch_ = restored_->epoch;
    resumed_step_ = step_;
    note("resumed from " + what + " (step " + std::to_string(step_) + ", epoch " + std::to_string(epoch_ + 1) +
         (streams ? ", record " : ", sample ") + std::to_string(restored_->cursor) + " of the epoch; written by " + std::to_string(ts.world_size) +
         " rank(s), resumed on " + std::to_string(g_.size()) + ")");
  }

  // ---- metrics and reporting ----
  // The model's metrics and the target, checked before anything collective.
  void set_up_metrics() {
    ms_ = metrics_of(m_);
    if (ms_.size() > stats::max_metrics)
      throw usage_error("trainer: the model reports " + std::to_string(ms_.size()) + " metrics; at most " +
                            std::to_string(stats::max_metrics) + " (stats::max_metrics)",
                        site("ddp trainer"));
    for (std::size_t k = 0; k < ms_.size(); ++k) {
      const std::string& n = ms_.list()[k].name;
      const bool word = !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
      if (!word || n == "loss" || ms_.find(n) != k)
        throw usage_error("trainer: the model's metric " + std::to_string(k) + " is named '" + n +
                              "' (a metric needs a name of letters, digits and '_', not 'loss', used once)",
                          site("ddp trainer"));
    }
    target_ = o_.target;
    if (target_.metric.empty() && o_.target_accuracy > 0) target_ = {"accuracy", o_.target_accuracy, false};
    if (!target_.metric.empty() && target_.metric != "loss" && ms_.find(target_.metric) == ms_.size()) {
      std::string have = "loss";
      for (const auto& m : ms_.list()) have += ", " + m.name;
      throw usage_error("trainer: the target's metric '" + target_.metric + "' is not one the model reports (" +
                            have + ")",
                        site("ddp trainer"));
    }
  }
  // Collective: every rank's model reports the same metrics (else their sums would mix).
  void verify_metrics() {
    const std::string sig = ms_.signature();
    const std::uint64_t mine = hash64(sig.data(), sig.size());
    std::vector<std::uint64_t> all(static_cast<std::size_t>(g_.size()));
    c_.allgather(&mine, all.data(), 1, dtype::i64, options{});
    std::string differ;
    for (int r = 1; r < g_.size(); ++r)
      if (all[static_cast<std::size_t>(r)] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (!differ.empty())
      throw usage_error("the model's metrics differ between ranks: rank(s) " + differ +
                            " report others than rank 0 (this rank's: '" + sig + "'; name, op, mean or value)",
                        site("ddp trainer"));
  }
  std::string target_words() const {
    if (target_.metric.empty()) return {};
    char v[32];
    std::snprintf(v, sizeof v, "%g", target_.value);
    return target_.metric + (target_.at_most ? " <= " : " ") + v;
  }
  // Stats summed, maximised or minimised over the ranks (collective; at most three small allreduces).
  void reduce(stats& s) {
    double sums[2 + stats::max_metrics], maxes[stats::max_metrics];
    std::size_t ns = 2, nm = 0;
    sums[0] = s.loss_sum;
    sums[1] = s.count;
    for (std::size_t k = 0; k < ms_.size(); ++k) {
      const metric_op op = ms_.list()[k].op;
      if (op == metric_op::sum) sums[ns++] = s.values[k];
      else maxes[nm++] = op == metric_op::max ? s.values[k] : -s.values[k];
    }
    c_.allreduce(sums, sums, ns, dtype::f64, op_kind::sum, options{});
    if (nm) c_.allreduce(maxes, maxes, nm, dtype::f64, op_kind::max, options{});
    s.loss_sum = sums[0];
    s.count = sums[1];
    ns = 2, nm = 0;
    for (std::size_t k = 0; k < ms_.size(); ++k) {
      const metric_op op = ms_.list()[k].op;
      if (op == metric_op::sum) s.values[k] = sums[ns++];
      else s.values[k] = op == metric_op::max ? maxes[nm++] : -maxes[nm++];
    }
  }
  std::vector<double> reported(const stats& s) const {
    std::vector<double> v(ms_.size());
    for (std::size_t k = 0; k < ms_.size(); ++k) v[k] = ms_.reported(s, k);
    return v;
  }
  template <class F>
  void tell(F&& f) {
    for (observer* x : observers_) f(*x);
  }
  void note(const std::string& s) {
    tell([&](observer& x) { x.on_note(s); });
  }
  static std::string num(double v, int prec = 4) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", prec, v);
    return b;
  }
  run_info run_description(std::uint64_t train, std::uint64_t test) {
    run_info r;
    r.rank = g_.rank();
    r.ranks = g_.size();
    r.label = o_.label;
    if (o_.lr.on()) {
      if (!r.label.empty()) r.label += ", ";
      r.label += o_.lr.words();
    }
    if constexpr (requires { g_.description(); }) r.group = g_.description();
    r.threads = o_.threads;
    for (auto s : sizes_) r.parameters += s;
    r.tensors = tensors_.size();
    r.buckets = r_->buckets().size();
    r.optimizer = opt_.name();
    r.batch = (o_.deterministic ? std::to_string(o_.global_batch) + " global in " + std::to_string(o_.micro_shards) +
                                      " fixed shards (deterministic)"
                                : std::to_string(o_.batch) + " per rank, " + std::to_string(o_.global_batch) + " global") +
              (o_.accumulate > 1 ? " x " + std::to_string(o_.accumulate) + " accumulated" : std::string());
    if (o_.zero_stage)
      r.sharding = "ZeRO-1: optimizer state sharded over " + std::to_string(g_.size()) + " rank(s), " +
                   std::to_string(optimizer_state_bytes() >> 10) + " KiB here";
    r.epochs = o_.epochs;
    r.train_samples = train;
    r.eval_samples = test;
    r.evaluates = test > 0;
    r.deterministic = o_.deterministic;
    r.global_batch = o_.global_batch;
    r.resumed_from = resumed_step_;
    r.metrics = &ms_;
    r.precision = mw_.words(o_.deterministic, o_.f32_gradients, scaler_, o_.loss_scale.initial);
    return r;
  }
  void record_eval(fit_summary& sum, double train_seconds) {
    if constexpr (evaluable<M>) {
      const stats t = [&] {
        if constexpr (streams) return evaluate(*test_src_);
        else return survive(phase::evaluation, [&] { return evaluate(test_size_); });
      }();
      eval_point p;
      p.step = step_;
      p.train_seconds = train_seconds;
      p.loss = t.mean_loss();
      p.metrics = reported(t);
      if (const std::size_t a = ms_.find("accuracy"); a < ms_.size()) p.accuracy = p.metrics[a];
      p.epoch = static_cast<double>(feed().epoch()) +
                static_cast<double>(feed().cursor()) / static_cast<double>(feed().epoch_length());
      sum.evals.push_back(p);
      if (!target_.metric.empty() && !sum.seconds_to_target) {
        const double v = target_.metric == "loss" ? p.loss : p.metrics[ms_.find(target_.metric)];
        if (target_.at_most ? v <= target_.value : v >= target_.value) {
          sum.seconds_to_target = train_seconds;
          sum.epoch_to_target = p.epoch;
        }
      }
      tell([&](observer& x) { x.on_eval(sum.evals.back()); });
    } else {
      (void)sum, (void)train_seconds;
    }
  }

 private:
  Group& g_;
  Control& c_;
  M& m_;
  O& opt_;
  trainer_options o_;
  std::vector<tensor_ref> tensors_;
  std::vector<std::size_t> sizes_;
  std::unique_ptr<timeline> tl_;  // before r_: the reducer records into it until it is destroyed
  std::optional<reducer<Group, trainer_hook>> r_;
  std::vector<parameter> params_;  // what the reducer was built with (rebuilt after a shrink)
  reducer_options ro_;
  std::uint64_t shrinks_ = 0;      // times the group shrank under this trainer
  std::uint64_t phases_ = 0;       // collective phases of fit() this rank finished (survive)
  phase last_phase_ = phase::step;  // the last one, and its outcome when it was statistics
  stats last_outcome_{};
  std::vector<std::span<float>> views_;
  std::vector<batch_type> micro_;  // the first micro_n_ are this step's
  std::size_t micro_n_ = 0;
  std::optional<distributed_sampler> sampler_;  // an indexed model's
  record_source* src_ = nullptr;                // a streaming model's training records (fit())
  bool welcome_pending_ = false;  // a streaming model's joiner: the members' state comes in fit()
  bool joined_ = false;           // this rank joined a running group: its position came from a member
  bool stateless_ = false;        // this rank joined and has not been sent the state yet
  group::membership members_now_;  // the last change's membership (shrink or grow)
  record_source* test_src_ = nullptr;           // ... and its test records
  record_batch eval_records_;                   // this rank's share of an evaluation batch
  std::optional<sampler_state> restored_;
  std::string restored_records_, restored_what_;  // a streaming resume: the records fingerprint, the checkpoint
  splitmix64 rng_;
  std::vector<std::uint64_t> hashes_, all_hashes_;
  std::uint64_t step_ = 0, epoch_ = 0, resumed_step_ = 0, test_size_ = 0, last_samples_ = 0;
  double comm_s_ = 0.0, eval_total_ = 0.0, opt_s_ = 0.0;
  step_counters<on_device> counters_;  // the trainer's counts in the reducer's trailer
  std::optional<zero1<O>> zero_;      // ZeRO-1: the optimizer, sharded
  mutable std::vector<float> scratch_;  // device groups: a tensor copied to the host (hashes, checks)
  bool first_micro_ = false, last_micro_ = false, local_bad_ = false;
  metric_set ms_;
  trainer_options::goal target_;
  std::optional<fixed_point_gradients> fixed_;  // deterministic mode's gradients and arithmetic
  // Mixed precision (precision.hpp): the master weights and each gradient's type, loss scaling,
  // the typed gradient views (16-bit buckets, or a loss scale to hand the model).
  master_weights mw_;
  loss_scaler scaler_;
  std::vector<grad_view> typed_views_;
  bool typed_grads_ = false, check_overflow_ = false;
  std::uint64_t overflow_ = 0;
  std::optional<console_report> console_;
  std::vector<observer*> observers_;     // console_ first, then trainer_options::observers
  // Stragglers: this rank's work in the current window (seconds, steps), the time blocked in a
  // step's collectives besides finish() (ZeRO-1's allgather), the exchange's buffers.
  straggler_detector strag_;
  double work_s_ = 0.0, blocked_s_ = 0.0;
  std::uint64_t work_steps_ = 0, stragglers_named_ = 0;
  bool hosts_sent_ = false;
  std::vector<double> work_all_, work_sums_, work_counts_;
};

}  // namespace ddp
KFT_NAMESPACE_END
