// SPDX-License-Identifier: Apache-2.0
// Boost.Test programs whose ranks run as threads (shm_ranks.hpp) get one error string per rank
// back; `kft_test::none(errors)` is true when every rank finished cleanly and logs each rank's
// error otherwise (include after <boost/test/unit_test.hpp>; call it on the test's thread: Boost
// checks are not thread-safe).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kft_test {

inline bool none(const std::vector<std::string>& errors) {
  bool ok = true;
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) {
      BOOST_TEST_MESSAGE("rank " << r << " error: " << errors[r]);
      ok = false;
    }
  return ok;
}

}  // namespace kft_test
