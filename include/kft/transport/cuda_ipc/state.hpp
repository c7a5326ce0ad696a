// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/state.hpp
/// @brief Everything a CUDA IPC communicator and its outstanding work share: the ranks'
/// regions, the status word, the streams, the failure latch; the set-up steps (allocate,
/// publish the handle, map the peers), stopping the group, and freeing it all. No kernels: any
/// C++ compiler reads it.
///
/// Set-up: each rank allocates one device region (a control block and `staging_bytes` of
/// staging), publishes its `cudaIpcMemHandle_t` under `<name>/<rank>` in the store (hex, then
/// its pid and device), and opens every other rank's (`cudaIpcMemLazyEnablePeerAccess`: NVLink
/// or PCIe peer access between GPUs, or the same GPU shared by several processes).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/state.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/cuda_error.hpp>
#include <kft/core/error.hpp>
#include <kft/core/hex.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/cuda_ipc/config.hpp>
#include <kft/transport/cuda_ipc/layout.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

struct state {
  int rank = 0, size = 1, device = 0;
  config cfg;
  std::uint64_t seq = 0;
  unsigned long long epoch = 0;
  unsigned char* base = nullptr;                   // this rank's region
  std::array<unsigned char*, max_ranks> region{};  // every rank's region (this rank's = base)
  peers ctl{};
  status* st_host = nullptr;  // host-mapped
  status* st_dev = nullptr;
  cudaStream_t stream = nullptr, side = nullptr;
  bool own_stream = false;
  kft::detail::failure_latch failed;  // why calls are refused (none while healthy)
  bool ready = false;                 // set-up done: every rank's region mapped
  rendezvous::store* store = nullptr;

  error_site site(std::string op, std::uint64_t s = 0) const {
    return error_site::in(cfg.identity, rank, size, "cuda_ipc " + std::move(op), s);
  }
  /// A CUDA call of the set-up or of the current call, checked.
  void check(cudaError_t rc, const char* call) const { kft::detail::cuda_check(rc, call, site("call", seq)); }

  /// The store key under which rank `j` publishes its handle.
  std::string key(int j) const { return cfg.name + "/" + std::to_string(j); }

  // ---- set-up, in the constructor's order ------------------------------------------------------

  /// This rank's region (the control block zeroed), the host-mapped status word, the streams.
  void allocate() {
    check(cudaSetDevice(device), "cudaSetDevice");
    const std::size_t bytes = control_bytes + cfg.staging_bytes;
    void* mem = nullptr;
    check(cudaMalloc(&mem, bytes), "cudaMalloc (cuda_ipc staging)");
    base = static_cast<unsigned char*>(mem);
    check(cudaMemset(base, 0, control_bytes), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    void* host = nullptr;
    check(cudaHostAlloc(&host, sizeof(status), cudaHostAllocMapped), "cudaHostAlloc (status)");
    st_host = static_cast<status*>(host);
    std::memset(st_host, 0, sizeof(status));
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
    st_dev = static_cast<status*>(dev);
    if (cfg.stream != nullptr) {
      stream = cfg.stream;
    } else {
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      own_stream = true;
    }
    check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }

  /// Publishes this rank's handle, then waits (`cfg.timeout`) until every rank has.
  /// @throws timeout_error naming the ranks that did not
  void publish_and_wait() {
    cudaIpcMemHandle_t mine{};
    check(cudaIpcGetMemHandle(&mine, base), "cudaIpcGetMemHandle");
    store->set(key(rank), kft::detail::to_hex(&mine, sizeof mine) + " " + std::to_string(::getpid()) + " " +
                              std::to_string(device));
    std::vector<std::string> keys;
    for (int j = 0; j < size; ++j) keys.push_back(key(j));
    try {
      store->wait(keys, cfg.timeout);
    } catch (const timeout_error&) {
      std::string missing;
      for (int j = 0; j < size; ++j)
        if (!store->try_get(keys[static_cast<std::size_t>(j)])) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      throw timeout_error("set-up timed out after " + kft::detail::describe_duration(cfg.timeout) +
                              " waiting for rank(s) " + missing + " to publish their CUDA IPC handle under '" +
                              cfg.name + "/<rank>' in " + store->describe(),
                          site("init"));
    }
  }

  /// Maps every other rank's region through its published handle.
  /// @throws transport_error for an entry that is not a handle, or one that cannot be opened
  void open_peers() {
    for (int j = 0; j < size; ++j) {
      auto& r = region[static_cast<std::size_t>(j)];
      if (j == rank) {
        r = base;
      } else {
        const std::string k = key(j);
        const std::string v = store->get(k, cfg.timeout);
        cudaIpcMemHandle_t h{};
        const auto sp = v.find(' ');
        const std::string why = sp == std::string::npos ? std::string("no process and device after the handle")
                                                        : kft::detail::read_hex(std::string_view(v).substr(0, sp), &h, sizeof h);
        if (!why.empty())
          throw transport_error("rank " + std::to_string(j) + "'s entry '" + k + "' is not a CUDA IPC handle (" + why +
                                    "): '" + kft::detail::excerpt(v, 80) + "'",
                                site("init"));
        void* p = nullptr;
        const cudaError_t rc = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
        if (rc != cudaSuccess)
          throw transport_error("cannot open rank " + std::to_string(j) + "'s CUDA IPC handle (process and device: " +
                                    v.substr(sp + 1) + "; this rank is on device " + std::to_string(device) +
                                    "): " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) +
                                    "); the ranks of a cuda_ipc communicator must be distinct processes of one node "
                                    "whose GPUs have peer access (cudaDeviceCanAccessPeer)",
                                site("init"), static_cast<int>(rc));
        r = static_cast<unsigned char*>(p);
      }
      ctl.ctl[j] = reinterpret_cast<control*>(r);
    }
  }

  // ---- failures ---------------------------------------------------------------------------------

  /// What the barrier kernel reported (read once the call's work has completed on the GPU).
  status finding() const {
    const volatile status& v = *st_host;
    status r{};
    r.code = v.code;
    r.peer = v.peer;
    r.epoch = v.epoch;
    r.theirs = v.theirs;
    return r;
  }

  /// Why the group was aborted, as the aborting rank put it in the store (empty: unknown).
  std::string abort_reason() const noexcept {
    try {
      return store->try_get(cfg.name + "/abort").value_or("");
    } catch (...) {
      return {};
    }
  }

  /// Tells this rank's barrier kernels to stop and every rank's to give up with "aborted by
  /// this rank" (noexcept: used on the way out of failures).
  void abort_group(std::string_view why) noexcept {
    try {
      if (store != nullptr) store->set(cfg.name + "/abort", std::string(why));
    } catch (...) {
    }
    if (st_host != nullptr) reinterpret_cast<volatile status*>(st_host)->stop = 1;
    static thread_local unsigned long long word = 0;
    word = static_cast<unsigned long long>(rank) + 1;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    for (int j = 0; j < size; ++j)
      if (region[static_cast<std::size_t>(j)] != nullptr)
        cudaMemcpyAsync(region[static_cast<std::size_t>(j)] + offsetof(control, aborted), &word, sizeof word,
                        cudaMemcpyHostToDevice, side);
    cudaStreamSynchronize(side);
    if (prev >= 0) cudaSetDevice(prev);
  }

  /// Unmaps the peers and frees this rank's region, status word and streams (after the
  /// stream's work has finished).
  void free_all() noexcept {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (int j = 0; j < size; ++j)
      if (j != rank && region[static_cast<std::size_t>(j)] != nullptr) cudaIpcCloseMemHandle(region[static_cast<std::size_t>(j)]);
    if (base != nullptr) cudaFree(base);
    if (st_host != nullptr) cudaFreeHost(st_host);
    if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
    if (side != nullptr) cudaStreamDestroy(side);
    if (prev >= 0) cudaSetDevice(prev);
  }
};

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
