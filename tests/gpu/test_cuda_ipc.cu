// SPDX-License-Identifier: Apache-2.0
// The CUDA IPC communicator (kft/transport/cuda_ipc/communicator.cuh) between real processes:
// this program starts itself as 2, 3 and 4 ranks (KFT_CUDA_IPC_RANKS, e.g. "2 4") meeting through
// a file store, all on GPU 0 unless there are more (CUDA IPC works between processes sharing one
// GPU, so one GPU tests every path except NVLink), and each rank checks:
//  - allreduce: every dtype x op, counts below and above the staging (chunked), one-shot,
//    two-shot and auto, in place and out of place, against the host reference;
//  - broadcast, reduce_scatter (chunked), allgather (chunked), barrier;
//  - every rank's outputs (reduce_scatter's own slices aside) are bit-identical (hashes compared
//    through the store);
//  - a mismatched call (different counts) fails on every rank naming the other call, and the
//    next call is refused with a usage_error naming that failure;
//  - a rank that never calls: the caller's timeout_error comes within its deadline;
//  - abort(reason) on one rank: the others' calls fail with remote_error carrying the reason;
//  - with 4 ranks, the generic hierarchical allreduce over two of these communicators (two
//    "nodes" of 2 ranks, two rails of 2): the pipelined path, its remainder and the latency
//    path against the host reference, bit-identical on every rank; avg refused (device buffers);
//  - the DDP reducer over this communicator (kft/ddp/cuda.hpp): device bucket storage,
//    gradients landing on a compute stream of the test's own, each bucket's allreduce ordered
//    after them by an event; 4 steps (the first rebuilds) in a shuffled ready order per rank,
//    the rank-order average, bit-identical on every rank; small and default buckets and the
//    deterministic mode.
// Exit: 0 passed, 1 failed, 77 no CUDA device (CTest: skipped).
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kft/core/hash.hpp>
#include <kft/collectives/allreduce_hierarchical.hpp>
#include <kft/ddp/cuda.hpp>
#include <kft/rendezvous/file_store.hpp>
#include <kft/transport/cuda_ipc/communicator.cuh>

#include "../common/reference.hpp"

using namespace std::chrono_literals;
namespace ipc = kft::cuda_ipc;

namespace {

int g_rank = 0, g_size = 1;
long g_failures = 0;

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      ++g_failures;                                              \
      std::printf("[rank %d/%d] FAIL %s:%d: ", g_rank, g_size, __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                                  \
      std::printf("\n");                                         \
      std::fflush(stdout);                                       \
    }                                                            \
  } while (0)

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

struct device_buffer {
  void* p = nullptr;
  std::size_t bytes;
  explicit device_buffer(std::size_t n) : bytes(n > 0 ? n : 1) { cuda(cudaMalloc(&p, bytes), "cudaMalloc"); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p); }
  void upload(const std::vector<unsigned char>& h) {
    cuda(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // pageable uploads may still be in flight
  }
  std::vector<unsigned char> download(std::size_t n) const {
    std::vector<unsigned char> h(n);
    if (n) cuda(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
};

// Rank r on GPU r % GPUs (all on GPU 0 with one GPU: processes sharing it).
int my_device() {
  int d = 0;
  cuda(cudaGetDeviceCount(&d), "cudaGetDeviceCount");
  const int dev = g_rank % std::max(d, 1);
  cuda(cudaSetDevice(dev), "cudaSetDevice");
  return dev;
}

std::uint64_t g_hash = kft::detail::fnv1a_basis;
void fold(const std::vector<unsigned char>& v) { g_hash = g_hash * 31 + kft_test::bits_hash(v.data(), v.size()); }

long check_allreduce(ipc::communicator& c, kft::dtype t, kft::op_kind op, std::size_t n, kft::algo a, bool in_place) {
  const std::size_t es = kft::size_of(t), bytes = n * es;
  std::vector<unsigned char> h(bytes);
  for (std::size_t i = 0; i < n; ++i) kft_test::put(t, h.data(), i, kft_test::input(g_rank, i, op, t));
  device_buffer in(bytes), out(bytes);
  in.upload(h);
  cuda(cudaMemset(out.p, 0xff, out.bytes), "cudaMemset");
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  c.allreduce(in.p, in_place ? in.p : out.p, n, t, op, {.algorithm = a});
  const auto got = (in_place ? in : out).download(bytes);
  fold(got);
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = kft_test::expected(g_size, i, op, t), g = kft_test::get(t, got.data(), i);
    if (!kft_test::close_enough(g, want, t, op) && wrong++ < 2)
      std::printf("[rank %d/%d] allreduce %s %s x %zu algo %s%s: element %zu is %g, want %g\n", g_rank, g_size,
                  std::string(kft::name(t)).c_str(), std::string(kft::name(op)).c_str(), n,
                  std::string(kft::name(a)).c_str(), in_place ? " in place" : "", i, g, want);
  }
  return wrong;
}

void collectives(kft::rendezvous::store& store) {
  ipc::config cfg;
  cfg.name = "sweep";
  cfg.timeout = 60s;
  cfg.staging_bytes = 256 << 10;  // small: counts above 64 Ki floats are chunked
  cfg.one_shot_bytes = 32 << 10;
  ipc::communicator c(store, g_rank, g_size, my_device(), cfg);
  const auto t0 = std::chrono::steady_clock::now();
  long wrong = 0, calls = 0;
  const kft::dtype all_types[] = {kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16,
                                  kft::dtype::i32, kft::dtype::i64, kft::dtype::u8};
  const kft::op_kind all_ops[] = {kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min, kft::op_kind::max,
                                  kft::op_kind::avg};
  for (auto t : all_types)
    for (auto op : all_ops) {
      const bool wide = t == kft::dtype::f32 || t == kft::dtype::bf16;
      for (std::size_t n : {std::size_t{7}, std::size_t{4099}, std::size_t{100003}})
        for (kft::algo a : {kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot}) {
          if (!wide && a != kft::algo::automatic) continue;
          for (bool in_place : {false, true}) {
            wrong += check_allreduce(c, t, op, n, a, in_place);
            ++calls;
          }
        }
    }
  EXPECT(wrong == 0, "allreduce: %ld wrong element(s)", wrong);

  // broadcast from the last rank, chunked
  for (std::size_t n : {std::size_t{7}, std::size_t{100003}}) {
    const int root = g_size - 1;
    std::vector<unsigned char> h(n * 4);
    for (std::size_t i = 0; i < n; ++i) kft_test::put(kft::dtype::f32, h.data(), i, static_cast<double>(i % 1000) + g_rank);
    device_buffer in(h.size()), out(h.size());
    in.upload(h);
    c.broadcast(in.p, out.p, n, kft::dtype::f32, root);
    const auto got = out.download(h.size());
    fold(got);
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += kft_test::get(kft::dtype::f32, got.data(), i) != static_cast<double>(i % 1000) + root;
    EXPECT(bad == 0, "broadcast x %zu: %ld wrong", n, bad);
    ++calls;
  }
  // reduce_scatter: in = n x size, out = slice rank, reduced
  for (std::size_t n : {std::size_t{7}, std::size_t{4099}, std::size_t{40000}}) {
    const auto t = kft::dtype::f32;
    const auto op = kft::op_kind::sum;
    const std::size_t total = n * static_cast<std::size_t>(g_size);
    std::vector<unsigned char> h(total * 4);
    for (std::size_t i = 0; i < total; ++i) kft_test::put(t, h.data(), i, kft_test::input(g_rank, i, op, t));
    device_buffer in(h.size()), out(n * 4);
    in.upload(h);
    c.reduce_scatter(in.p, out.p, n, t, op);
    const auto got = out.download(n * 4);  // each rank's own slice: not in the cross-rank hash
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      bad += kft_test::get(t, got.data(), i) != kft_test::expected(g_size, static_cast<std::size_t>(g_rank) * n + i, op, t);
    EXPECT(bad == 0, "reduce_scatter x %zu: %ld wrong", n, bad);
    ++calls;
  }
  // allgather, chunked
  for (std::size_t n : {std::size_t{7}, std::size_t{70000}}) {
    std::vector<unsigned char> h(n * 4);
    for (std::size_t i = 0; i < n; ++i) kft_test::put(kft::dtype::f32, h.data(), i, static_cast<double>(g_rank * 100000 + i % 5000));
    device_buffer in(h.size()), out(h.size() * static_cast<std::size_t>(g_size));
    in.upload(h);
    c.allgather(in.p, out.p, n, kft::dtype::f32);
    const auto got = out.download(out.bytes);
    fold(got);
    long bad = 0;
    for (int j = 0; j < g_size; ++j)
      for (std::size_t i = 0; i < n; ++i)
        bad += kft_test::get(kft::dtype::f32, got.data(), static_cast<std::size_t>(j) * n + i) !=
               static_cast<double>(j * 100000 + static_cast<int>(i % 5000));
    EXPECT(bad == 0, "allgather x %zu: %ld wrong", n, bad);
    ++calls;
  }
  // The typed forms (spans) reach the same calls; sizes are checked before anything is enqueued.
  {
    const std::size_t n = 1000;
    std::vector<unsigned char> h(n * 4);
    for (std::size_t i = 0; i < n; ++i) kft_test::put(kft::dtype::f32, h.data(), i, kft_test::input(g_rank, i, kft::op_kind::max, kft::dtype::f32));
    device_buffer d(h.size());
    d.upload(h);
    auto* p = static_cast<float*>(d.p);
    c.allreduce(std::span<const float>(p, n), std::span<float>(p, n), kft::ops::max);
    const auto got = d.download(h.size());
    fold(got);
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      bad += kft_test::get(kft::dtype::f32, got.data(), i) != kft_test::expected(g_size, i, kft::op_kind::max, kft::dtype::f32);
    EXPECT(bad == 0, "typed allreduce max: %ld wrong", bad);
    ++calls;
    bool sized = false;
    try {
      c.allreduce(std::span<const float>(p, n), std::span<float>(p, n - 1), kft::ops::sum);
    } catch (const kft::usage_error&) {
      sized = true;
    }
    EXPECT(sized, "typed allreduce with different sizes was not refused");
  }
  for (int i = 0; i < 3; ++i) c.barrier();
  calls += 3;
  EXPECT(c.sequence() == static_cast<std::uint64_t>(calls), "sequence %llu after %ld calls",
         static_cast<unsigned long long>(c.sequence()), calls);
  // Bad input is refused before anything is enqueued.
  bool refused = false;
  try {
    c.broadcast(nullptr, nullptr, 1, kft::dtype::f32, g_size);
  } catch (const kft::usage_error& e) {
    refused = std::string(e.what()).find("root") != std::string::npos;
  }
  EXPECT(refused, "broadcast with root = size was not refused naming the root");

  // Every rank's outputs hash alike.
  store.set("sweep/hash/" + std::to_string(g_rank), std::to_string(g_hash));
  for (int j = 0; j < g_size; ++j) {
    const auto theirs = store.get("sweep/hash/" + std::to_string(j), 60s);
    EXPECT(theirs == std::to_string(g_hash), "rank %d's outputs differ from this rank's (hash %s vs %llu)", j,
           theirs.c_str(), static_cast<unsigned long long>(g_hash));
  }
  std::printf("[rank %d/%d] %ld calls checked in %.2f s (allreduce: 7 dtypes x 5 ops x 3 counts, one-shot/two-shot/auto "
              "on f32 and bf16, in and out of place; broadcast, reduce_scatter, allgather, barrier)\n",
              g_rank, g_size, calls, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Four ranks as two nodes of two: node k = {2k, 2k+1}, rail j = {j, j+2}. The generic
// hierarchical allreduce with a CUDA IPC communicator at both levels (on one GPU: the levels'
// composition, not a network) reduces over all four.
void hierarchical(kft::rendezvous::store& store) {
  if (g_size != 4) return;
  const int node = g_rank / 2, local = g_rank % 2;
  ipc::config ncfg;
  ncfg.name = "hier-node" + std::to_string(node);
  ncfg.timeout = 60s;
  ncfg.staging_bytes = 256 << 10;
  ipc::config rcfg = ncfg;
  rcfg.name = "hier-rail" + std::to_string(local);
  ipc::communicator intra(store, local, 2, my_device(), ncfg);
  ipc::communicator inter(store, node, 2, my_device(), rcfg);
  kft::hierarchical_config hc;
  hc.chunk_bytes = 128 << 10;  // several pipelined chunks at the larger counts (one GPU time-slices the ranks: keep it short)
  hc.small_bytes = 4 << 10;
  hc.inter_algorithm = kft::algo::automatic;
  kft::hierarchical_allreduce<ipc::communicator, ipc::communicator> ar(intra, inter, hc);
  const auto t0 = std::chrono::steady_clock::now();
  long wrong = 0, calls = 0;
  std::uint64_t hash = kft::detail::fnv1a_basis;
  for (auto t : {kft::dtype::f32, kft::dtype::bf16, kft::dtype::i32})
    for (auto op : {kft::op_kind::sum, kft::op_kind::max})
      for (std::size_t n : {std::size_t{3}, std::size_t{1000}, std::size_t{65536 + 3}, (std::size_t{1} << 18) + 5}) {
        const std::size_t es = kft::size_of(t), bytes = n * es;
        std::vector<unsigned char> h(bytes);
        for (std::size_t i = 0; i < n; ++i) kft_test::put(t, h.data(), i, kft_test::input(g_rank, i, op, t));
        device_buffer in(bytes), out(bytes);
        in.upload(h);
        cuda(cudaMemset(out.p, 0xff, out.bytes), "cudaMemset");
        cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        ar(in.p, out.p, n, t, op);
        ++calls;
        const auto got = out.download(bytes);
        hash = hash * 31 + kft_test::bits_hash(got.data(), got.size());
        long bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double want = kft_test::expected(4, i, op, t), g = kft_test::get(t, got.data(), i);
          if (!kft_test::close_enough(g, want, t, op) && bad++ < 2)
            std::printf("[rank %d/%d] hierarchical %s %s x %zu: element %zu is %g, want %g\n", g_rank, g_size,
                        std::string(kft::name(t)).c_str(), std::string(kft::name(op)).c_str(), n, i, g, want);
        }
        wrong += bad;
      }
  EXPECT(wrong == 0, "hierarchical allreduce: %ld wrong elements", wrong);
  bool refused = false;
  try {
    device_buffer b(64);
    ar(b.p, b.p, 16, kft::dtype::f32, kft::op_kind::avg);
  } catch (const kft::usage_error& e) {
    refused = std::string(e.what()).find("avg") != std::string::npos;
  }
  EXPECT(refused, "hierarchical avg on device buffers was not refused");
  store.set("hier/hash/" + std::to_string(g_rank), std::to_string(hash));
  for (int j = 0; j < g_size; ++j) {
    const auto theirs = store.get("hier/hash/" + std::to_string(j), 60s);
    EXPECT(theirs == std::to_string(hash), "hierarchical: rank %d's outputs differ from this rank's", j);
  }
  std::printf("[rank %d/%d] hierarchical allreduce (2 nodes x 2 ranks, cuda_ipc at both levels): %ld calls checked "
              "in %.2f s (f32, bf16, i32 x sum, max x 4 counts)\n",
              g_rank, g_size, calls, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The DDP reducer over CUDA IPC: the same checks as tests/gpu/test_ddp_nccl.cpp, between processes.
double grad_value(int r, std::size_t i, std::size_t j, int s) {
  return static_cast<double>((static_cast<std::size_t>(r) * 5 + i * 3 + j * 7 + static_cast<std::size_t>(s) * 11) % 9) -
         4.0;
}

void reducer(kft::rendezvous::store& store, const char* what, kft::ddp::reducer_options opts) {
  namespace ddp = kft::ddp;
  const std::vector<ddp::parameter> params = {{1, kft::dtype::f32, "a"},         {7, kft::dtype::f64, "b"},
                                              {1023, kft::dtype::bf16, "c"},     {(1u << 20) + 3, kft::dtype::f32, "d"},
                                              {4099, kft::dtype::f32, "e"},      {300000, kft::dtype::f32, "f"}};
  ipc::config cfg;
  cfg.name = std::string("ddp-") + what;
  cfg.timeout = 60s;
  cfg.staging_bytes = 256 << 10;  // buckets above it are chunked
  ipc::communicator c(store, g_rank, g_size, my_device(), cfg);
  cudaStream_t compute = nullptr;
  cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
  opts.stream = compute;
  long wrong = 0;
  bool on_device = true;
  std::uint64_t hash = kft::detail::fnv1a_basis;
  double ms = 0;
  {
    ddp::reducer<ipc::communicator> red(c, params, opts);
    std::vector<std::vector<unsigned char>> host(params.size());
    for (int s = 1; s <= 4; ++s) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        host[i].resize(params[i].count * kft::size_of(params[i].type));
        for (std::size_t j = 0; j < params[i].count; ++j)
          kft_test::put(params[i].type, host[i].data(), j, grad_value(g_rank, i, j, s));
      }
      std::vector<std::size_t> order(params.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937 rng(static_cast<unsigned>(g_rank * 100 + s));
      std::shuffle(order.begin(), order.end(), rng);
      const auto t0 = std::chrono::steady_clock::now();
      red.zero_grad();
      for (std::size_t i : order) {
        cudaPointerAttributes a{};
        cuda(cudaPointerGetAttributes(&a, red.gradient_data(i)), "cudaPointerGetAttributes");
        if (a.type != cudaMemoryTypeDevice) on_device = false;
        // "backward": the gradient lands on the compute stream, asynchronously
        cuda(cudaMemcpyAsync(red.gradient_data(i), host[i].data(), host[i].size(), cudaMemcpyHostToDevice, compute),
             "cudaMemcpyAsync");
        red.mark_ready(i);
      }
      red.finish();
      cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
      if (s > 1) ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 3;
      for (std::size_t i = 0; i < params.size(); ++i) {
        std::vector<unsigned char> back(host[i].size());
        cuda(cudaMemcpy(back.data(), red.gradient_data(i), back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        long bad = 0;
        for (std::size_t j = 0; j < params[i].count; ++j) {
          double sum = 0;
          for (int q = 0; q < g_size; ++q) sum += grad_value(q, i, j, s);
          // The average as the kernels form it: the sum (exact here), one division, one rounding.
          std::vector<unsigned char> want(kft::size_of(params[i].type));
          kft_test::put(params[i].type, want.data(), 0,
                        params[i].type == kft::dtype::f64 ? sum / g_size
                                                          : static_cast<double>(static_cast<float>(sum) /
                                                                                static_cast<float>(g_size)));
          const double got = kft_test::get(params[i].type, back.data(), j), w = kft_test::get(params[i].type, want.data(), 0);
          // Deterministic mode sums in 64-bit fixed point and divides after decoding: within
          // two units in the last place of the kernels' average (bit identity across ranks is
          // checked by the hash below).
          const bool ok = opts.deterministic
                              ? std::fabs(got - w) <= 2 * kft_test::ulp_of(params[i].type) * std::max(std::fabs(w), 1.0)
                              : got == w;
          if (!ok && bad++ < 2)
            std::printf("[rank %d/%d] ddp %s step %d parameter %s element %zu: %g, want %g\n", g_rank, g_size, what, s,
                        params[i].name.c_str(), j, got, w);
        }
        wrong += bad;
        hash = hash * 31 + kft_test::bits_hash(back.data(), back.size());
      }
    }
  }
  cudaStreamDestroy(compute);
  EXPECT(wrong == 0, "ddp reducer over cuda_ipc (%s): %ld wrong gradient elements", what, wrong);
  EXPECT(on_device, "ddp reducer over cuda_ipc (%s): gradients are not device memory", what);
  const std::string key = std::string("ddp/") + what + "/hash/";
  store.set(key + std::to_string(g_rank), std::to_string(hash));
  for (int j = 0; j < g_size; ++j) {
    const auto theirs = store.get(key + std::to_string(j), 60s);
    EXPECT(theirs == std::to_string(hash), "ddp reducer over cuda_ipc (%s): rank %d's gradients differ from this rank's",
           what, j);
  }
  std::printf("[rank %d/%d] ddp reducer over cuda_ipc, %s: 4 steps checked, %.3f ms per step\n", g_rank, g_size, what,
              ms);
}

void reducers(kft::rendezvous::store& store) {
  reducer(store, "small-buckets", {.limits = {.first_bucket_bytes = 64u << 10, .bucket_bytes_cap = 1u << 20}});
  reducer(store, "default-buckets", {});
  reducer(store, "deterministic", {.deterministic = true});
}

void failures(kft::rendezvous::store& store) {
  // A mismatched call: rank 0 sends 8 floats, the others 9.
  {
    ipc::config cfg;
    cfg.name = "mismatch";
    cfg.timeout = 20s;
    cfg.staging_bytes = 64 << 10;
    ipc::communicator c(store, g_rank, g_size, my_device(), cfg);
    device_buffer b(64);
    std::string what;
    try {
      c.allreduce(b.p, b.p, g_rank == 0 ? 8 : 9, kft::dtype::f32, kft::op_kind::sum);
    } catch (const kft::error& e) {
      what = e.what();
    }
    EXPECT(what.find("different call") != std::string::npos, "mismatch not reported: '%s'", what.c_str());
    std::printf("[rank %d/%d] mismatch: %s\n", g_rank, g_size, what.c_str());
    // After a failure the communicator refuses calls, as every transport does: a usage_error
    // naming the failure, and the call it refused (numbered after the failed one).
    std::string refused;
    try {
      c.allreduce(b.p, b.p, 8, kft::dtype::f32, kft::op_kind::sum);
    } catch (const kft::usage_error& e) {
      refused = e.what();
    } catch (const kft::error& e) {
      refused = std::string("not a usage_error: ") + e.what();
    }
    EXPECT(refused.find("earlier failure") != std::string::npos && refused.find("different call") != std::string::npos &&
               refused.find("allreduce #2") != std::string::npos,
           "the call after a mismatch was not refused with a usage_error naming it: '%s'", refused.c_str());
    EXPECT(!c.broken().empty(), "broken() is empty after a mismatch");
  }
  // A rank that never calls: rank 0's call times out (GPU deadline 2 s); the others wait.
  {
    ipc::config cfg;
    cfg.name = "late";
    cfg.timeout = 2s;
    cfg.staging_bytes = 64 << 10;
    ipc::communicator c(store, g_rank, g_size, my_device(), cfg);
    if (g_rank == 0) {
      device_buffer b(64);
      std::string what;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.allreduce(b.p, b.p, 4, kft::dtype::f32, kft::op_kind::sum);
      } catch (const kft::timeout_error& e) {
        what = e.what();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT(what.find("timed out") != std::string::npos && s < 9.0, "no timeout_error in time (%.1f s): '%s'", s,
             what.c_str());
      std::printf("[rank %d/%d] late rank: timeout_error after %.2f s: %s\n", g_rank, g_size, s, what.c_str());
      store.set("late/done", "1");
    } else {
      (void)store.get("late/done", 60s);
    }
  }
  // abort(reason) on the last rank while the others are in a call.
  {
    ipc::config cfg;
    cfg.name = "abort";
    cfg.timeout = 30s;
    cfg.staging_bytes = 64 << 10;
    ipc::communicator c(store, g_rank, g_size, my_device(), cfg);
    if (g_rank == g_size - 1) {
      std::this_thread::sleep_for(300ms);
      c.abort("checking abort");
      store.set("abort/done", "1");
    } else {
      device_buffer b(64);
      std::string what;
      try {
        c.allreduce(b.p, b.p, 4, kft::dtype::f32, kft::op_kind::sum);
      } catch (const kft::remote_error& e) {
        what = e.what();
      }
      EXPECT(what.find("checking abort") != std::string::npos, "abort not seen: '%s'", what.c_str());
      std::printf("[rank %d/%d] abort: %s\n", g_rank, g_size, what.c_str());
      (void)store.get("abort/done", 60s);
    }
  }
}

int child(const char* dir) {
  try {
    kft::rendezvous::file_store store(dir);
    collectives(store);
    hierarchical(store);
    reducers(store);
    failures(store);
  } catch (const std::exception& e) {
    std::printf("[rank %d/%d] FAIL: %s\n", g_rank, g_size, e.what());
    return 1;
  }
  return g_failures == 0 ? 0 : 1;
}

// Starts `p` copies of this program as ranks and waits for them (at most `limit`).
int launch(const char* self, int p, std::chrono::seconds limit) {
  char tmpl[] = "/tmp/kft_cuda_ipc_XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("KFT_TEST_RANK", std::to_string(r).c_str(), 1);
      ::setenv("KFT_TEST_SIZE", std::to_string(p).c_str(), 1);
      ::setenv("KFT_TEST_STORE", dir, 1);
      ::execl(self, self, static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int worst = 0;
  std::size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (rc != 0) std::printf("rank %zu of %d exited %d\n", r, p, rc);
        if (rc != 0 && worst != 1) worst = rc == 77 ? 77 : 1;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      std::printf("FAIL: %d ranks still running after %lld s: killed\n", p, static_cast<long long>(limit.count()));
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) ::kill(pids[r], SIGKILL);
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) ::waitpid(pids[r], nullptr, 0);
      worst = 1;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return worst;
}

}  // namespace

int main(int, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (const char* r = std::getenv("KFT_TEST_RANK"); r != nullptr) {
    g_rank = std::atoi(r);
    g_size = std::atoi(std::getenv("KFT_TEST_SIZE"));
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (e != cudaSuccess || devices == 0) return 77;
    return child(std::getenv("KFT_TEST_STORE"));
  }
  if (e != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return 77;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* ranks = std::getenv("KFT_CUDA_IPC_RANKS");
  std::istringstream in(ranks != nullptr ? ranks : "2 3 4");
  int worst = 0;
  for (int p; in >> p;) {
    if (p < 1 || p > ipc::max_ranks) {
      std::printf("KFT_CUDA_IPC_RANKS: %d is outside 1..%d\n", p, ipc::max_ranks);
      return 2;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const char* lim = std::getenv("KFT_CUDA_IPC_LIMIT_S");  // per rank count; default 240 s
    const int rc = launch(argv[0], p, std::chrono::seconds(lim != nullptr ? std::max(1, std::atoi(lim)) : 240));
    std::printf("== %d ranks on %d GPU(s): %s in %.1f s\n", p, devices, rc == 0 ? "passed" : "FAILED",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (rc != 0) worst = 1;
  }
  return worst;
}
