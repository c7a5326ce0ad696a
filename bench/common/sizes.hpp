// SPDX-License-Identifier: Apache-2.0
// nccl-tests' size arguments, shared by every bench program: a number with an optional K, M
// or G suffix (powers of 1024), e.g. "256K".
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

inline std::size_t parse_size(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  double units = 1;
  std::string num = s;
  switch (s.back()) {
    case 'K': case 'k': units = 1024.0; num.pop_back(); break;
    case 'M': case 'm': units = 1024.0 * 1024; num.pop_back(); break;
    case 'G': case 'g': units = 1024.0 * 1024 * 1024; num.pop_back(); break;
    default: break;
  }
  std::size_t used = 0;
  const double v = std::stod(num, &used);
  if (used != num.size() || v < 0) throw std::invalid_argument("not a size: " + s);
  return static_cast<std::size_t>(std::llround(v * units));
}
