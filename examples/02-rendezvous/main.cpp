// SPDX-License-Identifier: Apache-2.0
// Example 02: meet the other ranks through the job's store.
//
// Under kftrun the store is already there (kftrun's node-0 agent hosts it and tells every
// worker where, with a token); under torchrun's static rendezvous it is torchrun's own store.
// Otherwise rank 0 hosts it at MASTER_ADDR:MASTER_PORT (on several hosts every rank then needs
// the same KFT_RDZV_TOKEN). Each rank publishes its host name, waits for everyone's, and rank 0
// prints the table.
//
//   kftrun --nproc-per-node 3 -- build/examples/02-rendezvous
//   02-rendezvous --timestamp     also print when the rendezvous completed (for bench/)
#include <time.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <kft/kft.hpp>
#include <kft/rendezvous/connect.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const bool timestamp = argc > 1 && std::strcmp(argv[1], "--timestamp") == 0;
  try {
    const kft::world_info me = kft::discover();
    auto store = kft::rendezvous::connect_store(me);
    auto& s = *store.client;

    s.set("host/" + std::to_string(me.rank), me.hostname);
    std::vector<std::string> keys;
    for (int r = 0; r < me.world_size; ++r) keys.push_back("host/" + std::to_string(r));
    s.wait(keys, 60s);
    kft::rendezvous::barrier(s, "met", me.world_size, 60s);
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);

    if (me.rank == 0) {
      std::printf("%d ranks met through the %s\n", me.world_size, s.describe().c_str());
      for (int r = 0; r < me.world_size; ++r)
        std::printf("  rank %d on %s\n", r, s.try_get(keys[static_cast<std::size_t>(r)])->c_str());
      if (timestamp)
        std::printf("rendezvous-complete-ns %lld\n", static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
    }
    return 0;  // a rank 0 that hosts the store keeps it up until every rank has disconnected
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
