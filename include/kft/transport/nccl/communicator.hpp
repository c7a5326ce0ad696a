// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/nccl/communicator.hpp
/// @brief Collectives over NCCL (component `kft::nccl`) on device buffers, with kft's dtypes, ops,
/// errors and deadlines.
///
///     kft::nccl::communicator comm(*store, rank, size, local_rank);   // meets through the store
///     comm.allreduce(std::span<const float>(g, n), std::span<float>(g, n), kft::ops::avg);
///     auto w = comm.allreduce_async(in, out, kft::ops::sum, kft::nccl::options{.stream = s});
///     w.wait();                                                     // or w.detach(): stream-ordered
///     auto rail = comm.split(local_rank, rank, "rail 0");           // explicit, named split
///
/// Every collective is enqueued on a CUDA stream (the call's `nccl::options::stream`, else the
/// communicator's own) and, for the `_async` forms, returns a `kft::async::work` whose `wait()`
/// polls a CUDA event recorded after it. The plain forms wait before returning, so they mean
/// what the MPI and shm communicators' do: `out` holds the result when the call returns.
/// Dropping a work waits for it, as every backend's does; `work::detach()` lets it go
/// stream-ordered instead (later work on the stream sees the result).
///
/// NCCL has no watchdog of its own: a rank that never arrives leaves every other rank's kernel
/// spinning. kft creates the communicator non-blocking (`ncclConfig_t::blocking = 0`) and polls
/// its event and `ncclCommGetAsyncError` against a deadline; past it, the call throws
/// `timeout_error` and the communicator is aborted (`ncclCommAbort`, which stops the kernels) on
/// a thread of its own: the abort can take seconds, the error comes at the deadline.
/// `kft::wait_for_background_cleanup` waits for such aborts (exit does too, bounded). After a
/// failure the communicator refuses further calls. NCCL return codes become kft exceptions in
/// one place (`kft::nccl::check`), CUDA's in `kft::detail::cuda_check` (core/cuda_error.hpp).
/// The pieces: `options.hpp` (settings, per-call options, the unique id, types), `state.hpp`
/// (what the communicator and its work share).
///
/// Not thread-safe: one communicator is used by one thread at a time (as NCCL requires).
///
/// One cohesive thing at ~400 lines: the communicator's life cycle (init with a deadline, split,
/// close) and its collectives, all on one `comm_state`.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/communicator.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <kft/async/work.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/nccl/options.hpp>
#include <kft/transport/nccl/state.hpp>
#include <kft/transport/nccl/work.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

/// @brief A NCCL communicator owned by kft: RAII, move-only; `split` is explicit; `abort()`
/// stops it on the failure path.
class communicator : public typed_collectives<communicator, options> {
  using typed = typed_collectives<communicator, options>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  /// Buffers live on the device: host-side post-processing (e.g. the generic hierarchical
  /// allreduce's division for avg) must not touch them.
  static constexpr bool device_buffers = true;
  /// @brief Collective over `size` ranks: meets through `store` (rank 0 publishes a NCCL unique
  /// id under "nccl/<name>/<n>/id", n counting this rank's communicators of that name, so a job
  /// may create several), then creates the communicator on CUDA device `device`.
  /// @throws usage_error for a bad rank/size, timeout_error when the others do not arrive within
  /// `cfg.timeout`, transport_error when NCCL or CUDA fails
  communicator(rendezvous::store& store, int rank, int size, int device, config cfg = {}) {
    validate(rank, size, device);
    const auto n = store.add("nccl/" + cfg.name + "/calls/" + std::to_string(rank), 1);
    const std::string key = "nccl/" + cfg.name + "/" + std::to_string(n) + "/id";
    ncclUniqueId id{};
    if (rank == 0) {
      id = unique_id();
      store.set(key, detail::to_hex(id));
    } else {
      id = detail::from_hex(store.get(key, cfg.timeout), key, error_site::of("nccl communicator"));
    }
    init(id, rank, size, device, std::move(cfg));
  }

  /// @brief Collective: creates the communicator from a unique id that the caller distributed
  /// (`kft::nccl::unique_id()` on one rank; see mpi_bootstrap.hpp for MPI).
  communicator(const ncclUniqueId& id, int rank, int size, int device, config cfg = {}) {
    validate(rank, size, device);
    init(id, rank, size, device, std::move(cfg));
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      close();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// @brief Flushes and destroys the NCCL communicator (aborts it when broken, or when the
  /// flush outlasts `config::destroy_timeout`). Never throws.
  ~communicator() { close(); }

  /// @brief False for a moved-from communicator and the result of a split with a negative color.
  bool valid() const noexcept { return s_ && (s_->comm != nullptr || !s_->broken.empty()); }
  int rank() const noexcept { return s_ ? s_->rank : -1; }
  int size() const noexcept { return s_ ? s_->size : 0; }
  int device() const noexcept { return s_ ? s_->device : -1; }
  std::uint64_t sequence() const noexcept { return s_ ? s_->seq : 0; }
  ncclComm_t native() const noexcept { return s_ ? s_->comm : nullptr; }
  /// @brief The stream collectives run on when a call names none.
  cudaStream_t stream() const noexcept { return s_ ? s_->stream : nullptr; }
  const config& configuration() const {
    if (!s_) throw usage_error("configuration() of an empty communicator", error_site::of("nccl communicator"));
    return s_->cfg;
  }
  error_site next_site(collective c) const {
    return s_ ? s_->site(std::string(name(c)), s_->seq + 1) : error_site::of("nccl " + std::string(name(c)));
  }
  /// @brief Why this communicator refuses calls (empty while healthy).
  std::string broken() const { return s_ ? s_->broken : std::string("moved from"); }

  /// @brief Collective: ranks with the same `color` form a new communicator, ordered by `key`.
  /// A negative color gives an invalid (empty) communicator. Needs NCCL >= 2.18.
  /// @throws usage_error with older NCCL, timeout_error when the others do not call it
  communicator split(int color, int key, std::string label = {}) const {
    require("split");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    auto& s = *s_;
    detail::device_guard g(s.device, s.site("split", 0));
    ncclComm_t child = nullptr;
    // config nullptr: the child inherits the parent's (non-blocking) configuration.
    const ncclResult_t rc = ncclCommSplit(s.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr);
    if (rc != ncclInProgress) check(rc, "ncclCommSplit", s.site("split", 0));
    communicator c;
    c.s_ = std::make_shared<detail::comm_state>();
    c.s_->device = s.device;
    c.s_->rank = s.rank;  // until adopt() reads the child's own
    c.s_->size = s.size;
    c.s_->cfg = s.cfg;
    c.s_->cfg.stream = nullptr;  // the child gets its own stream
    c.s_->cfg.identity.label = label.empty() ? "split " + std::to_string(color) : std::move(label);
    // A non-blocking split may hand the child out only when NCCL's background job ends (NCCL
    // 2.28 does): read it again on every poll, never the value seen when ncclCommSplit returned.
    const auto child_now = [&child] { return *static_cast<ncclComm_t const volatile*>(&child); };
    const auto deadline = std::chrono::steady_clock::now() + s.cfg.timeout;
    backoff b(std::chrono::microseconds(500));
    try {
      for (;;) {
        const bool parent = s.in_progress(s.comm, "split", 0);
        c.s_->comm = child_now();
        const bool mine = c.s_->comm != nullptr && c.s_->in_progress(c.s_->comm, "split", 0);
        if (!parent && !mine) break;
        if (std::chrono::steady_clock::now() > deadline) {
          c.s_->abort_in_background();
          s.time_out("split", 0,
                     "split timed out after " + kft::detail::describe_duration(s.cfg.timeout) +
                         " waiting for the other ranks to call it; the NCCL communicator was aborted");
        }
        b.pause();
      }
    } catch (...) {
      c.s_->abort_in_background();
      throw;
    }
    c.s_->comm = child_now();
    if (c.s_->comm == nullptr) {
      c.s_.reset();  // not a member: an invalid communicator
      return c;
    }
    c.adopt();
    return c;
#else
    (void)color;
    (void)key;
    (void)label;
    throw usage_error("split needs ncclCommSplit (NCCL >= 2.18); kft was compiled against NCCL " +
                          std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH),
                      s_->site("split", 0));
#endif
  }

  // ---- runtime-typed collectives: device buffers, enqueued on the call's stream ---------------

  /// @brief out = in reduced over all ranks; in == out is in place. Waits for the result.
  template <call_options O = kft::options>
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const O& o = {}) {
    allreduce_async(in, out, count, t, op, o).wait();
  }
  /// @brief out = root's in (in is read on the root only; in == out is in place).
  template <call_options O = kft::options>
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const O& o = {}) {
    broadcast_async(in, out, count, t, root, o).wait();
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count x size), reduced over all ranks.
  template <call_options O = kft::options>
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const O& o = {}) {
    reduce_scatter_async(in, out, recv_count, t, op, o).wait();
  }
  /// @brief out (send_count x size) = every rank's in, in rank order.
  template <call_options O = kft::options>
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const O& o = {}) {
    allgather_async(in, out, send_count, t, o).wait();
  }
  /// @brief Every rank has arrived (an allreduce of one int on the device: NCCL has no barrier).
  template <call_options O = kft::options>
  void barrier(const O& o = {}) {
    barrier_async(o).wait();
  }
  template <call_options O = kft::options>
  async::work barrier_async(const O& o = {}) {
    require("barrier");
    if (s_->scratch == nullptr) {  // its value is never read: no need to clear it
      detail::device_guard g(s_->device, s_->site("barrier", s_->seq + 1));
      kft::detail::cuda_check(cudaMalloc(&s_->scratch, sizeof(std::int32_t)), "cudaMalloc",
                              s_->site("barrier", s_->seq + 1));
    }
    const call c = resolve(o, "barrier");
    return launch(collective::barrier, "ncclAllReduce", 1, dtype::i32, c, [&](cudaStream_t st) {
      return ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, st);
    });
  }

  /// @brief Enqueues an allreduce; in == out is in place.
  template <call_options O = kft::options>
  async::work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const O& o = {}) {
    const call c = resolve(o, "allreduce");
    detail::redop r;
    detail::make_redop(*s_, r, "allreduce", t, op, c.prescale, c.timeout);
    return launch(collective::allreduce, "ncclAllReduce", count, t, c, [&](cudaStream_t st) {
      return in_whole_parts(count, t, pre_mul_sum(t, op, c), c, "allreduce", [&](std::size_t at, std::size_t n) {
        return ncclAllReduce(offset(in, at, t), offset(out, at, t), n, detail::datatype(t), r.op, s_->comm, st);
      });
    });
  }
  /// @brief Enqueues a broadcast from `root`.
  template <call_options O = kft::options>
  async::work broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const O& o = {}) {
    require("broadcast");
    kft::detail::require_root(root, s_->size, next_site(collective::broadcast));
    const call c = resolve(o, "broadcast");
    return launch(collective::broadcast, "ncclBroadcast", count, t, c, [&](cudaStream_t st) {
      return ncclBroadcast(in, out, count, detail::datatype(t), root, s_->comm, st);
    });
  }
  /// @brief Enqueues a reduce-scatter. In place when out == in + rank * recv_count (NCCL's
  /// convention, and kft's).
  template <call_options O = kft::options>
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                               const O& o = {}) {
    const call c = resolve(o, "reduce_scatter");
    detail::redop r;
    detail::make_redop(*s_, r, "reduce_scatter", t, op, c.prescale, c.timeout);
    return launch(collective::reduce_scatter, "ncclReduceScatter", recv_count, t, c, [&](cudaStream_t st) {
      // One rank: the send buffer is the receive buffer's shape, so parts are cut alike.
      return in_whole_parts(recv_count, t, pre_mul_sum(t, op, c), c, "reduce_scatter", [&](std::size_t at, std::size_t n) {
        return ncclReduceScatter(offset(in, at, t), offset(out, at, t), n, detail::datatype(t), r.op, s_->comm, st);
      });
    });
  }
  /// @brief Enqueues an allgather. In place when in == out + rank * send_count.
  template <call_options O = kft::options>
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const O& o = {}) {
    const call c = resolve(o, "allgather");
    return launch(collective::allgather, "ncclAllGather", send_count, t, c, [&](cudaStream_t st) {
      return ncclAllGather(in, out, send_count, detail::datatype(t), s_->comm, st);
    });
  }

  /// @brief Waits until everything enqueued so far on `stream` (nullptr: the communicator's)
  /// has completed, checking NCCL's asynchronous error; past `timeout` (0: the communicator's)
  /// the communicator is aborted.
  /// @throws timeout_error, transport_error
  void synchronize(cudaStream_t stream = nullptr, std::chrono::milliseconds timeout = {}) {
    require("synchronize");
    auto& s = *s_;
    // Local: takes no sequence number (the last collective's names the wait in messages).
    detail::device_guard g(s.device, s.site("synchronize", s.seq));
    auto ev = std::make_shared<detail::event>(s_, s.take_event("synchronize", s.seq));
    kft::detail::cuda_check(cudaEventRecord(ev->ev, stream != nullptr ? stream : s.stream), "cudaEventRecord",
                            s.site("synchronize", s.seq));
    detail::work_of(ev, collective::none, "synchronize", s.seq, 0, dtype::u8,
                    kft::timeout_or(kft::options{.timeout = timeout}, s.cfg.timeout))
        .wait();
  }

  /// @brief Stops this communicator now (`ncclCommAbort`: running kernels exit, other ranks
  /// see a failure or time out). Later calls throw usage_error. Only this communicator stops:
  /// unlike MPI_Abort, the process and the job go on.
  void abort(std::string_view reason = "abort() called") noexcept {
    if (!s_) return;
    if (s_->broken.empty()) {
      try {
        s_->broken = reason;
      } catch (...) {
      }
    }
    s_->abort_quietly();
  }

 private:
  communicator() = default;

  struct call {
    std::chrono::milliseconds timeout;
    cudaStream_t stream;
    double prescale;
  };
  template <class O>
  call resolve(const O& o, const char* op) const {
    require(op);
    if (o.algorithm != algo::automatic)
      kft::detail::unsupported_algorithm(o.algorithm, "NCCL", "auto: NCCL chooses, NCCL_ALGO steers it",
                                         s_->site(op, s_->seq + 1));
    if constexpr (std::same_as<O, options>)
      return {kft::timeout_or(kft::options{.timeout = o.timeout}, s_->cfg.timeout), o.stream, o.prescale};
    else return {kft::timeout_or(o, s_->cfg.timeout), nullptr, 0.0};
  }

  // The one path every collective takes: number it, enqueue it (waiting out NCCL's background
  // enqueue on a non-blocking communicator), record an event after it.
  template <class Enqueue>
  async::work launch(collective c, const char* nccl_call, std::size_t count, dtype t, const call& k, Enqueue&& enqueue) {
    const char* op = name(c).data();  // names are literals: NUL-terminated
    require(op);
    auto& s = *s_;
    const std::uint64_t seq = ++s.seq;
    detail::device_guard g(s.device, s.site(op, seq));
    const cudaStream_t st = k.stream != nullptr ? k.stream : s.stream;
    // Nothing to move: no NCCL call (whatever a NCCL version makes of a zero count), but the
    // call is numbered and completes in stream order like any other.
    const ncclResult_t rc = count == 0 ? ncclSuccess : enqueue(st);
    if (rc == ncclInProgress)
      s.settle(op, seq, k.timeout, "enqueueing the collective");
    else
      check(rc, nccl_call, s.site(op, seq));
    auto ev = std::make_shared<detail::event>(s_, s.take_event(op, seq));
    kft::detail::cuda_check(cudaEventRecord(ev->ev, st), "cudaEventRecord", s.site(op, seq));
    return detail::work_of(std::move(ev), c, op, seq, count, t, k.timeout);
  }

  // NCCL reduces with a PreMulSum for avg on floating-point types and for a prescale.
  static bool pre_mul_sum(dtype t, op_kind op, const call& c) {
    return c.prescale != 0.0 || (op == op_kind::avg && detail::floating(t));
  }
  template <class P>
  static P* offset(P* p, std::size_t elements, dtype t) {
    using byte = std::conditional_t<std::is_const_v<P>, const unsigned char, unsigned char>;
    return static_cast<P*>(static_cast<byte*>(p) + elements * size_of(t));
  }

  // NCCL before 2.29.7 leaves up to 31 trailing elements unwritten when a one-rank communicator
  // reduces with a PreMulSum (NVIDIA/nccl#1950, seen on an H200 with 2.28.3): its one-rank
  // kernel gives each of min(32, ceil(bytes / 16 KiB)) blocks a rounded-down share. There, kft
  // enqueues the call as two: a head of whole 16 KiB units, which that split covers exactly, and
  // a tail under 16 KiB, which one block covers. Elsewhere it is the one call.
  template <class Enqueue>
  ncclResult_t in_whole_parts(std::size_t count, dtype t, bool pms, const call& c, const char* op, Enqueue&& part) {
    static const bool one_rank_tail_bug = version_code() < 22907;
    constexpr std::size_t unit = std::size_t{16} << 10;
    const std::size_t head = count * size_of(t) / unit * unit / size_of(t);
    if (!one_rank_tail_bug || !pms || s_->size != 1 || head == 0 || head == count) return part(0, count);
    const ncclResult_t rc = part(0, head);
    if (rc == ncclInProgress)
      s_->settle(op, s_->seq, c.timeout, "enqueueing the collective");
    else if (rc != ncclSuccess)
      return rc;
    return part(head, count - head);
  }

  static void validate(int rank, int size, int device) {
    if (size < 1 || rank < 0 || rank >= size || device < 0)
      throw usage_error("rank " + std::to_string(rank) + " of " + std::to_string(size) + " on CUDA device " +
                            std::to_string(device) + " is not a valid place",
                        error_site::of("nccl communicator"));
  }

  void init(const ncclUniqueId& id, int rank, int size, int device, config cfg) {
    s_ = std::make_shared<detail::comm_state>();
    auto& s = *s_;
    s.rank = rank;
    s.size = size;
    s.device = device;
    s.cfg = std::move(cfg);
    detail::device_guard g(device, s.site("init", 0));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t nc = NCCL_CONFIG_INITIALIZER;
    nc.blocking = 0;  // initialisation and collectives may complete in the background: pollable
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    nc.commName = s.cfg.name.c_str();  // shows in NCCL's logs
#endif
    const ncclResult_t rc = ncclCommInitRankConfig(&s.comm, size, id, rank, &nc);
    if (rc != ncclInProgress) {
      if (rc != ncclSuccess) s.abort_quietly();
      check(rc, "ncclCommInitRankConfig", s.site("init", 0));
    }
    const auto deadline = std::chrono::steady_clock::now() + s.cfg.timeout;
    backoff b(std::chrono::microseconds(500));
    while (s.in_progress(s.comm, "init", 0)) {
      if (std::chrono::steady_clock::now() > deadline)
        s.time_out("init", 0,
                   "NCCL initialisation timed out after " + kft::detail::describe_duration(s.cfg.timeout) +
                       " waiting for the other " + std::to_string(size - 1) +
                       " rank(s) (every rank must create this communicator with the same unique id); "
                       "the NCCL communicator was aborted");
      b.pause();
    }
#else
    // Before NCCL 2.14 initialisation blocks: no deadline.
    check(ncclCommInitRank(&s.comm, size, id, rank), "ncclCommInitRank", s.site("init", 0));
#endif
    adopt();
  }

  // Reads what NCCL made of the communicator and gives it a stream.
  void adopt() {
    auto& s = *s_;
    detail::device_guard g(s.device, s.site("init", 0));
    check(ncclCommCount(s.comm, &s.size), "ncclCommCount", s.site("init", 0));
    check(ncclCommUserRank(s.comm, &s.rank), "ncclCommUserRank", s.site("init", 0));
    if (s.cfg.stream != nullptr) {
      s.stream = s.cfg.stream;
    } else {
      kft::detail::cuda_check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                              s.site("init", 0));
      s.own_stream = true;
    }
  }

  void close() noexcept {
    if (s_) s_->release_comm();
    s_.reset();
  }

  void require(const char* op) const {
    if (!s_) throw usage_error("this communicator is empty (moved from, or a split with a negative color)",
                               error_site::of(std::string("nccl ") + op));
    if (!s_->broken.empty())
      throw usage_error("this communicator was stopped by an earlier failure (" + s_->broken + ")",
                        s_->site(op, s_->seq + 1));
    if (s_->comm == nullptr)
      throw usage_error("this communicator has no NCCL communicator", s_->site(op, s_->seq + 1));
  }
  std::shared_ptr<detail::comm_state> s_;
};

static_assert(async_communicator<communicator>);

}  // namespace nccl
KFT_NAMESPACE_END
