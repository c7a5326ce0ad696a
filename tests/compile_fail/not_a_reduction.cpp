// SPDX-License-Identifier: Apache-2.0
// EXPECT: reduction
// A reduction that is not one of kft::ops (the backends could not recognise it).
#include <functional>
#include <span>
#include <vector>

#include <kft/transport/shm/communicator.hpp>

void use(kft::shm::communicator& comm) {
  std::vector<float> a(4), b(4);
  comm.allreduce(std::span<const float>(a), std::span<float>(b), std::plus<float>{});
}
