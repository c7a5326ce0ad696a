// SPDX-License-Identifier: Apache-2.0
// Device buffers for a GPU factory's run_case (tests/conformance/nccl.cpp, cuda_ipc.cu):
// allocated per case, freed when the case ends.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <utility>
#include <vector>

namespace kft_test::conformance {

struct device_memory {
  std::vector<void*> blocks;
  device_memory() = default;
  device_memory(const device_memory&) = delete;
  device_memory(device_memory&& o) noexcept : blocks(std::move(o.blocks)) {}
  ~device_memory() {
    for (void* b : blocks) cudaFree(b);
  }
  void* alloc(std::size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<std::size_t>(bytes, 1)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    blocks.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes && cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("cudaMemcpy H2D");
    // A pageable upload may still be in flight when cudaMemcpy returns, and a communicator's
    // non-blocking stream does not wait for the legacy stream: on an H200 a canary upload
    // landed over an out-of-place result without this.
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize after H2D");
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes && cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("cudaMemcpy D2H");
  }
};

}  // namespace kft_test::conformance
