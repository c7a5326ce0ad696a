// SPDX-License-Identifier: Apache-2.0
// widths.hpp: the --hidden option of the Fashion-MNIST examples (05 on CPUs, 08 on GPUs):
// comma-separated hidden layer widths, each 1..65536, refused with CLI11's validation error.
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace fmnist {

inline std::vector<int> parse_widths(const std::string& hidden) {
  std::vector<int> w;
  std::stringstream ss(hidden);
  std::string part;
  while (std::getline(ss, part, ',')) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || v < 1 || v > 65536)
      throw CLI::ValidationError("--hidden", "\"" + hidden + "\": expected widths like 256,128 (each 1..65536)");
    w.push_back(v);
  }
  if (w.empty()) throw CLI::ValidationError("--hidden", "no hidden layer given");
  return w;
}

}  // namespace fmnist
