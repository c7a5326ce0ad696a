// SPDX-License-Identifier: Apache-2.0
// Strict integer parsing of launcher variables, and the error message format.
#define BOOST_TEST_MODULE kft_parse
#include <boost/test/unit_test.hpp>

#include <string>

#include <kft/kft.hpp>

namespace {
kft::environment env_of(std::string name, std::string value) {
  return kft::environment(kft::environment::map_type{{std::move(name), std::move(value)}});
}

// Returns the config_error's message, failing the test if none is thrown.
std::string error_of(const kft::environment& env, const char* name) {
  try {
    (void)kft::env_int(env, name);
  } catch (const kft::config_error& e) {
    BOOST_TEST(e.variable() == name);
    return e.what();
  }
  BOOST_FAIL("no config_error for " << name);
  return {};
}
}  // namespace

BOOST_AUTO_TEST_CASE(accepts_plain_decimal) {
  BOOST_TEST(*kft::env_int(env_of("N", "0"), "N") == 0);
  BOOST_TEST(*kft::env_int(env_of("N", "17"), "N") == 17);
  BOOST_TEST(*kft::env_int(env_of("N", "2147483647"), "N") == 2147483647);
  BOOST_TEST(!kft::env_int(env_of("N", "1"), "OTHER").has_value());
}

BOOST_AUTO_TEST_CASE(rejects_garbage_with_variable_and_value) {
  for (const char* bad : {"abc", "", " 3", "3 ", "+3", "3x", "0x10", "1e3", "3.0"}) {
    const std::string msg = error_of(env_of("RANK", bad), "RANK");
    BOOST_TEST_INFO("value \"" << bad << "\" gave: " << msg);
    BOOST_TEST(msg.find("RANK=\"" + std::string(bad) + "\"") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(rejects_negative_and_overflow) {
  BOOST_TEST(error_of(env_of("RANK", "-1"), "RANK").find("negative") != std::string::npos);
  BOOST_TEST(error_of(env_of("RANK", "99999999999999999999999"), "RANK").find("out of range") != std::string::npos);
  BOOST_TEST(error_of(env_of("RANK", "2147483648"), "RANK").find("above the maximum") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(required_variable_missing) {
  BOOST_CHECK_EXCEPTION((void)kft::env_int_required(kft::environment{}, "WORLD_SIZE", 1), kft::config_error,
                        [](const kft::config_error& e) {
                          return e.variable() == "WORLD_SIZE" &&
                                 std::string(e.what()).find("not set") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(error_messages_name_rank_operation_and_sequence) {
  kft::error_site site;
  site.rank = 3;
  site.world_size = 8;
  site.operation = "allreduce";
  site.sequence = 41;
  kft::timeout_error e("timed out after 30 s waiting for rank 5", site);
  BOOST_TEST(std::string(e.what()) == "kft: rank 3/8 allreduce #41: timed out after 30 s waiting for rank 5");
  BOOST_TEST(e.detail() == "timed out after 30 s waiting for rank 5");
  BOOST_TEST(*e.sequence() == 41u);
  const kft::error& base = e;  // one hierarchy
  BOOST_TEST(base.rank() == 3);

  kft::config_error c("RANK", "abc", "is not an integer");
  BOOST_TEST(std::string(c.what()) == "kft: discover: RANK=\"abc\" is not an integer");
}

BOOST_AUTO_TEST_CASE(inline_namespace_encodes_configuration) {
  const std::string ns = KFT_ABI_NAMESPACE_STRING;
  const std::string expect = "v" + std::to_string(KFT_VERSION_MAJOR) + "_" + std::to_string(KFT_VERSION_MINOR) +
                             "_mpi" + std::to_string(KFT_WITH_MPI) + "_cuda" + std::to_string(KFT_WITH_CUDA) +
                             "_nccl" + std::to_string(KFT_WITH_NCCL) + "_hwloc" + std::to_string(KFT_WITH_HWLOC) +
                             "_gloo" + std::to_string(KFT_WITH_GLOO);
  BOOST_TEST(ns == expect);
}

// KFT_TIMEOUT is read from the environment given, never the process's; configs hold the
// constant default until a maker applies the job's, and a value the program set stays.
BOOST_AUTO_TEST_CASE(the_job_timeout_comes_from_the_environment_given) {
  using namespace std::chrono_literals;
  BOOST_TEST((kft::job_timeout(kft::environment()) == kft::default_job_timeout));
  BOOST_TEST((kft::job_timeout(env_of("KFT_TIMEOUT", "")) == kft::default_job_timeout));
  BOOST_TEST((kft::job_timeout(env_of("KFT_TIMEOUT", "90")) == 90s));
  BOOST_TEST((kft::job_timeout(env_of("KFT_TIMEOUT", "1500ms")) == 1500ms));
  BOOST_TEST((kft::timeouts(env_of("KFT_TIMEOUT", "1s")).report_grace == 1s));
  try {
    (void)kft::job_timeout(env_of("KFT_TIMEOUT", "7x"));
    BOOST_FAIL("no config_error for KFT_TIMEOUT=7x");
  } catch (const kft::config_error& e) {
    BOOST_TEST(e.variable() == "KFT_TIMEOUT");
    BOOST_TEST(e.value() == "7x");
  }
  const auto job = kft::derived_timeouts::from(4s);
  std::chrono::milliseconds at_default = kft::default_job_timeout, chosen = 60s;
  std::chrono::milliseconds grace = kft::default_timeouts.report_grace;
  kft::apply_timeout(at_default, job);
  kft::apply_timeout(chosen, job);
  kft::apply_timeout(grace, kft::derived_timeouts::from(500ms), &kft::derived_timeouts::report_grace);
  BOOST_TEST((at_default == 4s));
  BOOST_TEST((chosen == 60s));
  BOOST_TEST((grace == 500ms));
}
