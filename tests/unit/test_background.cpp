// SPDX-License-Identifier: Apache-2.0
// kft/core/background.hpp: clean-up on threads of its own (NCCL's abort after a deadline):
// the caller goes on at once, `wait` sees the end, exit waits within each job's limit and
// names the jobs past it.
#define BOOST_TEST_MODULE kft_background
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <kft/core/background.hpp>

using namespace std::chrono_literals;
using kft::detail::background;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct child_result {
  int status = -1;
  double seconds = 0;
  std::string err;
};

// Forks; the child hands `jobs` to the background with stderr in a file, then calls exit(0),
// which runs the process's exit handlers. Returns how the child ended and how long it took.
template <class F>
child_result exit_with_jobs(F jobs) {
  BOOST_REQUIRE(kft::wait_for_background_cleanup(10s));  // the child must not inherit a running job
  char path[] = "/tmp/kft-background-XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_REQUIRE(fd >= 0);
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fd, 2);
    jobs();
    std::exit(0);
  }
  child_result r;
  ::waitpid(pid, &r.status, 0);
  r.seconds = seconds_since(t0);
  ::close(fd);
  r.err = read_file(path);
  ::unlink(path);
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_caller_goes_on_while_the_job_runs) {
  std::atomic<bool> release{false};
  std::atomic<bool> ended{false};
  const auto t0 = std::chrono::steady_clock::now();
  background::instance().run("a held job", 10s, [&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    ended = true;
  });
  BOOST_TEST(seconds_since(t0) < 1.0);
  BOOST_TEST(kft::background_cleanup_in_flight() == 1u);
  BOOST_TEST(!kft::wait_for_background_cleanup(50ms));
  BOOST_TEST(!ended.load());
  release = true;
  BOOST_TEST(kft::wait_for_background_cleanup(10s));
  BOOST_TEST(ended.load());
  BOOST_TEST(kft::background_cleanup_in_flight() == 0u);
}

BOOST_AUTO_TEST_CASE(what_a_job_holds_goes_before_wait_returns) {
  // The NCCL abort keeps the communicator's state alive until the abort has ended.
  auto state = std::make_shared<int>(7);
  std::weak_ptr<int> seen = state;
  std::atomic<int> read{0};
  background::instance().run("a job holding state", 10s, [&read, keep = std::move(state)] { read = *keep; });
  BOOST_TEST(kft::wait_for_background_cleanup(10s));
  BOOST_TEST(read.load() == 7);
  BOOST_TEST(seen.expired());
}

BOOST_AUTO_TEST_CASE(many_jobs_at_once_all_end) {
  std::atomic<int> ran{0};
  for (int i = 0; i < 32; ++i)
    background::instance().run("job " + std::to_string(i), 10s, [&ran] {
      std::this_thread::sleep_for(2ms);
      ran.fetch_add(1);
    });
  BOOST_TEST(kft::wait_for_background_cleanup(10s));
  BOOST_TEST(ran.load() == 32);
}

BOOST_AUTO_TEST_CASE(a_job_that_throws_is_named_and_the_process_goes_on) {
  const auto r = exit_with_jobs([] {
    background::instance().run("a failing clean-up", 5s, [] { throw std::runtime_error("boom"); });
    (void)kft::wait_for_background_cleanup(5s);
  });
  BOOST_TEST(WIFEXITED(r.status));
  BOOST_TEST(WEXITSTATUS(r.status) == 0);
  BOOST_TEST(r.err.find("a failing clean-up failed: boom") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(exit_waits_for_a_job_within_its_limit) {
  char path[] = "/tmp/kft-background-done-XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_REQUIRE(fd >= 0);
  ::close(fd);
  const std::string done = path;
  const auto r = exit_with_jobs([&done] {
    background::instance().run("a slow clean-up", 10s, [done] {
      std::this_thread::sleep_for(300ms);
      std::ofstream(done) << "ended";
    });
  });
  BOOST_TEST(WIFEXITED(r.status));
  BOOST_TEST(WEXITSTATUS(r.status) == 0);
  BOOST_TEST(read_file(done) == "ended");  // exit did not cut it short
  BOOST_TEST(r.seconds >= 0.3);
  BOOST_TEST(r.err.find("not waited for") == std::string::npos, r.err);
  ::unlink(path);
}

BOOST_AUTO_TEST_CASE(exit_leaves_a_job_past_its_limit_and_names_it) {
  const auto r = exit_with_jobs([] {
    background::instance().run("a stuck clean-up", 200ms, [] { std::this_thread::sleep_for(30s); });
  });
  BOOST_TEST(WIFEXITED(r.status));
  BOOST_TEST(WEXITSTATUS(r.status) == 0);
  BOOST_TEST(r.seconds >= 0.2);
  BOOST_TEST(r.seconds < 10.0);  // not the job's 30 s
  BOOST_TEST(r.err.find("not waited for: a stuck clean-up") != std::string::npos, r.err);
}
