// SPDX-License-Identifier: Apache-2.0
// Calls abi_probe; compiled against another kft configuration, it must not link.
#include <kft/kft.hpp>

int abi_probe(const kft::world_info& w);

int main() { return abi_probe(kft::world_info{}); }
