// SPDX-License-Identifier: Apache-2.0
// kft's CUDA reduction kernels (kft/kernels/cuda_reduce.cuh) against cudaMemcpy device to
// device on the same GPU, in one run: for each size, dtype, op and number of inputs k, the
// kernel's time and bandwidth (k inputs read + 1 output written, per byte of the message)
// beside a D2D copy of the same message (read once, written once), and their ratio.
//
//   cuda_reduce_perf [-b 1M] [-e 1G] [-f 4] [-k 2,4] [-d float,half,bfloat16] [-o sum,avg,min,max]
//                    [-n 20] [-w 5] [--json FILE]
//
// Times are CUDA events around n back-to-back launches (after w warm-up ones), divided by n.
// Without a CUDA device it says so and exits 77.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <kft/kernels/cuda_reduce.cuh>

#include "../common/sizes.hpp"

namespace {

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

kft::dtype dtype_of(const std::string& s) {
  for (auto t : {kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16, kft::dtype::i32,
                 kft::dtype::i64, kft::dtype::u8})
    if (s == kft::nccl_name(t) || s == kft::name(t)) return t;
  throw std::invalid_argument("-d: unknown dtype '" + s + "' (float, double, half, bfloat16, int32, int64, uint8)");
}

kft::op_kind op_of(const std::string& s) {
  for (auto o : {kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min, kft::op_kind::max, kft::op_kind::avg})
    if (s == kft::name(o)) return o;
  throw std::invalid_argument("-o: unknown op '" + s + "' (sum, prod, min, max, avg)");
}

// Average seconds of one call of f over n calls after w warm-up calls, by CUDA events.
template <class F>
double time_calls(F&& f, int w, int n) {
  for (int i = 0; i < w; ++i) f();
  cudaEvent_t a, b;
  cuda(cudaEventCreate(&a), "cudaEventCreate");
  cuda(cudaEventCreate(&b), "cudaEventCreate");
  cuda(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < n; ++i) f();
  cuda(cudaEventRecord(b), "cudaEventRecord");
  cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / 1e3 / n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft's CUDA reduction kernels beside cudaMemcpy device to device"};
  std::string b = "1M", e = "1G", ks = "2,4", ds = "float,half,bfloat16", os = "sum,avg,min,max", json;
  double f = 4;
  int n = 20, w = 5;
  app.add_option("-b,--minbytes", b, "smallest message in bytes (K/M/G)")->capture_default_str();
  app.add_option("-e,--maxbytes", e, "largest message in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", f, "size factor between rows")->capture_default_str()->check(CLI::Range(1.01, 1e6));
  app.add_option("-k,--inputs", ks, "numbers of inputs, comma-separated (1..8)")->capture_default_str();
  app.add_option("-d,--datatype", ds, "dtypes, comma-separated")->capture_default_str();
  app.add_option("-o,--op", os, "ops, comma-separated")->capture_default_str();
  app.add_option("-n,--iters", n, "timed calls per row")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", w, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--json", json, "also write the rows to this file");
  CLI11_PARSE(app, argc, argv);

  std::size_t lo = 0, hi = 0;
  std::vector<int> k_list;
  std::vector<kft::dtype> types;
  std::vector<kft::op_kind> op_list;
  try {
    lo = parse_size(b);
    hi = parse_size(e);
    if (lo == 0 || hi < lo) throw std::invalid_argument("-b/-e: need 0 < minbytes <= maxbytes (got " + b + ", " + e + ")");
    for (const auto& x : split_list(ks)) {
      const int k = std::stoi(x);
      if (k < 1 || k > kft::cuda_kernels::max_inputs) throw std::invalid_argument("-k: " + x + " is outside 1..8");
      k_list.push_back(k);
    }
    for (const auto& x : split_list(ds)) types.push_back(dtype_of(x));
    for (const auto& x : split_list(os)) op_list.push_back(op_of(x));
    if (k_list.empty() || types.empty() || op_list.empty()) throw std::invalid_argument("-k, -d and -o need a value each");
  } catch (const std::exception& x) {
    std::fprintf(stderr, "cuda_reduce_perf: %s\n", x.what());
    return 2;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_reduce_perf: no CUDA device: skipped\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    std::printf("# kft cuda_reduce_perf on %s (%d SMs, %.1f GiB), CUDA driver %d, runtime %d\n", prop.name,
                prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30), driver, runtime);
    std::printf("# time: CUDA events around %d calls after %d warm-up ones; kernel GB/s counts k reads + 1 write of "
                "the message,\n# copy GB/s a read + a write (cudaMemcpyAsync D2D of the same bytes); ratio = kernel "
                "GB/s / copy GB/s\n",
                n, w);
    const int kmax = *std::max_element(k_list.begin(), k_list.end());
    std::vector<void*> in(static_cast<std::size_t>(kmax));
    for (auto& p : in) {
      cuda(cudaMalloc(&p, hi), "cudaMalloc");
      cuda(cudaMemset(p, 0, hi), "cudaMemset");
    }
    void *out = nullptr, *copy = nullptr;
    cuda(cudaMalloc(&out, hi), "cudaMalloc");
    cuda(cudaMalloc(&copy, hi), "cudaMalloc");
    cuda(cudaMemset(out, 0, hi), "cudaMemset");
    cuda(cudaMemset(copy, 0, hi), "cudaMemset");
    std::printf("#\n# %12s %9s %6s %2s | %10s %9s | %10s %9s | %6s\n", "size(B)", "type", "op", "k", "time(us)",
                "GB/s", "copy(us)", "GB/s", "ratio");
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t bytes = lo; bytes <= hi; bytes = std::max(bytes + 1, static_cast<std::size_t>(bytes * f))) {
      const double t_copy =
          time_calls([&] { cuda(cudaMemcpyAsync(copy, in[0], bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync"); }, w, n);
      const double copy_gbs = 2.0 * static_cast<double>(bytes) / t_copy / 1e9;
      for (auto t : types)
        for (auto op : op_list)
          for (int k : k_list) {
            const std::size_t count = bytes / kft::size_of(t);
            const double t_k = time_calls([&] { kft::cuda_kernels::reduce(out, in.data(), k, count, t, op); }, w, n);
            const double gbs = static_cast<double>(k + 1) * static_cast<double>(count * kft::size_of(t)) / t_k / 1e9;
            std::printf("  %12zu %9s %6s %2d | %10.1f %9.1f | %10.1f %9.1f | %6.2f\n", bytes,
                        std::string(kft::nccl_name(t)).c_str(), std::string(kft::name(op)).c_str(), k, t_k * 1e6, gbs,
                        t_copy * 1e6, copy_gbs, gbs / copy_gbs);
            rows.push_back({{"bytes", bytes}, {"dtype", kft::nccl_name(t)}, {"op", kft::name(op)}, {"k", k},
                            {"us", t_k * 1e6}, {"gbs", gbs}, {"copy_us", t_copy * 1e6}, {"copy_gbs", copy_gbs},
                            {"ratio", gbs / copy_gbs}});
          }
    }
    for (auto p : in) cudaFree(p);
    cudaFree(out);
    cudaFree(copy);
    if (!json.empty()) {
      std::ofstream o(json);
      o << nlohmann::json{{"device", prop.name}, {"driver", driver}, {"runtime", runtime}, {"rows", rows}}.dump(1)
        << "\n";
      if (!o) throw std::runtime_error("cannot write " + json);
    }
  } catch (const std::exception& x) {
    std::fprintf(stderr, "cuda_reduce_perf: %s\n", x.what());
    return 1;
  }
  return 0;
}
