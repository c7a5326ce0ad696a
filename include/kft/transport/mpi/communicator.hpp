/// @file kft/transport/mpi/communicator.hpp
/// @brief Collectives over MPI (component `kft::mpi`), with kft's dtypes, ops, errors and deadlines.
///
///     kft::mpi::communicator world;                       // a duplicate of MPI_COMM_WORLD
///     world.allreduce(std::span<const float>(g), std::span<float>(g), kft::ops::avg);
///     auto rail = world.split(local_rank, rank);          // explicit, named split
///     auto r = rail.allreduce_async(in, out, kft::ops::sum);
///     r.wait();
///
/// The communicator owns a duplicate of the caller's `MPI_Comm` (so kft's traffic never matches
/// the program's own), with `MPI_ERRORS_RETURN`: every MPI return code becomes a kft exception in
/// one place (`check`). Collectives run as MPI-3 nonblocking calls polled with a deadline, so a
/// rank that never arrives gives a `timeout_error` instead of a hang (MPI cannot cancel a
/// collective: after a timeout the communicator refuses further calls). f16 and bf16 reduce
/// through user-defined MPI ops that accumulate in float; `avg` is a sum divided locally.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/communicator.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kft/collectives/options.hpp>
#include <kft/collectives/reduce_kernels.hpp>
#include <kft/core/backoff.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi {

using namespace std::chrono_literals;

/// @brief Settings of one communicator.
struct config {
  std::chrono::milliseconds timeout = 300s;  ///< default deadline of every collective
  /// Compare every call's signature (collective, dtype, op, count, root, sequence number) across
  /// ranks with one extra small MPI_Allreduce. Off by default (it doubles small-message latency);
  /// `KFT_MPI_CHECK=1` turns it on.
  bool check_signatures = false;
};

namespace detail {

inline std::string error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

// f16/bf16 travel as MPI_UINT16_T and reduce through these user ops (float accumulation).
template <dtype T, op_kind Op>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  kernels::reduce(inout, srcs, 2, static_cast<std::size_t>(*len), T, Op, 1);
}

template <dtype T>
MPI_Op user_op(op_kind op) {
  // One MPI_Op per (type, op), created on first use (MPI is initialised by then) and kept
  // until MPI_Finalize frees it.
  static const std::array<MPI_Op, 4> ops = [] {
    std::array<MPI_Op, 4> o{};
    MPI_Op_create(&reduce16<T, op_kind::sum>, 1, &o[0]);
    MPI_Op_create(&reduce16<T, op_kind::prod>, 1, &o[1]);
    MPI_Op_create(&reduce16<T, op_kind::min>, 1, &o[2]);
    MPI_Op_create(&reduce16<T, op_kind::max>, 1, &o[3]);
    return o;
  }();
  switch (op) {
    case op_kind::prod: return ops[1];
    case op_kind::min: return ops[2];
    case op_kind::max: return ops[3];
    default: return ops[0];  // sum, and avg (divided afterwards)
  }
}

inline MPI_Datatype datatype(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
    case dtype::f16:
    case dtype::bf16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op reduction(dtype t, op_kind op) {
  if (t == dtype::f16) return user_op<dtype::f16>(op);
  if (t == dtype::bf16) return user_op<dtype::bf16>(op);
  switch (op) {
    case op_kind::prod: return MPI_PROD;
    case op_kind::min: return MPI_MIN;
    case op_kind::max: return MPI_MAX;
    default: return MPI_SUM;
  }
}

}  // namespace detail

class communicator;

/// @brief A collective in flight. Move-only; `wait()` polls MPI until it completes or its
/// deadline passes. Destroying an unfinished request waits for it (MPI owns the buffers until
/// then), without throwing.
class [[nodiscard]] request {
 public:
  request() = default;
  request(request&& o) noexcept
      : c_(std::exchange(o.c_, nullptr)),
        req_(std::exchange(o.req_, MPI_REQUEST_NULL)),
        what_(std::move(o.what_)),
        seq_(o.seq_),
        divide_(std::exchange(o.divide_, 0)),
        out_(o.out_),
        count_(o.count_),
        type_(o.type_),
        timeout_(o.timeout_),
        inplace_rs_(std::exchange(o.inplace_rs_, false)),
        rs_base_(o.rs_base_),
        rs_out_(o.rs_out_),
        rs_bytes_(o.rs_bytes_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      c_ = std::exchange(o.c_, nullptr);
      req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
      what_ = std::move(o.what_);
      seq_ = o.seq_;
      divide_ = std::exchange(o.divide_, 0);
      out_ = o.out_;
      count_ = o.count_;
      type_ = o.type_;
      timeout_ = o.timeout_;
      inplace_rs_ = std::exchange(o.inplace_rs_, false);
      rs_base_ = o.rs_base_;
      rs_out_ = o.rs_out_;
      rs_bytes_ = o.rs_bytes_;
    }
    return *this;
  }
  ~request() { finish_quietly(); }

  /// @brief True when done; progresses MPI.
  bool test();
  /// @brief Blocks until done. @throws timeout_error after the call's deadline, transport_error
  void wait();

 private:
  friend class communicator;
  void finish_quietly() noexcept {
    if (req_ != MPI_REQUEST_NULL && MPI_Wait(&req_, MPI_STATUS_IGNORE) == MPI_SUCCESS) complete();
  }
  void set_average(void* out, std::size_t count, dtype t, int divisor) {
    out_ = out;
    count_ = count;
    type_ = t;
    divide_ = divisor;
  }
  void complete() {
    // In-place reduce-scatter: MPI leaves the result at the start of the buffer, kft's
    // convention is the rank's own slot.
    if (inplace_rs_ && rs_out_ != rs_base_) std::memmove(rs_out_, rs_base_, rs_bytes_);
    if (divide_ > 0) {
      const void* src[1] = {out_};
      kernels::reduce(out_, src, 1, count_, type_, op_kind::avg, divide_);
    }
    divide_ = 0;
    inplace_rs_ = false;
  }

  communicator* c_ = nullptr;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string what_;
  std::uint64_t seq_ = 0;
  int divide_ = 0;  // avg: divide by this once done
  void* out_ = nullptr;
  std::size_t count_ = 0;
  dtype type_ = dtype::f32;
  std::chrono::milliseconds timeout_{0};
  bool inplace_rs_ = false;
  void* rs_base_ = nullptr;
  void* rs_out_ = nullptr;
  std::size_t rs_bytes_ = 0;
};

/// @brief An MPI communicator owned by kft: RAII, move-only; `split` is explicit.
class communicator {
 public:
  /// @brief Duplicates `comm` (collective over it). The default is MPI_COMM_WORLD.
  /// @throws usage_error when MPI is not initialised, transport_error when MPI fails
  explicit communicator(MPI_Comm comm = MPI_COMM_WORLD, config cfg = {}) : cfg_(std::move(cfg)) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
      throw usage_error("MPI is not initialised (call MPI_Init before creating a kft::mpi::communicator)",
                        error_site::of("mpi communicator"));
    if (comm == MPI_COMM_NULL) throw usage_error("MPI_COMM_NULL given", error_site::of("mpi communicator"));
    if (auto v = environment::process().get("KFT_MPI_CHECK"); v && *v == "1") cfg_.check_signatures = true;
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", "set-up", 0);
    adopt();
  }
  communicator(communicator&& o) noexcept { *this = std::move(o); }
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      cfg_ = o.cfg_;
      rank_ = o.rank_;
      size_ = o.size_;
      world_rank_ = o.world_rank_;
      seq_ = o.seq_;
      broken_ = std::move(o.broken_);
      scratch_ = std::move(o.scratch_);
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() { release(); }

  /// @brief False for the result of a split with a negative color (no communicator).
  bool valid() const noexcept { return comm_ != MPI_COMM_NULL; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::uint64_t sequence() const noexcept { return seq_; }
  MPI_Comm native() const noexcept { return comm_; }
  const config& settings() const noexcept { return cfg_; }

  /// @brief Collective: ranks with the same `color` form a new communicator, ordered by `key`.
  /// A negative color gives an invalid (empty) communicator.
  communicator split(int color, int key) const {
    require("split");
    communicator c(empty{}, cfg_);
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c.comm_), "MPI_Comm_split", "split", 0);
    if (c.comm_ != MPI_COMM_NULL) c.adopt();
    return c;
  }

  // ---- runtime-typed collectives --------------------------------------------------------------

  /// @brief out = in reduced over all ranks; in == out is in place. `algo::ring` runs kft's ring
  /// (below); anything else is MPI's own allreduce.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    if (o.algorithm == algo::ring) return ring_allreduce(in, out, count, t, op, o);
    allreduce_async(in, out, count, t, op, o).wait();
  }
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    broadcast_async(in, out, count, t, root, o).wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    reduce_scatter_async(in, out, recv_count, t, op, o).wait();
  }
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    allgather_async(in, out, send_count, t, o).wait();
  }
  void barrier(const options& o = {}) {
    request r = start("barrier", o, 0, dtype::u8, op_kind::sum, -1);
    check(MPI_Ibarrier(comm_, &r.req_), "MPI_Ibarrier", "barrier", r.seq_);
    r.wait();
  }

  /// @brief Nonblocking MPI allreduce (MPI's algorithm); in == out is in place.
  request allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    request r = start("allreduce", o, count, t, op, -1);
    check(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, int_count(count, "allreduce"), detail::datatype(t),
                         detail::reduction(t, op), comm_, &r.req_),
          "MPI_Iallreduce", "allreduce", r.seq_);
    if (op == op_kind::avg) r.set_average(out, count, t, size_);
    return r;
  }
  /// @brief out = root's in (in is read on the root only; in == out is in place).
  request broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    if (root < 0 || root >= size_)
      throw usage_error("broadcast root " + std::to_string(root) + " is not a rank of this communicator (size " +
                            std::to_string(size_) + ")",
                        site("broadcast", seq_ + 1));
    request r = start("broadcast", o, count, t, op_kind::sum, root);
    if (rank_ == root && in != out) std::memcpy(out, in, count * size_of(t));
    check(MPI_Ibcast(out, int_count(count, "broadcast"), detail::datatype(t), root, comm_, &r.req_), "MPI_Ibcast",
          "broadcast", r.seq_);
    return r;
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count x size), reduced over all ranks.
  /// In place when out == in + rank * recv_count.
  request reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                               const options& o = {}) {
    request r = start("reduce_scatter", o, recv_count, t, op, -1);
    const std::size_t es = size_of(t);
    const bool in_place = static_cast<const unsigned char*>(in) + static_cast<std::size_t>(rank_) * recv_count * es ==
                          static_cast<unsigned char*>(out);
    // MPI's in-place reduce-scatter leaves the result at the start of the buffer; kft's
    // convention is slice `rank`, so the in-place form reduces into the whole buffer's own slot.
    if (in_place) {
      r.inplace_rs_ = true;
      r.rs_base_ = const_cast<void*>(in);
    }
    check(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : in, in_place ? const_cast<void*>(in) : out,
                                    int_count(recv_count, "reduce_scatter"), detail::datatype(t),
                                    detail::reduction(t, op), comm_, &r.req_),
          "MPI_Ireduce_scatter_block", "reduce_scatter", r.seq_);
    r.rs_out_ = out;
    r.rs_bytes_ = recv_count * es;
    if (op == op_kind::avg) r.set_average(out, recv_count, t, size_);
    return r;
  }
  /// @brief out (send_count x size) = every rank's in, in rank order. In place when
  /// in == out + rank * send_count.
  request allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    request r = start("allgather", o, send_count, t, op_kind::sum, -1);
    const bool in_place = static_cast<const unsigned char*>(in) ==
                          static_cast<unsigned char*>(out) + static_cast<std::size_t>(rank_) * send_count * size_of(t);
    const int n = int_count(send_count, "allgather");
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, detail::datatype(t), out, n, detail::datatype(t), comm_,
                         &r.req_),
          "MPI_Iallgather", "allgather", r.seq_);
    return r;
  }

  // ---- typed collectives --------------------------------------------------------------------

  template <class T, reduction Op>
  void allreduce(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    same_size(in.size(), out.size(), "allreduce");
    allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op>
  void allreduce(std::span<T> inout, Op op, const options& o = {}) {
    allreduce(std::span<const T>(inout), inout, op, o);
  }
  template <class T, reduction Op>
  request allreduce_async(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    same_size(in.size(), out.size(), "allreduce");
    return allreduce_async(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T>
  void broadcast(std::span<T> inout, int root, const options& o = {}) {
    broadcast(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
  }
  template <class T, reduction Op>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    same_size(in.size(), out.size() * static_cast<std::size_t>(size_), "reduce_scatter (in = out x size)");
    reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out, const options& o = {}) {
    same_size(in.size() * static_cast<std::size_t>(size_), out.size(), "allgather (out = in x size)");
    allgather(in.data(), out.data(), in.size(), dtype_of_v<T>, o);
  }

  /// @brief The one place where MPI return codes become kft exceptions.
  void check(int rc, const char* call, const char* op, std::uint64_t seq) const {
    if (rc == MPI_SUCCESS) return;
    int cls = rc;
    MPI_Error_class(rc, &cls);
    throw transport_error(std::string(call) + " failed: " + detail::error_string(rc), site(op, seq), cls);
  }

  /// @brief Stops every rank of the job (MPI_Abort): MPI has no way to stop only a communicator.
  [[noreturn]] void abort(const std::string& reason, int code = 1) noexcept {
    std::fprintf(stderr, "kft: rank %d/%d: aborting the MPI job: %s\n", rank_, size_, reason.c_str());
    MPI_Abort(comm_ == MPI_COMM_NULL ? MPI_COMM_WORLD : comm_, code);
    std::abort();
  }

 private:
  friend class request;
  struct empty {};
  communicator(empty, config cfg) : cfg_(std::move(cfg)) {}

  void adopt() {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "set-up", 0);
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "set-up", 0);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "set-up", 0);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  }
  void release() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  error_site site(std::string op, std::uint64_t seq) const {
    error_site s;
    s.rank = rank_;
    s.world_size = size_;
    s.operation = "mpi " + std::move(op);
    if (seq) s.sequence = seq;
    return s;
  }
  void require(const char* op) const {
    if (comm_ == MPI_COMM_NULL)
      throw usage_error("this communicator is empty (a split with a negative color)", site(op, seq_ + 1));
    if (!broken_.empty())
      throw usage_error("this communicator was stopped by an earlier failure (" + broken_ + ")", site(op, seq_ + 1));
  }
  int int_count(std::size_t count, const char* op) const {
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw usage_error(std::to_string(count) + " elements exceed MPI's int count; split the call", site(op, seq_ + 1));
    return static_cast<int>(count);
  }
  static void same_size(std::size_t a, std::size_t b, const char* what) {
    if (a != b)
      throw usage_error(std::string(what) + ": buffer sizes do not match (" + std::to_string(a) + " vs " +
                            std::to_string(b) + " elements)",
                        error_site::of(what));
  }

  // kft's ring: reduce-scatter then allgather, p-1 steps each, every rank sending one segment
  // (count/p elements) to its right neighbour while receiving one from its left, so every link
  // carries 2(p-1)/p x N in both directions at once. MPI's own choice for large messages may
  // be a reduce + broadcast that uses one direction at a time (Open MPI's libnbc does for
  // p < 4). Segments are reduced in ring order once and then copied: every rank ends with the
  // same bits.
  void ring_allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o) {
    require("allreduce");
    const std::uint64_t seq = ++seq_;
    const auto timeout = o.timeout.count() > 0 ? o.timeout : cfg_.timeout;
    if (cfg_.check_signatures) compare_signatures("allreduce", count, t, op, -1, o.tag, seq);
    const std::size_t es = size_of(t), p = static_cast<std::size_t>(size_), r = static_cast<std::size_t>(rank_);
    auto* buf = static_cast<unsigned char*>(out);
    if (in != out && count) std::memcpy(out, in, count * es);
    if (p == 1 || count == 0) {
      if (op == op_kind::avg) average(out, count, t);
      return;
    }
    auto seg = [&](std::size_t s) {  // [begin, length) of segment s, the first count % p one longer
      const std::size_t q = count / p, rem = count % p;
      return std::pair{s * q + std::min(s, rem), q + (s < rem ? 1 : 0)};
    };
    scratch_.resize(std::max(scratch_.size(), (count / p + 1) * es));
    const int right = static_cast<int>((r + 1) % p), left = static_cast<int>((r + p - 1) % p);
    const op_kind level = op == op_kind::avg ? op_kind::sum : op;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto exchange = [&](std::size_t send_s, void* recv_to, std::size_t recv_s, const char* phase) {
      const auto [sb, sn] = seg(send_s);
      const auto [rb, rn] = seg(recv_s);
      MPI_Request reqs[2];
      check(MPI_Irecv(recv_to, int_count(rn * es, "allreduce"), MPI_BYTE, left, ring_tag, comm_, &reqs[0]),
            "MPI_Irecv", "allreduce", seq);
      check(MPI_Isend(buf + sb * es, int_count(sn * es, "allreduce"), MPI_BYTE, right, ring_tag, comm_, &reqs[1]),
            "MPI_Isend", "allreduce", seq);
      (void)rb;
      poll(reqs, 2, deadline, timeout, "allreduce", seq, phase);
    };
    for (std::size_t step = 0; step + 1 < p; ++step) {  // reduce-scatter
      const std::size_t send_s = (r + p - step) % p, recv_s = (r + 2 * p - step - 1) % p;
      exchange(send_s, scratch_.data(), recv_s, "ring reduce-scatter");
      const auto [rb, rn] = seg(recv_s);
      const void* srcs[2] = {buf + rb * es, scratch_.data()};
      kernels::reduce(buf + rb * es, srcs, 2, rn, t, level, 1);
    }
    if (op == op_kind::avg) {  // scale the segment this rank owns once, before it is copied around
      const auto [ob, on] = seg((r + 1) % p);
      average(buf + ob * es, on, t);
    }
    for (std::size_t step = 0; step + 1 < p; ++step) {  // allgather
      const std::size_t send_s = (r + 1 + p - step) % p, recv_s = (r + p - step) % p;
      exchange(send_s, buf + seg(recv_s).first * es, recv_s, "ring allgather");
    }
  }

  void average(void* data, std::size_t count, dtype t) const {
    const void* src[1] = {data};
    kernels::reduce(data, src, 1, count, t, op_kind::avg, size_);
  }

  // Polls point-to-point requests to completion or the deadline (MPI cannot cancel a send:
  // after a timeout the communicator refuses further calls).
  void poll(MPI_Request* reqs, int n, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
            const char* op, std::uint64_t seq, const char* phase) {
    backoff b = backoff::oversubscribed(std::chrono::microseconds(200));
    for (std::uint32_t spin = 0;; ++spin) {
      int done = 0;
      check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall", op, seq);
      if (done) return;
      b.pause();
      if ((spin & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
        broken_ = std::string("a timed-out ") + op + " #" + std::to_string(seq);
        // Point-to-point requests can be withdrawn: nothing of this call stays pending in MPI.
        for (int i = 0; i < n; ++i)
          if (reqs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&reqs[i]);
            MPI_Request_free(&reqs[i]);
          }
        throw timeout_error(std::string(op) + " timed out after " + kft::detail::describe_duration(timeout) + " in " +
                                phase + " waiting for rank " + std::to_string((rank_ + size_ - 1) % size_) +
                                " (left neighbour) or rank " + std::to_string((rank_ + 1) % size_) + " (right)",
                            site(op, seq));
      }
    }
  }

  static constexpr int ring_tag = 0x6b66;  // "kf"; the communicator is kft's own duplicate

  // Numbers a call and, when asked, compares its signature across ranks before it starts.
  request start(const char* op, const options& o, std::size_t count, dtype t, op_kind k, int root) {
    require(op);
    request r;
    r.c_ = this;
    r.seq_ = ++seq_;
    r.what_ = op;
    r.count_ = count;
    r.type_ = t;
    r.timeout_ = o.timeout.count() > 0 ? o.timeout : cfg_.timeout;
    if (cfg_.check_signatures) compare_signatures(op, count, t, k, root, o.tag, r.seq_);
    return r;
  }

  void compare_signatures(const char* op, std::size_t count, dtype t, op_kind k, int root, std::uint32_t tag,
                          std::uint64_t seq) {
    const std::int64_t mine[6] = {static_cast<std::int64_t>(seq), static_cast<std::int64_t>(std::strlen(op) * 131 + op[0] + op[1]),
                                  static_cast<std::int64_t>(count), static_cast<std::int64_t>(t) * 16 + static_cast<std::int64_t>(k),
                                  root, static_cast<std::int64_t>(tag)};
    std::int64_t both[12];  // max of mine, max of -mine
    for (int i = 0; i < 6; ++i) both[i] = mine[i], both[6 + i] = -mine[i];
    check(MPI_Allreduce(MPI_IN_PLACE, both, 12, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce", op, seq);
    bool same = true;
    for (int i = 0; i < 6; ++i) same = same && both[i] == -both[6 + i];
    if (same) return;
    // Someone differs: everyone learns who, and names the first rank that differs from it.
    std::vector<std::int64_t> all(6 * static_cast<std::size_t>(size_));
    check(MPI_Allgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, comm_), "MPI_Allgather", op, seq);
    std::vector<std::string> names(static_cast<std::size_t>(size_));
    check(MPI_Barrier(comm_), "MPI_Barrier", op, seq);
    for (int r = 0; r < size_; ++r) {
      if (std::memcmp(&all[6 * static_cast<std::size_t>(r)], mine, sizeof mine) == 0) continue;
      const std::int64_t* s = &all[6 * static_cast<std::size_t>(r)];
      broken_ = "signature mismatch";
      throw mismatch_error("rank " + std::to_string(r) + " is at #" + std::to_string(s[0]) + " (count " +
                               std::to_string(s[2]) + ", " + std::string(name(static_cast<dtype>(s[3] / 16))) + " " +
                               std::string(name(static_cast<op_kind>(s[3] % 16))) + ", root " + std::to_string(s[4]) +
                               ", tag " + std::to_string(s[5]) + "), rank " + std::to_string(rank_) + " at #" +
                               std::to_string(seq) + " " + op + " (count " + std::to_string(count) + ", " +
                               std::string(name(t)) + " " + std::string(name(k)) + ", root " + std::to_string(root) +
                               ", tag " + std::to_string(tag) + ")",
                           site(op, seq));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  config cfg_;
  int rank_ = 0, size_ = 0, world_rank_ = 0;
  std::uint64_t seq_ = 0;
  std::string broken_;
  std::vector<unsigned char> scratch_;  // ring: one segment, grown when a bigger call comes
};

inline bool request::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  c_->check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test", what_.c_str(), seq_);
  if (done) complete();
  return done != 0;
}

inline void request::wait() {
  if (c_ == nullptr) throw usage_error("wait() on an empty request", error_site::of("mpi request"));
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // MPI progresses only inside MPI calls: poll often, yield rather than sleep for long.
  backoff b = backoff::oversubscribed(std::chrono::microseconds(200));
  for (std::uint32_t spin = 0; !test(); ++spin) {
    b.pause();
    if ((spin & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
      c_->broken_ = "a timed-out " + what_ + " #" + std::to_string(seq_);
      req_ = MPI_REQUEST_NULL;  // MPI cannot cancel a collective; the request is abandoned
      throw timeout_error(what_ + " (" + std::to_string(count_) + " x " + std::string(name(type_)) +
                              ") timed out after " + kft::detail::describe_duration(timeout_) + " waiting for the " +
                              std::to_string(c_->size_ - 1) + " other rank(s) of this MPI communicator (MPI does " +
                              "not say which rank is late)",
                          c_->site(what_, seq_));
    }
  }
}

}  // namespace mpi
KFT_NAMESPACE_END
