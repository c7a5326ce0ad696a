// SPDX-License-Identifier: Apache-2.0
// kft::ddp::cuda_sgd (kft/ddp/cuda_optim.cuh) on a real GPU against the host kft::ddp::sgd:
// the same options, parameters and gradients over several steps (plain, momentum, dampening,
// nesterov, weight decay, a gradient scale), equal within a few units in the last place (the
// GPU may fuse a multiply and an add); a NaN or an infinity in a gradient is named by
// end_step() as the first bad parameter; bad sizes are refused. Without a CUDA device the
// program exits 77 (CTest: skipped) and says why.
#include <kft/config.hpp>

#define BOOST_TEST_MODULE kft_cuda_optim
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <kft/ddp/cuda_optim.cuh>
#include <kft/ddp/optim.hpp>

namespace {

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

struct device_floats {
  float* p = nullptr;
  std::size_t n = 0;
  explicit device_floats(const std::vector<float>& h) : n(h.size()) {
    cuda(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    if (n) cuda(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
  ~device_floats() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    if (n) cuda(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  std::span<float> span() { return {p, n}; }
};

float value(std::uint64_t& s) {  // deterministic values in [-1, 1)
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<float>(s >> 40) / 8388608.0f - 1.0f;
}

// Runs `steps` steps of host sgd and cuda_sgd from the same start; returns the largest
// difference in units of 2^-23 relative to max(|w|, 1).
double compare(kft::ddp::sgd_options o, int steps, float scale) {
  const std::vector<std::size_t> sizes{1, 1000, 70001};
  std::uint64_t seed = 42;
  std::vector<std::vector<float>> w(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::size_t k = 0; k < sizes[i]; ++k) w[i].push_back(value(seed));
  std::vector<std::unique_ptr<device_floats>> dw;
  for (auto& v : w) dw.push_back(std::make_unique<device_floats>(v));
  kft::ddp::sgd host(o);
  kft::ddp::cuda_sgd dev(o, nullptr);
  host.bind(sizes);
  dev.bind(sizes);
  for (int s = 0; s < steps; ++s) {
    host.begin_step();
    dev.begin_step();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> g(sizes[i]);
      for (auto& x : g) x = value(seed);
      device_floats dg(g);
      BOOST_TEST(host.step(i, w[i], g, scale));
      BOOST_TEST(dev.step(i, dw[i]->span(), std::span<const float>(dg.p, dg.n), scale));
      cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // dg is freed at the end of the scope
    }
    BOOST_TEST(dev.end_step() == std::numeric_limits<std::size_t>::max());
  }
  BOOST_TEST(host.state().steps == dev.state().steps);
  double worst = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto got = dw[i]->get();
    for (std::size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::fabs(static_cast<double>(got[k]) - w[i][k]) /
                                  (std::max(1.0, std::fabs(static_cast<double>(w[i][k]))) * 0x1p-23));
  }
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_CASE(matches_the_host_sgd) {
  struct variant {
    const char* what;
    kft::ddp::sgd_options o;
    float scale;
  };
  const variant vs[] = {
      {"plain", {.lr = 0.1f}, 1.0f},
      {"momentum", {.lr = 0.05f, .momentum = 0.9f}, 1.0f},
      {"momentum + weight decay + scale", {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f}, 0.5f},
      {"dampening", {.lr = 0.05f, .momentum = 0.8f, .dampening = 0.3f}, 2.0f},
      {"nesterov", {.lr = 0.02f, .momentum = 0.9f, .nesterov = true}, 1.0f},
  };
  for (const auto& v : vs) {
    const double ulps = compare(v.o, 5, v.scale);
    std::printf("cuda_sgd vs sgd, %s: largest difference %.1f units of 2^-23 after 5 steps\n", v.what, ulps);
    BOOST_TEST(ulps <= 64.0, v.what << ": cuda_sgd differs from sgd by " << ulps << " units");
  }
}

BOOST_AUTO_TEST_CASE(a_non_finite_gradient_is_named) {
  const std::vector<std::size_t> sizes{8, 8, 8};
  kft::ddp::cuda_sgd dev({.lr = 0.1f, .momentum = 0.9f}, nullptr);
  dev.bind(sizes);
  std::vector<float> ones(8, 1.0f), bad(8, 1.0f);
  bad[5] = std::numeric_limits<float>::infinity();
  device_floats w0(ones), w1(ones), w2(ones), g_ok(ones), g_bad(bad);
  dev.begin_step();
  dev.step(0, w0.span(), {g_ok.p, 8}, 1.0f);
  dev.step(1, w1.span(), {g_ok.p, 8}, 1.0f);
  dev.step(2, w2.span(), {g_bad.p, 8}, 1.0f);
  BOOST_TEST(dev.end_step() == 2u);
  dev.begin_step();  // the flag starts over each step
  dev.step(0, w0.span(), {g_ok.p, 8}, 1.0f);
  BOOST_TEST(dev.end_step() == std::numeric_limits<std::size_t>::max());
}

BOOST_AUTO_TEST_CASE(bad_sizes_are_refused) {
  kft::ddp::cuda_sgd dev({.lr = 0.1f}, nullptr);
  const std::vector<std::size_t> sizes{8};
  dev.bind(sizes);
  std::vector<float> h(8, 1.0f);
  device_floats w(h), g(h);
  BOOST_CHECK_THROW(dev.step(1, w.span(), {g.p, 8}, 1.0f), kft::usage_error);
  BOOST_CHECK_THROW(dev.step(0, w.span().subspan(0, 4), {g.p, 8}, 1.0f), kft::usage_error);
  BOOST_CHECK_THROW(kft::ddp::cuda_sgd({.lr = -1.0f}), kft::usage_error);
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
