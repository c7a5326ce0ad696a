// SPDX-License-Identifier: Apache-2.0
// What the trainer's tests share (include once per test program): ranks as threads over the
// shared-memory transport, one BLAS thread each, a small synthetic problem for example 05's MLP,
// and a temporary directory.
#pragma once

#include <cblas.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <kft/group/process_group.hpp>

#include "rank_errors.hpp"
#include "shm_ranks.hpp"
#include "../../examples/05-fashion-mnist/idx.hpp"
#include "../../examples/05-fashion-mnist/mlp.hpp"

using namespace std::chrono_literals;
namespace ddp = kft::ddp;
namespace fs = std::filesystem;

// (Each test program uses some of these.)
namespace {

std::atomic<int> segment_counter{0};

[[maybe_unused]] std::vector<std::string> with_ranks(int p, const std::function<void(kft::group::process_group&)>& body) {
  return kft_test::with_shm_ranks(p, body, {.pool = 16u << 20, .timeout = 60s});
}

using kft_test::none;

struct fixture {
  fixture() { openblas_set_num_threads(1); }  // ranks are threads: one BLAS thread each
};
BOOST_GLOBAL_FIXTURE(fixture);

// A small problem: 32-pixel synthetic "images", an MLP 32-24-16-10.
[[maybe_unused]] const fmnist::dataset& train_set() {
  static const fmnist::dataset d = fmnist::synthetic(1000, 32, 7);
  return d;
}
[[maybe_unused]] const fmnist::dataset& test_set() {
  static const fmnist::dataset d = fmnist::synthetic(300, 32, 8);
  return d;
}
[[maybe_unused]] fmnist::mlp small_model() { return fmnist::mlp({32, 24, 16, 10}, &train_set(), &test_set(), 11); }

[[maybe_unused]] std::vector<float> flat(fmnist::mlp& m) {
  std::vector<float> v;
  for (auto& t : m.parameters()) v.insert(v.end(), t.value.begin(), t.value.end());
  return v;
}

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("kft-trainer-" + std::to_string(::getpid()) + "-" + std::to_string(segment_counter++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace
