// SPDX-License-Identifier: Apache-2.0
/// @file kft/kernels/cuda_reduce.cuh
/// @brief CUDA reduction kernels (component `kft::cuda`, compiled by nvcc): `out = in[0] op
/// in[1] op ... op in[k-1]`, element by element, over k device buffers of one device (or of
/// peers the device can reach: CUDA IPC or peer access). The building block of a GPU
/// allreduce inside a node: a one-shot allreduce reduces every rank's buffer into its own
/// output, a two-shot one reduces a slice and gathers the slices.
///
///     kft::cuda_kernels::reduce(out, {a, b}, n, kft::dtype::bf16, kft::op_kind::avg, stream);
///
/// - Types: f32, f64, f16, bf16, i32, i64, u8. f16 and bf16 accumulate in f32 and round once
///   (to nearest even) at the end; f32 in f32; integers in their own type (wrapping).
/// - Ops: sum, prod, min, max, avg (sum / k; integers truncate, as every kft backend does).
/// - Order: inputs are combined in index order 0, 1, ..., k-1, on every element, so ranks that
///   pass the same buffers in the same order get bit-identical results.
/// - Access: 16-byte vector loads and stores when every pointer is 16-byte aligned (cudaMalloc
///   gives 256), else one element at a time; a grid-stride loop sized to the device.
/// - `out` may be one of the inputs (in place); other overlap is undefined.
///
/// Enqueued on `stream`; nothing waits. Errors (a launch failure, k outside 1..max_inputs)
/// throw with the call named.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/kernels/cuda_reduce.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/kernels/cuda_reduce.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <kft/core/cuda_error.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_kernels {

/// The most inputs one call reduces (a node's GPUs: 8).
inline constexpr int max_inputs = 8;

namespace detail {

// Storage type -> accumulator type and the conversions between them.
template <class T>
struct acc_of {
  using type = T;
  __device__ static T load(T v) { return v; }
  __device__ static T store(T v) { return v; }
};
template <>
struct acc_of<__half> {
  using type = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct acc_of<__nv_bfloat16> {
  using type = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <class A>
__device__ inline A combine(A x, A y, op_kind op) {
  switch (op) {
    case op_kind::prod: return static_cast<A>(x * y);
    case op_kind::min: return y < x ? y : x;
    case op_kind::max: return x < y ? y : x;
    default: return static_cast<A>(x + y);  // sum, avg
  }
}

template <class T>
struct inputs {
  const T* p[max_inputs];
};

// One element: inputs in index order, then avg's division, then one rounding to T.
template <class T, int K>
__device__ inline T reduce_one(const T (&x)[K], op_kind op) {
  using C = acc_of<T>;
  using A = typename C::type;
  A a = C::load(x[0]);
#pragma unroll
  for (int j = 1; j < K; ++j) a = combine<A>(a, C::load(x[j]), op);
  if (op == op_kind::avg) a = static_cast<A>(a / static_cast<A>(K));
  return C::store(a);
}

// Vectors (16 bytes) each thread keeps in flight per input: more for fewer inputs, so that
// every thread has 8 loads outstanding whatever K is (registers: U x K x 16 bytes).
template <int K>
inline constexpr int unroll_for = K <= 2 ? 4 : (K <= 4 ? 2 : 1);

// Every pointer 16-byte aligned (checked by the launcher). Each thread loads U vectors of
// every input before it combines any, so that many loads are in flight per thread.
template <class T, int K>
__global__ void __launch_bounds__(512) reduce_vec(T* out, inputs<T> in, std::size_t vectors, op_kind op) {
  constexpr int V = 16 / sizeof(T);
  constexpr int U = unroll_for<K>;
  union pack {
    uint4 raw;
    T e[V];
  };
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < vectors;
       base += stride * U) {
    pack src[U][K];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t v = base + u * stride;
      if (v < vectors) {
#pragma unroll
        for (int j = 0; j < K; ++j) src[u][j].raw = reinterpret_cast<const uint4*>(in.p[j])[v];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t v = base + u * stride;
      if (v >= vectors) break;
      pack r;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        T x[K];
#pragma unroll
        for (int j = 0; j < K; ++j) x[j] = src[u][j].e[e];
        r.e[e] = reduce_one<T, K>(x, op);
      }
      reinterpret_cast<uint4*>(out)[v] = r.raw;
    }
  }
}

// Element by element: unaligned buffers, and the tail after the last whole vector.
template <class T, int K>
__global__ void reduce_scalar(T* out, inputs<T> in, std::size_t begin, std::size_t n, op_kind op) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = begin + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T x[K];
#pragma unroll
    for (int j = 0; j < K; ++j) x[j] = in.p[j][i];
    out[i] = reduce_one<T, K>(x, op);
  }
}

// Blocks to launch: enough to keep every SM busy (a few per SM), never more than the work.
inline unsigned blocks_for(std::size_t items, unsigned threads) {
  int device = 0, sms = 0;
  kft::detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice", error_site::of("cuda reduce"));
  kft::detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                          "cudaDeviceGetAttribute(multiprocessor count)", error_site::of("cuda reduce"));
  const std::size_t want = (items + threads - 1) / threads;
  const std::size_t most = static_cast<std::size_t>(sms) * 4;
  return static_cast<unsigned>(want < most ? (want > 0 ? want : 1) : most);
}

template <class T, int K>
void launch_k(T* out, const inputs<T>& p, bool aligned, std::size_t n, op_kind op, cudaStream_t stream) {
  constexpr unsigned threads = 512;
  constexpr std::size_t V = 16 / sizeof(T);
  const std::size_t vectors = aligned ? n / V : 0;
  if (vectors > 0) {
    const std::size_t per_thread_round = static_cast<std::size_t>(unroll_for<K>);
    reduce_vec<T, K><<<blocks_for((vectors + per_thread_round - 1) / per_thread_round, threads), threads, 0, stream>>>(
        out, p, vectors, op);
  }
  const std::size_t done = vectors * V;
  if (done < n) reduce_scalar<T, K><<<blocks_for(n - done, threads), threads, 0, stream>>>(out, p, done, n, op);
  kft::detail::cuda_check(cudaGetLastError(), "launching the reduction kernel", error_site::of("cuda reduce"));
}

template <class T>
void launch(T* out, const void* const* in, int k, std::size_t n, op_kind op, cudaStream_t stream) {
  inputs<T> p{};
  bool aligned = reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  for (int j = 0; j < k; ++j) {
    p.p[j] = static_cast<const T*>(in[j]);
    aligned = aligned && reinterpret_cast<std::uintptr_t>(in[j]) % 16 == 0;
  }
  switch (k) {
    case 1: return launch_k<T, 1>(out, p, aligned, n, op, stream);
    case 2: return launch_k<T, 2>(out, p, aligned, n, op, stream);
    case 3: return launch_k<T, 3>(out, p, aligned, n, op, stream);
    case 4: return launch_k<T, 4>(out, p, aligned, n, op, stream);
    case 5: return launch_k<T, 5>(out, p, aligned, n, op, stream);
    case 6: return launch_k<T, 6>(out, p, aligned, n, op, stream);
    case 7: return launch_k<T, 7>(out, p, aligned, n, op, stream);
    default: return launch_k<T, 8>(out, p, aligned, n, op, stream);
  }
}

}  // namespace detail

/// @brief Enqueues `out[i] = in[0][i] op ... op in[k-1][i]` for i < count on `stream`.
/// @throws usage_error when k is outside 1..max_inputs or a pointer is null with count > 0;
///         transport_error when the launch fails.
inline void reduce(void* out, const void* const* in, int k, std::size_t count, dtype t, op_kind op,
                   cudaStream_t stream = nullptr) {
  if (k < 1 || k > max_inputs)
    throw usage_error("cuda reduce: " + std::to_string(k) + " inputs (1.." + std::to_string(max_inputs) + " allowed)",
                      error_site::of("cuda reduce"));
  if (count == 0) return;
  if (out == nullptr) throw usage_error("cuda reduce: the output pointer is null", error_site::of("cuda reduce"));
  for (int j = 0; j < k; ++j)
    if (in[j] == nullptr)
      throw usage_error("cuda reduce: input " + std::to_string(j) + " is null", error_site::of("cuda reduce"));
  switch (t) {
    case dtype::f32: return detail::launch(static_cast<float*>(out), in, k, count, op, stream);
    case dtype::f64: return detail::launch(static_cast<double*>(out), in, k, count, op, stream);
    case dtype::f16: return detail::launch(static_cast<__half*>(out), in, k, count, op, stream);
    case dtype::bf16: return detail::launch(static_cast<__nv_bfloat16*>(out), in, k, count, op, stream);
    case dtype::i32: return detail::launch(static_cast<std::int32_t*>(out), in, k, count, op, stream);
    case dtype::i64: return detail::launch(static_cast<std::int64_t*>(out), in, k, count, op, stream);
    case dtype::u8: return detail::launch(static_cast<std::uint8_t*>(out), in, k, count, op, stream);
  }
  throw usage_error("cuda reduce: unknown dtype", error_site::of("cuda reduce"));
}

/// @brief The same with the inputs listed: `reduce(out, {a, b}, n, dtype::f32, op_kind::sum, s)`.
inline void reduce(void* out, std::initializer_list<const void*> in, std::size_t count, dtype t, op_kind op,
                   cudaStream_t stream = nullptr) {
  reduce(out, in.begin(), static_cast<int>(in.size()), count, t, op, stream);
}

}  // namespace cuda_kernels
KFT_NAMESPACE_END
