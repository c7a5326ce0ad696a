// SPDX-License-Identifier: Apache-2.0
// Slurm's compressed host lists and task counts.
#define BOOST_TEST_MODULE kft_slurm_lists
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include <kft/discovery/slurm_lists.hpp>

using strings = std::vector<std::string>;
using ints = std::vector<int>;
namespace slurm = kft::slurm;

BOOST_AUTO_TEST_CASE(plain_and_single_names) {
  BOOST_TEST(slurm::expand_hostlist("node1") == strings({"node1"}), boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_hostlist("a,b,c") == strings({"a", "b", "c"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(ranges_keep_zero_padding_and_order) {
  BOOST_TEST(slurm::expand_hostlist("node[01-03,07],gpu-a[1-2]") ==
                 strings({"node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"}),
             boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_hostlist("n[8-11]") == strings({"n8", "n9", "n10", "n11"}), boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_hostlist("n[098-101]") == strings({"n098", "n099", "n100", "n101"}),
             boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_hostlist("x[3]") == strings({"x3"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(several_brackets_expand_as_a_product) {
  BOOST_TEST(slurm::expand_hostlist("r[1-2]n[1-2]-ib") == strings({"r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(malformed_host_lists_name_the_variable) {
  for (const char* bad : {"", "node[1-3", "node1-3]", "node[]", "node[a-b]", "node[3-1]", "node[1,,2]", "a,,b",
                          "node[1-2[3]]", ",a", "n[0-99999999]"}) {
    BOOST_TEST_INFO("list \"" << bad << "\"");
    BOOST_CHECK_EXCEPTION(slurm::expand_hostlist(bad, "SLURM_STEP_NODELIST"), kft::config_error,
                          [&](const kft::config_error& e) {
                            return e.variable() == "SLURM_STEP_NODELIST" && e.value() == bad;
                          });
  }
}

// Found by tests/fuzz/slurm_lists: names without brackets after a full range went past the cap.
BOOST_AUTO_TEST_CASE(the_entry_cap_counts_plain_names_too) {
  BOOST_TEST(slurm::expand_hostlist("n[0-1048574],last").size() == slurm::max_hostlist_entries);
  for (const char* over : {"[0-1048575]0,1", "n[0-1048575],a", "a,b,n[0-1048574]"}) {
    BOOST_TEST_INFO("list \"" << over << "\"");
    BOOST_CHECK_EXCEPTION(slurm::expand_hostlist(over, "SLURM_NODELIST"), kft::config_error,
                          [&](const kft::config_error& e) {
                            return e.variable() == "SLURM_NODELIST" &&
                                   std::string(e.what()).find("more than 1048576 hosts") != std::string::npos;
                          });
  }
}

// The entry cap alone let a long name before a big range ask for gigabytes (1000 characters x
// 2^20 hosts = 2 GB, seen while writing tests/fuzz/slurm_lists): the names' total size is
// capped too.
BOOST_AUTO_TEST_CASE(expansions_are_capped_in_bytes_not_only_in_entries) {
  const std::string prefix(100, 'x');  // 2^20 names of 107 characters: 107 MiB
  for (const std::string& big : {prefix + "[0-1048575]",
                                 "r[0-1023]" + std::string(70000, 'y'),  // the text after a bracket, per name
                                 "r[0-1023]n[0-1023]-" + prefix}) {
    BOOST_TEST_INFO("list of " << big.size() << " characters");
    BOOST_CHECK_EXCEPTION(slurm::expand_hostlist(big, "SLURM_JOB_NODELIST"), kft::config_error,
                          [&](const kft::config_error& e) {
                            return e.variable() == "SLURM_JOB_NODELIST" &&
                                   std::string(e.what()).find("MiB") != std::string::npos;
                          });
  }
  // Real lists, even a million short names, are still expanded.
  const auto hosts = slurm::expand_hostlist("nid[000000-999999]");
  BOOST_TEST(hosts.size() == 1000000u);
  BOOST_TEST(hosts.back() == "nid999999");
}

BOOST_AUTO_TEST_CASE(task_counts) {
  BOOST_TEST(slurm::expand_tasks_per_node("4") == ints({4}), boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_tasks_per_node("2(x3),1") == ints({2, 2, 2, 1}), boost::test_tools::per_element());
  BOOST_TEST(slurm::expand_tasks_per_node("1,3(x2)") == ints({1, 3, 3}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(malformed_task_counts) {
  for (const char* bad : {"", "x", "2(x0)", "(x3)", "2(3)", "2(x3", "2,,1", "-1", "2(x-1)", "2(xa)"}) {
    BOOST_TEST_INFO("list \"" << bad << "\"");
    BOOST_CHECK_EXCEPTION(slurm::expand_tasks_per_node(bad, "SLURM_TASKS_PER_NODE"), kft::config_error,
                          [&](const kft::config_error& e) {
                            return e.variable() == "SLURM_TASKS_PER_NODE" && e.value() == bad;
                          });
  }
}
