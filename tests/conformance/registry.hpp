// SPDX-License-Identifier: Apache-2.0
// Registers the conformance cases as named Boost.Test cases: suite "<factory>_p<ranks>", then
// "<collective>", then one case per spec, so one combination runs alone, e.g.
//   test_conformance_shm --run_test=shm_p3/allreduce/two_shot_bf16_avg_n4099_in_place
#pragma once

#include <boost/test/unit_test.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cases.hpp"

namespace kft_test::conformance {

// Runs one case on every rank of the job and returns each rank's outcome (the runner's
// business: ranks as threads, or one rank per process).
using runner = std::function<std::vector<outcome>(const spec&)>;

// Checks what the ranks saw: nothing wrong, and the outputs that must match do, bit for bit.
inline void check(const spec& s, const std::vector<outcome>& seen) {
  std::size_t wrong = 0;
  std::string first;
  for (const auto& o : seen) {
    wrong += o.wrong;
    if (first.empty()) first = o.first;
  }
  BOOST_CHECK_MESSAGE(wrong == 0u, s.name() << ": " << wrong << " wrong element(s); " << first);
  for (std::size_t r = 1; r < seen.size(); ++r)
    BOOST_CHECK_MESSAGE(seen[r].output_hash == seen[0].output_hash,
                        s.name() << ": rank " << r << "'s output differs in its bits from rank 0's");
}

// Adds the suite of one factory and rank count to the master suite.
inline void register_suite(const std::string& factory, int p, const std::vector<spec>& specs, runner run) {
  auto* top = BOOST_TEST_SUITE(factory + "_p" + std::to_string(p));
  std::map<std::string, boost::unit_test::test_suite*> by_coll;
  auto shared = std::make_shared<runner>(std::move(run));
  for (const auto& s : specs) {
    const std::string cname(kft::name(s.coll));
    auto& suite = by_coll[cname];
    if (!suite) {
      suite = BOOST_TEST_SUITE(cname);
      top->add(suite);
    }
    suite->add(boost::unit_test::make_test_case([shared, s] { check(s, (*shared)(s)); }, s.name(), __FILE__, __LINE__));
  }
  boost::unit_test::framework::master_test_suite().add(top);
}

}  // namespace kft_test::conformance
