// SPDX-License-Identifier: Apache-2.0
// Example 03: allreduce inside a node through shared memory.
//
//   kftrun --nproc-per-node 2 -- build/examples/03-allreduce
//
// Every rank joins the job (kft::init: who it is and the job's store; no process group, since
// this example builds the node's shared-memory communicator itself) and averages a "gradient"
// with its peers; then it times a 64 MiB allreduce on a zero-copy buffer (allocated inside the
// shared segment) and rank 0 prints the bandwidth.
#include <chrono>
#include <cstdio>
#include <vector>

#include <kft/init.hpp>
#include <kft/kft.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  try {
    auto job = kft::init(argc, argv, {.make_group = false});
    auto comm = kft::group::node_communicator(job.store(), job.world(), {.pool_bytes = 64u << 20});

    // A gradient whose average over the ranks is known: rank r contributes r + i % 10.
    std::vector<float> grad(1000);
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(comm.rank()) + static_cast<float>(i % 10);
    comm.allreduce(std::span<float>(grad), kft::ops::avg);
    const float mean_rank = static_cast<float>(comm.size() - 1) / 2.0f;
    for (std::size_t i = 0; i < grad.size(); ++i)
      if (grad[i] != mean_rank + static_cast<float>(i % 10)) {
        std::fprintf(stderr, "rank %d: wrong average at %zu: %g\n", comm.rank(), i, static_cast<double>(grad[i]));
        return 1;
      }

    // 64 MiB in the shared segment: the allreduce reads the peers' data in place.
    auto big = comm.allocate<float>((64u << 20) / sizeof(float));
    for (auto& x : big) x = 1.0f;
    comm.allreduce(big, kft::ops::sum);  // warm-up
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int iters = 10;
    for (int i = 0; i < iters; ++i) comm.allreduce(big, kft::ops::sum);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (comm.rank() == 0) {
      const double algbw = static_cast<double>(big.size_bytes()) / secs / 1e9;
      std::printf("%d ranks: averaged 1000 floats correctly; 64 MiB zero-copy allreduce: %.2f ms, algbw %.2f GB/s, "
                  "busbw %.2f GB/s\n",
                  comm.size(), secs * 1e3, algbw, algbw * 2.0 * (comm.size() - 1) / comm.size());
    }
    return 0;
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
