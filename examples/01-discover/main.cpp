// SPDX-License-Identifier: Apache-2.0
// Example 01: who am I in this job?
//
// The same binary, started by mpirun, srun, torchrun or a Kubernetes pod (or by hand),
// prints its place in the job. Nothing in the code depends on the launcher.
#include <cstdio>

#include <kft/kft.hpp>

int main() {
  try {
    const kft::world_info me = kft::discover();
    auto show = [](const std::optional<int>& v) { return v ? *v : -1; };
    std::printf("rank %d of %d (local %d of %d, node %d of %d) on %s, decided by %s\n", me.rank, me.world_size,
                show(me.local_rank), show(me.local_size), show(me.node_rank), show(me.node_count),
                me.hostname.c_str(), me.backend.c_str());
    for (const auto& note : me.notes) std::printf("  note: %s\n", note.c_str());
    return 0;
  } catch (const kft::config_error& e) {
    // A malformed launcher environment: the message names the variable and its value.
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
