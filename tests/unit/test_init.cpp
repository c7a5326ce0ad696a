// SPDX-License-Identifier: Apache-2.0
// kft::init(): a lone process, ranks as threads over rank 0's TCP store, a launcher's store
// (kftrun's form) and a file store, malformed environments (the step named), the MPI launcher
// rule without MPI, and the report at KFT_LOG_LEVEL=info (not at the default, warn).
#define BOOST_TEST_MODULE init
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kft/init.hpp>
#include <kft/rendezvous/file_store.hpp>
#include <kft/rendezvous/tcp_store_server.hpp>

using namespace std::chrono_literals;
using map = kft::environment::map_type;

namespace {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "kft-init-XXXXXX").string();
    path = ::mkdtemp(t.data());
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

int free_port() {
  kft::rendezvous::tcp_store_server probe({"127.0.0.1", 0, "t", {}});
  return probe.port();
}

// A unique segment name per test run, so parallel runs never share one.
std::string run_id(const std::string& test) { return "init-" + test + "-" + std::to_string(::getpid()); }

// Standard error captured into a file while alive (the report goes there).
struct stderr_capture {
  temp_dir dir;
  int saved = -1;
  stderr_capture() {
    std::fflush(stderr);
    saved = ::dup(2);
    const int fd = ::open((dir.path / "err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string text() {
    std::fflush(stderr);
    std::ifstream in(dir.path / "err");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  ~stderr_capture() {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
  }
};

// Restores the process-wide log threshold that init sets.
struct threshold_guard {
  kft::log::level saved = kft::log::threshold();
  ~threshold_guard() { kft::log::set_threshold(saved); }
};

// `n` ranks as threads, each with the torchrun-style environment `env_of(rank)` and options
// `opt`: every rank allreduces its rank + 1, and the sum must be n(n+1)/2 on all of them.
struct thread_job {
  std::vector<std::string> bootstrap, group, errors;
  std::vector<float> sums;
  std::vector<int> ranks;
  template <class EnvOf, class Opt>
  thread_job(int n, EnvOf env_of, Opt opt) : bootstrap(n), group(n), errors(n), sums(n), ranks(n, -1) {
    std::vector<std::thread> t;
    for (int r = 0; r < n; ++r)
      t.emplace_back([&, r] {
        const auto i = static_cast<std::size_t>(r);
        try {
          kft::init_options o = opt();
          o.env = env_of(r);
          auto job = kft::init(std::move(o));
          ranks[i] = job.rank();
          bootstrap[i] = job.bootstrap();
          group[i] = job.group().description();
          std::vector<float> x(4099, static_cast<float>(job.rank() + 1));
          job.group().allreduce(std::span<float>(x), kft::ops::sum);
          sums[i] = x[4098];
          job.group().barrier();
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& x : t) x.join();
  }
};

map torchrun_env(int rank, int size, const std::string& id) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(size)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(size)},
          {"KFT_RUN_ID", id}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_lone_process_is_one_rank_with_no_store_server) {
  threshold_guard g;
  auto job = kft::init({.env = kft::environment(map{{"KFT_RUN_ID", run_id("lone")}})});
  BOOST_TEST(job.rank() == 0);
  BOOST_TEST(job.size() == 1);
  BOOST_TEST(job.world().backend == "single");
  BOOST_TEST(job.bootstrap() == "single process");
  BOOST_TEST(!job.owns_mpi());
  BOOST_TEST(job.has_group());
  BOOST_TEST(job.group().description() == "shared memory: 1 node x 1 rank");
  BOOST_TEST(job.store()->describe() == "memory store");
  std::vector<double> x{1.5, 2.5};
  job.group().allreduce(std::span<double>(x), kft::ops::sum);
  BOOST_TEST(x[1] == 2.5);
  // The report says who, how they met and the group.
  BOOST_TEST(job.report() ==
             "joined as rank 0 of 1; discovery: single; bootstrap: single process; group: shared memory: 1 node x 1 rank");
  // Move-only: the group travels with the session.
  kft::session moved = std::move(job);
  BOOST_TEST(moved.has_group());
  BOOST_TEST(!job.has_group());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  moved.group().barrier();
}

BOOST_AUTO_TEST_CASE(ranks_as_threads_meet_at_rank_0s_tcp_store) {
  threshold_guard g;
  const int port = free_port();
  const std::string id = run_id("tcp");
  thread_job j(
      3,
      [&](int r) {
        auto m = torchrun_env(r, 3, id);
        m["MASTER_ADDR"] = "127.0.0.1";
        m["MASTER_PORT"] = std::to_string(port);
        m["KFT_RDZV_TOKEN"] = "init-test-token";
        return kft::environment(m);
      },
      [] { return kft::init_options{.group = {.shm = {.pool_bytes = 1u << 20}}}; });
  for (int r = 0; r < 3; ++r) {
    const auto i = static_cast<std::size_t>(r);
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(j.errors[i] == "");
      BOOST_TEST(j.ranks[i] == r);
      BOOST_TEST(j.bootstrap[i] == "kft store hosted by rank 0 at 127.0.0.1:" + std::to_string(port) +
                                       " (torchrun's rendezvous address (c10d or --standalone))");
      BOOST_TEST(j.group[i] == "shared memory: 1 node x 3 ranks");
      BOOST_TEST(j.sums[i] == 6.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(ranks_as_forked_processes_meet_and_share_memory) {
  threshold_guard g;
  const int port = free_port();
  const std::string id = run_id("fork");
  std::vector<pid_t> kids;
  for (int r = 0; r < 2; ++r) {
    const pid_t p = ::fork();
    if (p == 0) {  // a rank: exit 0 when the sum and the bootstrap are right
      int rc = 1;
      try {
        auto m = torchrun_env(r, 2, id);
        m["MASTER_ADDR"] = "127.0.0.1";
        m["MASTER_PORT"] = std::to_string(port);
        m["KFT_RDZV_TOKEN"] = "fork-token";
        auto job = kft::init({.group = {.shm = {.pool_bytes = 1u << 20}}, .env = kft::environment(m)});
        std::vector<float> x(100000, static_cast<float>(r + 1));
        job.group().allreduce(std::span<float>(x), kft::ops::sum);
        const bool ok = job.rank() == r && x[99999] == 3.0f && job.group().description() == "shared memory: 1 node x 2 ranks" &&
                        job.bootstrap().rfind("kft store hosted by rank 0 at 127.0.0.1:", 0) == 0;
        rc = ok ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 2;
      }
      ::_exit(rc);  // the session is gone: the group, the store (rank 0 drained it)
    }
    kids.push_back(p);
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (std::size_t r = 0; r < kids.size(); ++r) {
    int status = -1;
    while (::waitpid(kids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(kids[r], SIGKILL);
        ::waitpid(kids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    BOOST_TEST_CONTEXT("rank " << r) { BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status); }
  }
}

BOOST_AUTO_TEST_CASE(under_kftrun_the_ranks_use_the_launchers_store) {
  threshold_guard g;
  // The launcher's store, as kftrun's agent hosts it, with its token and a round's prefix.
  kft::rendezvous::tcp_store_server server({"127.0.0.1", 0, "kftrun-token", {}});
  const std::string id = run_id("kftrun");
  thread_job j(
      2,
      [&](int r) {
        auto m = torchrun_env(r, 2, id);
        m["TORCHELASTIC_RUN_ID"] = id;
        m["KFT_STORE_ADDR"] = "127.0.0.1";
        m["KFT_STORE_PORT"] = std::to_string(server.port());
        m["KFT_RDZV_TOKEN"] = "kftrun-token";
        m["KFT_STORE_PREFIX"] = "kftrun/" + id + "/r0/user/";
        // An agent under srun --mpi=pmix passes on its PMIx variables: a kftrun worker is
        // never an MPI rank.
        m["PMIX_RANK"] = "0";
        return kft::environment(m);
      },
      [] { return kft::init_options{.group = {.shm = {.pool_bytes = 1u << 20}}}; });
  for (int r = 0; r < 2; ++r) {
    const auto i = static_cast<std::size_t>(r);
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(j.errors[i] == "");
      BOOST_TEST(j.bootstrap[i] == "kftrun's store at 127.0.0.1:" + std::to_string(server.port()));
      BOOST_TEST(j.sums[i] == 3.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_given_file_store_is_used_instead_of_the_launchers) {
  threshold_guard g;
  temp_dir dir;
  auto store = std::make_shared<kft::rendezvous::file_store>(dir.path);
  const std::string id = run_id("file");
  thread_job j(
      2, [&](int r) { return kft::environment(torchrun_env(r, 2, id)); },
      [&] { return kft::init_options{.group = {.shm = {.pool_bytes = 1u << 20}}, .store = store}; });
  for (int r = 0; r < 2; ++r) {
    const auto i = static_cast<std::size_t>(r);
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(j.errors[i] == "");
      BOOST_TEST(j.bootstrap[i].rfind("the given store (file store", 0) == 0, j.bootstrap[i]);
      BOOST_TEST(j.sums[i] == 3.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(without_a_group_init_gives_the_world_and_the_store) {
  threshold_guard g;
  auto job = kft::init({.env = kft::environment(map{}), .make_group = false});
  BOOST_TEST(!job.has_group());
  BOOST_TEST(job.size() == 1);
  job.store()->set("k", "v");
  BOOST_TEST(job.store()->get("k", 1s) == "v");
  BOOST_TEST(job.report().find("group: none (make_group = false)") != std::string::npos, job.report());
}

// The job's timeout: init reads KFT_TIMEOUT from its environment and applies it to the group;
// the session gives it to a transport the program builds itself.
BOOST_AUTO_TEST_CASE(init_applies_the_job_timeout_and_gives_it) {
  threshold_guard g;
  auto job = kft::init({.env = kft::environment(map{{"KFT_RUN_ID", run_id("timeout")}, {"KFT_TIMEOUT", "7s"}})});
  BOOST_TEST((job.timeout() == 7s));
  BOOST_TEST((job.group().get<kft::shm::communicator>()->configuration().timeout == 7s));
  auto plain = kft::init({.env = kft::environment(map{}), .make_group = false});
  BOOST_TEST((plain.timeout() == kft::default_job_timeout));
}

BOOST_AUTO_TEST_CASE(a_malformed_environment_names_the_variable_and_the_step) {
  threshold_guard g;
  auto init_with = [](map m) { return kft::init({.env = kft::environment(std::move(m))}); };
  BOOST_CHECK_EXCEPTION(init_with({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}), kft::config_error,
                        [](const kft::config_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return e.variable() == "RANK" && e.value() == "abc" &&
                                 std::string(e.what()).rfind("kft: init: discover", 0) == 0 &&
                                 std::string(e.what()).find("RANK=\"abc\" is not an integer") != std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(init_with({{"KFT_LOG_LEVEL", "loud"}}), kft::config_error, [](const kft::config_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.variable() == "KFT_LOG_LEVEL" &&
           std::string(e.what()).rfind("kft: init (log): KFT_LOG_LEVEL=\"loud\" is not a log level", 0) == 0;
  });
  BOOST_CHECK_EXCEPTION(init_with({{"KFT_TIMEOUT", "soon"}}), kft::config_error, [](const kft::config_error& e) {
    return e.variable() == "KFT_TIMEOUT" && std::string(e.what()).rfind("kft: init (timeout): KFT_TIMEOUT=", 0) == 0;
  });
  // The group's own setting: the process group step.
  BOOST_CHECK_EXCEPTION(init_with({{"KFT_INTER_NODE", "tcp"}}), kft::config_error, [](const kft::config_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.variable() == "KFT_INTER_NODE" &&
           std::string(e.what()).rfind("kft: init: process group: KFT_INTER_NODE=\"tcp\" is not auto, mpi or gloo", 0) == 0;
  });
  // Several hosts and no token: the rendezvous step's error, as connect_store words it.
  BOOST_CHECK_EXCEPTION(init_with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"GROUP_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}),
                        kft::config_error, [](const kft::config_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return e.variable() == "KFT_RDZV_TOKEN" &&
                                 std::string(e.what()).find("init: rendezvous (store connect): KFT_RDZV_TOKEN=\"\" is not set") !=
                                     std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(a_store_that_never_answers_is_a_rendezvous_timeout) {
  threshold_guard g;
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_CHECK_EXCEPTION(
      (void)kft::init({.env = kft::environment(map{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", std::to_string(free_port())},
                                                   {"KFT_RDZV_TOKEN", "t"}}),
                       .rendezvous_timeout = 300ms}),
      kft::timeout_error, [](const kft::timeout_error& e) {
        BOOST_TEST_MESSAGE(e.what());
        return std::string(e.what()).find("init: rendezvous") != std::string::npos;
      });
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < 10s));  // the deadline held
}

BOOST_AUTO_TEST_CASE(an_mpi_launcher_without_mpi_and_without_an_address_is_refused_saying_what_to_do) {
  threshold_guard g;
  BOOST_TEST(kft::detail::mpi_launcher(kft::environment(map{{"OMPI_COMM_WORLD_SIZE", "2"}})) == "Open MPI's mpirun");
  BOOST_TEST(kft::detail::mpi_launcher(kft::environment(map{{"PMIX_RANK", "0"}, {"SLURM_STEP_ID", "0"}})) ==
             "srun --mpi=pmix");
  BOOST_TEST(kft::detail::mpi_launcher(kft::environment(map{{"PMI_SIZE", "2"}})).rfind("MPICH's mpirun", 0) == 0);
  BOOST_TEST(kft::detail::mpi_launcher(kft::environment(map{{"PMIX_RANK", "0"}, {"TORCHELASTIC_RUN_ID", "x"}})) == "");
  BOOST_TEST(kft::detail::mpi_launcher(kft::environment(map{})) == "");
  // init_mpi = false stands for a build without MPI: the same words, naming the launcher.
  BOOST_CHECK_EXCEPTION(
      (void)kft::init({.env = kft::environment(map{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}),
                       .init_mpi = false}),
      kft::config_error, [](const kft::config_error& e) {
        BOOST_TEST_MESSAGE(e.what());
        const std::string m = e.what();
        return e.variable() == "OMPI_COMM_WORLD_SIZE" && m.find("Open MPI's mpirun started this process") != std::string::npos &&
               m.find("MASTER_ADDR") != std::string::npos && m.find("kftrun") != std::string::npos &&
               m.find("init: rendezvous") != std::string::npos;
      });
  // ... and with a rendezvous address it meets through the store (here one rank: no server).
  auto job = kft::init({.env = kft::environment(map{{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                                     {"KFT_RUN_ID", run_id("ompi1")}}),
                        .init_mpi = false});
  BOOST_TEST(job.world().backend == "mpi");
  BOOST_TEST(job.bootstrap() == "single process");
}

BOOST_AUTO_TEST_CASE(the_report_is_logged_at_info_and_not_at_the_default_warn) {
  threshold_guard g;
  std::string at_info, at_warn, at_default;
  {
    stderr_capture c;
    auto job = kft::init({.env = kft::environment(map{{"KFT_LOG_LEVEL", "info"}, {"KFT_RUN_ID", run_id("log1")}})});
    at_info = c.text();
  }
  {
    stderr_capture c;
    auto job = kft::init({.env = kft::environment(map{{"KFT_LOG_LEVEL", "warn"}, {"KFT_RUN_ID", run_id("log2")}})});
    at_warn = c.text();
  }
  {
    stderr_capture c;
    auto job = kft::init({.env = kft::environment(map{{"KFT_RUN_ID", run_id("log3")}})});
    at_default = c.text();
  }
  BOOST_TEST(at_info ==
             "kft[rank 0] INFO: joined as rank 0 of 1; discovery: single; bootstrap: single process; group: shared "
             "memory: 1 node x 1 rank\n");
  BOOST_TEST(at_warn == "");
  BOOST_TEST(at_default == "");
  BOOST_TEST((kft::log::threshold() == kft::log::level::warn));  // the last init's (the default)
}
