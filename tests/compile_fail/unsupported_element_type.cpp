// SPDX-License-Identifier: Apache-2.0
// EXPECT: kft: unsupported element type
// A collective on an element type kft has no dtype for.
#include <span>
#include <vector>

#include <kft/transport/shm/communicator.hpp>

void use(kft::shm::communicator& comm) {
  std::vector<char> a(4), b(4);
  comm.allreduce(std::span<const char>(a), std::span<char>(b), kft::ops::sum);
}
