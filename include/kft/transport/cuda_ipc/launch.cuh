// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/launch.cuh
/// @brief The one path every CUDA IPC call takes (nvcc), in three steps: `number` it (refused
/// after a failure), `enqueue` its collective on the stream (on the communicator's device,
/// ending with an event), and hand back a work handle (`work_of`) that completes with the
/// event and turns what the barrier kernel found into the call's error (`raise_finding`), or
/// stops the call past its deadline (`stop_late`).
///
/// After a failure the communicator refuses further calls (`usage_error` naming it); a timeout
/// or a mismatch found here also aborts the group, so the peers' barriers give up too.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/launch.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/launch.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <kft/async/work.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/cuda_error.hpp>
#include <kft/core/error.hpp>
#include <kft/core/hex.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/cuda_ipc/call.cuh>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// A call as its messages and its work handle name it.
struct call_info {
  collective c = collective::none;
  std::uint64_t seq = 0;
  std::string what;  // "allreduce"
  std::string desc;  // "allreduce (4099 x bf16)"
  std::chrono::milliseconds timeout{};
};

/// How long the host waits past the call's deadline, which the GPU keeps, before it stops the call itself.
inline constexpr std::chrono::seconds host_grace{5};

/// Step 1: numbers the next call of `c` and fixes its deadline.
/// @throws usage_error after an earlier failure (naming it)
inline call_info number(state& s, collective c, std::size_t n, dtype t, const options& o) {
  call_info ci;
  ci.c = c;
  ci.what = std::string(name(c));
  s.failed.check(s.site(ci.what, s.seq + 1));
  ci.seq = ++s.seq;
  ci.timeout = timeout_or(o, s.cfg.timeout);
  ci.desc = ci.what + " (" + std::to_string(n) + " x " + std::string(kft::name(t)) + ")";
  return ci;
}

/// The communicator's device, current for a scope; the caller's again after it.
class device_scope {
 public:
  explicit device_scope(const state& s) : device_(s.device) {
    cudaGetDevice(&prev_);
    if (prev_ != device_) s.check(cudaSetDevice(device_), "cudaSetDevice");
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }

 private:
  int device_;
  int prev_ = -1;
};

/// Step 2: enqueues the call: `body(call&)` (its collective), a barrier if it enqueued none (a
/// call that moves nothing still meets), and an event after it, which it returns.
template <class Body>
cudaEvent_t enqueue(state& s, const call_info& ci, unsigned long long sig, Body&& body) {
  device_scope on(s);
  call k{s, sig, static_cast<unsigned long long>(ci.timeout.count()) * 1000000ull};
  cudaEvent_t ev = nullptr;
  try {
    body(k);
    if (k.barriers == 0) k.sync();
    s.check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    s.check(cudaEventRecord(ev, s.stream), "cudaEventRecord");
  } catch (...) {
    if (ev != nullptr) cudaEventDestroy(ev);
    throw;
  }
  return ev;
}

/// Throws the call's error for what the barrier kernel found (nothing when it found nothing);
/// the communicator refuses calls from then on.
inline void raise_finding(state& s, const status& r, const call_info& ci) {
  if (r.code == status_fine) return;
  const std::string peer = "rank " + std::to_string(r.peer);
  const auto site = s.site(ci.what, ci.seq);
  std::string msg;
  if (r.code == status_timed_out) {
    msg = ci.desc + " timed out after " + kft::detail::describe_duration(ci.timeout) + " on CUDA device " +
          std::to_string(s.device) + " waiting for " + peer + " (barrier " + std::to_string(r.epoch) + ")";
    s.failed.set(msg);
    s.abort_group("rank " + std::to_string(s.rank) + ": " + msg);
    throw timeout_error(msg + "; the group was aborted", site);
  }
  if (r.code == status_mismatch) {
    msg = ci.desc + ": " + peer + " is in a different call (signature " + kft::detail::to_hex(&r.theirs, sizeof r.theirs) +
          "; its collective, count, dtype, op, root, tag or algorithm differ)";
    s.failed.set(msg);
    s.abort_group("rank " + std::to_string(s.rank) + ": " + msg);
    throw mismatch_error(msg, site);
  }
  const std::string why = s.abort_reason();
  if (r.code == status_stopped) {
    msg = ci.desc + " was stopped on this rank" + (why.empty() ? std::string() : ": " + why);
    s.failed.set(msg);
    throw remote_error(msg, site);
  }
  msg = ci.desc + ": the group was aborted by " + peer + (why.empty() ? std::string() : " (" + why + ")");
  s.failed.set(msg);
  throw remote_error(msg, site);
}

/// Past the host's deadline, when the GPU's own did not end the call (kernels queued behind
/// other work, or a hung device): tells the barrier kernels to stop, gives them a moment,
/// aborts the group and returns the call's timeout_error. Releases the event unless `done`.
inline std::exception_ptr stop_late(state& s, const call_info& ci, cudaEvent_t ev, bool& done) {
  reinterpret_cast<volatile status*>(s.st_host)->stop = 1;
  for (int i = 0; i < 200 && cudaEventQuery(ev) == cudaErrorNotReady; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done) {
    done = true;
    cudaEventDestroy(ev);  // released once the device is past it
  }
  const std::string msg = ci.desc + " did not complete within " + kft::detail::describe_duration(ci.timeout) +
                          " + " + std::to_string(host_grace.count()) + " s on CUDA device " + std::to_string(s.device);
  s.failed.set(msg);
  s.abort_group("rank " + std::to_string(s.rank) + ": " + msg);
  return std::make_exception_ptr(timeout_error(msg + "; the group was aborted", s.site(ci.what, ci.seq)));
}

/// Step 3: the call's work handle, driven by the waiting thread: done when the event is, then
/// failing with what the barrier kernel found.
inline async::work work_of(std::shared_ptr<state> st, call_info info, cudaEvent_t ev) {
  auto w = std::make_shared<async::work_state>();
  w->op = info.c;
  w->seq = info.seq;
  w->timeout = info.timeout + host_grace;  // the GPU gives up first, at `timeout`
  w->name = "cuda_ipc " + info.desc;
  auto ci = std::make_shared<const call_info>(std::move(info));
  auto done = std::make_shared<bool>(false);
  auto finish = [st, ev, ci, done]() {
    if (*done) return;
    *done = true;
    cudaEventDestroy(ev);
    raise_finding(*st, st->finding(), *ci);
  };
  w->progress = [ev, finish, st, ci]() {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      st->failed.set(std::string("cudaEventQuery: ") + cudaGetErrorString(e));
      kft::detail::cuda_check(e, "cudaEventQuery", st->site(ci->what, ci->seq));
    }
    finish();
    return true;
  };
  w->on_timeout = [ev, done, st, ci]() -> std::exception_ptr { return stop_late(*st, *ci, ev, *done); };
  return async::work(std::move(w));
}

/// A call of collective `c` whose arguments the facade has checked: numbered, enqueued by
/// `body(call&)`, and handed back as a work handle.
template <class Body>
async::work launch(const std::shared_ptr<state>& st, collective c, std::size_t n, dtype t, op_kind op, int root,
                   const options& o, Body&& body) {
  state& s = *st;
  call_info ci = number(s, c, n, t, o);
  const unsigned long long sig =
      signature(c, n, t, op, root, o.tag, o.algorithm, s.cfg.staging_bytes, s.cfg.one_shot_bytes);
  const cudaEvent_t ev = enqueue(s, ci, sig, std::forward<Body>(body));
  return work_of(st, std::move(ci), ev);
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
