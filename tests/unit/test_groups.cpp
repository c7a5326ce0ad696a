// Process groups without a launcher: the factory's choice, the type-erased group, async work's
// rules (order, the destruction rule, deadlines), and errors that place a group in the job.
#define BOOST_TEST_MODULE kft_groups
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <kft/async/engine.hpp>
#include <kft/group/factory.hpp>
#include <kft/rendezvous/memory_store.hpp>

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
