// SPDX-License-Identifier: Apache-2.0
// CPU binding of local ranks with hwloc: the plan covers the cores evenly, and applying it binds
// the process (checked in forked children, so the test process keeps its own binding).
#define BOOST_TEST_MODULE kft_binding
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <kft/topology/hwloc.hpp>

namespace {
int count_cores() { return kft::topology::query_host().cores; }
}  // namespace

BOOST_AUTO_TEST_CASE(core_policy_gives_disjoint_even_shares) {
  const int cores = count_cores();
  BOOST_REQUIRE(cores >= 1);
  const int ranks = cores;  // one core each
  int total = 0;
  std::string seen;
  for (int r = 0; r < ranks; ++r) {
    const auto b = kft::topology::plan_binding(r, ranks, kft::topology::bind_policy::core);
    BOOST_TEST_MESSAGE("rank " << r << ": " << b.cpuset << " (" << b.reason << ")");
    BOOST_TEST(!b.cpuset.empty());
    BOOST_TEST(b.pus >= 1);
    BOOST_TEST(seen.find("[" + b.cpuset + "]") == std::string::npos);  // no two ranks share a core
    seen += "[" + b.cpuset + "]";
    total += b.pus;
  }
  BOOST_TEST(total == kft::topology::query_host().pus);  // every PU used exactly once
}

BOOST_AUTO_TEST_CASE(more_ranks_than_cores_wrap_around) {
  const int cores = count_cores();
  const auto first = kft::topology::plan_binding(0, 2 * cores, kft::topology::bind_policy::core);
  const auto wrapped = kft::topology::plan_binding(cores, 2 * cores, kft::topology::bind_policy::core);
  BOOST_TEST(first.pus >= 1);
  BOOST_TEST(wrapped.pus >= 1);
}

BOOST_AUTO_TEST_CASE(applying_binds_the_process) {
  const auto plan = kft::topology::plan_binding(0, count_cores(), kft::topology::bind_policy::core);
  const pid_t child = fork();
  if (child == 0) {
    int rc = 1;
    try {
      const auto b = kft::topology::bind_local_rank(0, count_cores(), kft::topology::bind_policy::core);
      rc = b.applied && kft::topology::query_host().bound_cpuset == plan.cpuset ? 0 : 3;
    } catch (...) {
      rc = 2;
    }
    _exit(rc);
  }
  int status = 0;
  BOOST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);  // 3: bound elsewhere than planned
}

BOOST_AUTO_TEST_CASE(policies_and_errors) {
  const auto none = kft::topology::plan_binding(0, 1, kft::topology::bind_policy::none);
  BOOST_TEST(!none.applied);
  BOOST_TEST(none.cpuset.empty());
  const auto numa = kft::topology::plan_binding(0, 1, kft::topology::bind_policy::numa);
  BOOST_TEST(numa.pus == kft::topology::query_host().pus);  // one NUMA node here: all of it
  BOOST_CHECK_THROW(kft::topology::plan_binding(2, 2, kft::topology::bind_policy::core), kft::usage_error);
  BOOST_CHECK_THROW(kft::topology::plan_binding(0, 1, kft::topology::bind_policy::gpu), kft::usage_error);
  const auto nogpu = kft::topology::plan_binding(0, 1, kft::topology::bind_policy::gpu, "0000:ff:1f.7");
  BOOST_TEST(nogpu.cpuset.empty());  // no such device: left alone, with the reason
  BOOST_TEST(nogpu.reason.find("0000:ff:1f.7") != std::string::npos);
  using kft::environment;
  BOOST_TEST((kft::topology::bind_policy_from_env(environment(environment::map_type{{"KFT_BIND", "numa"}})) ==
              kft::topology::bind_policy::numa));
  BOOST_CHECK_THROW(kft::topology::bind_policy_from_env(environment(environment::map_type{{"KFT_BIND", "socket"}})),
                    kft::config_error);
}
