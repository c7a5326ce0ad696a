// SPDX-License-Identifier: Apache-2.0
// mlp_cuda.cuh: example 05's multi-layer perceptron (ReLU hidden layers, softmax
// cross-entropy) on one CUDA device, written as a kft::ddp::model for the trainer over a GPU
// group. Matrix products go through cuBLAS, the rest (gathering and normalising the batch, bias
// and ReLU, the loss) through the small kernels below, everything on one stream. Its backward
// pass writes each layer's gradients straight into the reducer's device buckets and hands them
// over (g.ready: a CUDA event, no host wait) as soon as their kernels are enqueued, last layer
// first, so the allreduce of layer l runs while layers l-1 ... 1 are still being differentiated.
//
// The numbers are mlp.hpp's: the same initial weights (the same splitmix64 draws, in the same
// order, the same row-major layouts), the same input normalisation, the same loss; only the
// order of the floating-point sums inside the matrix products differs (cuBLAS, FP32 math).
//
// nvcc only (this header holds kernels; include it in one translation unit).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kft/ddp/sampler.hpp>
#include <kft/ddp/trainer.hpp>

#include "idx.hpp"

namespace fmnist {

namespace gpu {

/// Throws std::runtime_error naming the call and CUDA's error unless rc is cudaSuccess.
inline void check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

/// The same for cuBLAS.
inline void check(cublasStatus_t rc, const char* call) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(call) + " failed: " + cublasGetStatusName(rc) + " (" +
                           cublasGetStatusString(rc) + ")");
}

/// An owned device array of T (cudaMalloc / cudaFree); move-only.
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(std::size_t n) { reallocate(n); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~device_array() { release(); }

  /// Frees the old contents and allocates room for `n` elements (uninitialised).
  void reallocate(std::size_t n) {
    release();
    if (n == 0) return;
    void* p = nullptr;
    check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  void release() noexcept {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// What the loss kernel adds up over a batch.
struct batch_totals {
  double loss_sum;
  unsigned long long correct;
};

// ---- kernels ----------------------------------------------------------------------------------

// x[r][c] = (image[idx[r]][c] / 255 - 0.2860) / 0.3530, rounded as mlp.hpp rounds it (no FMA).
__global__ void gather_normalize(const std::uint8_t* __restrict__ images, std::size_t dim,
                                 const std::uint32_t* __restrict__ idx, std::size_t rows, float* __restrict__ x) {
  const std::size_t n = rows * dim;
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = k / dim, c = k % dim;
    const float v = static_cast<float>(images[static_cast<std::size_t>(idx[r]) * dim + c]);
    x[k] = __fmul_rn(__fsub_rn(__fmul_rn(v, 1.0f / 255.0f), 0.2860f), 1.0f / 0.3530f);
  }
}

// z[r][c] += bias[c], then max(z, 0) when `relu` (a hidden layer).
__global__ void bias_activation(float* __restrict__ z, const float* __restrict__ bias, std::size_t rows,
                                std::size_t cols, bool relu) {
  const std::size_t n = rows * cols;
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = z[k] + bias[k % cols];
    z[k] = relu ? (v > 0.0f ? v : 0.0f) : v;  // a NaN becomes 0, as in mlp.hpp
  }
}

// Backward through a ReLU: the layer's output `out` becomes dh where it passed (out > 0), 0 elsewhere.
__global__ void relu_backward(float* __restrict__ out, const float* __restrict__ dh, std::size_t n) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[k] = out[k] > 0.0f ? dh[k] : 0.0f;
}

__global__ void fill(float* __restrict__ p, std::size_t n, float v) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[k] = v;
}

// Softmax cross-entropy, one thread per row of the logits z (rows x classes): the row's loss
// (log-sum-exp in double, as mlp.hpp) and whether its argmax is the label, summed per warp and
// added into *totals. With `gradient`, the row becomes d(mean loss)/d(logits) =
// (softmax - onehot) / rows, scaled by inv_rows. blockDim.x must be a multiple of 32.
__global__ void softmax_cross_entropy(float* __restrict__ z, const std::uint8_t* __restrict__ labels,
                                      const std::uint32_t* __restrict__ idx, int rows, int classes, float inv_rows,
                                      bool gradient, batch_totals* totals) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  double loss = 0.0;
  unsigned long long correct = 0;
  if (r < rows) {
    float* row = z + static_cast<std::size_t>(r) * static_cast<std::size_t>(classes);
    const int y = labels[idx[r]];
    float mx = row[0];
    int arg = 0;
    for (int c = 1; c < classes; ++c)
      if (row[c] > mx) mx = row[c], arg = c;
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(row[c] - mx));
    loss = log(sum) - static_cast<double>(row[y] - mx);
    correct = arg == y ? 1ull : 0ull;
    if (gradient) {
      const double inv = 1.0 / sum;
      for (int c = 0; c < classes; ++c) {
        float p = static_cast<float>(exp(static_cast<double>(row[c] - mx)) * inv);
        if (c == y) p -= 1.0f;
        row[c] = p * inv_rows;
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    loss += __shfl_down_sync(0xffffffffu, loss, o);
    correct += __shfl_down_sync(0xffffffffu, correct, o);
  }
  if ((threadIdx.x & 31u) == 0) {
    atomicAdd(&totals->loss_sum, loss);
    atomicAdd(&totals->correct, correct);
  }
}

inline constexpr int block_threads = 256;

// Two timing events, destroyed on scope exit.
struct event_pair {
  cudaEvent_t start = nullptr, stop = nullptr;
  event_pair() {
    check(cudaEventCreate(&start), "cudaEventCreate");
    if (cudaEventCreate(&stop) != cudaSuccess) {
      cudaEventDestroy(start);
      throw std::runtime_error("cudaEventCreate failed");
    }
  }
  event_pair(const event_pair&) = delete;
  event_pair& operator=(const event_pair&) = delete;
  ~event_pair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Blocks for a grid-stride loop over n elements (n > 0).
inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>((n + block_threads - 1) / block_threads, 1, 4096));
}

}  // namespace gpu

class mlp_cuda {
 public:
  /// widths: input, hidden..., classes (784, 256, 128, 10). The initial weights are mlp.hpp's
  /// (PyTorch's nn.Linear initialisation from `seed`), drawn on the host and uploaded. Both
  /// datasets (either may be null) are uploaded once. Every kernel and cuBLAS call runs on `stream`.
  mlp_cuda(std::vector<int> widths, const dataset* train, const dataset* test, std::uint64_t seed, cudaStream_t stream)
      : w_(std::move(widths)), train_(train), test_(test), stream_(stream) {
    if (w_.size() < 2) throw std::invalid_argument("mlp_cuda: needs an input and an output width");
    for (int w : w_)
      if (w < 1) throw std::invalid_argument("mlp_cuda: layer width " + std::to_string(w) + " (must be >= 1)");
    for (const dataset* d : {train, test}) {
      if (!d) continue;
      if (static_cast<std::size_t>(w_.front()) != d->dim)
        throw std::invalid_argument("mlp_cuda: input width " + std::to_string(w_.front()) + " but the images have " +
                                    std::to_string(d->dim) + " pixels");
      for (std::uint8_t l : d->labels)
        if (l >= w_.back())
          throw std::invalid_argument("mlp_cuda: label " + std::to_string(l) + " but only " +
                                      std::to_string(w_.back()) + " classes");
    }

    gpu::check(cublasCreate(&blas_.h), "cublasCreate");
    gpu::check(cublasSetStream(blas_.h, stream_), "cublasSetStream");

    // mlp.hpp's initialisation, draw for draw: layer by layer, the weights (in x out,
    // row-major) then the biases, uniform in +-1/sqrt(fan_in).
    kft::ddp::splitmix64 g{seed};
    std::vector<std::vector<float>> host_w, host_b;
    for (std::size_t l = 0; l + 1 < w_.size(); ++l) {
      const int in = w_[l], out = w_[l + 1];
      const float bound = 1.0f / std::sqrt(static_cast<float>(in));
      auto uni = [&] { return (static_cast<float>(g.next() >> 40) / 16777216.0f * 2.0f - 1.0f) * bound; };
      host_w.emplace_back(static_cast<std::size_t>(in) * static_cast<std::size_t>(out));
      for (auto& x : host_w.back()) x = uni();
      host_b.emplace_back(static_cast<std::size_t>(out));
      for (auto& x : host_b.back()) x = uni();
    }
    for (std::size_t l = 0; l < host_w.size(); ++l) {
      weights_.emplace_back(host_w[l].size());
      upload(weights_.back().data(), host_w[l].data(), host_w[l].size() * sizeof(float));
      biases_.emplace_back(host_b[l].size());
      upload(biases_.back().data(), host_b[l].data(), host_b[l].size() * sizeof(float));
    }
    if (train_) upload_set(*train_, train_dev_);
    if (test_) upload_set(*test_, test_dev_);
    totals_.reallocate(1);
    z_.resize(layers());
    // The host arrays above go out of scope: the copies must be done.
    gpu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  mlp_cuda(const mlp_cuda&) = delete;
  mlp_cuda& operator=(const mlp_cuda&) = delete;
  mlp_cuda(mlp_cuda&&) = delete;
  mlp_cuda& operator=(mlp_cuda&&) = delete;
  /// Waits for the stream's work (it may still use the buffers), then frees them (members).
  ~mlp_cuda() { cudaStreamSynchronize(stream_); }

  std::size_t layers() const { return weights_.size(); }
  /// The stream every kernel runs on: the trainer orders the gradients' communication after it.
  cudaStream_t stream() const { return stream_; }

  /// fc1.weight (in x out, row-major), fc1.bias, fc2.weight, ...: spans over device memory.
  std::vector<kft::ddp::tensor_ref> parameters() {
    std::vector<kft::ddp::tensor_ref> p;
    for (std::size_t l = 0; l < layers(); ++l) {
      p.push_back({"fc" + std::to_string(l + 1) + ".weight", std::span<float>(weights_[l].data(), weights_[l].size())});
      p.push_back({"fc" + std::to_string(l + 1) + ".bias", std::span<float>(biases_[l].data(), biases_[l].size())});
    }
    return p;
  }

  /// Forward and backward over training samples `idx` (host indices); the gradients of the
  /// batch's mean loss go into g (device spans), each layer's handed over as soon as its kernels
  /// are enqueued. Waits for the stream once, at the end, for the loss and the accuracy.
  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, kft::ddp::gradients& g) {
    if (!train_) throw std::logic_error("mlp_cuda: no training set");
    if (g.size() != 2 * layers())
      throw std::invalid_argument("mlp_cuda: " + std::to_string(g.size()) + " gradient buffers for " +
                                  std::to_string(2 * layers()) + " parameters");
    const bool accumulate = g.accumulate();
    if (idx.empty()) {  // no samples: a zero gradient (or nothing added), every parameter ready
      for (std::size_t i = 0; i < g.size(); ++i) {
        if (!accumulate)
          gpu::check(cudaMemsetAsync(g[i].data(), 0, g[i].size_bytes(), stream_), "cudaMemsetAsync");
        g.ready(i);
      }
      return {};
    }
    const int b = forward(*train_, train_dev_, idx, true);
    const std::size_t rows = static_cast<std::size_t>(b);
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    // z_.back() holds d(mean loss)/d(logits). Row-major X (r x c) is column-major X^T (c x r)
    // with the same leading dimension c; cuBLAS computes the transposed products.
    for (std::size_t l = layers(); l-- > 0;) {
      const int in = w_[l], out = w_[l + 1];
      const float* h = l == 0 ? x_.data() : z_[l - 1].data();  // the layer's input (its ReLU output)
      float* dz = z_[l].data();
      const auto dw = g[2 * l], db = g[2 * l + 1];
      check_size(dw, static_cast<std::size_t>(in) * static_cast<std::size_t>(out), 2 * l);
      check_size(db, static_cast<std::size_t>(out), 2 * l + 1);
      // dW = H^T dZ (in x out): dW^T (out x in) = dZ^T (out x b) . H (b x in).
      gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, b, &one, dz, out, h, in, &beta, dw.data(), out),
                 "cublasSgemm (weight gradient)");
      // db = the column sums of dZ: dZ^T (out x b) . ones (b).
      gpu::check(cublasSgemv(blas_.h, CUBLAS_OP_N, out, b, &one, dz, out, ones_.data(), 1, &beta, db.data(), 1),
                 "cublasSgemv (bias gradient)");
      g.ready(2 * l);
      g.ready(2 * l + 1);
      if (l == 0) break;
      // dH = dZ W^T (b x in): dH^T (in x b) = W (in x out) . dZ^T (out x b), W being the
      // transpose of the column-major (out x in) view of its row-major storage.
      gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_T, CUBLAS_OP_N, in, b, out, &one, weights_[l].data(), out, dz, out, &zero,
                             dh_.data(), in),
                 "cublasSgemm (input gradient)");
      // Through the ReLU of layer l-1: its output z_[l-1] is > 0 where it passed.
      const std::size_t n = rows * static_cast<std::size_t>(in);
      gpu::relu_backward<<<gpu::blocks_for(n), gpu::block_threads, 0, stream_>>>(z_[l - 1].data(), dh_.data(), n);
      gpu::check(cudaGetLastError(), "relu_backward kernel launch");
    }
    return fetch_totals(b);
  }

  /// The cuBLAS matrix products of one training step over a batch of `b` samples, alone: each
  /// layer's forward product, weight gradient and (but the first) input gradient, the calls
  /// forward_backward makes, on scratch buffers. Their mean time over `reps` timed steps (after
  /// warm-up), in seconds, by CUDA events on the model's stream: the compute a step has for the
  /// gradients' communication to hide behind.
  double gemm_seconds(int b, int reps) {
    if (b < 1 || reps < 1) throw std::invalid_argument("mlp_cuda::gemm_seconds: batch and repetitions must be >= 1");
    reserve(static_cast<std::size_t>(b));
    std::vector<gpu::device_array<float>> dw(layers());
    for (std::size_t l = 0; l < layers(); ++l) {
      dw[l].reallocate(static_cast<std::size_t>(w_[l]) * static_cast<std::size_t>(w_[l + 1]));
      gpu::check(cudaMemsetAsync(z_[l].data(), 0, static_cast<std::size_t>(b) * w_[l + 1] * sizeof(float), stream_),
                 "cudaMemsetAsync");
    }
    gpu::check(cudaMemsetAsync(x_.data(), 0, static_cast<std::size_t>(b) * w_.front() * sizeof(float), stream_),
               "cudaMemsetAsync");
    const float one = 1.0f, zero = 0.0f;
    const auto step = [&] {
      for (std::size_t l = 0; l < layers(); ++l) {
        const int in = w_[l], out = w_[l + 1];
        const float* h = l == 0 ? x_.data() : z_[l - 1].data();
        gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_N, out, b, in, &one, weights_[l].data(), out, h, in,
                               &zero, z_[l].data(), out),
                   "cublasSgemm (forward)");
      }
      for (std::size_t l = layers(); l-- > 0;) {
        const int in = w_[l], out = w_[l + 1];
        const float* h = l == 0 ? x_.data() : z_[l - 1].data();
        gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, b, &one, z_[l].data(), out, h, in, &zero,
                               dw[l].data(), out),
                   "cublasSgemm (weight gradient)");
        if (l == 0) break;
        gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_T, CUBLAS_OP_N, in, b, out, &one, weights_[l].data(), out,
                               z_[l].data(), out, &zero, dh_.data(), in),
                   "cublasSgemm (input gradient)");
      }
    };
    for (int i = 0; i < 10; ++i) step();  // cuBLAS picks and loads its kernels
    gpu::event_pair ev;
    gpu::check(cudaEventRecord(ev.start, stream_), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) step();
    gpu::check(cudaEventRecord(ev.stop, stream_), "cudaEventRecord");
    gpu::check(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
    float ms = 0;
    gpu::check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
    return static_cast<double>(ms) / 1e3 / reps;
  }

  /// The loss and accuracy statistics over test samples `idx` (host indices); no gradients.
  kft::ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) {
    if (!test_) throw std::logic_error("mlp_cuda: no test set");
    if (idx.empty()) return {};
    return fetch_totals(forward(*test_, test_dev_, idx, false));
  }

 private:
  struct device_set {
    gpu::device_array<std::uint8_t> images, labels;
  };
  struct blas_handle {
    cublasHandle_t h = nullptr;
    blas_handle() = default;
    blas_handle(const blas_handle&) = delete;
    blas_handle& operator=(const blas_handle&) = delete;
    ~blas_handle() {
      if (h) cublasDestroy(h);
    }
  };

  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes) gpu::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
  }
  void upload_set(const dataset& d, device_set& out) {
    out.images.reallocate(d.images.size());
    upload(out.images.data(), d.images.data(), d.images.size());
    out.labels.reallocate(d.labels.size());
    upload(out.labels.data(), d.labels.data(), d.labels.size());
  }

  static void check_size(std::span<float> s, std::size_t want, std::size_t i) {
    if (s.size() != want)
      throw std::invalid_argument("mlp_cuda: gradient buffer " + std::to_string(i) + " has " + std::to_string(s.size()) +
                                  " elements, the parameter " + std::to_string(want));
  }

  // Room for batches of `rows` samples: the scratch buffers grow (never shrink), so a warm
  // model allocates nothing. Every earlier call ended waiting for the stream, so no kernel
  // still uses the buffers freed here.
  void reserve(std::size_t rows) {
    if (rows <= rows_) return;
    rows_ = std::max(rows, 2 * rows_);
    idx_dev_.reallocate(rows_);
    x_.reallocate(rows_ * static_cast<std::size_t>(w_.front()));
    std::size_t widest_hidden = 0;
    for (std::size_t l = 0; l < layers(); ++l) {
      z_[l].reallocate(rows_ * static_cast<std::size_t>(w_[l + 1]));
      if (l > 0) widest_hidden = std::max(widest_hidden, static_cast<std::size_t>(w_[l]));
    }
    dh_.reallocate(rows_ * widest_hidden);
    ones_.reallocate(rows_);
    gpu::fill<<<gpu::blocks_for(rows_), gpu::block_threads, 0, stream_>>>(ones_.data(), rows_, 1.0f);
    gpu::check(cudaGetLastError(), "fill kernel launch");
  }

  // Forward pass over samples `idx` of `d` (on the device as `dd`): leaves the ReLU outputs in
  // z_[0..L-2] and, with `gradient`, d(mean loss)/d(logits) in z_[L-1]; the batch's loss sum
  // and correct count are being added into totals_. Returns the batch size.
  int forward(const dataset& d, const device_set& dd, std::span<const std::uint32_t> idx, bool gradient) {
    if (idx.size() > static_cast<std::size_t>(INT_MAX))
      throw std::invalid_argument("mlp_cuda: a batch of " + std::to_string(idx.size()) + " samples");
    const int b = static_cast<int>(idx.size());
    const std::size_t rows = idx.size();
    for (std::uint32_t i : idx)
      if (i >= d.n)
        throw std::out_of_range("mlp_cuda: sample " + std::to_string(i) + " of a set of " + std::to_string(d.n));
    reserve(rows);
    idx_host_.assign(idx.begin(), idx.end());
    gpu::check(cudaMemcpyAsync(idx_dev_.data(), idx_host_.data(), rows * sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                               stream_),
               "cudaMemcpyAsync (sample indices)");
    gpu::check(cudaMemsetAsync(totals_.data(), 0, sizeof(gpu::batch_totals), stream_), "cudaMemsetAsync");
    const std::size_t n0 = rows * d.dim;
    gpu::gather_normalize<<<gpu::blocks_for(n0), gpu::block_threads, 0, stream_>>>(dd.images.data(), d.dim,
                                                                                  idx_dev_.data(), rows, x_.data());
    gpu::check(cudaGetLastError(), "gather_normalize kernel launch");
    const float one = 1.0f, zero = 0.0f;
    for (std::size_t l = 0; l < layers(); ++l) {
      const int in = w_[l], out = w_[l + 1];
      const float* h = l == 0 ? x_.data() : z_[l - 1].data();
      // Z = H W (b x out): Z^T (out x b) = W^T (out x in) . H^T (in x b), both the plain
      // column-major views of the row-major arrays.
      gpu::check(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_N, out, b, in, &one, weights_[l].data(), out, h, in, &zero,
                             z_[l].data(), out),
                 "cublasSgemm (forward)");
      const std::size_t n = rows * static_cast<std::size_t>(out);
      gpu::bias_activation<<<gpu::blocks_for(n), gpu::block_threads, 0, stream_>>>(
          z_[l].data(), biases_[l].data(), rows, static_cast<std::size_t>(out), l + 1 < layers());
      gpu::check(cudaGetLastError(), "bias_activation kernel launch");
    }
    const auto loss_blocks = static_cast<unsigned>((rows + gpu::block_threads - 1) / gpu::block_threads);
    gpu::softmax_cross_entropy<<<loss_blocks, gpu::block_threads, 0, stream_>>>(
        z_.back().data(), dd.labels.data(), idx_dev_.data(), b, w_.back(), 1.0f / static_cast<float>(b), gradient,
        totals_.data());
    gpu::check(cudaGetLastError(), "softmax_cross_entropy kernel launch");
    return b;
  }

  // The batch's totals, once the stream has done everything enqueued so far.
  kft::ddp::batch_stats fetch_totals(int b) {
    gpu::check(cudaMemcpyAsync(&totals_host_, totals_.data(), sizeof totals_host_, cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync (batch totals)");
    gpu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return {totals_host_.loss_sum, static_cast<std::uint64_t>(totals_host_.correct), static_cast<std::uint64_t>(b)};
  }

  std::vector<int> w_;
  const dataset* train_;
  const dataset* test_;
  cudaStream_t stream_;
  blas_handle blas_;
  std::vector<gpu::device_array<float>> weights_, biases_;  // weights_[l]: in x out, row-major
  device_set train_dev_, test_dev_;
  // Scratch for batches of up to rows_ samples.
  std::size_t rows_ = 0;
  gpu::device_array<std::uint32_t> idx_dev_;
  gpu::device_array<float> x_, dh_, ones_;
  std::vector<gpu::device_array<float>> z_;  // z_[l]: layer l's output (b x out, row-major)
  gpu::device_array<gpu::batch_totals> totals_;
  std::vector<std::uint32_t> idx_host_;
  gpu::batch_totals totals_host_{};
};

}  // namespace fmnist
