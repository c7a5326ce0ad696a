// SPDX-License-Identifier: Apache-2.0
// ddp_overlap_cuda: how much of the DDP reducer's communication hides behind a GPU backward
// pass, with the reducer over kft's CUDA IPC communicator (kft/ddp/cuda.hpp): buckets in device
// memory, each bucket's allreduce on the communicator's stream behind a CUDA event recorded on
// the compute stream, no host synchronisation until finish(). The GPU counterpart of
// ddp_overlap (same quantities, same formula).
//
//   ddp_overlap_cuda [-p 2,4] [--layers 16] [--layer-bytes 4M] [--cap 8M] [--first 4M]
//                    [--ratios 0.5,1,2,4] [--steps 9] [--backward sleep|fma] [--json FILE]
//
// It starts its ranks itself (processes meeting through a file store), rank r on GPU r % GPUs.
// On one GPU the processes share it: run it under NVIDIA's MPS daemon, or the GPU time-slices
// between them and every bucket waits ~2 ms per other process (the numbers then measure that).
//
// A synthetic model of L layers of equal size. Layer l's backward is a kernel on the compute
// stream that takes rho x C / L (--backward sleep: one thread waiting on the GPU's clock, the
// SMs free, as ddp_overlap's sleeps leave the core free; fma: every SM busy with FMAs for about
// that long, so communication competes for the GPU), then a kernel writing its gradient; then
// mark_ready. Per step, on the slowest rank, timed with CUDA events on the compute stream from
// the moment every rank's GPU leaves a barrier:
//   C  communication alone: every gradient ready at once, then finish();
//   B  the backward's own time, from the same step as T (events after its last layer);
//   T  the step with overlap: layer by layer, backward kernels then mark_ready; then finish();
//   A  allreduce after backward: every layer's kernels, then everything marked, then finish().
// Exposed communication X = max(0, T - B), hidden fraction H = 1 - X / C; medians over --steps.
// "enqueue" is the host's time to enqueue a T step's backward and marks: when it reaches B the
// GPU waited for the host. The last step's gradients are checked against the rank average.
// Exit: 0, 1 on a failure or a wrong gradient, 2 on a bad flag, 77 without a CUDA device.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <kft/ddp/cuda.hpp>
#include <kft/ddp/reducer.hpp>
#include <kft/rendezvous/file_store.hpp>
#include <kft/transport/cuda_ipc/communicator.cuh>

#include "cuda_launch.hpp"
#include "../common/sizes.hpp"

using namespace std::chrono_literals;

namespace {

struct args {
  std::vector<int> ranks{2, 4};
  int layers = 16, steps = 9;
  std::size_t layer_bytes = std::size_t{4} << 20, cap = std::size_t{8} << 20, first = std::size_t{4} << 20;
  std::vector<double> ratios{0.5, 1, 2, 4};
  bool fma = false;
  std::string json;
};

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

__device__ unsigned long long gpu_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread waits `ns` on the GPU's clock: the stream is busy, the SMs are not.
__global__ void sleep_kernel(unsigned long long ns) {
  const unsigned long long t0 = gpu_ns();
  while (gpu_ns() - t0 < ns) __nanosleep(256);
}

// Every thread chains `iters` FMAs: the SMs are busy (compute bound, no memory traffic).
__global__ void fma_kernel(float* sink, int iters) {
  float a = static_cast<float>(threadIdx.x) * 1e-3f, b = 0.999f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, 1e-4f);
    b = fmaf(b, 0.9999f, 1e-5f);
  }
  if (a == -1.0f) sink[0] = b;  // never true; keeps the loop
}

__global__ void fill_kernel(float* g, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    g[i] = v;
}

// Rank r's gradient of layer l: small integers times a power-of-two-free factor, so the
// average over the ranks is exact in f32.
float grad_value(int rank, int l) { return static_cast<float>(rank + 1) * static_cast<float>(1 + l % 4); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

class rank_job {
 public:
  rank_job(const args& a, int rank, int size, const char* dir)
      : a_(a), rank_(rank), size_(size), store_(dir), comm_(make_comm(store_, rank, size, a)) {
    cuda(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (auto* e : {&e0_, &eb_, &e1_}) cuda(cudaEventCreate(e), "cudaEventCreate");
    cuda(cudaGetDeviceProperties(&prop_, comm_.device()), "cudaGetDeviceProperties");
    cuda(cudaMalloc(&sink_, 16), "cudaMalloc");
    per_ = a.layer_bytes / sizeof(float);
  }
  rank_job(const rank_job&) = delete;
  rank_job& operator=(const rank_job&) = delete;
  ~rank_job() {
    cudaFree(sink_);
    for (auto e : {e0_, eb_, e1_}) cudaEventDestroy(e);
    cudaStreamDestroy(compute_);
  }

  int run() {
    std::vector<kft::ddp::parameter> params;
    for (int l = 0; l < a_.layers; ++l) params.push_back({per_, kft::dtype::f32, "layer" + std::to_string(l)});
    kft::ddp::reducer<kft::cuda_ipc::communicator> red(
        comm_, params,
        {.limits = {.first_bucket_bytes = a_.first, .bucket_bytes_cap = a_.cap}, .rebuild_buckets = false, .stream = compute_});
    red_ = &red;
    if (a_.fma) calibrate();
    // C: communication alone (one warm-up step first).
    std::vector<double> cs;
    for (int s = 0; s <= a_.steps; ++s) {
      auto w = start();
      mark_all();
      red.finish();
      const double t = stop(w);
      if (s > 0) cs.push_back(t);
    }
    const double C = median(slowest(cs, "C"));
    if (rank_ == 0) {
      std::printf("# ddp_overlap_cuda: %d ranks (processes, CUDA IPC) on %s, %d layers x %zu B f32 gradients, "
                  "%zu bucket(s) (first %zu B, cap %zu B), backward = %s\n",
                  size_, prop_.name, a_.layers, a_.layer_bytes, red.buckets().size(), a_.first, a_.cap,
                  a_.fma ? "FMA kernels on every SM" : "one waiting thread per layer (SMs free)");
      std::printf("# C = communication alone, B = backward, T = step with overlap, A = allreduce after backward "
                  "(CUDA events); X = max(0, T - B), H = 1 - X / C; medians of %d steps, slowest rank; "
                  "enqueue = host time to enqueue T's backward and marks\n",
                  a_.steps);
      std::printf("# %6s %10s %10s %10s %10s %8s %8s %12s\n", "B/C", "C (ms)", "B (ms)", "T (ms)", "A (ms)", "H", "A/T",
                  "enqueue (ms)");
    }
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t ri = 0; ri < a_.ratios.size(); ++ri) {
      const double layer_s = a_.ratios[ri] * C / a_.layers;
      std::vector<double> bs, ts, as, enq;
      for (int s = 0; s < a_.steps; ++s) {
        auto w = start();
        const auto h0 = std::chrono::steady_clock::now();
        for (int l = a_.layers - 1; l >= 0; --l) {
          backward_layer(l, layer_s);
          red.mark_ready(static_cast<std::size_t>(l));
        }
        enq.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count());
        cuda(cudaEventRecord(eb_, compute_), "cudaEventRecord");
        red.finish();
        ts.push_back(stop(w));
        float ms = 0;
        cuda(cudaEventElapsedTime(&ms, e0_, eb_), "cudaEventElapsedTime");
        bs.push_back(ms * 1e-3);
        auto wa = start();
        for (int l = a_.layers - 1; l >= 0; --l) backward_layer(l, layer_s);
        mark_all();
        red.finish();
        as.push_back(stop(wa));
      }
      const std::string tag = std::to_string(ri);
      const auto B = slowest(bs, "B" + tag), T = slowest(ts, "T" + tag), A = slowest(as, "A" + tag),
                 E = slowest(enq, "E" + tag);
      std::vector<double> hs;
      for (std::size_t s = 0; s < T.size(); ++s) hs.push_back(1.0 - std::max(0.0, T[s] - B[s]) / C);
      if (rank_ == 0) {
        std::printf("  %6.2f %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f %12.3f\n", a_.ratios[ri], C * 1e3, median(B) * 1e3,
                    median(T) * 1e3, median(A) * 1e3, median(hs), median(A) / median(T), median(E) * 1e3);
        rows.push_back({{"ratio", a_.ratios[ri]}, {"C_ms", C * 1e3}, {"B_ms", median(B) * 1e3}, {"T_ms", median(T) * 1e3},
                        {"A_ms", median(A) * 1e3}, {"H", median(hs)}, {"enqueue_ms", median(E) * 1e3}});
      }
    }
    const long wrong = check(red);
    long bad = 0;
    store_.set("wrong/" + std::to_string(rank_), std::to_string(wrong));
    for (int r = 0; r < size_; ++r) bad += std::stol(store_.get("wrong/" + std::to_string(r), 120s));
    if (rank_ == 0) {
      std::printf("# gradients after the last step: %s\n",
                  bad == 0 ? "every element is the rank average, on every rank"
                           : (std::to_string(bad) + " wrong element(s)").c_str());
      if (!a_.json.empty()) {
        std::ofstream o(a_.json, std::ios::app);
        o << nlohmann::json{{"ranks", size_},
                            {"gpu", prop_.name},
                            {"backward", a_.fma ? "fma" : "sleep"},
                            {"layers", a_.layers},
                            {"layer_bytes", a_.layer_bytes},
                            {"cap", a_.cap},
                            {"buckets", red.buckets().size()},
                            {"rows", rows},
                            {"wrong", bad}}
                 .dump()
          << "\n";
      }
    }
    red_ = nullptr;
    return bad == 0 ? 0 : 1;
  }

 private:
  static kft::cuda_ipc::communicator make_comm(kft::rendezvous::store& st, int rank, int size, const args& a) {
    int devices = 0;
    cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    kft::cuda_ipc::config cfg;
    cfg.name = "ddp_overlap";
    cfg.timeout = 120s;
    cfg.staging_bytes = std::max(a.cap, a.first);  // a bucket is one chunk
    return kft::cuda_ipc::communicator(st, rank, size, rank % devices, cfg);
  }

  // Every rank's GPU starts the step when it leaves one barrier: the compute stream waits
  // for the communicator's stream, and e0 is recorded there.
  kft::async::work start() {
    auto w = comm_.barrier_async();
    cudaEvent_t left = nullptr;
    cuda(cudaEventCreateWithFlags(&left, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventRecord(left, comm_.stream()), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(compute_, left, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(left);  // released once the stream has passed it
    cuda(cudaEventRecord(e0_, compute_), "cudaEventRecord");
    return w;
  }
  // Seconds from e0 to everything the compute stream has so far (finish() made it wait for
  // the communication).
  double stop(kft::async::work& w) {
    cuda(cudaEventRecord(e1_, compute_), "cudaEventRecord");
    cuda(cudaEventSynchronize(e1_), "cudaEventSynchronize");
    w.wait();
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, e0_, e1_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }
  void mark_all() {
    for (int l = a_.layers - 1; l >= 0; --l) red_->mark_ready(static_cast<std::size_t>(l));
  }
  void backward_layer(int l, double seconds) {
    if (a_.fma) {
      const int iters = std::max(1, static_cast<int>(seconds / fma_seconds_per_iter_));
      fma_kernel<<<prop_.multiProcessorCount * 4, 256, 0, compute_>>>(sink_, iters);
    } else {
      sleep_kernel<<<1, 1, 0, compute_>>>(static_cast<unsigned long long>(seconds * 1e9));
    }
    fill_kernel<<<prop_.multiProcessorCount * 2, 256, 0, compute_>>>(static_cast<float*>(red_->gradient_data(l)), per_,
                                                                     grad_value(rank_, l));
    cuda(cudaGetLastError(), "kernel launch");
  }
  // The FMA kernel's time per iteration, with every rank running it at once (as in a step).
  void calibrate() {
    const int iters = 1 << 16;
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      auto w = start();
      fma_kernel<<<prop_.multiProcessorCount * 4, 256, 0, compute_>>>(sink_, iters);
      best = std::min(best, stop(w));
    }
    fma_seconds_per_iter_ = best / iters;
  }
  // Every rank's values of one quantity through the store; per step, the largest.
  std::vector<double> slowest(const std::vector<double>& mine, const std::string& what) {
    std::ostringstream o;
    o.precision(17);
    for (double v : mine) o << v << ' ';
    store_.set("t/" + what + "/" + std::to_string(rank_), o.str());
    std::vector<double> worst(mine.size(), 0.0);
    for (int r = 0; r < size_; ++r) {
      std::istringstream in(store_.get("t/" + what + "/" + std::to_string(r), 120s));
      for (double& w : worst) {
        double v = 0;
        in >> v;
        w = std::max(w, v);
      }
    }
    return worst;
  }
  // The last step's reduced gradients: the average of every rank's values, exactly.
  long check(kft::ddp::reducer<kft::cuda_ipc::communicator>& red) {
    cuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    long wrong = 0;
    std::vector<float> back(per_);
    for (int l = 0; l < a_.layers; ++l) {
      float sum = 0;
      for (int r = 0; r < size_; ++r) sum += grad_value(r, l);
      const float want = sum / static_cast<float>(size_);
      cuda(cudaMemcpy(back.data(), red.gradient_data(static_cast<std::size_t>(l)), per_ * sizeof(float),
                      cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      for (float v : back) wrong += v != want;
    }
    return wrong;
  }

  const args& a_;
  int rank_, size_;
  kft::rendezvous::file_store store_;
  kft::cuda_ipc::communicator comm_;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t e0_ = nullptr, eb_ = nullptr, e1_ = nullptr;
  cudaDeviceProp prop_{};
  float* sink_ = nullptr;
  std::size_t per_ = 0;
  double fma_seconds_per_iter_ = 1e-9;
  kft::ddp::reducer<kft::cuda_ipc::communicator>* red_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the DDP reducer's overlap of CUDA IPC communication with a GPU backward pass (starts its own ranks)"};
  args a;
  std::string ps = "2,4", layer_bytes = "4M", cap = "8M", first = "4M", backward = "sleep";
  app.add_option("-p,--ranks", ps, "rank counts, comma-separated (2..8)")->capture_default_str();
  app.add_option("--layers", a.layers, "layers (one parameter each)")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--layer-bytes", layer_bytes, "gradient bytes per layer (f32)")->capture_default_str();
  app.add_option("--cap", cap, "bucket_bytes_cap")->capture_default_str();
  app.add_option("--first", first, "first_bucket_bytes")->capture_default_str();
  app.add_option("--ratios", a.ratios, "backward time / communication time to measure")->delimiter(',');
  app.add_option("--steps", a.steps, "steps per measurement (median)")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--backward", backward, "sleep (SMs free) or fma (SMs busy)")->capture_default_str();
  app.add_option("--json", a.json, "append a line of JSON per rank count to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    a.layer_bytes = parse_size(layer_bytes);
    a.cap = parse_size(cap);
    a.first = parse_size(first);
    if (a.layer_bytes < 16 || a.layer_bytes % 16 != 0)
      throw std::invalid_argument("--layer-bytes: " + layer_bytes + " is not a positive multiple of 16 bytes");
    if (a.cap == 0 || a.first == 0) throw std::invalid_argument("--cap/--first: need more than 0 bytes");
    if (backward != "sleep" && backward != "fma")
      throw std::invalid_argument("--backward: '" + backward + "' is not sleep or fma");
    a.fma = backward == "fma";
    for (double r : a.ratios)
      if (!(r > 0)) throw std::invalid_argument("--ratios: " + std::to_string(r) + " is not above 0");
    a.ranks.clear();
    std::stringstream ss(ps);
    for (std::string x; std::getline(ss, x, ',');) {
      const int p = std::stoi(x);
      if (p < 2 || p > kft::cuda_ipc::max_ranks) throw std::invalid_argument("-p: " + x + " is outside 2..8");
      a.ranks.push_back(p);
    }
  } catch (const std::exception& x) {
    std::fprintf(stderr, "ddp_overlap_cuda: %s\n", x.what());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("ddp_overlap_cuda: no CUDA device: skipped\n");
    return 77;
  }
  if (const auto me = cuda_bench::this_rank(); me.is_rank()) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
      return rank_job(a, me.rank, me.size, me.store).run();
    } catch (const std::exception& x) {
      std::fprintf(stderr, "ddp_overlap_cuda rank %d: %s\n", me.rank, x.what());
      return 1;
    }
  }
  std::printf("# %d GPU(s)%s\n", devices,
              devices == 1 ? "; every rank on GPU 0 (time-sliced between the processes unless the MPS daemon runs)" : "");
  std::fflush(stdout);
  int worst = 0;
  for (int p : a.ranks) {
    const int rc = cuda_bench::launch(argv, p, "ddp_overlap_cuda");
    if (rc != 0) {
      std::printf("ddp_overlap_cuda: %d ranks: a rank exited %d\n", p, rc);
      worst = 1;
    }
  }
  return worst;
}
