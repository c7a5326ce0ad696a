// SPDX-License-Identifier: Apache-2.0
// kft's CUDA reduction kernels (kft/kernels/cuda_reduce.cuh) on a real GPU: every dtype x op x
// number of inputs x count, aligned (16-byte vectors) and misaligned (element by element), in
// place and out of place, checked element by element against the host reference; the same
// inputs give bit-identical outputs; bad arguments are refused. Without a CUDA device the
// program exits 77 (CTest: skipped) and says why.
#include <kft/config.hpp>

#define BOOST_TEST_MODULE kft_cuda_reduce
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kft/kernels/cuda_reduce.cuh>

#include "../common/reference.hpp"

namespace {

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// Device memory freed on scope exit.
struct device_buffer {
  void* p = nullptr;
  explicit device_buffer(std::size_t bytes) { cuda(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc"); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p); }
};

constexpr kft::dtype dtypes[] = {kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16,
                                 kft::dtype::i32, kft::dtype::i64, kft::dtype::u8};
constexpr kft::op_kind ops[] = {kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min, kft::op_kind::max,
                                kft::op_kind::avg};

// k inputs (input j = "rank" j of the reference) reduced into out; `shift` elements of offset
// on every pointer (1: no pointer is 16-byte aligned, so the element-by-element path runs).
// Returns the wrong elements, printing the first three.
long check(kft::dtype t, kft::op_kind op, int k, std::size_t n, std::size_t shift, bool in_place) {
  const std::size_t es = kft::size_of(t), bytes = (n + shift) * es;
  std::vector<std::unique_ptr<device_buffer>> bufs;
  std::vector<const void*> in;
  for (int j = 0; j < k; ++j) {
    std::vector<unsigned char> h(bytes);
    for (std::size_t i = 0; i < n; ++i) kft_test::put(t, h.data() + shift * es, i, kft_test::input(j, i, op, t));
    bufs.push_back(std::make_unique<device_buffer>(bytes));
    cuda(cudaMemcpy(bufs.back()->p, h.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    in.push_back(static_cast<unsigned char*>(bufs.back()->p) + shift * es);
  }
  device_buffer out_buf(bytes);
  cuda(cudaMemset(out_buf.p, 0xff, bytes), "cudaMemset");
  void* out = in_place ? const_cast<void*>(in[0]) : static_cast<unsigned char*>(out_buf.p) + shift * es;
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  kft::cuda_kernels::reduce(out, in.data(), k, n, t, op);
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<unsigned char> got(n * es + 1);
  cuda(cudaMemcpy(got.data(), out, n * es, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = kft_test::expected(k, i, op, t), g = kft_test::get(t, got.data(), i);
    if (!kft_test::close_enough(g, want, t, op) && wrong++ < 3)
      BOOST_TEST_MESSAGE(kft::name(t) << " " << kft::name(op) << " k=" << k << " n=" << n << " shift=" << shift
                                      << (in_place ? " in place" : "") << ": element " << i << " is " << g
                                      << ", want " << want);
  }
  return wrong;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_dtype_op_and_input_count) {
  long wrong = 0, cases = 0;
  for (auto t : dtypes)
    for (auto op : ops)
      for (int k : {1, 2, 3, 4, 8})
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{(1u << 20) + 3}})
          for (std::size_t shift : {std::size_t{0}, std::size_t{1}})
            for (bool in_place : {false, true}) {
              if (n > 4099 && (shift == 1 || k == 3)) continue;  // large counts: the vector path
              wrong += check(t, op, k, n, shift, in_place);
              ++cases;
            }
  std::printf("cuda reduce: %ld cases (7 dtypes x 5 ops x k in {1,2,3,4,8} x counts x alignment x placement)\n", cases);
  BOOST_TEST(wrong == 0);
}

BOOST_AUTO_TEST_CASE(same_inputs_give_the_same_bits) {
  const std::size_t n = (1u << 22) + 5;
  for (auto t : {kft::dtype::f32, kft::dtype::f16, kft::dtype::bf16}) {
    const std::size_t bytes = n * kft::size_of(t);
    device_buffer a(bytes), b(bytes), o1(bytes), o2(bytes);
    std::vector<unsigned char> h(bytes);
    for (std::size_t i = 0; i < n; ++i) kft_test::put(t, h.data(), i, 0.1 * static_cast<double>(i % 1000) - 37.3);
    cuda(cudaMemcpy(a.p, h.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    for (std::size_t i = 0; i < n; ++i) kft_test::put(t, h.data(), i, 1.7 - 0.03 * static_cast<double>(i % 777));
    cuda(cudaMemcpy(b.p, h.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    kft::cuda_kernels::reduce(o1.p, {a.p, b.p}, n, t, kft::op_kind::avg);
    kft::cuda_kernels::reduce(o2.p, {a.p, b.p}, n, t, kft::op_kind::avg);
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<unsigned char> r1(bytes), r2(bytes);
    cuda(cudaMemcpy(r1.data(), o1.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(r2.data(), o2.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    BOOST_TEST((r1 == r2), kft::name(t) << ": two runs differ");
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused) {
  device_buffer a(64);
  const void* none[1] = {nullptr};
  const void* one[1] = {a.p};
  BOOST_CHECK_THROW(kft::cuda_kernels::reduce(a.p, one, 0, 4, kft::dtype::f32, kft::op_kind::sum), kft::usage_error);
  const void* nine[9] = {a.p, a.p, a.p, a.p, a.p, a.p, a.p, a.p, a.p};
  BOOST_CHECK_THROW(kft::cuda_kernels::reduce(a.p, nine, 9, 4, kft::dtype::f32, kft::op_kind::sum), kft::usage_error);
  BOOST_CHECK_THROW(kft::cuda_kernels::reduce(a.p, none, 1, 4, kft::dtype::f32, kft::op_kind::sum), kft::usage_error);
  BOOST_CHECK_THROW(kft::cuda_kernels::reduce(nullptr, one, 1, 4, kft::dtype::f32, kft::op_kind::sum), kft::usage_error);
  try {
    kft::cuda_kernels::reduce(a.p, nine, 9, 4, kft::dtype::f32, kft::op_kind::sum);
  } catch (const kft::usage_error& e) {
    BOOST_TEST(std::string(e.what()).find("9 inputs") != std::string::npos, e.what());
  }
  kft::cuda_kernels::reduce(a.p, none, 1, 0, kft::dtype::f32, kft::op_kind::sum);  // nothing to do: no error
}

int main(int argc, char* argv[]) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
