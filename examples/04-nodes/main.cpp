// SPDX-License-Identifier: Apache-2.0
// Example 04: allreduce across nodes: shared memory inside each node, MPI between them.
//
//   mpirun -np 4 build/examples/04-nodes                     # one machine: one node
//   mpirun -np 2 env KFT_HOST_ID=a build/examples/04-nodes : -np 2 env KFT_HOST_ID=b build/examples/04-nodes
//
// kft::group::mpi_group groups the ranks by host, builds a shared-memory communicator per node and an
// MPI communicator per rail, and picks how each allreduce runs (one node: shared memory; even
// nodes: hierarchical; uneven: flat). The example averages a gradient with every algorithm that
// applies, checks the result, and rank 0 prints the layout and what ran.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include <kft/group/mpi_group.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    auto g = kft::group::mpi_group();  // collective over MPI_COMM_WORLD
    auto& w = *g;
    const auto& lay = w.layout();
    std::vector<float> grad(1 << 20);  // 4 MiB: large enough for the pipelined path
    const float mean_rank = static_cast<float>(w.size() - 1) / 2.0f;
    for (auto a : {kft::algo::automatic, kft::algo::flat, kft::algo::hierarchical}) {
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(w.rank()) + static_cast<float>(i % 10);
      w.allreduce(std::span<float>(grad), kft::ops::avg, {.algorithm = a});
      for (std::size_t i = 0; i < grad.size(); ++i)
        if (grad[i] != mean_rank + static_cast<float>(i % 10)) {
          std::fprintf(stderr, "rank %d: wrong average at %zu with %s\n", w.rank(), i, kft::name(a).data());
          status = 1;
          break;
        }
      if (w.rank() == 0)
        std::printf("%s: %s ran %s, averaged %zu floats correctly\n", lay.describe().c_str(),
                    kft::name(a).data(), kft::name(w.choose(grad.size() * sizeof(float), a)).data(), grad.size());
    }
  } catch (const kft::config_error& e) {  // e.g. started by a launcher that is not this MPI's
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
