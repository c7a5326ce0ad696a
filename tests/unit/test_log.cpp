// SPDX-License-Identifier: Apache-2.0
// kft/core/log.hpp: the line format, level names, the threshold and KFT_LOG_LEVEL.
#define BOOST_TEST_MODULE kft_log
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>

#include <kft/core/log.hpp>

namespace lg = kft::log;

namespace {
kft::environment env_with_level(std::string value) {
  return kft::environment(kft::environment::map_type{{"KFT_LOG_LEVEL", std::move(value)}});
}

// Runs `f` with standard error sent to a temporary file; returns what was written.
template <class F>
std::string captured_stderr(F f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  BOOST_REQUIRE(tmp != nullptr);
  const int saved = ::dup(2);
  ::dup2(::fileno(tmp), 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(tmp);
  std::string out;
  char buf[256];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

// Restores the process-wide threshold after a test case changes it.
struct threshold_guard {
  lg::level saved = lg::threshold();
  ~threshold_guard() { lg::set_threshold(saved); }
};
}  // namespace

BOOST_AUTO_TEST_CASE(format_is_who_level_message_newline) {
  BOOST_TEST(lg::format(lg::level::warn, "kftrun[node 1]", "restarting all workers") ==
             "kftrun[node 1] WARN: restarting all workers\n");
  BOOST_TEST(lg::format(lg::level::info, "kftrun", "round 0: 1 node(s)") == "kftrun INFO: round 0: 1 node(s)\n");
  BOOST_TEST(lg::format(lg::level::error, "kft-info", "bad") == "kft-info ERROR: bad\n");
  BOOST_TEST(lg::format(lg::level::debug, "kft[rank 0]", "x") == "kft[rank 0] DEBUG: x\n");
  // A message that already ends in a newline gets no second one.
  BOOST_TEST(lg::format(lg::level::info, "kftrun", "done\n") == "kftrun INFO: done\n");
}

BOOST_AUTO_TEST_CASE(names_and_tags) {
  BOOST_TEST(lg::name(lg::level::error) == "error");
  BOOST_TEST(lg::name(lg::level::warn) == "warn");
  BOOST_TEST(lg::name(lg::level::info) == "info");
  BOOST_TEST(lg::name(lg::level::debug) == "debug");
  BOOST_TEST(lg::tag(lg::level::error) == "ERROR");
  BOOST_TEST(lg::tag(lg::level::warn) == "WARN");
  BOOST_TEST(lg::tag(lg::level::info) == "INFO");
  BOOST_TEST(lg::tag(lg::level::debug) == "DEBUG");
}

BOOST_AUTO_TEST_CASE(parse_accepts_the_four_levels_in_any_case) {
  BOOST_TEST((lg::parse("error") == lg::level::error));
  BOOST_TEST((lg::parse("WARN") == lg::level::warn));
  BOOST_TEST((lg::parse("warning") == lg::level::warn));
  BOOST_TEST((lg::parse("Info") == lg::level::info));
  BOOST_TEST((lg::parse("debug") == lg::level::debug));
  for (const char* bad : {"", "verbose", "trace", "2", "info ", " debug", "errors"})
    BOOST_TEST(!lg::parse(bad).has_value(), "parse(\"" << bad << "\") is not a level");
  // Every level's name parses back to it.
  for (auto l : {lg::level::error, lg::level::warn, lg::level::info, lg::level::debug})
    BOOST_TEST((lg::parse(lg::name(l)) == l));
}

BOOST_AUTO_TEST_CASE(threshold_decides_what_is_enabled) {
  threshold_guard g;
  lg::set_threshold(lg::level::warn);
  BOOST_TEST((lg::threshold() == lg::level::warn));
  BOOST_TEST(lg::enabled(lg::level::error));
  BOOST_TEST(lg::enabled(lg::level::warn));
  BOOST_TEST(!lg::enabled(lg::level::info));
  BOOST_TEST(!lg::enabled(lg::level::debug));
  lg::set_threshold(lg::level::debug);
  BOOST_TEST(lg::enabled(lg::level::debug));
  lg::set_threshold(lg::level::error);
  BOOST_TEST(lg::enabled(lg::level::error));
  BOOST_TEST(!lg::enabled(lg::level::warn));
}

BOOST_AUTO_TEST_CASE(write_goes_to_stderr_only_at_or_above_the_threshold) {
  threshold_guard g;
  lg::set_threshold(lg::level::info);
  const std::string out = captured_stderr([] {
    lg::debug("t", "hidden debug");
    lg::info("t", "shown info");
    lg::warn("t", "shown warn");
    lg::error("t", "shown error");
  });
  BOOST_TEST(out == "t INFO: shown info\nt WARN: shown warn\nt ERROR: shown error\n");
  lg::set_threshold(lg::level::error);
  BOOST_TEST(captured_stderr([] { lg::warn("t", "hidden"); lg::error("t", "only this"); }) == "t ERROR: only this\n");
}

BOOST_AUTO_TEST_CASE(threshold_from_reads_KFT_LOG_LEVEL) {
  BOOST_TEST((lg::threshold_from(kft::environment{}, lg::level::info) == lg::level::info));
  BOOST_TEST((lg::threshold_from(kft::environment{}, lg::level::warn) == lg::level::warn));
  BOOST_TEST((lg::threshold_from(env_with_level(""), lg::level::warn) == lg::level::warn));  // empty = unset
  BOOST_TEST((lg::threshold_from(env_with_level("debug"), lg::level::warn) == lg::level::debug));
  BOOST_TEST((lg::threshold_from(env_with_level("ERROR"), lg::level::info) == lg::level::error));
  BOOST_TEST((lg::threshold_from(env_with_level("warning"), lg::level::info) == lg::level::warn));
  // Another variable does not count.
  BOOST_TEST((lg::threshold_from(kft::environment(kft::environment::map_type{{"KFT_LOGLEVEL", "debug"}}),
                                lg::level::info) == lg::level::info));
}

BOOST_AUTO_TEST_CASE(threshold_from_refuses_a_bad_value_naming_the_variable) {
  bool thrown = false;
  try {
    (void)lg::threshold_from(env_with_level("loud"), lg::level::info);
  } catch (const kft::config_error& e) {
    thrown = true;
    BOOST_TEST(e.variable() == "KFT_LOG_LEVEL");
    BOOST_TEST(e.value() == "loud");
    const std::string what = e.what();
    BOOST_TEST(what.find("KFT_LOG_LEVEL=\"loud\"") != std::string::npos, what);
    BOOST_TEST(what.find("error, warn, info or debug") != std::string::npos, what);
  }
  BOOST_TEST(thrown, "KFT_LOG_LEVEL=loud is refused");
}
