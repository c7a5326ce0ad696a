// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/nccl/state.hpp
/// @brief What a NCCL communicator and its work share (component `kft::nccl`): the NCCL
/// communicator, its stream, reusable events, the failure state, and the polling of NCCL's
/// asynchronous errors against deadlines (`ncclCommGetAsyncError`; `ncclCommAbort` past them,
/// on a thread of its own so that the error comes at the deadline).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/state.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kft/core/background.hpp>
#include <kft/core/backoff.hpp>
#include <kft/core/cuda_error.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/transport/nccl/options.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl {
namespace detail {

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
struct comm_state : std::enable_shared_from_this<comm_state> {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 0, device = 0;
  std::uint64_t seq = 0;
  config cfg;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  std::string broken;               // why the communicator refuses calls; empty while healthy
  std::uint64_t issued = 0;         // calls numbered (== seq: NCCL calls are issued in order)
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
    return error_site::in(cfg.identity, rank, size, "nccl " + std::move(op), s);
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

  // After a failure: ncclCommAbort waits until the communicator's kernels and proxy threads
  // stop, seconds when a kernel is stuck behind other work, so it runs on a thread of its own
  // (kft/core/background.hpp) and the failing call throws at once. The job keeps this state
  // alive: the stream, events and scratch are released only after the abort. Where no thread
  // can be had, the abort runs here, as abort_quietly does.
  void abort_in_background() noexcept {
    if (comm == nullptr) return;
    const ncclComm_t c = comm;
    comm = nullptr;
    const int dev = device;
    try {
      std::shared_ptr<comm_state> keep = weak_from_this().lock();
      const auto limit = std::max<std::chrono::milliseconds>(cfg.destroy_timeout, std::chrono::seconds(10));
      kft::detail::background::instance().run("ncclCommAbort of \"" + cfg.name + "\" (rank " + std::to_string(rank) +
                                                  ", " + broken + ")",
                                              limit, [c, dev, keep = std::move(keep)] {
                                                device_guard g(dev, device_guard::quiet_t{});
                                                ncclCommAbort(c);
                                              });
    } catch (...) {
      device_guard g(dev, device_guard::quiet_t{});
      ncclCommAbort(c);
    }
  }

  // NCCL reported an error for the communicator (a peer failed, a network error, a bad
  // argument found in the background): it is unusable from now on.
  void fail_async(ncclResult_t st, const char* op, std::uint64_t s) {
    broken = std::string("NCCL reported \"") + ncclGetErrorString(st) + "\" during " + op + " #" + std::to_string(s);
    try {
      check(st, "ncclCommGetAsyncError", site(op, s));
    } catch (...) {
      abort_in_background();
      throw;
    }
  }
  void fail_cuda(cudaError_t e, const char* call, const char* op, std::uint64_t s) {
    broken = std::string(call) + " failed during " + op + " #" + std::to_string(s);
    try {
      kft::detail::cuda_check(e, call, site(op, s));
    } catch (...) {
      abort_in_background();
      throw;
    }
  }
  // Past a deadline: the error is thrown now; the abort finishes in the background.
  void time_out(const char* op, std::uint64_t s, const std::string& detail) {
    broken = std::string("a timed-out ") + op + " #" + std::to_string(s);
    abort_in_background();
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

// A reduction handle: NCCL's built-in op, or a PreMulSum created for this call (destroyed as
// soon as the collective is enqueued, which NCCL allows).
struct redop {
  ncclRedOp_t op = ncclSum;
  const comm_state* owner = nullptr;
  ncclComm_t comm = nullptr;  // set when op is a custom PreMulSum
  redop() = default;
  redop(const redop&) = delete;
  redop& operator=(const redop&) = delete;
  ~redop() {
    // Not after an abort: the op went with the communicator.
    if (comm != nullptr && owner->comm == comm) ncclRedOpDestroy(op, comm);
  }
};
inline void make_redop(comm_state& st, redop& r, const char* what, dtype t, op_kind k, double prescale,
                       std::chrono::milliseconds timeout) {
  if (prescale != 0.0) {
    if (k != op_kind::sum || !floating(t))
      throw usage_error("prescale needs op sum and a floating-point dtype (got " + std::string(name(k)) + " on " +
                            std::string(name(t)) + ")",
                        st.site(what, st.seq + 1));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
    union {
      float f;
      double d;
      std::uint16_t h;
    } scalar{};
    if (t == dtype::f32) scalar.f = static_cast<float>(prescale);
    else if (t == dtype::f64) scalar.d = prescale;
    else if (t == dtype::f16) scalar.h = half(static_cast<float>(prescale)).bits;
    else scalar.h = bfloat16(static_cast<float>(prescale)).bits;
    const ncclResult_t rc =
        ncclRedOpCreatePreMulSum(&r.op, &scalar, datatype(t), ncclScalarHostImmediate, st.comm);
    if (rc == ncclInProgress)  // a non-blocking communicator may answer so for any call
      st.settle(what, st.seq + 1, timeout, "creating the PreMulSum op");
    else
      check(rc, "ncclRedOpCreatePreMulSum", st.site(what, st.seq + 1));
    r.owner = &st;
    r.comm = st.comm;
    return;
#else
    throw usage_error("prescale needs ncclRedOpCreatePreMulSum (NCCL >= 2.11)", st.site(what, st.seq + 1));
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

}  // namespace detail
}  // namespace nccl
KFT_NAMESPACE_END
