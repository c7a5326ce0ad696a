// SPDX-License-Identifier: Apache-2.0
// Uses kft the way an application would, and fails if discovery gives the wrong answer.
// Prints kft's inline namespace, which names the components this translation unit was built with.
#include <iostream>

#include <kft/kft.hpp>
#ifdef CONSUMER_USES_MPI
#include <kft/discovery/mpi.hpp>
#endif

int main() {
  const kft::environment env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "consumer"}}, "node-x");
  const kft::world_info w = kft::discover(env);
  if (w.rank != 1 || w.world_size != 2 || w.backend != "torchrun") {
    std::cerr << "consumer: wrong discovery result:\n" << kft::to_string(w);
    return 1;
  }
#ifdef CONSUMER_USES_MPI
  // Without MPI_Init the MPI precedence falls through to the same answer (and calls into MPI).
  if (kft::discover(env, kft::discovery::mpi_precedence{}).rank != 1) return 1;
#endif
  std::cout << "consumer OK via " << KFT_CONSUME_MODE << " (" << KFT_ABI_NAMESPACE_STRING << ")\n";
  return 0;
}
