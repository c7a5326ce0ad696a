// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/nccl/work.hpp
/// @brief A NCCL collective as `kft::async::work` (component `kft::nccl`): done when a CUDA
/// event recorded after it has completed on the device, NCCL's asynchronous error checked on
/// every poll, the communicator aborted past the deadline.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/transport/nccl/work.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <cuda_runtime_api.h>

#include <exception>
#include <memory>
#include <string>

#include <kft/async/work.hpp>
#include <kft/transport/nccl/state.hpp>

KFT_NAMESPACE_BEGIN
namespace nccl::detail {

// An event recorded after a collective; returned to the communicator's pool when done with.
struct event {
  std::shared_ptr<comm_state> s;
  cudaEvent_t ev = nullptr;
  event(std::shared_ptr<comm_state> state, cudaEvent_t e) : s(std::move(state)), ev(e) {}
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() {
    if (ev != nullptr) s->give_back(ev);
  }
};

// The work of an enqueued call: done when its event has completed on the device; NCCL's
// asynchronous error is checked on every poll; past the deadline the communicator is aborted.
inline async::work work_of(std::shared_ptr<event> ev, collective c, const char* what, std::uint64_t seq,
                           std::size_t count, dtype t, std::chrono::milliseconds timeout) {
  auto st = std::make_shared<async::work_state>();
  st->op = c;
  st->seq = seq;
  st->timeout = timeout;
  st->name = std::string("nccl ") + what;
  st->progress = [ev, what, seq] {
    auto& s = *ev->s;
    const cudaError_t e = cudaEventQuery(ev->ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) s.fail_cuda(e, "cudaEventQuery", what, seq);
    if (s.comm != nullptr) (void)s.in_progress(s.comm, what, seq);
    return false;
  };
  st->on_timeout = [ev, what, seq, count, t, timeout]() -> std::exception_ptr {
    auto& s = *ev->s;
    try {
      s.time_out(what, seq,
                 std::string(what) + " (" + std::to_string(count) + " x " + std::string(kft::name(t)) +
                     ") timed out after " + kft::detail::describe_duration(timeout) + " on CUDA device " +
                     std::to_string(s.device) + " waiting for the " + std::to_string(s.size - 1) +
                     " other rank(s); the NCCL communicator was aborted (NCCL does not say which rank is late; "
                     "NCCL_DEBUG=INFO shows its view)");
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  };
  return async::work(std::move(st));
}

}  // namespace nccl::detail
KFT_NAMESPACE_END
