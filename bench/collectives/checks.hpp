// SPDX-License-Identifier: Apache-2.0
// checks.hpp: how a *_perf program checks its results (-c) before it times anything. Inputs are
// small integers of rank and index, exact in every dtype; a check counts the output elements
// that differ from what a correct reduction stores (f16/bf16 and `avg` on floats within a
// 1-2 ulp tolerance), and the input elements an out-of-place call changed. Part of
// harness.cpp; a collective's file includes it too, for its `verify` (harness.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>

#include "backend.hpp"
#include "control.hpp"

namespace kft_bench {

// ---- element values ----------------------------------------------------------------------------

template <class T>
struct elem {
  static T make(std::int64_t v) { return static_cast<T>(v); }
  static double value(T x) { return static_cast<double>(x); }
};
template <>
struct elem<kft::half> {
  static kft::half make(std::int64_t v) { return kft::half(static_cast<float>(v)); }
  static double value(kft::half x) { return static_cast<double>(static_cast<float>(x)); }
};
template <>
struct elem<kft::bfloat16> {
  static kft::bfloat16 make(std::int64_t v) { return kft::bfloat16(static_cast<float>(v)); }
  static double value(kft::bfloat16 x) { return static_cast<double>(static_cast<float>(x)); }
};

// Inputs: small integers of rank and index, chosen so that the sum over all ranks stays exact.
struct pattern {
  kft::op_kind op = kft::op_kind::sum;
  int p = 1;
  std::size_t mod = 2;

  pattern(kft::dtype t, kft::op_kind o, int nranks) : op(o), p(nranks) {
    std::size_t limit = std::size_t{1} << 24;  // exact integers in float
    if (t == kft::dtype::bf16) limit = 256;
    if (t == kft::dtype::f16) limit = 2048;
    if (t == kft::dtype::u8) limit = 255;
    mod = std::clamp<std::size_t>(limit / static_cast<std::size_t>(p), 2, 1021);
  }
  std::int64_t at(int r, std::size_t i) const {
    const std::size_t h = i * 7 + static_cast<std::size_t>(r) * 13;
    if (op == kft::op_kind::prod) return h % 3 == 0 ? 2 : 1;  // products stay <= 2^p
    return static_cast<std::int64_t>(h % mod);
  }
  std::int64_t reduced(std::size_t i) const {
    std::int64_t acc = at(0, i);
    for (int r = 1; r < p; ++r) {
      const std::int64_t v = at(r, i);
      switch (op) {
        case kft::op_kind::sum:
        case kft::op_kind::avg: acc += v; break;
        case kft::op_kind::prod: acc *= v; break;
        case kft::op_kind::min: acc = std::min(acc, v); break;
        case kft::op_kind::max: acc = std::max(acc, v); break;
      }
    }
    return acc;
  }
};

// What a correct reduction of element i stores, computed the way kft's kernels round: integer
// math for integers, one division for avg (in float for f32/f16/bf16, double for f64).
template <class T>
T expected_reduced(const pattern& pt, std::size_t i) {
  const std::int64_t acc = pt.reduced(i);
  if (pt.op != kft::op_kind::avg) return elem<T>::make(acc);
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(acc / pt.p);
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(acc) / static_cast<double>(pt.p);
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(acc) / static_cast<float>(pt.p);
  } else {
    return T(static_cast<float>(acc) / static_cast<float>(pt.p));
  }
}

// Relative tolerance of a check: 0 (exact) unless rounding can legitimately differ.
inline double tolerance(kft::dtype t, kft::op_kind op) {
  if (t == kft::dtype::f16) return 2e-3;
  if (t == kft::dtype::bf16) return 1.6e-2;
  if (op == kft::op_kind::avg && t == kft::dtype::f32) return 2.5e-7;
  if (op == kft::op_kind::avg && t == kft::dtype::f64) return 5e-16;
  return 0;
}

template <class T, class F>
void fill(void* dst, std::size_t n, F&& value_of) {
  T* d = static_cast<T*>(dst);
  for (std::size_t i = 0; i < n; ++i) d[i] = value_of(i);
}

template <class T, class F>
std::int64_t count_wrong(const void* got_v, std::size_t n, double tol, F&& expected_of) {
  const T* got = static_cast<const T*>(got_v);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = elem<T>::value(got[i]), x = elem<T>::value(expected_of(i));
    const bool ok = tol == 0 ? g == x : std::fabs(g - x) <= tol * std::max(1.0, std::fabs(x));
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

// What a collective's `verify` works with: this rank's place, the expected values, and host
// views of the send and receive buffers (the buffers themselves for host backends; copies,
// moved to and from the device, for NCCL). Nothing here is timed.
template <class T>
struct check_ctx {
  backend& be;
  control& ctl;
  int me, p, root;
  std::size_t cnt;           // the call's count
  std::size_t send_bytes, recv_bytes;
  const pattern& pt;
  double tol;
  void* send;                // the backend's buffers
  void* recv;
  unsigned char* hs;         // their host views
  unsigned char* hr;
  std::function<void(const void*, void*)> call;  // the collective, on the backend's buffers
  std::function<std::pair<const void*, void*>()> in_place;  // where its in-place form reads and writes
  std::int64_t changed = 0;  // input elements an out-of-place call changed

  T mine(std::size_t i) const { return elem<T>::make(pt.at(me, i)); }
  T reduced(std::size_t i) const { return expected_reduced<T>(pt, i); }
  T rooted(std::size_t i) const { return elem<T>::make(pt.at(root, i)); }
  T gathered(std::size_t i) const { return elem<T>::make(pt.at(static_cast<int>(i / cnt), i % cnt)); }

  template <class F>
  void fill_send(std::size_t n, F&& f) {
    fill<T>(hs, n, f);
    if (be.device()) be.to_device(send, hs, n * sizeof(T));
  }
  void clear_recv() { std::memset(hr, 0xff, recv_bytes); }
  template <class F>
  void fill_recv(std::size_t offset, std::size_t n, F&& f) {
    fill<T>(hr + offset * sizeof(T), n, f);
  }
  void upload_recv() {
    if (be.device()) be.to_device(recv, hr, recv_bytes);
  }
  void run_out_of_place() { call(send, recv); }
  /// The out-of-place check's first half, the same for every collective: `n` input elements
  /// from `f`, a cleared output, the call, and a count of input elements the call changed.
  template <class F>
  void out_of_place_with(std::size_t n, F&& f) {
    fill_send(n, f);
    clear_recv();
    upload_recv();
    run_out_of_place();
    changed += send_changed(n, f);
  }
  void run_in_place() {
    const auto [in, out] = in_place();
    call(in, out);
  }
  template <class F>
  std::int64_t recv_wrong(std::size_t offset, std::size_t n, double tolerance, F&& f) {
    if (be.device()) be.to_host(hr, recv, recv_bytes);
    return count_wrong<T>(hr + offset * sizeof(T), n, tolerance, f);
  }
  template <class F>
  std::int64_t send_changed(std::size_t n, F&& f) {
    if (be.device()) be.to_host(hs, send, n * sizeof(T));
    return count_wrong<T>(hs, n, 0, f);
  }
};

}  // namespace kft_bench
