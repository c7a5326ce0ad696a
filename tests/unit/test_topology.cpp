// SPDX-License-Identifier: Apache-2.0
// Node grouping: layouts from host identities, the store exchange, KFT_HOST_ID.
#define BOOST_TEST_MODULE kft_topology
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <kft/rendezvous/memory_store.hpp>
#include <kft/topology/layout.hpp>

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(uniform_layout_numbers_nodes_by_lowest_rank) {
  // Ranks interleaved across hosts, as a round-robin launcher places them.
  const std::vector<std::string> hosts = {"b", "a", "b", "a"};
  kft::topology::layout l(2, hosts);
  BOOST_TEST(l.nodes() == 2);
  BOOST_TEST(l.node() == 0);  // "b" holds rank 0
  BOOST_TEST(l.node_of(1) == 1);
  BOOST_TEST(l.members(0) == std::vector<int>({0, 2}));
  BOOST_TEST(l.members(1) == std::vector<int>({1, 3}));
  BOOST_TEST(l.local_rank() == 1);
  BOOST_TEST(l.local_size() == 2);
  BOOST_TEST(l.uniform());
  BOOST_TEST(l.rail(0) == std::vector<int>({0, 1}));
  BOOST_TEST(l.rail(1) == std::vector<int>({2, 3}));
  BOOST_TEST(l.describe() == "2 nodes x 2 ranks");
}

BOOST_AUTO_TEST_CASE(uneven_layout_is_reported) {
  kft::topology::layout l(2, {"x", "x", "y"});
  BOOST_TEST(!l.uniform());
  BOOST_TEST(l.describe() == "2 nodes, uneven: 2+1");
  BOOST_TEST(l.rail(1) == std::vector<int>({1}));  // only node 0 has a local rank 1
  BOOST_TEST(l.local_rank() == 0);
  BOOST_TEST(kft::topology::layout(0, {"x"}).describe() == "1 node x 1 rank");
  BOOST_CHECK_THROW(kft::topology::layout(3, {"x", "y"}), kft::usage_error);
}

BOOST_AUTO_TEST_CASE(exchange_through_a_store) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const int p = 5;
  std::vector<kft::topology::layout> got(p);
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r)
    ranks.emplace_back([&, r] { got[static_cast<std::size_t>(r)] = kft::topology::exchange(*store, r, p, r < 3 ? "h0" : "h1", 10s); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < p; ++r) {
    const auto& l = got[static_cast<std::size_t>(r)];
    BOOST_TEST(l.rank() == r);
    BOOST_TEST(l.describe() == "2 nodes, uneven: 3+2");
    BOOST_TEST(l.local_rank() == (r < 3 ? r : r - 3));
  }
  // A second exchange by the same ranks uses fresh keys (a new host for rank 4 shows up).
  ranks.clear();
  for (int r = 0; r < p; ++r)
    ranks.emplace_back([&, r] { got[static_cast<std::size_t>(r)] = kft::topology::exchange(*store, r, p, r == 4 ? "h2" : "h0", 10s); });
  for (auto& t : ranks) t.join();
  BOOST_TEST(got[0].describe() == "2 nodes, uneven: 4+1");
}

BOOST_AUTO_TEST_CASE(exchange_names_the_ranks_that_never_came) {
  kft::rendezvous::memory_store store;
  try {
    kft::topology::exchange(store, 0, 3, "h0", 200ms);
    BOOST_FAIL("no timeout");
  } catch (const kft::timeout_error& e) {
    const std::string m = e.what();
    BOOST_TEST_MESSAGE(m);
    BOOST_TEST(m.find("ranks 1, 2 of 3 did not publish a host identity within 200 ms") != std::string::npos);
    BOOST_TEST(m.find("rank 0/3 topology exchange #1") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(host_id_honours_the_override) {
  BOOST_TEST(kft::topology::host_id(kft::environment(kft::environment::map_type{{"KFT_HOST_ID", "rack3-n07"}})) == "rack3-n07");
  const auto natural = kft::topology::host_id(kft::environment(kft::environment::map_type{}));
  BOOST_TEST(natural.find('/') != std::string::npos);  // host name / boot id
  BOOST_TEST(natural.size() > 2);
  BOOST_CHECK_THROW(kft::topology::host_id(kft::environment(kft::environment::map_type{{"KFT_HOST_ID", ""}})), kft::config_error);
  BOOST_CHECK_THROW(kft::topology::host_id(kft::environment(kft::environment::map_type{{"KFT_HOST_ID", "a\nb"}})), kft::config_error);
}
