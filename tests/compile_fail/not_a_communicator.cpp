// SPDX-License-Identifier: Apache-2.0
// EXPECT: (constraints not satisfied|async_communicator)
// The process group owns only what satisfies kft's communicator contract.
#include <kft/group/process_group.hpp>

struct half_a_communicator {
  int rank() const { return 0; }
  int size() const { return 1; }
};

void use() { kft::group::process_group pg(half_a_communicator{}); }
