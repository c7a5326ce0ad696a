/// @file kft/transport/nccl/communicator.hpp
/// @brief Collectives over NCCL (component `kft::nccl`) on device buffers, with kft's dtypes, ops,
/// errors and deadlines.
///
///     kft::nccl::communicator comm(*store, rank, size, local_rank);   // meets through the store
///     comm.allreduce(std::span<const float>(g, n), std::span<float>(g, n), kft::ops::avg);
///     auto r = comm.allreduce_async(in, out, kft::ops::sum, kft::nccl::options{.stream = s});
///     r.wait();                                                     // or drop it: stream-ordered
///     auto rail = comm.split(local_rank, rank);                     // explicit, named split
///
/// Every collective is enqueued on a CUDA stream (the call's `nccl::options::stream`, else the
/// communicator's own) and, for the `_async` forms, returns a `request` whose `wait()` polls a
/// CUDA event recorded after it. The plain forms wait before returning, so they mean what the
/// MPI and shm communicators' do: `out` holds the result when the call returns.
///
/// NCCL has no watchdog of its own: a rank that never arrives leaves every other rank's kernel
/// spinning. kft creates the communicator non-blocking (`ncclConfig_t::blocking = 0`) and polls
/// its event and `ncclCommGetAsyncError` against a deadline; past it, the communicator is
/// aborted (`ncclCommAbort`, which stops the kernels) and the call throws `timeout_error`. After a
/// failure the communicator refuses further calls. NCCL return codes become kft exceptions in
/// one place (`kft::nccl::check`), CUDA's in `kft::detail::cuda_check`.
///
/// Not thread-safe: one communicator is used by one thread at a time (as NCCL requires).
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
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/collectives/options.hpp>
#include <kft/core/backoff.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/topology/cuda.hpp>
#include <kft/transport/nccl/nccl.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {

using namespace std::chrono_literals;

/// @brief Settings of one communicator.
struct config {
  /// Default deadline of every collective, and of the initialisation (every rank must arrive).
  std::chrono::milliseconds timeout = 300s;
  /// How long the destructor lets `ncclCommFinalize` flush before it aborts instead (a
  /// destructor must neither throw nor hang on a peer that is gone).
  std::chrono::milliseconds destroy_timeout = 10s;
  /// Scopes the rendezvous keys ("nccl/<name>/...") so that several communicators can meet
  /// through one store; ranks of one communicator must use the same name.
  std::string name = "kft";
  /// The stream collectives run on when a call names none. nullptr: the communicator creates
  /// (and owns) a non-blocking stream of its device.
  cudaStream_t stream = nullptr;
};

/// @brief Per-call options of a NCCL collective: kft's options plus where the call runs.
///
///     comm.allreduce_async(in, out, kft::ops::sum, kft::nccl::options{.timeout = 5s, .stream = s});
///
/// Every collective also takes a plain `kft::options` (the generic algorithms pass those).
/// `algorithm` is accepted and ignored: NCCL chooses its own (NCCL_ALGO steers it).
struct options {
  algo algorithm = algo::automatic;
  std::chrono::milliseconds timeout{0};  ///< 0 = the communicator's default
  std::uint32_t tag = 0;                 ///< kept for symmetry; NCCL does not compare signatures
  cudaStream_t stream = nullptr;         ///< nullptr = the communicator's stream
  /// Sum only: every rank's input is multiplied by this before the sum (NCCL's PreMulSum, for
  /// floating-point dtypes), e.g. 1/N for an average that a hierarchical algorithm splits over
  /// two communicators. 0 = off.
  double prescale = 0.0;
};

/// @brief `kft::options` or `kft::nccl::options`: what the collectives take.
template <class O>
concept call_options = std::same_as<O, kft::options> || std::same_as<O, options>;

/// @brief A fresh NCCL unique id (rank 0 makes it; every rank must then use the same one).
inline ncclUniqueId unique_id() {
  ncclUniqueId id{};
  check(ncclGetUniqueId(&id), "ncclGetUniqueId", error_site::of("nccl unique id"));
  return id;
}

namespace detail {

/// The unique id as text for the store (hex: every store keeps text safely).
inline std::string to_hex(const ncclUniqueId& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * sizeof id.internal);
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15u];
  }
  return s;
}

inline ncclUniqueId from_hex(std::string_view s, const error_site& site) {
  ncclUniqueId id{};
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() != 2 * sizeof id.internal)
    throw transport_error("the NCCL unique id in the store has " + std::to_string(s.size()) + " characters, want " +
                              std::to_string(2 * sizeof id.internal) + " (another program uses the same key?)",
                          site);
  for (std::size_t i = 0; i < sizeof id.internal; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) throw transport_error("the NCCL unique id in the store is not hex", site);
    id.internal[i] = static_cast<char>(static_cast<unsigned char>(hi * 16 + lo));
  }
  return id;
}

inline ncclDataType_t datatype(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
  }
  return ncclFloat32;
}

inline bool floating(dtype t) { return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16; }

/// Makes `device` current for a scope (NCCL initialisation, stream and event creation need it)
/// and restores the caller's device after.
class device_guard {
 public:
  device_guard(int device, const error_site& site) {
    kft::detail::cuda_check(cudaGetDevice(&prev_), "cudaGetDevice", site);
    if (prev_ != device) {
      kft::detail::cuda_check(cudaSetDevice(device), "cudaSetDevice", site);
      changed_ = true;
    }
  }
  struct quiet_t {};
  /// For destructors: best effort, never throws.
  device_guard(int device, quiet_t) noexcept {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device && cudaSetDevice(device) == cudaSuccess) changed_ = true;
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};

/// What a communicator and its requests share. Requests keep it alive, so a request that
/// outlives its communicator (or a moved communicator) never points at freed memory.
struct comm_state {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 0, device = 0;
  std::uint64_t seq = 0;
  config cfg;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  std::string broken;               // why the communicator refuses calls; empty while healthy
  std::vector<cudaEvent_t> events;  // completed events, reused by the next requests
  void* scratch = nullptr;          // barrier: one device int, allocated on first use

  comm_state() = default;
  comm_state(const comm_state&) = delete;
  comm_state& operator=(const comm_state&) = delete;
  ~comm_state() {
    release_comm();
    if (events.empty() && !own_stream && scratch == nullptr) return;
    device_guard g(device, device_guard::quiet_t{});
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
    if (scratch != nullptr) cudaFree(scratch);
  }

  error_site site(std::string op, std::uint64_t s) const {
    error_site e;
    e.rank = rank;
    e.world_size = size;
    e.operation = "nccl " + std::move(op);
    if (s) e.sequence = s;
    return e;
  }

  cudaEvent_t take_event(const char* op, std::uint64_t s) {
    if (!events.empty()) {
      cudaEvent_t e = events.back();
      events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    kft::detail::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
                            site(op, s));
    return e;
  }
  void give_back(cudaEvent_t e) noexcept {
    try {
      events.push_back(e);
    } catch (...) {
      cudaEventDestroy(e);
    }
  }

  void abort_quietly() noexcept {
    if (comm == nullptr) return;
    device_guard g(device, device_guard::quiet_t{});
    ncclCommAbort(comm);
    comm = nullptr;
  }

  // NCCL reported an error for the communicator (a peer failed, a network error, a bad
  // argument found in the background): it is unusable from now on.
  void fail_async(ncclResult_t st, const char* op, std::uint64_t s) {
    broken = std::string("NCCL reported \"") + ncclGetErrorString(st) + "\" during " + op + " #" + std::to_string(s);
    try {
      check(st, "ncclCommGetAsyncError", site(op, s));
    } catch (...) {
      abort_quietly();
      throw;
    }
  }
  void fail_cuda(cudaError_t e, const char* call, const char* op, std::uint64_t s) {
    broken = std::string(call) + " failed during " + op + " #" + std::to_string(s);
    try {
      kft::detail::cuda_check(e, call, site(op, s));
    } catch (...) {
      abort_quietly();
      throw;
    }
  }
  void time_out(const char* op, std::uint64_t s, const std::string& detail) {
    broken = std::string("a timed-out ") + op + " #" + std::to_string(s);
    abort_quietly();
    throw timeout_error(detail, site(op, s));
  }

  /// Throws when NCCL has reported an asynchronous error; true while `c` is still in progress.
  bool in_progress(ncclComm_t c, const char* op, std::uint64_t s) {
    ncclResult_t st = ncclSuccess;
    check(ncclCommGetAsyncError(c, &st), "ncclCommGetAsyncError", site(op, s));
    if (st == ncclInProgress) return true;
    if (st != ncclSuccess) fail_async(st, op, s);
    return false;
  }

  // A non-blocking communicator may finish enqueueing (or initialising) in the background:
  // NCCL says ncclInProgress until then, and nothing else may be issued before it is done.
  void settle(const char* op, std::uint64_t s, std::chrono::milliseconds timeout, const char* waiting_for) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    backoff b(std::chrono::microseconds(500));
    while (in_progress(comm, op, s)) {
      if (std::chrono::steady_clock::now() > deadline)
        time_out(op, s,
                 std::string(op) + " timed out after " + kft::detail::describe_duration(timeout) + " " + waiting_for +
                     " (NCCL still in progress); the NCCL communicator was aborted");
      b.pause();
    }
  }

  void release_comm() noexcept {
    if (comm == nullptr) return;
    device_guard g(device, device_guard::quiet_t{});
    if (!broken.empty()) {
      ncclCommAbort(comm);
      comm = nullptr;
      return;
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    // Finalize flushes what is still queued; it completes in the background on a
    // non-blocking communicator, so it can be given a deadline. Past it: abort.
    ncclResult_t rc = ncclCommFinalize(comm);
    ncclResult_t st = rc;
    if (rc == ncclSuccess || rc == ncclInProgress) {
      const auto deadline = std::chrono::steady_clock::now() + cfg.destroy_timeout;
      backoff b(std::chrono::milliseconds(1));
      while (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress &&
             std::chrono::steady_clock::now() < deadline)
        b.pause();
    }
    if (st == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
#else
    ncclCommDestroy(comm);
#endif
    comm = nullptr;
  }
};

}  // namespace detail

class communicator;

/// @brief A collective in flight on its stream. Move-only. `wait()` polls a CUDA event recorded
/// after the collective, and NCCL's asynchronous error, until the call's deadline; past it the
/// communicator is aborted and `wait()` throws `timeout_error`.
///
/// Dropping a request does not wait: the collective stays ordered on its stream (later work on
/// that stream sees its result), as with plain NCCL. `communicator::synchronize()` then checks.
class [[nodiscard]] request {
 public:
  request() = default;
  request(request&& o) noexcept
      : s_(std::move(o.s_)),
        ev_(std::exchange(o.ev_, nullptr)),
        what_(o.what_),
        seq_(o.seq_),
        count_(o.count_),
        type_(o.type_),
        timeout_(o.timeout_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      recycle();
      s_ = std::move(o.s_);
      ev_ = std::exchange(o.ev_, nullptr);
      what_ = o.what_;
      seq_ = o.seq_;
      count_ = o.count_;
      type_ = o.type_;
      timeout_ = o.timeout_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { recycle(); }

  /// @brief True when the collective has completed on the device.
  /// @throws transport_error when NCCL or CUDA reported a failure (the communicator is aborted)
  bool test() {
    if (ev_ == nullptr) return true;
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) {
      recycle();
      return true;
    }
    if (e != cudaErrorNotReady) s_->fail_cuda(e, "cudaEventQuery", what_, seq_);
    if (s_->comm != nullptr) (void)s_->in_progress(s_->comm, what_, seq_);
    return false;
  }

  /// @brief Blocks until done.
  /// @throws timeout_error after the call's deadline (the communicator is then aborted),
  /// transport_error when NCCL or CUDA reported a failure, usage_error on an empty request
  void wait() {
    if (!s_) throw usage_error("wait() on an empty request", error_site::of("nccl request"));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    // Short sleeps at most: a GPU collective often completes in microseconds.
    backoff b(std::chrono::microseconds(200));
    while (!test()) {
      if (std::chrono::steady_clock::now() > deadline) {
        const int device = s_->device, size = s_->size;
        recycle();
        s_->time_out(what_, seq_,
                     std::string(what_) + " (" + std::to_string(count_) + " x " + std::string(name(type_)) +
                         ") timed out after " + kft::detail::describe_duration(timeout_) + " on CUDA device " +
                         std::to_string(device) + " waiting for the " + std::to_string(size - 1) +
                         " other rank(s); the NCCL communicator was aborted (NCCL does not say which rank is late; "
                         "NCCL_DEBUG=INFO shows its view)");
      }
      b.pause();
    }
  }

  /// @brief Waits up to `d` without aborting anything; true when done.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) {
    const auto until = std::chrono::steady_clock::now() + d;
    backoff b(std::chrono::microseconds(200));
    while (!test()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      b.pause();
    }
    return true;
  }

  /// @brief The collective's sequence number on its communicator (0 for an empty request).
  std::uint64_t sequence() const noexcept { return seq_; }

 private:
  friend class communicator;
  void recycle() noexcept {
    if (ev_ != nullptr && s_) s_->give_back(ev_);
    ev_ = nullptr;
  }

  std::shared_ptr<detail::comm_state> s_;
  cudaEvent_t ev_ = nullptr;
  const char* what_ = "";
  std::uint64_t seq_ = 0;
  std::size_t count_ = 0;
  dtype type_ = dtype::f32;
  std::chrono::milliseconds timeout_{0};
};

/// @brief A NCCL communicator owned by kft: RAII, move-only; `split` is explicit; `abort()`
/// stops it on the failure path.
class communicator {
 public:
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
      id = detail::from_hex(store.get(key, cfg.timeout), error_site::of("nccl communicator"));
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
  const config& settings() const {
    if (!s_) throw usage_error("settings() of an empty communicator", error_site::of("nccl communicator"));
    return s_->cfg;
  }
  /// @brief Why this communicator refuses calls (empty while healthy).
  std::string broken() const { return s_ ? s_->broken : std::string("moved from"); }

  /// @brief Collective: ranks with the same `color` form a new communicator, ordered by `key`.
  /// A negative color gives an invalid (empty) communicator. Needs NCCL >= 2.18.
  /// @throws usage_error with older NCCL, timeout_error when the others do not call it
  communicator split(int color, int key) const {
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
    c.s_->comm = child;
    const auto deadline = std::chrono::steady_clock::now() + s.cfg.timeout;
    backoff b(std::chrono::microseconds(500));
    try {
      for (;;) {
        const bool parent = s.in_progress(s.comm, "split", 0);
        const bool mine = child != nullptr && c.s_->in_progress(child, "split", 0);
        if (!parent && !mine) break;
        if (std::chrono::steady_clock::now() > deadline) {
          c.s_->abort_quietly();
          s.time_out("split", 0,
                     "split timed out after " + kft::detail::describe_duration(s.cfg.timeout) +
                         " waiting for the other ranks to call it; the NCCL communicator was aborted");
        }
        b.pause();
      }
    } catch (...) {
      c.s_->abort_quietly();
      throw;
    }
    if (child == nullptr) {
      c.s_.reset();  // not a member: an invalid communicator
      return c;
    }
    c.adopt();
    return c;
#else
    (void)color;
    (void)key;
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
    require("barrier");
    if (s_->scratch == nullptr) {  // its value is never read: no need to clear it
      detail::device_guard g(s_->device, s_->site("barrier", s_->seq + 1));
      kft::detail::cuda_check(cudaMalloc(&s_->scratch, sizeof(std::int32_t)), "cudaMalloc",
                              s_->site("barrier", s_->seq + 1));
    }
    const call c = resolve(o, "barrier");
    launch("barrier", "ncclAllReduce", 1, dtype::i32, c, [&](cudaStream_t st) {
      return ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, st);
    }).wait();
  }

  /// @brief Enqueues an allreduce; in == out is in place.
  template <call_options O = kft::options>
  request allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const O& o = {}) {
    const call c = resolve(o, "allreduce");
    redop r;
    make_redop(r, "allreduce", t, op, c);
    return launch("allreduce", "ncclAllReduce", count, t, c, [&](cudaStream_t st) {
      return ncclAllReduce(in, out, count, detail::datatype(t), r.op, s_->comm, st);
    });
  }
  /// @brief Enqueues a broadcast from `root`.
  template <call_options O = kft::options>
  request broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const O& o = {}) {
    require("broadcast");
    if (root < 0 || root >= s_->size)
      throw usage_error("broadcast root " + std::to_string(root) + " is not a rank of this communicator (size " +
                            std::to_string(s_->size) + ")",
                        s_->site("broadcast", s_->seq + 1));
    const call c = resolve(o, "broadcast");
    return launch("broadcast", "ncclBroadcast", count, t, c, [&](cudaStream_t st) {
      return ncclBroadcast(in, out, count, detail::datatype(t), root, s_->comm, st);
    });
  }
  /// @brief Enqueues a reduce-scatter. In place when out == in + rank * recv_count (NCCL's
  /// convention, and kft's).
  template <call_options O = kft::options>
  request reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                               const O& o = {}) {
    const call c = resolve(o, "reduce_scatter");
    redop r;
    make_redop(r, "reduce_scatter", t, op, c);
    return launch("reduce_scatter", "ncclReduceScatter", recv_count, t, c, [&](cudaStream_t st) {
      return ncclReduceScatter(in, out, recv_count, detail::datatype(t), r.op, s_->comm, st);
    });
  }
  /// @brief Enqueues an allgather. In place when in == out + rank * send_count.
  template <call_options O = kft::options>
  request allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const O& o = {}) {
    const call c = resolve(o, "allgather");
    return launch("allgather", "ncclAllGather", send_count, t, c, [&](cudaStream_t st) {
      return ncclAllGather(in, out, send_count, detail::datatype(t), s_->comm, st);
    });
  }

  // ---- typed collectives (spans over device memory) -------------------------------------------

  template <class T, reduction Op, call_options O = kft::options>
  void allreduce(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    same_size(in.size(), out.size(), "allreduce");
    allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op, call_options O = kft::options>
  void allreduce(std::span<T> inout, Op op, const O& o = {}) {
    allreduce(std::span<const T>(inout), inout, op, o);
  }
  template <class T, reduction Op, call_options O = kft::options>
  request allreduce_async(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    same_size(in.size(), out.size(), "allreduce");
    return allreduce_async(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, call_options O = kft::options>
  void broadcast(std::span<T> inout, int root, const O& o = {}) {
    broadcast(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
  }
  template <class T, reduction Op, call_options O = kft::options>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    same_size(in.size(), out.size() * static_cast<std::size_t>(size()), "reduce_scatter (in = out x size)");
    reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, call_options O = kft::options>
  void allgather(std::span<const T> in, std::span<T> out, const O& o = {}) {
    same_size(in.size() * static_cast<std::size_t>(size()), out.size(), "allgather (out = in x size)");
    allgather(in.data(), out.data(), in.size(), dtype_of_v<T>, o);
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
    request r;
    r.ev_ = s.take_event("synchronize", s.seq);
    r.s_ = s_;
    r.what_ = "synchronize";
    r.seq_ = s.seq;
    r.timeout_ = timeout.count() > 0 ? timeout : s.cfg.timeout;
    kft::detail::cuda_check(cudaEventRecord(r.ev_, stream != nullptr ? stream : s.stream), "cudaEventRecord",
                            s.site("synchronize", s.seq));
    r.wait();
  }

  /// @brief Stops this communicator now (`ncclCommAbort`: running kernels exit, other ranks
  /// see a failure or time out). Later calls throw usage_error. Only this communicator stops:
  /// unlike MPI_Abort, the process and the job go on.
  void abort(const std::string& reason = "abort() called") noexcept {
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
  call resolve(const kft::options& o, const char* op) const {
    require(op);
    return {o.timeout.count() > 0 ? o.timeout : s_->cfg.timeout, nullptr, 0.0};
  }
  call resolve(const options& o, const char* op) const {
    require(op);
    return {o.timeout.count() > 0 ? o.timeout : s_->cfg.timeout, o.stream, o.prescale};
  }

  // A reduction handle: NCCL's built-in op, or a PreMulSum created for this call (destroyed as
  // soon as the collective is enqueued, which NCCL allows).
  struct redop {
    ncclRedOp_t op = ncclSum;
    const detail::comm_state* owner = nullptr;
    ncclComm_t comm = nullptr;  // set when op is a custom PreMulSum
    redop() = default;
    redop(const redop&) = delete;
    redop& operator=(const redop&) = delete;
    ~redop() {
      // Not after an abort: the op went with the communicator.
      if (comm != nullptr && owner->comm == comm) ncclRedOpDestroy(op, comm);
    }
  };
  void make_redop(redop& r, const char* what, dtype t, op_kind k, const call& c) const {
    require(what);
    if (c.prescale != 0.0) {
      if (k != op_kind::sum || !detail::floating(t))
        throw usage_error("prescale needs op sum and a floating-point dtype (got " + std::string(name(k)) + " on " +
                              std::string(name(t)) + ")",
                          s_->site(what, s_->seq + 1));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
      union {
        float f;
        double d;
        std::uint16_t h;
      } scalar{};
      if (t == dtype::f32) scalar.f = static_cast<float>(c.prescale);
      else if (t == dtype::f64) scalar.d = c.prescale;
      else if (t == dtype::f16) scalar.h = half(static_cast<float>(c.prescale)).bits;
      else scalar.h = bfloat16(static_cast<float>(c.prescale)).bits;
      const ncclResult_t rc =
          ncclRedOpCreatePreMulSum(&r.op, &scalar, detail::datatype(t), ncclScalarHostImmediate, s_->comm);
      if (rc == ncclInProgress)  // a non-blocking communicator may answer so for any call
        s_->settle(what, s_->seq + 1, c.timeout, "creating the PreMulSum op");
      else
        check(rc, "ncclRedOpCreatePreMulSum", s_->site(what, s_->seq + 1));
      r.owner = s_.get();
      r.comm = s_->comm;
      return;
#else
      throw usage_error("prescale needs ncclRedOpCreatePreMulSum (NCCL >= 2.11)", s_->site(what, s_->seq + 1));
#endif
    }
    switch (k) {
      case op_kind::sum: r.op = ncclSum; break;
      case op_kind::prod: r.op = ncclProd; break;
      case op_kind::min: r.op = ncclMin; break;
      case op_kind::max: r.op = ncclMax; break;
      case op_kind::avg: r.op = ncclAvg; break;  // NCCL >= 2.10; integers: sum / size, truncated
    }
  }

  // The one path every collective takes: number it, enqueue it (waiting out NCCL's background
  // enqueue on a non-blocking communicator), record an event after it.
  template <class Enqueue>
  request launch(const char* op, const char* nccl_call, std::size_t count, dtype t, const call& c, Enqueue&& enqueue) {
    require(op);
    auto& s = *s_;
    const std::uint64_t seq = ++s.seq;
    detail::device_guard g(s.device, s.site(op, seq));
    const cudaStream_t st = c.stream != nullptr ? c.stream : s.stream;
    // Nothing to move: no NCCL call (whatever a NCCL version makes of a zero count), but the
    // call is numbered and completes in stream order like any other.
    const ncclResult_t rc = count == 0 ? ncclSuccess : enqueue(st);
    if (rc == ncclInProgress)
      s.settle(op, seq, c.timeout, "enqueueing the collective");
    else
      check(rc, nccl_call, s.site(op, seq));
    request r;
    r.ev_ = s.take_event(op, seq);
    r.s_ = s_;
    r.what_ = op;
    r.seq_ = seq;
    r.count_ = count;
    r.type_ = t;
    r.timeout_ = c.timeout;
    kft::detail::cuda_check(cudaEventRecord(r.ev_, st), "cudaEventRecord", s.site(op, seq));
    return r;
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
  static void same_size(std::size_t a, std::size_t b, const char* what) {
    if (a != b)
      throw usage_error(std::string(what) + ": buffer sizes do not match (" + std::to_string(a) + " vs " +
                            std::to_string(b) + " elements)",
                        error_site::of(std::string("nccl ") + what));
  }

  std::shared_ptr<detail::comm_state> s_;
};

}  // namespace nccl
KFT_NAMESPACE_END
