// SPDX-License-Identifier: Apache-2.0
// Conformance of the NCCL communicator (ranks as threads, one GPU each, device buffers).
// Without a CUDA device it exits 77 (CTest: skipped) saying why.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/nccl/communicator.hpp>

#include "device_memory.hpp"
#include "registry.hpp"

using namespace std::chrono_literals;
namespace conf = kft_test::conformance;

namespace {

using conf::device_memory;

// The ranks' communicators, made together (NCCL's init is collective), then one case on all.
class gpu_ranks {
 public:
  explicit gpu_ranks(int p) {
    auto store = std::make_shared<kft::rendezvous::memory_store>();
    comms_.resize(static_cast<std::size_t>(p));
    std::vector<std::thread> t;
    for (int r = 0; r < p; ++r)
      t.emplace_back([&, r] {
        cudaSetDevice(r);
        kft::nccl::config c;
        c.timeout = 60s;
        c.name = "conformance";
        comms_[static_cast<std::size_t>(r)] = std::make_unique<kft::nccl::communicator>(*store, r, p, r, c);
      });
    for (auto& x : t) x.join();
  }
  std::vector<conf::outcome> run(const conf::spec& s) {
    std::vector<conf::outcome> out(comms_.size());
    std::vector<std::thread> t;
    for (std::size_t r = 0; r < comms_.size(); ++r)
      t.emplace_back([&, r] {
        cudaSetDevice(static_cast<int>(r));
        try {
          out[r] = conf::run_case(*comms_[r], s, device_memory{}, static_cast<int>(comms_.size()) + 2);
        } catch (const std::exception& e) {
          out[r].wrong = 1;
          out[r].first = e.what();
        }
      });
    for (auto& x : t) x.join();
    return out;
  }

 private:
  std::vector<std::unique_ptr<kft::nccl::communicator>> comms_;
};

}  // namespace

bool init_unit_test() {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  for (int p = 1; p <= std::min(devices, 4); ++p) {
    auto ranks = std::make_shared<std::unique_ptr<gpu_ranks>>();
    conf::register_suite("nccl", p, conf::cases(p, [](kft::collective) { return std::vector{kft::algo::automatic}; }),
                         [ranks, p](const conf::spec& s) {
                           if (!*ranks) *ranks = std::make_unique<gpu_ranks>(p);
                           return (*ranks)->run(s);
                         });
  }
  return true;
}

int main(int argc, char* argv[]) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
