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
