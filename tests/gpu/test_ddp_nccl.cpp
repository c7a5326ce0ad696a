// SPDX-License-Identifier: Apache-2.0
// The DDP reducer over NCCL (ranks as threads, one GPU each): bucket storage in device memory,
// gradients written by the "backward" on a compute stream of the test's own (asynchronous
// copies standing in for kernels), each bucket's allreduce ordered after them by an event, the
// result against the rank-order average; deterministic layout and bit-identical results on every
// rank; a rebuild keeps the gradients; the auto cap. Prints the step time per configuration.
// Without a CUDA device it exits 77 (CTest: skipped) saying why.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <kft/core/hash.hpp>
#include <kft/transport/nccl/communicator.hpp>
#include <kft/ddp/cuda.hpp>
#include <kft/rendezvous/memory_store.hpp>

using namespace std::chrono_literals;
namespace ddp = kft::ddp;

namespace {

int gpus = 0;

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

double value(int r, std::size_t i, std::size_t j, int s) {
  return static_cast<double>((static_cast<std::size_t>(r) * 5 + i * 3 + j * 7 + static_cast<std::size_t>(s) * 11) % 9) - 4.0;
}

std::vector<ddp::parameter> model() {
  return {{1, kft::dtype::f32, "a"},      {7, kft::dtype::f64, "b"},         {1023, kft::dtype::bf16, "c"},
          {(1u << 20) + 3, kft::dtype::f32, "d"}, {4099, kft::dtype::f32, "e"}, {300000, kft::dtype::f32, "f"}};
}

// Host image of one parameter's gradient for rank r, step s.
std::vector<unsigned char> host_gradient(const ddp::parameter& p, int r, std::size_t i, int s) {
  std::vector<unsigned char> out(p.count * kft::size_of(p.type));
  for (std::size_t j = 0; j < p.count; ++j) {
    const double v = value(r, i, j, s);
    if (p.type == kft::dtype::f32) {
      const float f = static_cast<float>(v);
      std::memcpy(out.data() + 4 * j, &f, 4);
    } else if (p.type == kft::dtype::f64) {
      std::memcpy(out.data() + 8 * j, &v, 8);
    } else {
      const std::uint16_t b = kft::bfloat16::from_float(static_cast<float>(v));
      std::memcpy(out.data() + 2 * j, &b, 2);
    }
  }
  return out;
}

double read(const ddp::parameter& p, const unsigned char* base, std::size_t j) {
  if (p.type == kft::dtype::f32) {
    float f;
    std::memcpy(&f, base + 4 * j, 4);
    return f;
  }
  if (p.type == kft::dtype::f64) {
    double d;
    std::memcpy(&d, base + 8 * j, 8);
    return d;
  }
  std::uint16_t b;
  std::memcpy(&b, base + 2 * j, 2);
  return kft::bfloat16::to_float(b);
}

double average(kft::dtype t, double sum, int p) {
  if (t == kft::dtype::f32) return static_cast<float>(sum) / static_cast<float>(p);
  if (t == kft::dtype::f64) return sum / p;
  return kft::bfloat16::to_float(kft::bfloat16::from_float(static_cast<float>(sum) / static_cast<float>(p)));
}

struct outcome {
  std::size_t wrong = 0;
  std::uint64_t hash = 0;
  double step_ms = 0;
  std::size_t cap = 0;
  bool device_pointers = true;
  std::string error;
};

// Every rank: 4 steps (step 1 rebuilds), a shuffled ready order per rank and step.
std::vector<outcome> run(int p, ddp::reducer_options base) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::vector<outcome> out(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      auto& o = out[static_cast<std::size_t>(r)];
      try {
        cuda(cudaSetDevice(r), "cudaSetDevice");
        kft::nccl::config c;
        c.timeout = 60s;
        c.name = "ddp";
        kft::nccl::communicator comm(*store, r, p, r, c);
        cudaStream_t compute;
        cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
        auto opts = base;
        opts.stream = compute;
        ddp::reducer<kft::nccl::communicator> red(comm, model(), opts);
        o.cap = red.limits().bucket_bytes_cap;
        const auto params = model();
        std::vector<std::vector<unsigned char>> host(params.size());
        std::uint64_t h = kft::detail::fnv1a_basis;
        double total = 0;
        for (int s = 1; s <= 4; ++s) {
          for (std::size_t i = 0; i < params.size(); ++i) host[i] = host_gradient(params[i], r, i, s);
          std::vector<std::size_t> order(params.size());
          for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
          std::mt19937 rng(static_cast<unsigned>(r * 100 + s));
          std::shuffle(order.begin(), order.end(), rng);
          const auto t0 = std::chrono::steady_clock::now();
          red.zero_grad();
          for (std::size_t i : order) {
            cudaPointerAttributes a{};
            cuda(cudaPointerGetAttributes(&a, red.gradient_data(i)), "cudaPointerGetAttributes");
            if (a.type != cudaMemoryTypeDevice) o.device_pointers = false;
            // "backward": the gradient lands on the compute stream, asynchronously
            cuda(cudaMemcpyAsync(red.gradient_data(i), host[i].data(), host[i].size(), cudaMemcpyHostToDevice, compute),
                 "cudaMemcpyAsync");
            red.mark_ready(i);
          }
          red.finish();
          cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
          if (s > 1) total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          for (std::size_t i = 0; i < params.size(); ++i) {
            std::vector<unsigned char> back(host[i].size());
            cuda(cudaMemcpy(back.data(), red.gradient_data(i), back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
            for (std::size_t j = 0; j < params[i].count; ++j) {
              double sum = 0;
              for (int q = 0; q < p; ++q) sum += value(q, i, j, s);
              if (read(params[i], back.data(), j) != average(params[i].type, sum, p)) ++o.wrong;
            }
            for (unsigned char b : back) h = (h ^ b) * kft::detail::fnv1a_prime;
          }
        }
        o.hash = h;
        o.step_ms = total / 3;
        cudaStreamDestroy(compute);
      } catch (const std::exception& e) {
        o.error = e.what();
      }
    });
  for (auto& x : t) x.join();
  return out;
}

void check(const std::vector<outcome>& out, const char* what) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    BOOST_TEST(out[r].error.empty(), what << ": rank " << r << ": " << out[r].error);
    BOOST_TEST(out[r].wrong == 0u, what << ": rank " << r << " wrong elements");
    BOOST_TEST(out[r].device_pointers, what << ": gradients are device memory");
    BOOST_TEST(out[r].hash == out[0].hash, what << ": rank " << r << " bit-identical to rank 0");
  }
  std::printf("ddp over NCCL, %zu GPU(s), %s: %.3f ms per step (cap %zu B)\n", out.size(), what, out[0].step_ms,
              out[0].cap);
}

void reducer_over_nccl() {
  const int p = std::min(gpus, 4);
  check(run(p, {.limits = {.first_bucket_bytes = 64u << 10, .bucket_bytes_cap = 1u << 20}}), "64 KiB / 1 MiB buckets");
  check(run(p, {}), "default buckets");
  check(run(p, {.deterministic = true}), "deterministic");
  check(run(p, {.auto_bucket_cap = true}), "auto cap");
}

}  // namespace

bool init_suite() {
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("skipped: no CUDA device (cudaGetDeviceCount found none)\n");
    std::exit(77);
  }
  boost::unit_test::framework::master_test_suite().add(BOOST_TEST_CASE(&reducer_over_nccl));
  return true;
}

int main(int argc, char* argv[]) { return boost::unit_test::unit_test_main(&init_suite, argc, argv); }
