// SPDX-License-Identifier: Apache-2.0
// Defines a function taking a kft type; compiled against one kft configuration.
#include <kft/kft.hpp>

int abi_probe(const kft::world_info& w) { return w.rank; }
