// SPDX-License-Identifier: Apache-2.0
// EXPECT: no matching function for call to .*allreduce
// An output span of const elements: the result could not be written.
#include <span>
#include <vector>

#include <kft/transport/shm/communicator.hpp>

void use(kft::shm::communicator& comm) {
  std::vector<float> a(4), b(4);
  comm.allreduce(std::span<const float>(a), std::span<const float>(b), kft::ops::sum);
}
