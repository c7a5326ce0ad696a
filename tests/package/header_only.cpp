// SPDX-License-Identifier: Apache-2.0
// include/ on its own: compiled by tests/package/consume.sh with `g++ -std=c++20 -I<copy> -pthread`
// from a copy of include/ outside the source and build trees (no CMake, no configured.hpp).
// Every rank discovers itself, meets the others at the store, makes the job's process group
// and allreduces a vector whose sum it knows; it prints "OK" only when every element is right.
#include <cstdio>
#include <exception>
#include <vector>

#include <kft/kft.hpp>
#include <kft/group/factory.hpp>

int main() {
  try {
    const kft::world_info me = kft::discover();
    auto store = kft::rendezvous::connect_store(me);
    auto pg = kft::group::make_process_group(me, store.client);
    // Rank r contributes (r + 1) * (i % 7 + 1): the sum over n ranks is n(n+1)/2 * (i % 7 + 1).
    std::vector<float> v(4096);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((me.rank + 1) * static_cast<int>(i % 7 + 1));
    pg.allreduce(v.data(), v.data(), v.size(), kft::dtype::f32, kft::op_kind::sum);
    const int n = me.world_size;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 7 + 1));
      if (v[i] != want) {
        std::fprintf(stderr, "rank %d: v[%zu] = %g, want %g\n", me.rank, i, static_cast<double>(v[i]),
                     static_cast<double>(want));
        return 1;
      }
    }
    std::printf("rank %d of %d (%s, %s, %s): allreduce OK\n", me.rank, n, me.backend.c_str(), pg.description().c_str(),
                KFT_ABI_NAMESPACE_STRING);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "header_only: %s\n", e.what());
    return 1;
  }
}
