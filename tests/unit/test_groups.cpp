// SPDX-License-Identifier: Apache-2.0
// Process groups without a launcher: the factory's choice, the type-erased group, async work's
// rules (order, the destruction rule, deadlines), and errors that place a group in the job.
#define BOOST_TEST_MODULE kft_groups
#include <boost/test/unit_test.hpp>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <kft/async/engine.hpp>
#include <kft/group/factory.hpp>
#include <kft/group/shrink.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/tcp_store_server.hpp>

using namespace std::chrono_literals;

namespace {
kft::world_info place(int rank, int size, int local_size, int nodes) {
  kft::world_info w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank % local_size;
  w.local_size = local_size;
  w.node_rank = rank / local_size;
  w.node_count = nodes;
  w.hostname = "host" + std::to_string(rank / local_size);
  w.backend = "test";
  return w;
}
}  // namespace

BOOST_AUTO_TEST_CASE(one_node_gets_the_shared_memory_group) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const kft::environment env(kft::environment::map_type{{"KFT_RUN_ID", "groups-test"}});
  std::vector<std::string> what(3);
  std::vector<float> sums(3);
  std::vector<std::thread> t;
  for (int r = 0; r < 3; ++r)
    t.emplace_back([&, r] {
      auto pg = kft::group::make_process_group(place(r, 3, 3, 1), store, {}, env);
      what[static_cast<std::size_t>(r)] = pg.description();
      std::vector<float> x(1000, static_cast<float>(r + 1));
      auto w = pg.allreduce_async(std::span<float>(x), kft::ops::sum);
      w.wait();
      sums[static_cast<std::size_t>(r)] = x[999];
      if (pg.get<kft::shm::communicator>() == nullptr) what[static_cast<std::size_t>(r)] = "not shm";
    });
  for (auto& x : t) x.join();
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST(what[static_cast<std::size_t>(r)] == "shared memory: 1 node x 3 ranks");
    BOOST_TEST(sums[static_cast<std::size_t>(r)] == 6.0f);
  }
}

#if KFT_WITH_GLOO
// Several nodes and no MPI: shared memory per node + Gloo between them, and the group says so.
BOOST_AUTO_TEST_CASE(several_nodes_without_mpi_get_the_gloo_group) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::vector<std::string> what(4);
  std::vector<float> sums(4);
  std::vector<std::thread> t;
  for (int r = 0; r < 4; ++r)
    t.emplace_back([&, r] {
      const kft::environment env(kft::environment::map_type{{"KFT_RUN_ID", "groups-gloo"},
                                                            {"KFT_HOST_ID", "host" + std::to_string(r / 2)}});
      auto pg = kft::group::make_process_group(place(r, 4, 2, 2), store, {}, env);
      what[static_cast<std::size_t>(r)] = pg.description();
      std::vector<float> x(5000, static_cast<float>(r + 1));
      pg.allreduce(std::span<float>(x), kft::ops::sum);
      sums[static_cast<std::size_t>(r)] = x[4999];
    });
  for (auto& x : t) x.join();
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST_MESSAGE(what[static_cast<std::size_t>(r)]);
    BOOST_TEST(what[static_cast<std::size_t>(r)] ==
               "shared memory per node + Gloo between nodes (TCP on lo 127.0.0.1 (the route to 127.0.0.1)): 2 nodes x 2 ranks");
    BOOST_TEST(sums[static_cast<std::size_t>(r)] == 10.0f);
  }
}

// What building the group costs the store: the same number of requests per rank for 3 nodes as
// for 8 (2 ranks each). Every read of "everyone's" records (host identities, Gloo's addresses,
// the members' places) is one multi_get, not one get per rank; a regression to per-rank reads
// shows as a count that grows with the job.
BOOST_AUTO_TEST_CASE(building_the_gloo_group_costs_the_same_store_requests_per_rank_at_any_size) {
  kft::rendezvous::tcp_store_server::options serve;
  serve.token = "t";
  serve.log = [](const std::string&) {};
  kft::rendezvous::tcp_store_server server(serve);
  std::vector<double> per_rank;
  for (const int nodes : {3, 8}) {
    const int size = 2 * nodes;
    std::vector<std::string> errors(static_cast<std::size_t>(size));
    std::vector<std::uint64_t> sent(static_cast<std::size_t>(size));
    std::vector<std::thread> t;
    const auto before = server.requests();
    for (int r = 0; r < size; ++r)
      t.emplace_back([&, r] {
        try {
          kft::rendezvous::tcp_store::options so;
          so.host = "127.0.0.1";
          so.port = server.port();
          so.token = "t";
          so.name = "rank " + std::to_string(r);
          auto client = std::make_shared<kft::rendezvous::tcp_store>(so);
          auto scoped = std::make_shared<kft::rendezvous::prefix_store>(client, "n" + std::to_string(nodes) + "/");
          const kft::environment env(kft::environment::map_type{
              {"KFT_RUN_ID", "groups-cost-" + std::to_string(nodes)}, {"KFT_HOST_ID", "host" + std::to_string(r / 2)}});
          auto pg = kft::group::make_process_group(place(r, size, 2, nodes), scoped, {}, env);
          sent[static_cast<std::size_t>(r)] = client->requests();
          std::vector<float> x(100, 1.0f);
          pg.allreduce(std::span<float>(x), kft::ops::sum);
          if (x[99] != static_cast<float>(size)) errors[static_cast<std::size_t>(r)] = "wrong sum";
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& x : t) x.join();
    for (const auto& e : errors) BOOST_TEST(e.empty(), e);
    const double mean = static_cast<double>(server.requests() - before) / size;
    const auto most = *std::max_element(sent.begin(), sent.end());
    BOOST_TEST_MESSAGE(nodes << " nodes x 2 ranks: " << mean << " store requests per rank on average, at most " << most
                             << " from one rank");
    BOOST_TEST(most <= 16u);  // a handful, whatever the size
    per_rank.push_back(mean);
  }
  BOOST_TEST(per_rank[1] <= per_rank[0]);  // 8 nodes cost no rank more than 3 do
}

BOOST_AUTO_TEST_CASE(an_inter_node_choice_that_cannot_hold_is_refused) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  for (const char* v : {"mpi", "carrier-pigeon"}) {
    const kft::environment env(kft::environment::map_type{{"KFT_INTER_NODE", v}});
    BOOST_CHECK_EXCEPTION(kft::group::make_process_group(place(1, 4, 2, 2), store, {}, env), kft::config_error,
                          [&](const kft::config_error& e) {
                            BOOST_TEST_MESSAGE(e.what());
                            return e.variable() == "KFT_INTER_NODE" && e.value() == v;
                          });
  }
}
#else
BOOST_AUTO_TEST_CASE(several_nodes_without_mpi_are_refused_naming_why) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  BOOST_CHECK_EXCEPTION(kft::group::make_process_group(place(1, 4, 2, 2), store, {}, kft::environment{}),
                        kft::config_error, [](const kft::config_error& e) {
                          const std::string m = e.what();
                          BOOST_TEST_MESSAGE(m);
                          return m.find("rank 1/4 process group") != std::string::npos &&
                                 m.find("spans 2 nodes and has no inter-node CPU transport") != std::string::npos;
                        });
}
#endif

BOOST_AUTO_TEST_CASE(malformed_settings_are_refused_by_the_factory) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const kft::environment env(kft::environment::map_type{{"KFT_SHM_SMALL_BYTES", "lots"}});
  BOOST_CHECK_EXCEPTION(kft::group::make_process_group(place(0, 1, 1, 1), store, {}, env), kft::config_error,
                        [](const kft::config_error& e) { return e.variable() == "KFT_SHM_SMALL_BYTES"; });
}

// KFT_TIMEOUT: the transports' configs default to kft's constant; the groups' makers apply the
// job's from the environment they are given, and a timeout the program set stays.
BOOST_AUTO_TEST_CASE(the_group_makers_apply_the_job_timeout) {
  const kft::environment none(kft::environment::map_type{{"KFT_RUN_ID", "timeout-test"}});
  const kft::environment seven = none.with("KFT_TIMEOUT", "7s");
  BOOST_TEST((kft::shm::config{}.timeout == kft::default_job_timeout));
  BOOST_TEST((kft::group::shm_config(none).timeout == kft::default_job_timeout));
  BOOST_TEST((kft::group::shm_config(seven).timeout == 7s));
  kft::shm::config mine;
  mine.timeout = 60s;
  BOOST_TEST((kft::group::shm_config(seven, mine).timeout == 60s));
  BOOST_CHECK_EXCEPTION(kft::group::shm_config(none.with("KFT_TIMEOUT", "soon")), kft::config_error,
                        [](const kft::config_error& e) { return e.variable() == "KFT_TIMEOUT" && e.value() == "soon"; });
  {
    auto pg = kft::group::make_process_group(place(0, 1, 1, 1), std::make_shared<kft::rendezvous::memory_store>(), {},
                                             seven);
    BOOST_TEST((pg.get<kft::shm::communicator>()->configuration().timeout == 7s));
  }
  {
    kft::group::group_options o;
    o.timeout = 9s;
    auto pg = kft::group::make_process_group(place(0, 1, 1, 1), std::make_shared<kft::rendezvous::memory_store>(), o,
                                             seven);
    BOOST_TEST((pg.get<kft::shm::communicator>()->configuration().timeout == 9s));
  }
#if KFT_WITH_MPI
  BOOST_TEST((kft::mpi::config{}.timeout == kft::default_job_timeout));
  BOOST_TEST((kft::group::mpi_group_config_from(seven).mpi.timeout == 7s));
  BOOST_TEST((kft::group::mpi_group_config_from(seven).shm.timeout == 7s));
#endif
#if KFT_WITH_GLOO
  const auto g = kft::group::gloo_group_config_from(none.with("KFT_TIMEOUT", "1s"));
  BOOST_TEST((g.gloo.timeout == 1s));
  BOOST_TEST((g.gloo.report_grace == 1s));  // min(T, 2 s)
  BOOST_TEST((g.shm.timeout == 1s));
#endif
}

// KFT_SHM_TUNING: a machine's measured sizes and crossovers (bench/scripts/tune_shm.py) reach every
// communicator the groups build; its rows go before kft's defaults; KFT_SHM_* still win.
namespace {
std::string write_temp(const std::string& text) {
  char path[] = "/tmp/kft-tuning-XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_tuning_file_sets_sizes_and_crossovers_before_the_defaults) {
  const std::string path = write_temp(
      "# measured on a test machine\n"
      "staging_bytes 1M\n"
      "small_bytes 64K   # the one-shot slot\n"
      "copy_streaming_bytes 2M\n"
      "\n"
      "crossover allreduce ranks=2-4 oversubscribed=0 zero_copy=any one_shot_max=32K\n"
      "crossover broadcast ranks=5-* one_shot_max=4096\n");
  const auto cfg = kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_TUNING", path}}));
  BOOST_TEST(cfg.staging_bytes == 1u << 20);
  BOOST_TEST(cfg.small_bytes == 64u << 10);
  BOOST_TEST(cfg.streaming_bytes == kft::shm::config{}.streaming_bytes);
  BOOST_TEST(cfg.copy_streaming_bytes == 2u << 20);
  BOOST_TEST(cfg.crossovers.size() == std::size(kft::shm::default_crossovers) + 2);
  BOOST_TEST(cfg.crossovers[1].min_ranks == 5);
  BOOST_TEST(cfg.crossovers[1].max_ranks == 1 << 20);
  // 16 KiB on 2 ranks: the defaults say two-shot (8 KiB crossover), the file one-shot.
  using kft::shm::choose_algorithm;
  const auto ar = kft::collective::allreduce;
  BOOST_TEST((choose_algorithm(kft::shm::default_crossovers, ar, 2, false, false, 16u << 10, 64u << 10) ==
              kft::algo::two_shot));
  BOOST_TEST((choose_algorithm(cfg.crossovers, ar, 2, false, false, 16u << 10, cfg.small_bytes) == kft::algo::one_shot));
  BOOST_TEST((choose_algorithm(cfg.crossovers, ar, 2, false, false, 64u << 10, cfg.small_bytes) == kft::algo::two_shot));
  // A call the file does not cover (oversubscribed) falls back to the default rows.
  BOOST_TEST((choose_algorithm(cfg.crossovers, ar, 3, true, false, 16u << 10, cfg.small_bytes) == kft::algo::one_shot));
  BOOST_TEST((choose_algorithm(cfg.crossovers, ar, 3, true, false, 48u << 10, cfg.small_bytes) == kft::algo::two_shot));
  // A real communicator built from it chooses by the file's rows.
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  // (Boost.Test is not thread-safe: the rank threads record, the test thread checks.)
  std::vector<kft::algo> chosen(2);
  std::vector<std::vector<float>> sums(2);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      auto c = cfg;
      c.name = "tuned";
      kft::shm::communicator comm(store, r, 2, c);
      chosen[static_cast<std::size_t>(r)] = comm.choose(ar, 16u << 10, false);
      std::vector<float> x(4096, 1.0f + static_cast<float>(r));  // 16 KiB, one-shot
      comm.allreduce(std::span<float>(x), kft::ops::sum);
      sums[static_cast<std::size_t>(r)] = std::move(x);
    });
  for (auto& th : t) th.join();
  BOOST_TEST((chosen[0] == kft::algo::one_shot && chosen[1] == kft::algo::one_shot));
  for (const auto& x : sums) BOOST_TEST((x.size() == 4096u && x.front() == 3.0f && x.back() == 3.0f));
  // KFT_SHM_STAGING_BYTES wins over the file.
  const auto both = kft::group::shm_config(kft::environment(
      kft::environment::map_type{{"KFT_SHM_TUNING", path}, {"KFT_SHM_STAGING_BYTES", "65536"}}));
  BOOST_TEST(both.staging_bytes == 65536u);
  const auto copy_env = kft::group::shm_config(kft::environment(
      kft::environment::map_type{{"KFT_SHM_TUNING", path}, {"KFT_SHM_COPY_STREAMING_BYTES", "0"}}));
  BOOST_TEST(copy_env.copy_streaming_bytes == 0u);
  ::unlink(path.c_str());
}

BOOST_AUTO_TEST_CASE(a_bad_tuning_file_is_refused_naming_the_line) {
  struct bad_case {
    std::string text, expect;
  };
  const std::vector<bad_case> cases = {
      {"staging_bytes 1M\ncrossover allreduce ranks=2 one_shot_max=lots\n", "line 2: one_shot_max takes a byte count"},
      {"stagin_bytes 1M\n", "line 1: unknown setting \"stagin_bytes\""},
      {"\n\ncrossover allreduce ranks=2\n", "line 3: crossover needs one_shot_max=BYTES"},
      {"crossover allgatherv one_shot_max=1K\n", "line 1: unknown collective \"allgatherv\""},
      {"crossover allreduce ranks=4-2 one_shot_max=1K\n", "line 1: ranks takes N, N-M or N-*"},
      {"crossover allreduce zero_copy=yes one_shot_max=1K\n", "line 1: zero_copy takes 0, 1 or any"},
      {"crossover allreduce one_shot_max 1K\n", "line 1: expected key=value"},
      {"staging_bytes 100\n", "line 1: staging_bytes must be at least 4096"},
      {"small_bytes 1M 2M\n", "line 1: small_bytes takes one value"},
  };
  for (const auto& c : cases) {
    const std::string path = write_temp(c.text);
    BOOST_CHECK_EXCEPTION(
        kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_TUNING", path}})),
        kft::config_error, [&](const kft::config_error& e) {
          const std::string m = e.what();
          BOOST_TEST_MESSAGE(m);
          return e.variable() == "KFT_SHM_TUNING" && m.find(path) != std::string::npos &&
                 m.find(c.expect) != std::string::npos;
        });
    ::unlink(path.c_str());
  }
  BOOST_CHECK_EXCEPTION(
      kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_TUNING", "/nonexistent/tuning"}})),
      kft::config_error, [](const kft::config_error& e) {
        const std::string m = e.what();
        BOOST_TEST_MESSAGE(m);
        return m.find("/nonexistent/tuning") != std::string::npos && m.find("cannot be read") != std::string::npos;
      });
}

// A communicator inside the job says where it is: global rank, then the group and its rank.
BOOST_AUTO_TEST_CASE(errors_name_the_global_rank_and_the_group) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  std::mutex mu;
  std::string msg;
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      kft::shm::config c;
      c.name = "label";
      c.identity = {4 + r, 8, "node 2"};  // local ranks 0 and 1 are the job's ranks 4 and 5
      kft::shm::communicator comm(store, r, 2, c);
      std::vector<float> x(8);
      if (r == 1) {
        std::this_thread::sleep_for(600ms);  // never joins in time
        return;
      }
      try {
        comm.allreduce(std::span<float>(x), kft::ops::sum, {.timeout = 200ms});
      } catch (const kft::timeout_error& e) {
        std::lock_guard lock(mu);
        msg = e.what();
      }
    });
  for (auto& x : t) x.join();
  BOOST_TEST_INFO(msg);
  BOOST_TEST(msg.find("kft: rank 4/8 (node 2, rank 0/2) allreduce #1:") == 0u);
  BOOST_TEST(msg.find("waiting for rank(s) 1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(engine_runs_in_submission_order_and_reports_errors) {
  kft::async::engine e("test");
  std::vector<int> order;
  std::vector<kft::async::work> w;
  for (int i = 0; i < 20; ++i)
    w.push_back(e.submit({kft::collective::allreduce, static_cast<std::uint64_t>(i + 1), 5s, {}}, [&order, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 3)));
      order.push_back(i);
    }));
  auto bad = e.submit({kft::collective::broadcast, 21, 5s, {}},
                      [] { throw kft::usage_error("refused", kft::error_site::of("broadcast")); });
  for (auto& x : w) x.wait();
  BOOST_CHECK_THROW(bad.wait(), kft::usage_error);
  BOOST_CHECK_THROW(bad.wait(), kft::usage_error);  // every wait rethrows it
  for (int i = 0; i < 20; ++i) BOOST_TEST(order[static_cast<std::size_t>(i)] == i);
  BOOST_TEST(w[4].sequence() == 5u);
  BOOST_TEST((bad.op() == kft::collective::broadcast));
}

namespace {
std::vector<int> cpus_of(const cpu_set_t& set) {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}
std::vector<int> my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  BOOST_REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0);
  return cpus_of(set);
}
// The CPUs the worker of `e` may run on, seen from inside one of its tasks. Polled, not waited
// for: a waiter would run the task itself while the worker is idle.
std::vector<int> worker_cpus(kft::async::engine& e) {
  std::vector<int> seen;
  auto w = e.submit({kft::collective::barrier, 1, 5s, {}}, [&] { seen = my_cpus(); });
  while (!w.test()) std::this_thread::sleep_for(1ms);
  return seen;
}
}  // namespace

BOOST_AUTO_TEST_CASE(engine_binds_its_worker_to_its_share_of_the_cpus) {
  const std::vector<int> cpus = my_cpus();
  const int n = static_cast<int>(cpus.size());
  if (n >= 2) {
    for (int i = 0; i < n; ++i) {  // as many workers as CPUs: one each
      kft::async::engine e("place", {i, n});
      BOOST_TEST(worker_cpus(e) == std::vector<int>{cpus[static_cast<std::size_t>(i)]});
      BOOST_TEST(e.worker_cpu() == cpus[static_cast<std::size_t>(i)]);
    }
    kft::async::engine spread("two of many", {1, 2});  // fewer workers than CPUs: spread out
    BOOST_TEST(spread.worker_cpu() == -1);           // not started yet
    BOOST_TEST(worker_cpus(spread) == std::vector<int>{cpus[static_cast<std::size_t>(n / 2)]});
    kft::async::engine wrap("more than CPUs", {n + 1, 2 * n});  // more workers than CPUs: round robin
    BOOST_TEST(worker_cpus(wrap) == std::vector<int>{cpus[1]});
  } else {
    BOOST_TEST_MESSAGE("one CPU allowed: only the unbound cases below run");
  }
  kft::async::engine unknown("no placement");  // place unknown: left to the scheduler
  BOOST_TEST(worker_cpus(unknown) == cpus);
  BOOST_TEST(unknown.worker_cpu() == -1);
  // A thread bound to one CPU already (as a launcher binds a rank) starts a worker that stays there.
  std::vector<int> inherited;
  int bound = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus.back(), &one);
    BOOST_REQUIRE(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0);
    kft::async::engine e("launcher-bound", {0, 2});
    inherited = worker_cpus(e);
    bound = e.worker_cpu();
  }).join();
  BOOST_TEST(inherited == std::vector<int>{cpus.back()});
  BOOST_TEST(bound == -1);
}

BOOST_AUTO_TEST_CASE(shm_ranks_progress_threads_take_one_cpu_each_unless_told_not_to) {
  const std::vector<int> cpus = my_cpus();
  const int n = static_cast<int>(cpus.size());
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{})).bind_progress_thread);
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_PROGRESS_AFFINITY", "auto"}}))
                 .bind_progress_thread);
  const auto off = kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_PROGRESS_AFFINITY", "none"}}));
  BOOST_TEST(!off.bind_progress_thread);
  BOOST_CHECK_EXCEPTION(
      kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_PROGRESS_AFFINITY", "cores"}})),
      kft::config_error, [](const kft::config_error& e) {
        const std::string m = e.what();
        return m.find("KFT_PROGRESS_AFFINITY") != std::string::npos && m.find("cores") != std::string::npos;
      });
  // KFT_SHM_HUGE_PAGES: auto (the default), 1, 0; anything else is refused by name.
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{})).huge_pages == -1);
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_HUGE_PAGES", "1"}}))
                 .huge_pages == 1);
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_HUGE_PAGES", "0"}}))
                 .huge_pages == 0);
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_HUGE_PAGES", "auto"}}))
                 .huge_pages == -1);
  BOOST_CHECK_EXCEPTION(
      kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_HUGE_PAGES", "yes"}})),
      kft::config_error, [](const kft::config_error& e) {
        const std::string m = e.what();
        return m.find("KFT_SHM_HUGE_PAGES") != std::string::npos && m.find("yes") != std::string::npos;
      });
  // KFT_SHM_REGION_ALIGN: bytes (0, the default, lets the communicator choose); not a number is refused by name.
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{})).region_align_bytes == 0u);
  BOOST_TEST(kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_REGION_ALIGN", "4194304"}}))
                 .region_align_bytes == 4194304u);
  BOOST_CHECK_EXCEPTION(
      kft::group::shm_config(kft::environment(kft::environment::map_type{{"KFT_SHM_REGION_ALIGN", "8M"}})),
      kft::config_error, [](const kft::config_error& e) {
        const std::string m = e.what();
        return m.find("KFT_SHM_REGION_ALIGN") != std::string::npos && m.find("8M") != std::string::npos;
      });
  for (const bool bind : {true, false}) {
    auto store = std::make_shared<kft::rendezvous::memory_store>();
    std::vector<int> cpu(2, -2);
    std::vector<std::thread> t;
    for (int r = 0; r < 2; ++r)
      t.emplace_back([&, r] {
        kft::shm::config c;
        c.name = bind ? "bound" : "unbound";
        c.bind_progress_thread = bind;
        kft::shm::communicator comm(store, r, 2, c);
        std::vector<float> x(1024, 1.0f);
        auto w = comm.allreduce_async(x.data(), x.data(), x.size(), kft::dtype::f32, kft::op_kind::sum);
        while (!w.test()) std::this_thread::sleep_for(1ms);  // polled: the progress thread runs it
        cpu[static_cast<std::size_t>(r)] = comm.progress_cpu();
      });
    for (auto& th : t) th.join();
    for (int r = 0; r < 2; ++r) {
      const int want = bind && n >= 2 ? cpus[static_cast<std::size_t>(r * n / 2)] : -1;
      BOOST_TEST(cpu[static_cast<std::size_t>(r)] == want, "rank " << r << (bind ? " bound" : " unbound"));
    }
  }
}

BOOST_AUTO_TEST_CASE(dropping_work_waits_for_it) {
  kft::async::engine e("drop");
  std::atomic<bool> done{false};
  {
    auto w = e.submit({kft::collective::allreduce, 1, 5s, {}}, [&] {
      std::this_thread::sleep_for(100ms);
      done = true;
    });
  }  // the handle goes: the buffers it uses may go next, so it must be finished
  BOOST_TEST(done.load());
}

BOOST_AUTO_TEST_CASE(a_wait_has_a_deadline) {
  auto st = std::make_shared<kft::async::work_state>();
  st->op = kft::collective::allreduce;
  st->seq = 7;
  st->timeout = 100ms;
  st->progress = [] { return false; };  // never completes
  kft::async::work w(st);
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_CHECK_EXCEPTION(w.wait(), kft::timeout_error, [](const kft::timeout_error& e) {
    return std::string(e.what()).find("allreduce #7") != std::string::npos;
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(s < 3.0);  // 100 ms + 1 s of grace, not forever
  BOOST_TEST(!kft::async::work{}.valid());
  BOOST_TEST(kft::async::work{}.test());
}

// ---- shrinking: the survivors' agreement (group/shrink.hpp) ---------------------------------
// Ranks are threads over one memory store; a "lost" rank is one that never arrives. Results
// are collected and checked on the main thread.

namespace {
struct agreed {
  std::vector<int> members;
  int rank = -1;
  std::string error;
  double ms = 0.0;
};
std::vector<agreed> agree(kft::rendezvous::store& s, int size, const std::vector<int>& arrive,
                          const std::vector<int>& known_lost, const std::vector<int>& delay_ms,
                          kft::group::shrink_options o) {
  std::vector<agreed> out(arrive.size());
  std::vector<std::thread> ts;
  for (std::size_t k = 0; k < arrive.size(); ++k)
    ts.emplace_back([&, k] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms[k]));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        auto m = kft::group::agree_on_survivors(s, "test", 1, arrive[k], size, known_lost, o);
        out[k].members = m.members;
        out[k].rank = m.rank;
      } catch (const kft::error& e) {
        out[k].error = e.what();
      }
      out[k].ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& t : ts) t.join();
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(survivors_that_know_who_is_gone_agree_without_waiting_out_the_window) {
  kft::rendezvous::memory_store s;
  // Rank 2 of 4 is gone and every survivor knows it: the decision comes when the third arrives.
  const auto r = agree(s, 4, {0, 1, 3}, {2}, {0, 5, 10}, {.window = std::chrono::milliseconds(20000)});
  for (std::size_t k = 0; k < r.size(); ++k) {
    BOOST_TEST(r[k].error == "");
    BOOST_TEST(r[k].members == (std::vector<int>{0, 1, 3}), boost::test_tools::per_element());
    BOOST_TEST(r[k].rank == static_cast<int>(k));
    BOOST_TEST(r[k].ms < 10000.0);  // not the 20 s window
  }
}

BOOST_AUTO_TEST_CASE(a_rank_nobody_knew_was_gone_is_left_out_after_the_window) {
  kft::rendezvous::memory_store s;
  // Only rank 3 is known gone, but rank 1 never comes either: the window decides.
  const auto r = agree(s, 4, {0, 2}, {3}, {0, 0}, {.window = std::chrono::milliseconds(200)});
  for (const auto& a : r) {
    BOOST_TEST(a.error == "");
    BOOST_TEST(a.members == (std::vector<int>{0, 2}), boost::test_tools::per_element());
  }
  BOOST_TEST(r[0].rank == 0);
  BOOST_TEST(r[1].rank == 1);
  BOOST_TEST(r[0].ms >= 150.0);  // it did wait for rank 1
}

BOOST_AUTO_TEST_CASE(a_survivor_arriving_after_the_decision_is_told_it_is_out) {
  kft::rendezvous::memory_store s;
  // Ranks 0 and 1 believe 2 and 3 are gone and decide at once; rank 3 comes 300 ms later: one
  // membership, and rank 3 is told so by name, never a second job.
  const auto r = agree(s, 4, {0, 1, 3}, {2, 3}, {0, 0, 300}, {.window = std::chrono::milliseconds(100)});
  BOOST_TEST(r[0].members == (std::vector<int>{0, 1}), boost::test_tools::per_element());
  BOOST_TEST(r[1].members == (std::vector<int>{0, 1}), boost::test_tools::per_element());
  BOOST_TEST(r[2].members.empty());
  BOOST_TEST(r[2].error.find("rank 3 of 4") != std::string::npos, r[2].error);
  BOOST_TEST(r[2].error.find("agreed on ranks 0,1") != std::string::npos, r[2].error);
}

BOOST_AUTO_TEST_CASE(survivors_with_different_views_still_read_one_decision) {
  // 8 ranks, 2 gone; each survivor "knows" a different set (some nothing, some too much): every
  // survivor that got a membership got the same one, and everyone who arrived before it is in it.
  for (int round = 0; round < 20; ++round) {
    kft::rendezvous::memory_store s;
    const std::vector<int> arrive{0, 1, 2, 4, 5, 7};
    const std::vector<int> known = round % 2 ? std::vector<int>{3, 6} : std::vector<int>{3, 6, 1, 7};
    std::vector<int> delays;
    for (std::size_t k = 0; k < arrive.size(); ++k) delays.push_back(static_cast<int>((k * 7 + round) % 5));
    const auto r = agree(s, 8, arrive, known, delays, {.window = std::chrono::milliseconds(50)});
    std::vector<int> first;
    for (const auto& a : r)
      if (a.error.empty()) {
        if (first.empty()) first = a.members;
        BOOST_TEST(a.members == first, boost::test_tools::per_element());
      } else {
        BOOST_TEST(a.error.find("was left out") != std::string::npos, a.error);
      }
    BOOST_TEST(!first.empty());
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_to_the_agreement_are_refused) {
  kft::rendezvous::memory_store s;
  BOOST_CHECK_THROW(kft::group::agree_on_survivors(s, "x", 1, 4, 4, {}), kft::usage_error);
  BOOST_CHECK_THROW(kft::group::agree_on_survivors(s, "x", 0, 0, 4, {}), kft::usage_error);
  s.set("shrink/y/g1/members", "0,zero");
  BOOST_CHECK_THROW(kft::group::agree_on_survivors(s, "y", 1, 0, 2, {}), kft::group::membership_error);
}

// ---- growing back: a rank joins a running group (group/shrink.hpp) --------------------------

BOOST_AUTO_TEST_CASE(a_joiner_is_admitted_at_a_boundary_and_meets_the_members_as_one_generation) {
  kft::rendezvous::memory_store s;
  // Members 0,1,3 (generation 1, rank 2 lost); founding rank 2 asks to join; rank 0 of the
  // members sees the ticket, admits it to generation 2 of 4, and all four meet.
  std::vector<agreed> r(4);
  std::int64_t joiner_tickets = 0;
  std::vector<std::thread> ts;
  ts.emplace_back([&] {  // the joiner
    try {
      const auto a = kft::group::request_to_join(s, "g", 2, 4, std::chrono::seconds(20));
      joiner_tickets = a.tickets;
      auto m = kft::group::agree_on_members(s, "g", a.generation, 2, 4, a.expected);
      r[2].members = m.members;
      r[2].rank = m.rank;
    } catch (const kft::error& e) {
      r[2].error = e.what();
    }
  });
  for (int id : {0, 1, 3})
    ts.emplace_back([&, id] {
      try {
        if (id == 0) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (kft::group::join_tickets(s, "g") == 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          kft::group::admit_joiners(s, "g", 0, kft::group::join_tickets(s, "g"), 2, 4);
        }
        auto m = kft::group::agree_on_members(s, "g", 2, id, 4, 4);
        m.before = {0, 1, 3};
        r[static_cast<std::size_t>(id)].members = m.members;
        r[static_cast<std::size_t>(id)].rank = m.rank;
        if (m.joined() != std::vector<int>{2} || !m.lost().empty()) r[static_cast<std::size_t>(id)].error = "joined/lost";
      } catch (const kft::error& e) {
        r[static_cast<std::size_t>(id)].error = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int id = 0; id < 4; ++id) {
    BOOST_TEST(r[static_cast<std::size_t>(id)].error == "");
    BOOST_TEST(r[static_cast<std::size_t>(id)].members == (std::vector<int>{0, 1, 2, 3}), boost::test_tools::per_element());
    BOOST_TEST(r[static_cast<std::size_t>(id)].rank == id);  // founding rank 2 takes its old place
  }
  BOOST_TEST(joiner_tickets == 1);
}

BOOST_AUTO_TEST_CASE(a_joiner_is_told_the_group_finished_or_not_admitted_in_time) {
  {
    kft::rendezvous::memory_store s;
    kft::group::close_joins(s, "done");
    try {
      (void)kft::group::request_to_join(s, "done", 1, 4, std::chrono::seconds(20));
      BOOST_FAIL("a closed group admitted a joiner");
    } catch (const kft::group::join_closed_error& e) {
      BOOST_TEST(std::string(e.what()).find("the group finished first") != std::string::npos, e.what());
    }
  }
  {
    kft::rendezvous::memory_store s;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)kft::group::request_to_join(s, "busy", 1, 4, std::chrono::milliseconds(150));
      BOOST_FAIL("a joiner nobody admitted returned");
    } catch (const kft::timeout_error& e) {
      BOOST_TEST(std::string(e.what()).find("(ticket 1) and was not admitted within") != std::string::npos, e.what());
    }
    BOOST_TEST(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  }
  {
    kft::rendezvous::memory_store s;
    s.set("join/bad/admit/1", "two 4 1");
    BOOST_CHECK_THROW((void)kft::group::request_to_join(s, "bad", 1, 4, std::chrono::seconds(5)),
                      kft::group::membership_error);
    BOOST_CHECK_THROW((void)kft::group::request_to_join(s, "bad", 4, 4, std::chrono::seconds(5)), kft::usage_error);
  }
}

BOOST_AUTO_TEST_CASE(a_shrink_that_meets_a_grow_gives_the_generation_up_and_the_joiner_is_admitted_again) {
  // Generation 1 is members 0,1,2 (founding 3 lost). Rank 0 admits founding rank 3's ticket
  // to generation 2 (expecting 4) while member 2 dies: rank 1 sees it and shrinks (shrink
  // intent, generation 2) where rank 0 and the joiner grow. The decision is "void": rank 0 is
  // told (generation_void_error) and shrinks too; rank 1 goes on to generation 3 by itself;
  // both agree on 0,1 there. The joiner waits; rank 0 admits it again to generation 4, and
  // all three meet there.
  kft::rendezvous::memory_store s;
  const kft::group::shrink_options o{.window = std::chrono::milliseconds(3000), .timeout = std::chrono::seconds(20)};
  std::vector<agreed> r(4);
  std::vector<std::uint64_t> gen(4, 0);
  std::string rank0_void;
  std::vector<std::thread> ts;
  ts.emplace_back([&] {  // the joiner
    try {
      auto [a, m] = kft::group::join_members(s, "v", 3, 4, std::chrono::seconds(20), o);
      r[3].members = m.members;
      gen[3] = m.generation;
    } catch (const kft::error& e) {
      r[3].error = e.what();
    }
  });
  ts.emplace_back([&] {  // rank 0: admits, grows, is told the generation was given up, shrinks, admits again
    try {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (kft::group::join_tickets(s, "v") == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      kft::group::admit_joiners(s, "v", 0, 1, 2, 4);
      try {
        (void)kft::group::agree_on_members(s, "v", 2, 0, 4, 4, o, {}, 0, kft::group::intent::grow);
        r[0].error = "the grow was not given up";
        return;
      } catch (const kft::group::generation_void_error& e) {
        rank0_void = e.what();
      }
      const std::vector<int> lost{2};
      auto m = kft::group::agree_on_members(s, "v", 2, 0, 4, 2, o, lost, 3);
      gen[0] = m.generation;
      kft::group::admit_joiners(s, "v", 0, 1, m.generation + 1, 3);
      auto g = kft::group::agree_on_members(s, "v", m.generation + 1, 0, 4, 3, o, {}, 0, kft::group::intent::grow);
      r[0].members = g.members;
    } catch (const kft::error& e) {
      r[0].error = e.what();
    }
  });
  ts.emplace_back([&] {  // rank 1: saw member 2 die; shrinks, then grows with rank 0
    try {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (after rank 0's grow arrival)
      const std::vector<int> lost{2};
      auto m = kft::group::agree_on_members(s, "v", 2, 1, 4, 2, o, lost, 3);
      gen[1] = m.generation;
      if (m.members != std::vector<int>{0, 1}) r[1].error = "shrank to " + m.describe();
      auto g = kft::group::agree_on_members(s, "v", m.generation + 1, 1, 4, 3, o, {}, 0, kft::group::intent::grow);
      r[1].members = g.members;
    } catch (const kft::error& e) {
      r[1].error = e.what();
    }
  });
  for (auto& t : ts) t.join();
  BOOST_TEST(s.try_get("shrink/v/g2/members").value_or("") == "void");
  BOOST_TEST(rank0_void.find("generation 2 was given up") != std::string::npos, rank0_void);
  BOOST_TEST(gen[0] == 3u);
  BOOST_TEST(gen[1] == 3u);
  BOOST_TEST(gen[3] == 4u);
  for (int id : {0, 1, 3}) {
    BOOST_TEST(r[static_cast<std::size_t>(id)].error == "", "rank " << id);
    BOOST_TEST(r[static_cast<std::size_t>(id)].members == (std::vector<int>{0, 1, 3}), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(a_shrink_skips_a_generation_whose_group_could_not_be_built) {
  // Generation 1 was decided (0,1,2) but member 2 died before the build, which failed and
  // marked it: the survivors' shrink does not read that decision again, it agrees on 2.
  kft::rendezvous::memory_store s;
  s.set("shrink/f/g1/members", "0,1,2");
  kft::group::detail::mark_failed(s, "f", 1);
  const std::vector<int> lost{2};
  std::vector<kft::group::membership> m(2);
  std::vector<std::thread> ts;
  for (int id : {0, 1})
    ts.emplace_back([&, id] { m[static_cast<std::size_t>(id)] = kft::group::agree_on_survivors(s, "f", 1, id, 3, lost); });
  for (auto& t : ts) t.join();
  for (const auto& x : m) {
    BOOST_TEST(x.generation == 2u);
    BOOST_TEST(x.members == (std::vector<int>{0, 1}), boost::test_tools::per_element());
  }
}
