// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/cuda_optim.cuh
/// @brief `cuda_sgd`: torch.optim.SGD on device memory, for the trainer over a GPU group
/// (nvcc: this header holds kernels).
///
///     kft::ddp::cuda_sgd opt({.lr = 0.05f, .momentum = 0.9f}, stream);
///     kft::ddp::trainer t(gpu_comm, host_group, model, opt, options);   // model tensors on the device
///
/// The same update as `kft::ddp::sgd` (d = g x scale + wd w; b = m b + (1 - dampening) d, b = d
/// on the first step; w -= lr (nesterov ? d + m b : b)), one kernel per parameter on `stream`
/// (the model's: the update follows the reduced gradients and precedes the next forward pass
/// without a host wait). A gradient element that is NaN or infinite is recorded on the device;
/// `end_step()` waits for the step's kernels once and names the first such parameter. The
/// momentum buffers stay on the device (`state()` carries the step count only; the trainer
/// refuses checkpoints of device models for now).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/ddp/cuda_optim.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <kft/core/cuda_error.hpp>
#include <kft/core/error.hpp>
#include <kft/ddp/optim.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

namespace cuda_detail {

// One parameter's update; `bad` receives the smallest index of a parameter whose gradient
// holds a NaN or an infinity.
__global__ void sgd_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ b, std::size_t n,
                           float scale, float lr, float wd, float m, float damp, bool nesterov, bool first, int index,
                           int* bad) {
  bool finite = true;
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float gk = g[k];
    finite &= isfinite(gk);
    const float d = gk * scale + wd * w[k];
    if (b == nullptr) {
      w[k] -= lr * d;
    } else {
      const float v = first ? d : m * b[k] + damp * d;
      b[k] = v;
      w[k] -= lr * (nesterov ? d + m * v : v);
    }
  }
  if (!finite) atomicMin(bad, index);
}

}  // namespace cuda_detail

class cuda_sgd {
 public:
  /// @param stream where the updates run (the model's compute stream); nullptr: the legacy stream
  explicit cuda_sgd(sgd_options o = {}, cudaStream_t stream = nullptr) : o_(o), stream_(stream) {
    if (!(o_.lr >= 0.0f)) throw usage_error("cuda_sgd: lr = " + std::to_string(o_.lr) + " (must be >= 0)");
    if (o_.nesterov && (o_.momentum <= 0.0f || o_.dampening != 0.0f))
      throw usage_error("cuda_sgd: nesterov needs momentum > 0 and dampening 0");
    check(cudaMalloc(reinterpret_cast<void**>(&bad_), sizeof(int)), "cudaMalloc");
  }
  cuda_sgd(const cuda_sgd&) = delete;
  cuda_sgd& operator=(const cuda_sgd&) = delete;
  ~cuda_sgd() {
    for (float* p : momentum_) cudaFree(p);
    cudaFree(bad_);
  }

  std::string name() const {
    return "cuda_sgd(lr " + detail::shortest(o_.lr) + ", momentum " + detail::shortest(o_.momentum) +
           (o_.weight_decay != 0.0f ? ", weight decay " + detail::shortest(o_.weight_decay) : std::string()) + ")";
  }
  const sgd_options& options() const noexcept { return o_; }
  void set_lr(float lr) noexcept { o_.lr = lr; }

  /// @brief The parameters' sizes: allocates (and zeroes) the momentum buffers on the device.
  void bind(std::span<const std::size_t> sizes) {
    for (float* p : momentum_) cudaFree(p);
    momentum_.clear();
    sizes_.assign(sizes.begin(), sizes.end());
    if (o_.momentum == 0.0f) return;
    for (std::size_t n : sizes_) {
      float* p = nullptr;
      check(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMalloc");
      momentum_.push_back(p);
      check(cudaMemsetAsync(p, 0, n * sizeof(float), stream_), "cudaMemsetAsync");
    }
  }
  void begin_step() {
    ++s_.steps;
    const int none = INT_MAX;
    check(cudaMemcpyAsync(bad_, &none, sizeof none, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }
  /// @brief Enqueues parameter i's update (device spans); the verdict comes from end_step().
  bool step(std::size_t i, std::span<float> w, std::span<const float> g, float scale) {
    detail::check_sizes(sizes_, i, w, g, "cuda_sgd");
    if (w.empty()) return true;
    const int threads = 256;
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>((w.size() + threads - 1) / threads, 1024));
    cuda_detail::sgd_kernel<<<blocks, threads, 0, stream_>>>(
        w.data(), g.data(), momentum_.empty() ? nullptr : momentum_[i], w.size(), scale, o_.lr, o_.weight_decay,
        o_.momentum, 1.0f - o_.dampening, o_.nesterov, s_.steps == 1, static_cast<int>(i), bad_);
    check(cudaGetLastError(), "sgd kernel launch");
    return true;
  }
  /// @brief Waits for this step's updates; returns the first parameter whose gradient held a
  /// NaN or an infinity, or SIZE_MAX.
  std::size_t end_step() {
    int first = INT_MAX;
    check(cudaMemcpyAsync(&first, bad_, sizeof first, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return first == INT_MAX ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(first);
  }
  optimizer_state& state() noexcept { return s_; }
  /// @brief Bytes of optimizer state on the device.
  std::size_t state_bytes() const noexcept {
    std::size_t b = 0;
    if (!momentum_.empty())
      for (std::size_t n : sizes_) b += n * sizeof(float);
    return b;
  }

 private:
  static void check(cudaError_t rc, const char* what) {
    kft::detail::cuda_check(rc, what, error_site::of("cuda_sgd"));
  }
  sgd_options o_;
  cudaStream_t stream_;
  optimizer_state s_;
  std::vector<std::size_t> sizes_;
  std::vector<float*> momentum_;
  int* bad_ = nullptr;
};

}  // namespace ddp
KFT_NAMESPACE_END
