// SPDX-License-Identifier: Apache-2.0
// Ranks as threads for unit tests: body(group) runs on p threads, each with a process group
// over its own shared-memory communicator (one segment per call), and the exception text of
// each rank comes back ("" when none). Used by the DDP, trainer and libtorch tests.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

namespace kft_test {

struct rank_options {
  std::size_t pool = 64u << 20;                  ///< the segment's buffer pool (bucket storage)
  std::chrono::milliseconds timeout{30000};      ///< every collective's deadline
};

inline std::vector<std::string> with_shm_ranks(int p, const std::function<void(kft::group::process_group&)>& body,
                                               rank_options o = {}) {
  static std::atomic<int> calls{0};
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const std::string name = "t" + std::to_string(::getpid()) + "_" + std::to_string(calls++);
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      try {
        kft::shm::config c;
        c.name = name;
        c.pool_bytes = o.pool;
        c.timeout = o.timeout;
        kft::group::process_group g(kft::shm::communicator(store, r, p, c), "shm");
        body(g);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& x : t) x.join();
  return errors;
}

/// The first non-empty error, or "" (for a test's message).
inline std::string first_error(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return {};
}

}  // namespace kft_test
