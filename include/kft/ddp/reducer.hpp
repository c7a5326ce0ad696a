// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/reducer.hpp
/// @brief The DDP reducer: gradients live in buckets, each bucket is averaged across the ranks
/// as soon as its last gradient is ready, while the rest of the backward pass still runs.
///
///     kft::ddp::reducer r(pg, {{n1, kft::dtype::f32, "fc1.weight"}, {n2, kft::dtype::f32, "fc1.bias"}, ...});
///     for (step ...) {
///       r.zero_grad();
///       forward(...);
///       backward(..., [&](std::size_t i) {            // gradient i is final
///         r.mark_ready(i);                             // its bucket may launch now
///       });                                            // (backward writes into r.gradient<float>(i))
///       r.finish();                                    // every gradient averaged over the ranks
///       optimizer.step(...);
///     }
///
/// The model of a step (docs/ddp.md): gradients are views into bucket storage (`gradient<T>(i)`;
/// no copy in or out; storage inside the shared-memory segment when the group can give it).
/// `mark_ready(i)` counts down i's bucket; a bucket whose gradients are all ready is launched
/// through the hook (default: one async allreduce with `op_kind::avg`), strictly in bucket
/// order on every rank (a ready bucket waits for the lower ones). `finish()` waits for every
/// bucket. After the first step the buckets are rebuilt once from the ready order rank 0
/// observed (broadcast, so every rank keeps identical buckets); spans from `gradient()` are
/// valid until `layout_version()` changes.
///
/// Errors are always on and raised at the step where they happen: a parameter marked twice; a
/// parameter never marked by `finish()` (the others are told through the group's abort, so
/// they fail at once instead of waiting); parameter counts, shapes or dtypes that differ
/// between ranks (at construction, naming the first difference and both ranks); a bucket that
/// does not complete (the group's deadline; the message names the bucket, the step and its
/// parameters). The layout's fingerprint is the collectives' tag, so ranks with different
/// buckets fail the transport's signature check instead of adding wrong numbers.
///
/// A caller's own small values can ride with the gradients (`reducer_options::trailer`): they
/// sit in the bucket launched last, which `finish()` launches, so a trainer's step counters
/// travel with no collective of their own. For reduce-scatter hooks (ZeRO), `shard(r, n)`
/// answers which pieces of which parameters fall in rank r's slice of every bucket.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kft/async/work.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/ddp/buckets.hpp>
#include <kft/ddp/hooks.hpp>
#include <kft/ddp/memory.hpp>
#include <kft/ddp/timeline.hpp>
#include <kft/group/process_group.hpp>
#include <kft/transport/concepts.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief How a reducer works.
struct reducer_options {
  bucket_limits limits{};               ///< first bucket 1 MiB, then 25 MiB (PyTorch's defaults)
  /// Replace `limits.bucket_bytes_cap` by one chosen from the group's measured cost at
  /// construction (choose_bucket_cap: per-call cost <= `auto_overhead` of a bucket's time);
  /// every rank takes the slowest rank's timings, so all choose the same buckets.
  bool auto_bucket_cap = false;
  double auto_overhead = 0.05;
  bool find_unused_parameters = false;  ///< parameters not marked by finish() count as unused, not as an error
  bool rebuild_buckets = true;          ///< once, after step 1, from the observed ready order
  /// Fixed bucket layout (no rebuild): with a group whose reduction order per element is fixed
  /// (kft's shared-memory transport), results are bit-identical across runs, bucket caps and
  /// arrival orders.
  bool deterministic = false;
  bool shared_storage = true;  ///< bucket storage inside the group's shared segment when it has room
  /// Each bucket's storage holds a multiple of this many elements (the tail after the last
  /// gradient is zero padding): a hook that reduce-scatters a bucket over N ranks asks for N.
  std::size_t bucket_multiple = 1;
  std::chrono::milliseconds timeout{0};  ///< per bucket; 0 = the group's
  timeline* trace = nullptr;  ///< records readiness, queueing and communication (timeline.hpp)
  /// GPU groups (kft/ddp/cuda.hpp): the CUDA stream the backward pass runs on (a cudaStream_t;
  /// nullptr = the legacy default stream). Ignored by host groups.
  void* stream = nullptr;
  /// Values of the caller's own (`trailer<T>()`), reduced by the hook with the bucket that
  /// `finish()` launches last (of their type: one of their own when no gradient has it). 0: none.
  std::size_t trailer = 0;
  dtype trailer_type = dtype::f32;
};

template <async_communicator Group = group::process_group, comm_hook<Group> Hook = allreduce_avg>
class reducer {
 public:
  /// @brief Collective over the group: checks that every rank has the same parameters (count,
  /// dtype, number, in order), assigns the buckets and allocates their storage.
  /// @throws mismatch_error naming the first parameter that differs and two ranks
  reducer(Group& g, std::vector<parameter> params, reducer_options o = {}, Hook hook = {})
      : g_(g), params_(std::move(params)), o_(o), hook_(std::move(hook)), mem_(g, o.stream), user_(params_.size()) {
    if (params_.empty()) throw usage_error("a reducer needs at least one parameter", site("ddp reducer"));
    if (memory::on_device && o_.find_unused_parameters)
      throw usage_error("find_unused_parameters is not available for a reducer over a GPU group yet",
                        site("ddp reducer"));
    // The trailer: an internal last parameter, taken last (so it lands in the last bucket of its type).
    if (o_.trailer) params_.push_back({o_.trailer, o_.trailer_type, "kft.reducer.trailer"});
    verify_across_ranks();
    if (o_.auto_bucket_cap) {
      link_ = measure_link();
      o_.limits.bucket_bytes_cap = choose_bucket_cap(link_, o_.auto_overhead);
      o_.limits.first_bucket_bytes = std::min(o_.limits.first_bucket_bytes, o_.limits.bucket_bytes_cap);
    }
    std::vector<std::size_t> order;  // reverse registration order, the trailer last
    for (std::size_t i = user_; i-- > 0;) order.push_back(i);
    if (o_.trailer) order.push_back(user_);
    layout(assign_buckets(params_, o_.limits, order));
    ready_.assign(params_.size(), 0);
    observed_.reserve(params_.size());
    if (o_.find_unused_parameters) usage_.assign(params_.size(), 0);
  }
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;
  ~reducer() { settle(); }

  std::size_t parameters() const noexcept { return user_; }
  const parameter& param(std::size_t i) const {
    check_index(i, "param");
    return params_[i];
  }
  /// @brief Parameter indices per bucket; the trailer, when there is one, appears as index parameters().
  const bucket_assignment& buckets() const noexcept { return buckets_; }
  /// @brief Changes when the buckets are rebuilt (at most once, in the first synced step's finish()).
  std::uint64_t layout_version() const noexcept { return version_; }
  /// @brief Steps finished (synced or not).
  std::uint64_t steps() const noexcept { return step_; }
  /// @brief True when bucket storage is inside the group's shared segment (no copy-in).
  bool shared_storage() const noexcept { return shared_; }
  /// @brief The limits in use (with auto_bucket_cap: the chosen cap).
  const bucket_limits& limits() const noexcept { return o_.limits; }
  /// @brief With auto_bucket_cap: the group's allreduce cost as measured (the slowest rank's).
  const link_cost& measured_link() const noexcept { return link_; }

  /// @brief Where parameter i's gradient lives: its bucket and its first element's position in it.
  std::size_t bucket_of(std::size_t i) const {
    check_index(i, "bucket_of");
    return bucket_of_[i];
  }
  std::size_t offset_in_bucket(std::size_t i) const {
    check_index(i, "offset_in_bucket");
    return offset_of_[i];
  }
  /// @brief Bucket k's storage: its elements (padding included) and their type.
  std::size_t bucket_elements(std::size_t k) const { return store_.at(k).count; }
  /// @brief True when bucket k holds gradients (false for a bucket of the trailer alone).
  bool holds_gradients(std::size_t k) const {
    const auto& b = buckets_.at(k);
    return std::any_of(b.begin(), b.end(), [&](std::size_t i) { return i < user_; });
  }
  dtype bucket_type(std::size_t k) const { return store_.at(k).type; }
  void* bucket_data(std::size_t k) { return store_.at(k).data; }

  /// @brief Parameter i's gradient: a view into its bucket (valid until layout_version() changes).
  template <class T>
  std::span<T> gradient(std::size_t i) {
    check_index(i, "gradient");
    if (dtype_of_v<T> != params_[i].type)
      throw usage_error("gradient<" + std::string(name(dtype_of_v<T>)) + ">(" + std::to_string(i) + "): parameter '" +
                            params_[i].name + "' holds " + std::string(name(params_[i].type)),
                        site("ddp gradient"));
    return {static_cast<T*>(gradient_data(i)), params_[i].count};
  }
  void* gradient_data(std::size_t i) {
    check_index(i, "gradient");
    return data_of(i);
  }
  /// @brief The trailer's values (reducer_options::trailer): set them before finish(), read
  /// them after it (reduced by the hook, e.g. averaged). Valid until layout_version() changes.
  template <class T>
  std::span<T> trailer() {
    if (!o_.trailer) throw usage_error("trailer(): this reducer has none (reducer_options::trailer)", site("ddp trailer"));
    if (dtype_of_v<T> != o_.trailer_type)
      throw usage_error("trailer<" + std::string(name(dtype_of_v<T>)) + ">(): the trailer holds " +
                            std::string(name(o_.trailer_type)),
                        site("ddp trailer"));
    return {static_cast<T*>(trailer_data()), o_.trailer};
  }
  void* trailer_data() {
    if (!o_.trailer) throw usage_error("trailer(): this reducer has none (reducer_options::trailer)", site("ddp trailer"));
    return data_of(user_);
  }

  /// @brief One parameter's piece of a rank's slice of a bucket.
  struct slice {
    std::size_t param = 0;   ///< the parameter
    std::size_t offset = 0;  ///< its first element in the piece
    std::size_t count = 0;
    std::size_t bucket = 0;
    std::size_t at = 0;      ///< the piece's first element within the bucket
  };
  /// @brief Rank `rank` of `ranks`' share of a reduce-scatter: the slice [r c/n, (r + 1) c/n)
  /// of every gradient bucket (c its padded size, reducer_options::bucket_multiple = n), cut
  /// into pieces of parameters, in bucket order (the trailer is never part of one).
  std::vector<slice> shard(int rank, int ranks) const {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      throw usage_error("shard(" + std::to_string(rank) + ", " + std::to_string(ranks) + "): not a rank of that many",
                        site("ddp shard"));
    const auto n = static_cast<std::size_t>(ranks), me = static_cast<std::size_t>(rank);
    std::vector<slice> out;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      if (store_[k].count % n != 0)
        throw usage_error("shard(): bucket " + std::to_string(k) + " holds " + std::to_string(store_[k].count) +
                              " elements, not a multiple of " + std::to_string(n) + " (reducer_options::bucket_multiple)",
                          site("ddp shard"));
      const std::size_t per = store_[k].count / n, lo = me * per, hi = lo + per;
      for (std::size_t i : buckets_[k]) {
        if (i >= user_) continue;
        const std::size_t off = offset_of_[i], len = params_[i].count;
        const std::size_t a = std::max(lo, off), b = std::min(hi, off + len);
        if (a < b) out.push_back({i, a - off, b - a, k, a});
      }
    }
    return out;
  }

  /// @brief Copies `bytes` from the host into the reducer's kind of memory at `dst` (a
  /// gradient, or any buffer of that kind) and back: memcpy for host groups; for device groups
  /// a copy that first waits for everything enqueued on the compute stream and is complete
  /// when it returns.
  void upload(void* dst, const void* host, std::size_t bytes) { mem_.upload(dst, host, bytes); }
  void download(void* host, const void* src, std::size_t bytes) const { mem_.download(host, src, bytes); }

  /// @brief Zeroes every gradient (before a step whose backward adds into them).
  void zero_grad() {
    for (auto& b : store_) mem_.zero(b.data, b.count * size_of(b.type));
  }

  /// @brief Gradient i is final for this step. Launches its bucket (and every later one that
  /// is complete) when it was the bucket's last.
  /// @throws usage_error when i was already marked in this step
  void mark_ready(std::size_t i) {
    check_index(i, "mark_ready");
    mark(i);
  }

  /// @brief Waits for every bucket: afterwards every gradient is the average over the ranks.
  /// @throws usage_error naming a parameter that was never marked (not in find-unused mode),
  /// or the error of a bucket that did not complete (naming the bucket and the step)
  void finish() {
    const std::uint64_t step = step_ + 1;
    if (!syncing_) {  // an accumulation micro-step: nothing was sent
      std::fill(ready_.begin(), ready_.end(), 0);
      ++step_;
      return;
    }
    if (o_.trailer && !ready_[user_]) mark(user_);  // the trailer's bucket goes last
    // Parameters this rank never marked.
    std::size_t first_unmarked = params_.size(), unmarked = 0;
    for (std::size_t i = 0; i < user_; ++i)
      if (!ready_[i]) {
        if (first_unmarked == params_.size()) first_unmarked = i;
        ++unmarked;
      }
    if (unmarked && !o_.find_unused_parameters) {
      const auto& p = params_[first_unmarked];
      const std::string why = "parameter '" + p.name + "' (index " + std::to_string(first_unmarked) + ", bucket " +
                              std::to_string(bucket_of_[first_unmarked]) + ") was never marked ready on rank " +
                              std::to_string(g_.rank()) + " before finish() in step " + std::to_string(step) +
                              (unmarked > 1 ? " (" + std::to_string(unmarked - 1) + " more unmarked)" : "") +
                              "; a parameter that gets no gradient in some steps needs "
                              "reducer_options::find_unused_parameters";
      g_.abort(why);  // the ranks waiting for this bucket fail now, with this text
      settle();
      reset_step();
      throw usage_error(why, site("ddp finish", step));
    }
    if (unmarked) {  // find-unused mode: zero gradients, launched as if ready
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (!ready_[i]) {
          mem_.zero(data_of(i), params_[i].count * size_of(params_[i].type));
          ready_[i] = 1;
          if (--pending_[bucket_of_[i]] == 0) launch_ready();
        }
    }
    std::optional<async::work> usage_work;
    // Who used what: summed over the ranks, issued after the last bucket. (void): nvcc takes
    // emplace's returned reference for a discarded nodiscard value.
    if (!usage_.empty())
      (void)usage_work.emplace(
          g_.allreduce_async(usage_.data(), usage_.data(), usage_.size(), dtype::i32, op_kind::sum, opts()));
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      try {
        works_[k].wait();
      } catch (const error& e) {
        settle();
        reset_step();
        throw_bucket_error(k, step, e);
      }
      if (o_.trace)
        if (const auto* st = works_[k].state(); st && st->started_ns() && st->done_ns())
          o_.trace->add("bucket " + std::to_string(k), "comm", st->started_ns(), st->done_ns());
      bucket_view v = view(k);
      hook_.complete(v);
    }
    if (usage_work) {
      usage_work->wait();
      used_.assign(usage_.begin(), usage_.end());
      std::fill(usage_.begin(), usage_.end(), 0);
    }
    mem_.after_finish();
    ++step_;
    if (++synced_ == 1 && o_.rebuild_buckets && !o_.deterministic && !o_.find_unused_parameters) rebuild();
    reset_step();
  }

  /// @brief In find-unused mode, after finish(): how many ranks used parameter i in the step.
  int used_by(std::size_t i) const {
    check_index(i, "used_by");
    return used_.empty() ? g_.size() : used_[i];
  }

  /// @brief While the guard lives, steps only accumulate gradients: mark_ready and finish move
  /// nothing. k micro-steps under it plus one synced step issue exactly one step's collectives.
  class [[nodiscard]] sync_guard {
   public:
    explicit sync_guard(reducer& r) : r_(&r) { r_->syncing_ = false; }
    sync_guard(sync_guard&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
    sync_guard(const sync_guard&) = delete;
    ~sync_guard() {
      if (r_) r_->syncing_ = true;
    }

   private:
    reducer* r_;
  };
  sync_guard no_sync() { return sync_guard(*this); }

 private:
  // Where parameter i (or the trailer, i == user_) lives.
  void* data_of(std::size_t i) { return store_[bucket_of_[i]].data + offset_of_[i] * size_of(params_[i].type); }
  // Marks i (a parameter or the trailer) ready; launches what became complete.
  void mark(std::size_t i) {
    if (ready_[i])
      throw usage_error("parameter '" + params_[i].name + "' (index " + std::to_string(i) + ") was marked ready twice in " +
                            "step " + std::to_string(step_ + 1) +
                            " (is it used twice in the forward pass, or marked by two hooks?)",
                        site("ddp mark_ready"));
    ready_[i] = 1;
    if (!syncing_) return;  // no_sync: gradients accumulate locally, nothing travels
    if (o_.trace) o_.trace->instant(params_[i].name, "ready");
    if (synced_ == 0) observed_.push_back(i);
    if (!usage_.empty()) usage_[i] = 1;
    if (--pending_[bucket_of_[i]] == 0) launch_ready();
  }

  using memory = bucket_memory<Group>;
  struct storage {
    dtype type = dtype::f32;
    std::size_t count = 0;
    unsigned char* data = nullptr;
    std::unique_ptr<unsigned char, void (*)(void*)> owned{nullptr, &memory::release};
  };

  error_site site(std::string op, std::uint64_t seq = 0) const {
    if constexpr (requires { g_.next_site(collective::allreduce); }) {
      auto s = g_.next_site(collective::allreduce);
      s.operation = std::move(op);
      s.sequence.reset();
      if (seq) s.sequence = seq;
      return s;
    } else {
      return error_site::in({}, g_.rank(), g_.size(), std::move(op), seq);
    }
  }
  void check_index(std::size_t i, const char* what) const {
    if (i >= user_)
      throw usage_error(std::string(what) + "(" + std::to_string(i) + "): the reducer has " +
                            std::to_string(user_) + " parameters",
                        site("ddp " + std::string(what)));
  }
  options opts() const {
    options o;
    o.timeout = o_.timeout;
    o.tag = fingerprint_;
    return o;
  }
  bucket_view view(std::size_t k) {
    bucket_view v;
    v.index = k;
    v.type = store_[k].type;
    v.data = store_[k].data;
    v.count = store_[k].count;
    v.used = used_of_[k];
    v.last = k + 1 == buckets_.size();
    v.opts = opts();
    return v;
  }

  // Launches every complete bucket from the next one on, in order.
  void launch_ready() {
    if (next_ < buckets_.size() && pending_[next_] == 0) mem_.before_launch();
    while (next_ < buckets_.size() && pending_[next_] == 0) {
      bucket_view v = view(next_);
      if (o_.trace) o_.trace->instant("bucket " + std::to_string(next_), "queue");
      (void)(works_[next_] = as_work(hook_.launch(g_, v)));  // (void): as above, for nvcc
      ++next_;
    }
  }
  template <class W>
  static async::work as_work(W&& w) {
    if constexpr (std::same_as<std::remove_cvref_t<W>, async::work>) return std::forward<W>(w);
    else {
      auto st = std::make_shared<async::work_state>();
      st->op = w.op();
      st->seq = w.sequence();
      st->progress = [h = std::make_shared<std::remove_cvref_t<W>>(std::forward<W>(w))] { return h->test(); };
      return async::work(std::move(st));
    }
  }

  [[noreturn]] void throw_bucket_error(std::size_t k, std::uint64_t step, const error& e) const {
    const auto& members = buckets_[k];
    std::string names = "'" + params_[members.front()].name + "'";
    if (members.size() > 1) names += " .. '" + params_[members.back()].name + "'";
    const std::string msg = "bucket " + std::to_string(k) + " of step " + std::to_string(step) + " (" +
                            std::to_string(members.size()) + " parameter(s): " + names +
                            ") did not complete: " + e.what();
    if (dynamic_cast<const timeout_error*>(&e)) throw timeout_error(msg, site("ddp finish", step));
    if (dynamic_cast<const mismatch_error*>(&e)) throw mismatch_error(msg, site("ddp finish", step));
    if (dynamic_cast<const remote_error*>(&e)) throw remote_error(msg, site("ddp finish", step));
    if (dynamic_cast<const usage_error*>(&e)) throw usage_error(msg, site("ddp finish", step));
    throw transport_error(msg, site("ddp finish", step));
  }

  // Waits for whatever is in flight, ignoring its errors (the failure path).
  void settle() noexcept {
    for (auto& w : works_) {
      try {
        w.wait();
      } catch (...) {
      }
      async::work done;
      std::swap(w, done);  // (not `w = work()`: nvcc flags the discarded [[nodiscard]] result)
    }
  }
  void reset_step() {
    std::fill(ready_.begin(), ready_.end(), 0);
    for (std::size_t k = 0; k < buckets_.size(); ++k) pending_[k] = buckets_[k].size();
    next_ = 0;
  }

  // Every rank has the same parameters: rank 0's list, broadcast and compared.
  void verify_across_ranks() {
    const int p = g_.size(), me = g_.rank();
    std::vector<std::int64_t> counts(static_cast<std::size_t>(p));
    const std::int64_t n = static_cast<std::int64_t>(params_.size());
    host_call(&n, sizeof n, counts.data(), counts.size() * sizeof(std::int64_t), [&](const void* in, void* out) {
      g_.allgather(in, out, 1, dtype::i64, options{});
    });
    for (int r = 0; r < p; ++r)
      if (counts[static_cast<std::size_t>(r)] != counts[0])
        throw mismatch_error("rank " + std::to_string(r) + " has " + std::to_string(counts[static_cast<std::size_t>(r)]) +
                                 " parameters, rank 0 has " + std::to_string(counts[0]) +
                                 " (every rank must register the same model)",
                             site("ddp reducer"));
    std::vector<std::int64_t> mine(2 * params_.size()), zero(2 * params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      mine[2 * i] = static_cast<std::int64_t>(params_[i].count);
      mine[2 * i + 1] = static_cast<std::int64_t>(params_[i].type);
    }
    host_call(mine.data(), mine.size() * sizeof(std::int64_t), zero.data(), zero.size() * sizeof(std::int64_t),
              [&](const void* in, void* out) { g_.broadcast(in, out, mine.size(), dtype::i64, 0, options{}); });
    std::int64_t first = n;
    for (std::size_t i = 0; i < params_.size() && first == n; ++i)
      if (mine[2 * i] != zero[2 * i] || mine[2 * i + 1] != zero[2 * i + 1]) first = static_cast<std::int64_t>(i);
    std::vector<std::int64_t> firsts(static_cast<std::size_t>(p));
    host_call(&first, sizeof first, firsts.data(), firsts.size() * sizeof(std::int64_t), [&](const void* in, void* out) {
      g_.allgather(in, out, 1, dtype::i64, options{});
    });
    for (int r = 0; r < p; ++r) {
      const std::int64_t f = firsts[static_cast<std::size_t>(r)];
      if (f == n) continue;
      const auto i = static_cast<std::size_t>(f);
      auto desc = [&](std::int64_t c, std::int64_t t) {
        return std::string(name(static_cast<dtype>(t))) + " x " + std::to_string(c);
      };
      std::string detail = "parameter " + std::to_string(i) + " ('" + params_[i].name + "'): rank 0 has " +
                           desc(zero[2 * i], zero[2 * i + 1]);
      if (r == me) detail += ", rank " + std::to_string(me) + " has " + desc(mine[2 * i], mine[2 * i + 1]);
      else detail += ", rank " + std::to_string(r) + " has something else";
      throw mismatch_error(detail + " (every rank must register the same model, in the same order)", site("ddp reducer"));
    }
  }

  // Makes buckets `b` the layout: storage (copying gradients from the old one, if any), the
  // parameter -> (bucket, offset) tables and the fingerprint.
  void layout(bucket_assignment b) {
    std::vector<storage> fresh(b.size());
    std::vector<std::size_t> bucket_of(params_.size()), offset_of(params_.size()), used(b.size());
    const std::size_t multiple = std::max<std::size_t>(o_.bucket_multiple, 1);
    for (std::size_t k = 0; k < b.size(); ++k) {
      std::size_t n = 0;
      for (std::size_t i : b[k]) {
        bucket_of[i] = k;
        offset_of[i] = n;
        n += params_[i].count;
      }
      fresh[k].type = params_[b[k].front()].type;
      fresh[k].count = (n + multiple - 1) / multiple * multiple;
      used[k] = n;
      allocate(fresh[k]);
    }
    if (!store_.empty())  // a rebuild: the step's gradients move with their parameters
      for (std::size_t i = 0; i < params_.size(); ++i)
        mem_.copy(fresh[bucket_of[i]].data + offset_of[i] * size_of(params_[i].type), data_of(i),
                  params_[i].count * size_of(params_[i].type));
    store_ = std::move(fresh);
    buckets_ = std::move(b);
    bucket_of_ = std::move(bucket_of);
    offset_of_ = std::move(offset_of);
    used_of_ = std::move(used);
    fingerprint_ = fingerprint(params_, buckets_);
    works_.clear();
    works_.resize(buckets_.size());
    pending_.assign(buckets_.size(), 0);
    reset_step();
    ++version_;
  }

  void allocate(storage& s, bool may_share = true) {
    const std::size_t bytes = std::max<std::size_t>(s.count * size_of(s.type), 64);
    if constexpr (requires { g_.allocate_shared(bytes); }) {
      if (o_.shared_storage && may_share)  // collective: every rank asks in the same order, and gets the same answer
        if (void* p = g_.allocate_shared(bytes)) {
          s.data = static_cast<unsigned char*>(p);
          std::memset(s.data, 0, bytes);
          shared_ = true;
          return;
        }
    }
    s.owned.reset(static_cast<unsigned char*>(mem_.allocate(bytes)));
    s.data = s.owned.get();
  }

  // The reducer's own small collectives work on host arrays; a device group gets device copies.
  template <class F>
  void host_call(const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes, F&& op) {
    if constexpr (!memory::on_device) {
      op(in, out);
    } else {
      storage a, b;
      a.type = b.type = dtype::u8;
      a.count = in_bytes;
      b.count = out_bytes;
      allocate(a, false);
      allocate(b, false);
      mem_.upload(a.data, in, in_bytes);
      op(static_cast<const void*>(a.data), static_cast<void*>(b.data));
      mem_.download(out, b.data, out_bytes);
    }
  }

  // The group's allreduce time at two sizes (medians of 5 after a warm-up), the slowest rank's
  // on every rank (an allreduce max), fitted to alpha + beta x bytes.
  link_cost measure_link() {
    std::size_t total = 0;
    for (const auto& p : params_) total += p.count * size_of(p.type);
    const std::size_t small = 4u << 10, large = std::clamp<std::size_t>(total, 256u << 10, 4u << 20);
    storage buf;
    buf.type = dtype::f32;
    buf.count = large / 4;
    allocate(buf, false);
    auto time_of = [&](std::size_t bytes) {
      std::vector<double> t;
      for (int k = 0; k < 6; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        g_.allreduce(buf.data, buf.data, bytes / 4, dtype::f32, op_kind::sum, options{});
        if (k) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(t.begin(), t.begin() + 2, t.end());
      return t[2];
    };
    double times[2] = {time_of(small), time_of(large)};
    host_call(times, sizeof times, times, sizeof times, [&](const void* in, void* out) {
      g_.allreduce(in, out, 2, dtype::f64, op_kind::max, options{});
    });
    link_cost c;
    c.beta_s_per_byte = (times[1] - times[0]) / static_cast<double>(large - small);
    c.alpha_s = times[0] - c.beta_s_per_byte * static_cast<double>(small);
    return c;
  }

  // Rank 0's observed ready order becomes every rank's bucket order.
  void rebuild() {
    std::vector<std::int64_t> order(params_.size()), zero(params_.size());
    if (observed_.size() != params_.size()) return;  // (every parameter was marked: it is complete)
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(observed_[i]);
    host_call(order.data(), order.size() * sizeof(std::int64_t), zero.data(), zero.size() * sizeof(std::int64_t),
              [&](const void* in, void* out) { g_.broadcast(in, out, order.size(), dtype::i64, 0, options{}); });
    std::vector<std::size_t> seq(zero.begin(), zero.end());
    auto b = assign_buckets(params_, o_.limits, seq);
    if (b != buckets_) layout(std::move(b));
  }

  Group& g_;
  std::vector<parameter> params_;
  reducer_options o_;
  Hook hook_;
  memory mem_;
  std::size_t user_;  // the caller's parameters (params_ ends with the trailer when there is one)
  bucket_assignment buckets_;
  std::vector<std::size_t> bucket_of_, offset_of_, used_of_;
  std::vector<storage> store_;
  std::vector<std::uint8_t> ready_;
  std::vector<std::size_t> pending_;
  std::vector<async::work> works_;
  std::size_t next_ = 0;
  std::vector<std::size_t> observed_;
  std::vector<std::int32_t> usage_, used_;
  std::uint64_t step_ = 0, synced_ = 0, version_ = 0;
  std::uint32_t fingerprint_ = 0;
  link_cost link_{};
  bool syncing_ = true, shared_ = false;
};

}  // namespace ddp
KFT_NAMESPACE_END
