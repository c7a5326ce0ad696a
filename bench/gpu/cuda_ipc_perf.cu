// SPDX-License-Identifier: Apache-2.0
// all_reduce_perf for kft's CUDA IPC communicator (kft/transport/cuda_ipc), in nccl-tests'
// columns. It starts its ranks itself (processes meeting through a file store in a temporary
// directory), rank r on GPU r % GPUs: with one GPU every rank shares it, and the GPU time-slices
// between the processes, so the numbers then measure that sharing, not a link.
//
//   cuda_ipc_perf [-p 2,4] [-b 8] [-e 256M] [-f 4] [-n 20] [-w 5] [-a auto|one_shot|two_shot]
//                 [--staging 32M] [--json FILE]
//
// time = the slowest rank's average call (CUDA events around n calls after w warm-up calls, a
// barrier first); algbw = bytes / time; busbw = algbw x 2(p-1)/p (nccl-tests' allreduce bus
// factor); #wrong = elements of the first call's output that differ from the host reference.
// Exit: 0, 1 on a failure, 2 on a bad flag, 77 without a CUDA device.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kft/rendezvous/file_store.hpp>
#include <kft/transport/cuda_ipc/communicator.cuh>

#include "cuda_launch.hpp"
#include "../common/sizes.hpp"

using namespace std::chrono_literals;

namespace {

struct args {
  std::vector<int> ranks;
  std::size_t lo = 8, hi = std::size_t{256} << 20, staging = std::size_t{32} << 20;
  double factor = 4;
  int iters = 20, warmup = 5;
  kft::algo algorithm = kft::algo::automatic;
  std::string json;
};

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

// Input of rank r, element i: small integers, so every float sum is exact.
float value(int r, std::size_t i) { return static_cast<float>((static_cast<std::size_t>(r) * 7 + i * 3) % 11) - 4.0f; }

// One rank: every size, out of place then in place; rank 0 prints the rows.
int rank_main(const args& a, int rank, int size, const char* dir) {
  kft::rendezvous::file_store store(dir);
  int devices = 0;
  cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const int device = rank % devices;
  cuda(cudaSetDevice(device), "cudaSetDevice");
  kft::cuda_ipc::config cfg;
  cfg.staging_bytes = a.staging;
  cfg.timeout = 120s;
  kft::cuda_ipc::communicator comm(store, rank, size, device, cfg);
  void *in = nullptr, *out = nullptr;
  cuda(cudaMalloc(&in, a.hi), "cudaMalloc");
  cuda(cudaMalloc(&out, a.hi), "cudaMalloc");
  std::vector<float> h(a.hi / 4);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(rank, i);
  cudaEvent_t e0, e1;
  cuda(cudaEventCreate(&e0), "cudaEventCreate");
  cuda(cudaEventCreate(&e1), "cudaEventCreate");
  nlohmann::json rows = nlohmann::json::array();
  long wrong_total = 0;
  if (rank == 0) {
    std::printf("# kft cuda_ipc_perf: all_reduce in nccl-tests' columns, %d ranks (processes), algo %s, staging %zu B\n",
                size, std::string(kft::name(a.algorithm)).c_str(), a.staging);
    std::printf("#  %10s  %12s  %8s  %6s  %6s   %7s  %6s  %6s  %6s   %7s  %6s  %6s  %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("#  %10s  %12s  %8s  %6s  %6s   %7s  %6s  %6s  %6s   %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  int row = 0;
  for (std::size_t bytes = a.lo; bytes <= a.hi; bytes = std::max(bytes + 1, static_cast<std::size_t>(bytes * a.factor)), ++row) {
    const std::size_t n = std::max<std::size_t>(1, bytes / 4);
    double t[2] = {0, 0};
    long wrong[2] = {0, 0};
    for (int place = 0; place < 2; ++place) {
      void* dst = place == 0 ? out : in;
      cuda(cudaMemcpy(in, h.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      comm.allreduce(in, dst, n, kft::dtype::f32, kft::op_kind::sum, {.algorithm = a.algorithm});
      std::vector<float> got(n);
      cuda(cudaMemcpy(got.data(), dst, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += value(r, i);
        wrong[place] += got[i] != want;
      }
      std::vector<kft::async::work> ws;  // waited for after the timing: each checks its status
      for (int i = 0; i < a.warmup; ++i)
        ws.push_back(comm.allreduce_async(in, dst, n, kft::dtype::f32, kft::op_kind::sum, {.algorithm = a.algorithm}));
      comm.barrier();
      cuda(cudaEventRecord(e0, comm.stream()), "cudaEventRecord");
      for (int i = 0; i < a.iters; ++i)
        ws.push_back(comm.allreduce_async(in, dst, n, kft::dtype::f32, kft::op_kind::sum, {.algorithm = a.algorithm}));
      cuda(cudaEventRecord(e1, comm.stream()), "cudaEventRecord");
      cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
      for (auto& w : ws) w.wait();
      float ms = 0;
      cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t[place] = static_cast<double>(ms) * 1e3 / a.iters;
    }
    // The slowest rank's time, through the store.
    const std::string key = "perf/" + std::to_string(row) + "/";
    store.set(key + std::to_string(rank), std::to_string(t[0]) + " " + std::to_string(t[1]) + " " +
                                              std::to_string(wrong[0]) + " " + std::to_string(wrong[1]));
    if (rank == 0) {
      double worst[2] = {0, 0};
      long bad[2] = {0, 0};
      for (int r = 0; r < size; ++r) {
        std::istringstream v(store.get(key + std::to_string(r), 120s));
        double t0 = 0, t1 = 0;
        long w0 = 0, w1 = 0;
        v >> t0 >> t1 >> w0 >> w1;
        worst[0] = std::max(worst[0], t0);
        worst[1] = std::max(worst[1], t1);
        bad[0] += w0;
        bad[1] += w1;
      }
      const double b = static_cast<double>(n * 4), f = 2.0 * (size - 1) / size;
      const double alg0 = b / worst[0] / 1e3, alg1 = b / worst[1] / 1e3;
      std::printf("   %10zu  %12zu  %8s  %6s  %6d   %7.1f  %6.2f  %6.2f  %6ld   %7.1f  %6.2f  %6.2f  %6ld\n", n * 4, n,
                  "float", "sum", -1, worst[0], alg0, alg0 * f, bad[0], worst[1], alg1, alg1 * f, bad[1]);
      rows.push_back({{"bytes", n * 4}, {"oop_us", worst[0]}, {"oop_busbw", alg0 * f}, {"oop_wrong", bad[0]},
                      {"ip_us", worst[1]}, {"ip_busbw", alg1 * f}, {"ip_wrong", bad[1]}});
      wrong_total += bad[0] + bad[1];
    }
    comm.barrier();
  }
  cudaFree(in);
  cudaFree(out);
  if (rank == 0 && !a.json.empty()) {
    std::ofstream o(a.json, std::ios::app);
    o << nlohmann::json{{"ranks", size}, {"algo", kft::name(a.algorithm)}, {"rows", rows}}.dump() << "\n";
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"all_reduce_perf for kft's CUDA IPC communicator (starts its own ranks)"};
  args a;
  std::string ps = "2,4", b = "8", e = "256M", staging = "32M", algo = "auto";
  app.add_option("-p,--ranks", ps, "rank counts, comma-separated (1..8)")->capture_default_str();
  app.add_option("-b,--minbytes", b, "smallest size (K/M/G)")->capture_default_str();
  app.add_option("-e,--maxbytes", e, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", a.factor, "size factor between rows")->capture_default_str()->check(CLI::Range(1.01, 1e6));
  app.add_option("-n,--iters", a.iters, "timed calls per row")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", a.warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("-a,--algo", algo, "auto, one_shot or two_shot")->capture_default_str();
  app.add_option("--staging", staging, "staging bytes per rank")->capture_default_str();
  app.add_option("--json", a.json, "append a line of JSON per rank count to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    a.lo = parse_size(b);
    a.hi = parse_size(e);
    a.staging = parse_size(staging);
    if (a.lo == 0 || a.hi < a.lo) throw std::invalid_argument("-b/-e: need 0 < minbytes <= maxbytes (got " + b + ", " + e + ")");
    if (algo == "auto") a.algorithm = kft::algo::automatic;
    else if (algo == "one_shot") a.algorithm = kft::algo::one_shot;
    else if (algo == "two_shot") a.algorithm = kft::algo::two_shot;
    else throw std::invalid_argument("-a: '" + algo + "' is not auto, one_shot or two_shot");
    std::stringstream ss(ps);
    for (std::string x; std::getline(ss, x, ',');) {
      const int p = std::stoi(x);
      if (p < 1 || p > kft::cuda_ipc::max_ranks) throw std::invalid_argument("-p: " + x + " is outside 1..8");
      a.ranks.push_back(p);
    }
  } catch (const std::exception& x) {
    std::fprintf(stderr, "cuda_ipc_perf: %s\n", x.what());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_ipc_perf: no CUDA device: skipped\n");
    return 77;
  }
  if (const auto me = cuda_bench::this_rank(); me.is_rank()) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
      return rank_main(a, me.rank, me.size, me.store);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "cuda_ipc_perf rank %d: %s\n", me.rank, x.what());
      return 1;
    }
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("# %d GPU(s), GPU 0 %s%s\n", devices, prop.name,
              devices == 1 ? "; every rank on it (time-sliced between the processes unless the MPS daemon runs)" : "");
  std::fflush(stdout);
  int worst = 0;
  for (int p : a.ranks) {
    const int rc = cuda_bench::launch(argv, p, "cuda_ipc_perf");
    if (rc != 0) {
      std::printf("cuda_ipc_perf: %d ranks: a rank exited %d\n", p, rc);
      worst = 1;
    }
  }
  return worst;
}
