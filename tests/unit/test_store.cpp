// SPDX-License-Identifier: Apache-2.0
// The rendezvous stores: the same contract checked on the memory, file and TCP stores, then
// what only the TCP store has (tokens, addresses, a server that goes away).
#define BOOST_TEST_MODULE kft_store
#include <boost/test/unit_test.hpp>

#include <poll.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <limits>
#include <thread>
#include <vector>

#include <kft/core/token.hpp>
#include <kft/rendezvous/connect.hpp>
#include <kft/rendezvous/file_store.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/tcp_store_relay.hpp>

using namespace std::chrono_literals;
namespace rdzv = kft::rendezvous;

namespace {

// One store kind: a factory of clients that all reach the same data.
struct fixture_store {
  std::string kind;
  std::function<std::shared_ptr<rdzv::store>()> connect;
  std::shared_ptr<void> keep_alive;  // server / directory owner
};

struct temp_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("kft-store-test-" + kft::random_token());
  ~temp_dir() { std::filesystem::remove_all(path); }
};

std::vector<fixture_store> all_stores() {
  std::vector<fixture_store> out;
  auto mem = std::make_shared<rdzv::memory_store>();
  out.push_back({"memory", [mem] { return mem; }, mem});
  auto dir = std::make_shared<temp_dir>();
  out.push_back({"file", [dir] { return std::make_shared<rdzv::file_store>(dir->path); }, dir});
  const auto token = kft::random_token();
  auto server = std::make_shared<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", 0, token, {}});
  out.push_back({"tcp",
                 [server, token] {
                   rdzv::tcp_store::options o;
                   o.host = "127.0.0.1";
                   o.port = server->port();
                   o.token = token;
                   return std::make_shared<rdzv::tcp_store>(o);
                 },
                 server});
  // The same store through a node's relay (tcp_store_server::options::upstream): every test of
  // the store's semantics runs through one too.
  struct relayed {
    std::shared_ptr<rdzv::tcp_store_server> job, node;  // (the relay goes first)
    ~relayed() { node.reset(); }
  };
  auto both = std::make_shared<relayed>();
  both->job = std::make_shared<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", 0, token, {}});
  rdzv::tcp_store_server::options ro{"127.0.0.1", 0, token, {}};
  ro.upstream = rdzv::relay_to("127.0.0.1", both->job->port());
  both->node = std::make_shared<rdzv::tcp_store_server>(ro);
  out.push_back({"relay",
                 [both, token] {
                   rdzv::tcp_store::options o;
                   o.host = "127.0.0.1";
                   o.port = both->node->port();
                   o.token = token;
                   return std::make_shared<rdzv::tcp_store>(o);
                 },
                 both});
  return out;
}

template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

BOOST_AUTO_TEST_CASE(set_get_erase_keys) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto s = fs.connect();
      BOOST_TEST(!s->try_get("a").has_value());
      s->set("a", std::string("bytes\0with nul", 14));
      BOOST_TEST(*s->try_get("a") == std::string("bytes\0with nul", 14));
      s->set("a", "replaced");
      BOOST_TEST(s->get("a", 1s) == "replaced");
      s->set("job/b", "1");
      s->set("job/c", "2");
      BOOST_TEST(s->keys("job/") == std::vector<std::string>({"job/b", "job/c"}), boost::test_tools::per_element());
      BOOST_TEST(s->erase("job/b"));
      BOOST_TEST(!s->erase("job/b"));
      BOOST_TEST(s->keys("job/").size() == 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(waits_time_out_naming_missing_keys) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto s = fs.connect();
      s->set("here", "1");
      const std::vector<std::string> keys{"here", "absent-1", "absent-2"};
      double took = seconds_of([&] {
        BOOST_CHECK_EXCEPTION(s->wait(keys, 300ms), kft::timeout_error, [&](const kft::timeout_error& e) {
          const std::string m = e.what();
          BOOST_TEST_INFO(m);
          return m.find("\"absent-1\", \"absent-2\"") != std::string::npos && m.find("\"here\"") == std::string::npos &&
                 m.find(s->describe()) != std::string::npos && m.find("300 ms") != std::string::npos;
        });
      });
      BOOST_TEST(took >= 0.29);
      BOOST_TEST(took < 5.0);
      BOOST_CHECK_THROW((void)s->get("absent-1", 50ms), kft::timeout_error);
    }
  }
}

BOOST_AUTO_TEST_CASE(get_wakes_when_another_client_sets) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto reader = fs.connect();
      auto writer = fs.connect();
      std::thread t([&] {
        std::this_thread::sleep_for(100ms);
        writer->set("late", "value");
      });
      std::string got;
      const double took = seconds_of([&] { got = reader->get("late", 10s); });
      t.join();
      BOOST_TEST(got == "value");
      BOOST_TEST(took < 5.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(add_is_atomic_across_clients) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      constexpr int threads = 5, each = 40;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
          auto s = fs.connect();
          for (int i = 0; i < each; ++i) s->add("counter", 1);
        });
      for (auto& t : pool) t.join();
      auto s = fs.connect();
      BOOST_TEST(s->add("counter", 0) == threads * each);
      BOOST_TEST(s->add("counter", -10) == threads * each - 10);
      s->set("text", "abc");
      BOOST_CHECK_THROW(s->add("text", 1), kft::usage_error);
      // Past int64: refused, the counter unchanged (it was signed overflow, undefined behaviour).
      s->set("big", std::to_string(std::numeric_limits<std::int64_t>::max()));
      BOOST_CHECK_THROW(s->add("big", 1), kft::usage_error);
      BOOST_TEST(s->add("big", 0) == std::numeric_limits<std::int64_t>::max());
      s->set("small", std::to_string(std::numeric_limits<std::int64_t>::min()));
      BOOST_CHECK_THROW(s->add("small", -1), kft::usage_error);
    }
  }
}

BOOST_AUTO_TEST_CASE(compare_set_semantics) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto s = fs.connect();
      auto r = s->compare_set("leader", std::nullopt, "rank0");  // create if absent
      BOOST_TEST(r.swapped);
      r = s->compare_set("leader", std::nullopt, "rank1");  // already there
      BOOST_TEST(!r.swapped);
      BOOST_TEST(*r.current == "rank0");
      r = s->compare_set("leader", std::string_view("rank0"), "rank2");
      BOOST_TEST(r.swapped);
      BOOST_TEST(*s->try_get("leader") == "rank2");
      r = s->compare_set("nothing", std::string_view("x"), "y");
      BOOST_TEST(!r.swapped);
      BOOST_TEST(!r.current.has_value());
    }
  }
}

BOOST_AUTO_TEST_CASE(prefix_scoping_and_barrier) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto base = fs.connect();
      rdzv::prefix_store round1(base, "job/round1/");
      round1.set("x", "1");
      BOOST_TEST(*base->try_get("job/round1/x") == "1");
      BOOST_TEST(round1.keys("") == std::vector<std::string>({"x"}), boost::test_tools::per_element());
      rdzv::prefix_store round2(base, "job/round2/");
      BOOST_TEST(!round2.try_get("x").has_value());

      constexpr int n = 4;
      std::atomic<int> passed{0};
      std::vector<std::thread> ranks;
      for (int r = 0; r < n; ++r)
        ranks.emplace_back([&] {
          rdzv::prefix_store scoped(fs.connect(), "job/round1/");
          rdzv::barrier(scoped, "start", n, 10s);
          ++passed;
        });
      for (auto& t : ranks) t.join();
      BOOST_TEST(passed.load() == n);
      BOOST_CHECK_EXCEPTION(rdzv::barrier(round2, "lonely", 2, 100ms), kft::timeout_error,
                            [](const kft::timeout_error& e) {
                              return std::string(e.what()).find("1 of 2 arrived") != std::string::npos;
                            });
    }
  }
}

// multi_set / multi_get: the same results on every store (the TCP store's one request each is
// counted in the tcp suite below), and through a prefix.
BOOST_AUTO_TEST_CASE(multi_set_and_multi_get) {
  for (auto& fs : all_stores()) {
    BOOST_TEST_CONTEXT("store " << fs.kind) {
      auto s = fs.connect();
      const std::vector<rdzv::key_value> items{{"m/a", "1"}, {"m/b", std::string("two\0", 4)}, {"m/a", "3"}, {"m/c", ""}};
      s->multi_set(items);
      const std::vector<std::string> keys{"m/c", "m/a", "m/b", "m/a"};
      BOOST_TEST(s->multi_get(keys, 1s) == std::vector<std::string>({"", "3", std::string("two\0", 4), "3"}),
                 boost::test_tools::per_element());
      BOOST_TEST(s->multi_get({}, 0ms).empty());
      s->multi_set({});
      rdzv::prefix_store scoped(s, "m/");
      scoped.multi_set(std::vector<rdzv::key_value>{{"d", "4"}});
      BOOST_TEST(*s->try_get("m/d") == "4");
      BOOST_TEST(scoped.multi_get(std::vector<std::string>{"a", "d"}, 1s) == std::vector<std::string>({"3", "4"}),
                 boost::test_tools::per_element());
      // Waits for keys set later by another client...
      auto writer = fs.connect();
      std::thread t([&] {
        std::this_thread::sleep_for(100ms);
        writer->multi_set(std::vector<rdzv::key_value>{{"late/1", "x"}, {"late/2", "y"}});
      });
      const std::vector<std::string> late{"m/a", "late/1", "late/2"};
      BOOST_TEST(s->multi_get(late, 10s) == std::vector<std::string>({"3", "x", "y"}), boost::test_tools::per_element());
      t.join();
      // ...and names those still missing at its deadline.
      const std::vector<std::string> some{"m/a", "absent-1", "absent-2"};
      BOOST_CHECK_EXCEPTION((void)s->multi_get(some, 200ms), kft::timeout_error, [&](const kft::timeout_error& e) {
        const std::string m = e.what();
        BOOST_TEST_INFO(m);
        return m.find("\"absent-1\", \"absent-2\"") != std::string::npos && m.find("\"m/a\"") == std::string::npos;
      });
    }
  }
}

BOOST_AUTO_TEST_SUITE(tcp)

BOOST_AUTO_TEST_CASE(wrong_token_is_refused_and_logged) {
  std::mutex mu;
  std::vector<std::string> log;
  rdzv::tcp_store_server server({"127.0.0.1", 0, "right-token", [&](const std::string& line) {
                                   std::lock_guard lock(mu);
                                   log.push_back(line);
                                 }});
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "wrong-token";
  o.name = "intruder";
  BOOST_CHECK_EXCEPTION(rdzv::tcp_store{o}, kft::config_error, [&](const kft::config_error& e) {
    const std::string m = e.what();
    BOOST_TEST_INFO(m);
    return e.variable() == "KFT_RDZV_TOKEN" && m.find("refused") != std::string::npos &&
           m.find(server.address()) != std::string::npos && m.find("wrong-token") == std::string::npos;
  });
  BOOST_TEST(server.refused() == 1);
  std::lock_guard lock(mu);
  BOOST_REQUIRE(log.size() == 1u);
  BOOST_TEST(log[0].find("refused") != std::string::npos);
  BOOST_TEST(log[0].find("intruder") != std::string::npos);
  BOOST_TEST(log[0].find("wrong token") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(port_in_use_is_a_clear_error) {
  rdzv::tcp_store_server first({"127.0.0.1", 0, "t", {}});
  BOOST_CHECK_EXCEPTION((rdzv::tcp_store_server({"127.0.0.1", first.port(), "t", {}})), kft::transport_error,
                        [&](const kft::transport_error& e) {
                          const std::string m = e.what();
                          BOOST_TEST_INFO(m);
                          return m.find("already in use") != std::string::npos &&
                                 m.find("127.0.0.1:" + std::to_string(first.port())) != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(unreachable_store_times_out_naming_the_address) {
  int port = 0;
  {
    rdzv::tcp_store_server gone({"127.0.0.1", 0, "t", {}});
    port = gone.port();
  }  // nothing listens there now
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = "t";
  o.connect_timeout = 700ms;
  const double took = seconds_of([&] {
    BOOST_CHECK_EXCEPTION(rdzv::tcp_store{o}, kft::timeout_error, [&](const kft::timeout_error& e) {
      const std::string m = e.what();
      BOOST_TEST_INFO(m);
      return m.find("127.0.0.1:" + std::to_string(port)) != std::string::npos &&
             m.find("refused") != std::string::npos;
    });
  });
  BOOST_TEST(took >= 0.6);  // it retried until the deadline...
  BOOST_TEST(took < 3.0);   // ...and not much longer
}

BOOST_AUTO_TEST_CASE(connect_retries_until_the_server_appears) {
  int port = 0;
  {
    rdzv::tcp_store_server probe({"127.0.0.1", 0, "t", {}});
    port = probe.port();
  }
  std::unique_ptr<rdzv::tcp_store_server> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late = std::make_unique<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", port, "t", {}});
  });
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = "t";
  o.connect_timeout = 10s;
  rdzv::tcp_store client(o);
  starter.join();
  client.set("k", "v");
  BOOST_TEST(*client.try_get("k") == "v");
}

// A store bound to a name DNS does not know (yet): with resolve_timeout it keeps asking until
// then and names the address; without, it refuses at once. (".invalid" never resolves, RFC 6761.)
BOOST_AUTO_TEST_CASE(listen_resolves_its_name_until_the_resolve_timeout) {
  rdzv::tcp_store_server::options o{"kft-store-test.invalid", 0, "t", {}};
  o.resolve_timeout = 600ms;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rdzv::tcp_store_server s(o);
    BOOST_FAIL("a store bound to an unknown name was created");
  } catch (const kft::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("kft-store-test.invalid") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("store listen") != std::string::npos, e.what());
  }
  const auto tried = std::chrono::steady_clock::now() - t0;
  BOOST_TEST(tried >= 300ms, "gave up after " << std::chrono::duration<double>(tried).count() << " s");
  o.resolve_timeout = 0ms;
  BOOST_CHECK_THROW(rdzv::tcp_store_server{o}, kft::config_error);
}

// Options of a client of `server` on this host with the token "t".
static rdzv::tcp_store::options local_client_of(const rdzv::tcp_store_server& server) {
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "t";
  return o;
}

BOOST_AUTO_TEST_CASE(server_gone_is_reported_as_lost_store) {
  auto server = std::make_unique<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", 0, "t", {}});
  rdzv::tcp_store client(local_client_of(*server));
  client.ping();
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  BOOST_CHECK_EXCEPTION((void)client.get("never", 30s), kft::transport_error, [](const kft::transport_error& e) {
    const std::string m = e.what();
    BOOST_TEST_INFO(m);
    return m.find("lost the rendezvous store") != std::string::npos;
  });
  killer.join();
  BOOST_CHECK_THROW(client.ping(), kft::transport_error);
}

// kftrun tells a store that is gone (node lost) from one that is silent (hang) by the code.
BOOST_AUTO_TEST_CASE(a_gone_store_and_a_silent_one_have_different_codes) {
  auto server = std::make_unique<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", 0, "t", {}});
  auto o = local_client_of(*server);
  rdzv::tcp_store client(o);
  client.ping();
  server.reset();
  BOOST_CHECK_EXCEPTION(client.ping(), kft::transport_error, [](const kft::transport_error& e) {
    BOOST_TEST_INFO(e.what() << " (code " << e.backend_code() << ")");
    return e.backend_code() != 0 && e.backend_code() != ETIMEDOUT;
  });
  // A listener that never answers (its backlog takes the connection; nobody reads).
  auto silent = rdzv::detail::listen_on("127.0.0.1", 0);
  o.port = rdzv::detail::local_port(silent.get());
  o.connect_timeout = 400ms;
  o.io_timeout = 200ms;
  BOOST_CHECK_EXCEPTION(rdzv::tcp_store{o}, kft::transport_error, [](const kft::transport_error& e) {
    BOOST_TEST_INFO(e.what() << " (code " << e.backend_code() << ")");
    return e.backend_code() == ETIMEDOUT && std::string(e.what()).find("no reply within") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(owned_keys_go_with_the_connection_that_set_them) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", {}});
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "t";
  auto a = std::make_unique<rdzv::tcp_store>(o);
  rdzv::tcp_store b(o);
  a->set_owned("alive/a", "1");
  a->set_owned("taken", "a");
  a->set_owned("rebound", "a");
  a->set("plain", "a");
  b.set("taken", "b");          // a plain write takes the key over: it stays
  b.set_owned("rebound", "b");  // now bound to b
  BOOST_TEST(b.try_get("alive/a").value_or("") == "1");  // there while a is connected
  a.reset();                                             // a's connection closes
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (b.try_get("alive/a") && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  BOOST_TEST(!b.try_get("alive/a").has_value());
  BOOST_TEST(b.try_get("taken").value_or("") == "b");
  BOOST_TEST(b.try_get("rebound").value_or("") == "b");
  BOOST_TEST(b.try_get("plain").value_or("") == "a");
  {
    rdzv::tcp_store c(o);
    c.set_owned("alive/c", "1");
  }
  rdzv::tcp_store d(o);
  const auto deadline2 = std::chrono::steady_clock::now() + 5s;
  while (d.try_get("alive/c") && std::chrono::steady_clock::now() < deadline2) std::this_thread::sleep_for(5ms);
  BOOST_TEST(!d.try_get("alive/c").has_value());
  BOOST_TEST(d.try_get("rebound").value_or("") == "b");  // b is still connected
}

// One request per batch, whatever the number of keys: the server counts requests. Without the
// TCP store's own multi_get/multi_set (the store's defaults, key by key) these would be 1,000 and
// 1,001 requests.
BOOST_AUTO_TEST_CASE(batches_are_one_request_each) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", {}});
  auto client = std::make_shared<rdzv::tcp_store>(local_client_of(server));
  std::vector<rdzv::key_value> items;
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) {
    items.emplace_back("addr/" + std::to_string(i), "10.0.0." + std::to_string(i % 250) + ":" + std::to_string(29500 + i));
    keys.push_back(items.back().first);
  }
  auto requests_of = [&](auto&& f) {
    const auto before = server.requests();
    f();
    return server.requests() - before;
  };
  BOOST_TEST(requests_of([&] { client->multi_set(items); }) == 1u);
  std::vector<std::string> values;
  BOOST_TEST(requests_of([&] { values = client->multi_get(keys, 1s); }) == 1u);
  BOOST_REQUIRE(values.size() == items.size());
  for (std::size_t i = 0; i < items.size(); ++i) BOOST_TEST(values[i] == items[i].second);
  BOOST_TEST(requests_of([&] { client->wait(keys, 1s); }) == 1u);
  // Through a prefix (what connect_store hands out) the batch stays one request.
  rdzv::prefix_store scoped(client, "job/");
  BOOST_TEST(requests_of([&] { scoped.multi_set(items); }) == 1u);
  BOOST_TEST(requests_of([&] { (void)scoped.multi_get(keys, 1s); }) == 1u);
  // A multi_get that has to wait is still one request: the server holds it until the last key.
  rdzv::tcp_store writer(local_client_of(server));
  const std::vector<std::string> later{"later/1", "later/2", "later/3"};
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    for (const auto& k : later) {
      writer.set(k, k);
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto before = server.requests();
  values = client->multi_get(later, 10s);
  t.join();
  BOOST_TEST(server.requests() - before == 4u);  // the multi_get and the writer's 3 sets
  BOOST_TEST(values == later, boost::test_tools::per_element());
}

// The waiters' index: every waiter of a key wakes on its write (a barrier's crowd), a wait on
// keys one of which was erased meanwhile goes on waiting for it, and waits that ended leave
// nothing behind that a later write trips on.
BOOST_AUTO_TEST_CASE(waiters_wake_on_the_writes_of_their_keys) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", {}});
  constexpr int crowd = 40;
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < crowd; ++i)
    waiters.emplace_back([&] {
      try {
        rdzv::tcp_store c(local_client_of(server));
        if (c.get("open", 10s) == "yes") ++woke;
      } catch (const std::exception&) {
      }
    });
  rdzv::tcp_store admin(local_client_of(server));
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (server.connected() < crowd + 1 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(50ms);
  BOOST_TEST(woke.load() == 0);
  admin.set("open", "yes");
  for (auto& t : waiters) t.join();
  BOOST_TEST(woke.load() == crowd);

  // "a" present, "b" missing; "a" erased, "b" set: still waiting; "a" set: answered.
  admin.set("a", "1");
  std::atomic<bool> done{false};
  std::thread w([&] {
    try {
      rdzv::tcp_store c(local_client_of(server));
      c.wait(std::vector<std::string>{"a", "b"}, 10s);
      done = true;
    } catch (const std::exception&) {
    }
  });
  std::this_thread::sleep_for(100ms);
  admin.erase("a");
  admin.set("b", "2");
  std::this_thread::sleep_for(200ms);
  BOOST_TEST(!done.load(), "the wait goes on: \"a\" was erased");
  admin.add("a", 5);
  w.join();
  BOOST_TEST(done.load());

  // 3,000 waits that time out (more stale index entries than the server keeps before sweeping),
  // then their keys written: the server goes on serving.
  std::vector<std::string> many;
  for (int i = 0; i < 3000; ++i) many.push_back("stale/" + std::to_string(i));
  BOOST_CHECK_THROW(admin.wait(many, 50ms), kft::timeout_error);
  BOOST_CHECK_THROW(admin.wait(many, 50ms), kft::timeout_error);
  std::vector<rdzv::key_value> all;
  for (const auto& k : many) all.emplace_back(k, "v");
  admin.multi_set(all);
  admin.wait(many, 1s);
  BOOST_TEST(admin.multi_get(many, 1s).size() == many.size());
}

// A client that sends requests without reading the replies is served only while its unread
// replies stay under the limit (1 MiB in the server, plus what the kernel's buffers take), and
// the others are served meanwhile.
BOOST_AUTO_TEST_CASE(a_client_that_does_not_read_its_replies_stops_being_served) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", [](const std::string&) {}});
  rdzv::tcp_store admin(local_client_of(server));
  admin.set("big", std::string(1u << 20, 'x'));
  auto fd = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
  namespace wire = rdzv::wire;
  std::string burst = wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str("t").str("greedy").done();
  for (int i = 0; i < 2000; ++i) burst += wire::writer().u8(static_cast<std::uint8_t>(wire::op::get)).str("big").u32(0).done();
  BOOST_REQUIRE(rdzv::detail::send_all(fd.get(), burst, std::chrono::steady_clock::now() + 5s).empty());
  const auto before = server.requests();
  std::this_thread::sleep_for(500ms);
  const auto served = server.requests() - before;
  BOOST_TEST(served < 100u, served << " of the 2,000 requests served (2 GiB of replies) while none was read");
  const double took = seconds_of([&] {
    admin.set("other", "served");
    BOOST_TEST(admin.get("other", 1s) == "served");
  });
  BOOST_TEST(took < 1.0);
}

// The limits of one batch: more keys than a request may hold is refused by the client before it
// is sent and by the server if it comes anyway; values over a reply's 64 MiB are an error that
// leaves the connection usable.
BOOST_AUTO_TEST_CASE(batches_over_the_limits_are_refused_naming_them) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", [](const std::string&) {}});
  rdzv::tcp_store client(local_client_of(server));
  const std::vector<std::string> too_many(rdzv::wire::max_batch + 1);
  BOOST_CHECK_EXCEPTION((void)client.multi_get(too_many, 1s), kft::usage_error, [](const kft::usage_error& e) {
    BOOST_TEST_INFO(e.what());
    return std::string(e.what()).find("multi_get on 1048577 keys") != std::string::npos;
  });
  namespace wire = rdzv::wire;
  auto fd = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
  const std::string frames = wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str("t").str("raw").done() +
                             wire::writer().u8(static_cast<std::uint8_t>(wire::op::wait)).u32(wire::max_batch + 1).done();
  BOOST_REQUIRE(rdzv::detail::send_all(fd.get(), frames, std::chrono::steady_clock::now() + 2s).empty());
  std::string got(64, '\0');
  std::size_t have = 0;
  while (have < 9 + 5) {  // the hello's reply (5 bytes), then the error's header
    const auto r = rdzv::detail::recv_exact(fd.get(), got.data() + have, 1, std::chrono::steady_clock::now() + 2s);
    BOOST_REQUIRE(r.what == rdzv::detail::recv_result::status::ok);
    ++have;
  }
  BOOST_TEST(static_cast<int>(got[4]) == static_cast<int>(wire::status::ok));
  BOOST_TEST(static_cast<int>(got[9]) == static_cast<int>(wire::status::error));

  const std::string value((33u << 20), 'v');  // two of them: over a reply's 64 MiB
  client.set("v1", value);
  client.set("v2", value);
  BOOST_CHECK_EXCEPTION(client.multi_set(std::vector<rdzv::key_value>{{"v1", value}, {"v2", value}}), kft::usage_error,
                        [](const kft::usage_error& e) {
                          BOOST_TEST_INFO(e.what());
                          return std::string(e.what()).find("over a frame's 64 MiB") != std::string::npos;
                        });
  const std::vector<std::string> both{"v1", "v2"};
  BOOST_CHECK_EXCEPTION((void)client.multi_get(both, 1s), kft::usage_error, [](const kft::usage_error& e) {
    BOOST_TEST_INFO(e.what());
    return std::string(e.what()).find("ask for fewer keys") != std::string::npos;
  });
  BOOST_TEST(client.multi_get(std::vector<std::string>{"v1"}, 1s).front().size() == value.size());
}

// A client can connect from a chosen local address (the scale benchmark spreads its clients
// over 127.0.0.0/8 this way); the server sees it, and an address that cannot be bound is named.
BOOST_AUTO_TEST_CASE(a_client_connects_from_its_source_address) {
  std::vector<std::string> log;
  std::mutex mu;
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", [&](const std::string& l) {
                                   std::lock_guard lock(mu);
                                   log.push_back(l);
                                 }});
  auto o = local_client_of(server);
  o.source_address = "127.0.3.7";
  rdzv::tcp_store client(o);
  client.set("from", "127.0.3.7");
  o.token = "wrong";
  o.name = "source check";
  BOOST_CHECK_THROW(rdzv::tcp_store{o}, kft::config_error);
  {
    std::lock_guard lock(mu);
    BOOST_REQUIRE(!log.empty());
    BOOST_TEST(log.back().find("refused 127.0.3.7:") != std::string::npos, log.back());
  }
  o.token = "t";
  o.source_address = "10.255.255.254.1";
  o.connect_timeout = 1s;
  BOOST_CHECK_EXCEPTION(rdzv::tcp_store{o}, kft::config_error, [](const kft::config_error& e) {
    BOOST_TEST_INFO(e.what());
    return std::string(e.what()).find("10.255.255.254.1") != std::string::npos &&
           std::string(e.what()).find("store connect") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(garbage_does_not_crash_the_server) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "t", [](const std::string&) {}});
  for (std::string junk : {std::string("\xff\xff\xff\xff", 4), std::string("GET / HTTP/1.1\r\n\r\n"), std::string(5, '\0')}) {
    auto fd = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
    (void)!::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
  }
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "t";
  rdzv::tcp_store client(o);
  client.set("still", "alive");
  BOOST_TEST(client.get("still", 1s) == "alive");
}

// A burst of idle connections must not push out one whose hello may still be unread in its
// socket: while every stranger is younger than the grace, the new ones are closed; past it, the
// oldest goes (and a real client then gets in).
BOOST_AUTO_TEST_CASE(a_burst_does_not_evict_connections_younger_than_the_grace) {
  rdzv::tcp_store_server::options so{"127.0.0.1", 0, "t", [](const std::string&) {}};
  so.max_unauthenticated = 8;
  so.shed_grace = 700ms;
  rdzv::tcp_store_server server(so);
  auto closed = [](const rdzv::detail::unique_fd& fd) {  // the server hung up (within a short wait)
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 300) <= 0) return false;
    char b;
    return ::recv(fd.get(), &b, 1, MSG_DONTWAIT) <= 0;
  };
  std::vector<rdzv::detail::unique_fd> first, burst;
  for (int i = 0; i < 8; ++i) first.push_back(rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s));
  for (int i = 0; i < 4; ++i) burst.push_back(rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s));
  for (auto& fd : burst) BOOST_TEST(closed(fd), "a connection of the burst is closed");
  int open_first = 0;
  for (auto& fd : first) open_first += !closed(fd);
  BOOST_TEST(open_first == 8, "the earlier ones stay");
  BOOST_TEST(server.dropped() == 4);
  std::this_thread::sleep_for(800ms);  // the first 8 are past the grace now
  auto late = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
  BOOST_TEST(closed(first[0]), "the oldest stranger made room");
  BOOST_TEST(!closed(late));
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "t";
  rdzv::tcp_store client(o);  // the crowd is still there
  client.set("in", "yes");
  BOOST_TEST(client.get("in", 1s) == "yes");
}

// A store full of strangers younger than the grace closes a newcomer at once; the job's own
// client then connects again (with backoff, until its deadline) instead of failing.
BOOST_AUTO_TEST_CASE(a_client_turned_away_by_a_full_store_connects_again) {
  rdzv::tcp_store_server::options so{"127.0.0.1", 0, "t", [](const std::string&) {}};
  so.max_unauthenticated = 4;
  so.shed_grace = 60s;  // nobody can be shed: every newcomer is turned away while the crowd stays
  rdzv::tcp_store_server server(so);
  std::vector<rdzv::detail::unique_fd> crowd;
  for (int i = 0; i < 4; ++i) crowd.push_back(rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s));
  std::string failure;
  bool joined = false;
  std::thread agent([&] {  // records; the test thread checks (Boost.Test is not thread-safe)
    try {
      rdzv::tcp_store::options o;
      o.host = "127.0.0.1";
      o.port = server.port();
      o.token = "t";
      o.connect_timeout = 20s;
      rdzv::tcp_store client(o);
      client.set("in", "yes");
      joined = client.get("in", 1s) == "yes";
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  const auto turned_away_by = std::chrono::steady_clock::now() + 5s;
  while (server.dropped() == 0 && std::chrono::steady_clock::now() < turned_away_by) std::this_thread::sleep_for(10ms);
  const auto turned_away = server.dropped();
  crowd.clear();  // the crowd leaves; the client's next attempt gets a slot
  agent.join();
  BOOST_TEST(turned_away >= 1u, "the full store turned the client's first connection away");
  BOOST_TEST(failure.empty(), failure);
  BOOST_TEST(joined);
}

// A stranger that has sent bytes may be a client whose hello is arriving: shedding passes over
// it to the oldest silent one (the hello deadline still ends a slow talker).
BOOST_AUTO_TEST_CASE(shedding_passes_over_a_stranger_that_has_sent_bytes) {
  rdzv::tcp_store_server::options so{"127.0.0.1", 0, "t", [](const std::string&) {}};
  so.max_unauthenticated = 2;
  so.shed_grace = 100ms;
  rdzv::tcp_store_server server(so);
  auto closed = [](const rdzv::detail::unique_fd& fd) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 300) <= 0) return false;
    char b;
    return ::recv(fd.get(), &b, 1, MSG_DONTWAIT) <= 0;
  };
  auto talker = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);  // the older one
  const char partial[2] = {8, 0};  // half of a frame header
  BOOST_REQUIRE(::send(talker.get(), partial, sizeof partial, MSG_NOSIGNAL) == 2);
  auto silent = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
  std::this_thread::sleep_for(300ms);  // both past the grace
  auto newcomer = rdzv::detail::connect_with_retry("127.0.0.1", server.port(), 2s);
  BOOST_TEST(closed(silent), "the silent stranger is shed");
  BOOST_TEST(!closed(talker), "the older one that has sent bytes stays");
  BOOST_TEST(!closed(newcomer));
  BOOST_TEST(server.dropped() == 1u);
}

BOOST_AUTO_TEST_CASE(rank0_host_keeps_the_store_until_every_rank_left) {
  int port = 0;
  {
    rdzv::tcp_store_server probe({"127.0.0.1", 0, "t", {}});
    port = probe.port();
  }
  kft::world_info w0, w1;
  w0.rank = 0;
  w1.rank = 1;
  w0.world_size = w1.world_size = 2;
  w0.master_addr = w1.master_addr = "127.0.0.1";
  w0.master_port = w1.master_port = port;
  const kft::environment env(kft::environment::map_type{{"KFT_RDZV_TOKEN", "t"}});
  auto host = std::make_unique<rdzv::store_handle>(rdzv::connect_store(w0, env));
  BOOST_TEST(host->server != nullptr);
  auto other = rdzv::connect_store(w1, env);
  BOOST_TEST(other.server == nullptr);
  // Rank 0 finishes first; rank 1 still needs the store for a while.
  const double took = seconds_of([&] {
    std::thread leave([&] { host.reset(); });
    std::this_thread::sleep_for(300ms);
    other.client->set("late", "still served");
    BOOST_TEST(*other.client->try_get("late") == "still served");
    other.client.reset();  // rank 1 is done
    leave.join();
  });
  BOOST_TEST(took >= 0.29);
  BOOST_TEST(took < 5.0);
}

BOOST_AUTO_TEST_CASE(connect_store_uses_kftrun_variables_and_prefix) {
  rdzv::tcp_store_server server({"127.0.0.1", 0, "tok", {}});
  const kft::environment env(kft::environment::map_type{{"KFT_RDZV_TOKEN", "tok"},
                                                        {"KFT_STORE_ADDR", "127.0.0.1"},
                                                        {"KFT_STORE_PORT", std::to_string(server.port())},
                                                        {"KFT_STORE_PREFIX", "kftrun/job/r1/user/"}});
  kft::world_info w;
  auto h = rdzv::connect_store(w, env);
  BOOST_TEST(h.server == nullptr);
  h.client->set("k", "v");
  rdzv::tcp_store::options o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.token = "tok";
  rdzv::tcp_store raw(o);
  BOOST_TEST(*raw.try_get("kftrun/job/r1/user/k") == "v");
  // A launcher store without its token: refused, naming the variable.
  const kft::environment no_token(kft::environment::map_type{{"KFT_STORE_ADDR", "127.0.0.1"},
                                                             {"KFT_STORE_PORT", std::to_string(server.port())}});
  BOOST_CHECK_EXCEPTION(rdzv::connect_store(w, no_token), kft::config_error,
                        [](const kft::config_error& e) { return e.variable() == "KFT_RDZV_TOKEN"; });
}

namespace {
// A private runtime directory for the token handover, removed afterwards.
struct runtime_dir {
  std::filesystem::path path;
  runtime_dir() {
    char tmpl[] = "/tmp/kft-test-xdg-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~runtime_dir() { std::filesystem::remove_all(path); }
  std::size_t files() const {
    std::size_t n = 0;
    if (std::filesystem::exists(path / "kft"))
      for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path / "kft")) ++n;
    return n;
  }
};

int free_port() {
  rdzv::tcp_store_server probe({"127.0.0.1", 0, "t", {}});
  return probe.port();
}

kft::world_info one_host_rank(int rank, int size, int port, int nodes = 1) {
  kft::world_info w;
  w.rank = rank;
  w.world_size = size;
  w.node_count = nodes;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  return w;
}
}  // namespace

BOOST_AUTO_TEST_CASE(one_host_needs_no_token_and_leaves_no_file) {
  runtime_dir xdg;
  const int port = free_port();
  const kft::environment env(kft::environment::map_type{{"XDG_RUNTIME_DIR", xdg.path.string()},
                                                        {"TORCHELASTIC_RUN_ID", "unit-" + kft::random_token()}});
  std::optional<rdzv::store_handle> h1;
  std::thread peer([&] { h1.emplace(rdzv::connect_store(one_host_rank(1, 2, port), env, 10s)); });
  std::this_thread::sleep_for(100ms);  // rank 1 waits for rank 0's file
  auto h0 = std::make_unique<rdzv::store_handle>(rdzv::connect_store(one_host_rank(0, 2, port), env, 10s));
  peer.join();
  BOOST_TEST(h0->server != nullptr);
  BOOST_REQUIRE(!h0->token_file.empty());
  auto mode = [](const std::filesystem::path& p) {
    return static_cast<unsigned>(std::filesystem::status(p).permissions() & std::filesystem::perms::all);
  };
  BOOST_TEST(mode(h0->token_file) == 0600u);
  BOOST_TEST(mode(xdg.path / "kft") == 0700u);
  h1->client->set("from1", "x");
  BOOST_TEST(h0->client->get("from1", 2s) == "x");
  h1.reset();
  h0.reset();
  BOOST_TEST(xdg.files() == 0u);  // the handover file went with rank 0's handle
}

BOOST_AUTO_TEST_CASE(a_stale_token_file_of_a_dead_rank0_is_not_used) {
  runtime_dir xdg;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // a pid that no longer runs
  std::filesystem::create_directory(xdg.path / "kft");
  const auto file = (xdg.path / "kft" / "stale.token").string();
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    std::fprintf(f, "deadbeef %d\n", static_cast<int>(child));
    std::fclose(f);
    std::filesystem::permissions(file, std::filesystem::perms(0600));
  }
  BOOST_CHECK_EXCEPTION(rdzv::detail::read_token(file, 300ms), kft::timeout_error, [&](const kft::timeout_error& e) {
    return std::string(e.what()).find(file) != std::string::npos &&
           std::string(e.what()).find("KFT_RDZV_TOKEN") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(a_token_directory_open_to_others_is_refused) {
  runtime_dir xdg;
  std::filesystem::create_directory(xdg.path / "kft");
  std::filesystem::permissions(xdg.path / "kft", std::filesystem::perms(0755));
  const kft::environment env(kft::environment::map_type{{"XDG_RUNTIME_DIR", xdg.path.string()}});
  BOOST_CHECK_EXCEPTION(rdzv::connect_store(one_host_rank(0, 2, free_port()), env, 1s), kft::config_error,
                        [](const kft::config_error& e) {
                          return std::string(e.what()).find("is not a directory private to this user") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(several_hosts_still_need_a_token) {
  runtime_dir xdg;
  const kft::environment env(kft::environment::map_type{{"XDG_RUNTIME_DIR", xdg.path.string()}});
  BOOST_CHECK_EXCEPTION(rdzv::connect_store(one_host_rank(1, 4, free_port(), 2), env, 1s), kft::config_error,
                        [](const kft::config_error& e) {
                          return e.variable() == "KFT_RDZV_TOKEN" &&
                                 std::string(e.what()).find("several hosts") != std::string::npos;
                        });
  BOOST_TEST(xdg.files() == 0u);
}

BOOST_AUTO_TEST_CASE(torchrun_agent_store_needs_the_restart_count) {
  const kft::environment env(kft::environment::map_type{{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  BOOST_CHECK_EXCEPTION(rdzv::connect_store(one_host_rank(0, 2, 29500), env, 1s), kft::config_error,
                        [](const kft::config_error& e) { return e.variable() == "TORCHELASTIC_RESTART_COUNT"; });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(tokens_are_128_random_bits) {
  const auto a = kft::random_token(), b = kft::random_token();
  BOOST_TEST(a.size() == 32u);
  BOOST_TEST(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  BOOST_TEST(a != b);
}

// ---- a node's relay (tcp_store_server::options::upstream) -----------------------------------

namespace {
struct relay_pair {
  std::string token = kft::random_token();
  std::unique_ptr<rdzv::tcp_store_server> job;
  std::vector<std::unique_ptr<rdzv::tcp_store_server>> nodes;
  explicit relay_pair(int relays, std::function<void(const std::string&)> log = {}) {
    job = std::make_unique<rdzv::tcp_store_server>(rdzv::tcp_store_server::options{"127.0.0.1", 0, token, log});
    for (int i = 0; i < relays; ++i) {
      rdzv::tcp_store_server::options ro{"127.0.0.1", 0, token, log};
      ro.upstream = rdzv::relay_to("127.0.0.1", job->port());
      ro.upstream.name = "node " + std::to_string(i) + " relay";
      nodes.push_back(std::make_unique<rdzv::tcp_store_server>(ro));
    }
  }
  ~relay_pair() { nodes.clear(); }
  rdzv::tcp_store::options client(int port, std::string tok = {}) const {
    rdzv::tcp_store::options o;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = tok.empty() ? token : tok;
    o.connect_timeout = 5s;
    o.io_timeout = 10s;
    return o;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(ranks_meet_through_their_nodes_relays_and_the_store_sees_one_connection_per_node) {
  relay_pair p(2);
  constexpr int per_node = 4, world = 8;
  std::vector<long long> ranks(world, -1);
  std::vector<std::string> peers(world), errors(world);
  std::atomic<int> connected{0};
  int job_connections = -1;
  std::vector<std::thread> ts;
  for (int i = 0; i < world; ++i)
    ts.emplace_back([&, i] {
      try {
        rdzv::tcp_store s(p.client(p.nodes[static_cast<std::size_t>(i / per_node)]->port()));
        ++connected;
        const auto rank = s.add("rank", 1) - 1;
        ranks[static_cast<std::size_t>(i)] = rank;
        s.set("addr/" + std::to_string(rank), "host-" + std::to_string(rank));
        peers[static_cast<std::size_t>(i)] = s.get("addr/" + std::to_string((rank + 1) % world), 10s);
        rdzv::barrier(s, "b", world, 10s);
        if (rank == 0) job_connections = p.job->connected();  // (every rank is past the barrier's add)
        rdzv::barrier(s, "b2", world, 10s);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  std::vector<long long> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < world; ++i) {
    BOOST_TEST(errors[static_cast<std::size_t>(i)] == "");
    BOOST_TEST(sorted[static_cast<std::size_t>(i)] == i);  // each rank once
    const auto r = ranks[static_cast<std::size_t>(i)];
    BOOST_TEST(peers[static_cast<std::size_t>(i)] == "host-" + std::to_string((r + 1) % world));
  }
  BOOST_TEST(connected.load() == world);
  BOOST_TEST(job_connections == 2);  // the two relays, not the 8 ranks
  std::uint64_t through = 0, sent = 0;
  for (const auto& n : p.nodes) through += n->requests(), sent += n->upstream_requests();
  BOOST_TEST(sent <= through);
  BOOST_TEST(p.job->requests() == sent);  // the job's store served exactly what the relays sent
}

BOOST_AUTO_TEST_CASE(a_relay_shares_one_wait_among_its_clients_and_sends_a_late_one_up_again) {
  relay_pair p(1);
  const int port = p.nodes[0]->port();
  // 6 clients wait for one key through the relay: one wait goes up, all 6 get the value.
  std::vector<std::string> got(6);
  std::vector<std::thread> ts;
  for (std::size_t i = 0; i < got.size(); ++i)
    ts.emplace_back([&, i] {
      try {
        rdzv::tcp_store s(p.client(port));
        got[i] = s.get("ready", 10s);
      } catch (const std::exception& e) {
        got[i] = e.what();
      }
    });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (p.nodes[0]->requests() < got.size() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
  BOOST_TEST(p.nodes[0]->upstream_requests() == 1u);
  rdzv::tcp_store direct(p.client(p.job->port()));
  direct.set("ready", "yes");
  for (auto& t : ts) t.join();
  for (const auto& g : got) BOOST_TEST(g == "yes");
  BOOST_TEST(p.nodes[0]->upstream_requests() == 1u);

  // A short wait and a long one share the short one's; when it times out, the short one is
  // told so (naming the key) and the long one goes up again, and gets the value set later.
  std::string short_error, long_value;
  std::thread a([&] {
    try {
      rdzv::tcp_store s(p.client(port));
      (void)s.get("later", 300ms);
    } catch (const kft::timeout_error& e) {
      short_error = e.what();
    }
  });
  std::this_thread::sleep_for(50ms);
  std::thread b([&] {
    rdzv::tcp_store s(p.client(port));
    long_value = s.get("later", 10s);
  });
  std::this_thread::sleep_for(700ms);
  direct.set("later", "now");
  a.join();
  b.join();
  BOOST_TEST(short_error.find("later") != std::string::npos, short_error);
  BOOST_TEST(long_value == "now");
  BOOST_TEST(p.nodes[0]->upstream_requests() == 3u);  // the shared wait, and the long one again
}

BOOST_AUTO_TEST_CASE(a_client_that_asks_again_as_its_shared_wait_times_out_is_answered_too) {
  // Client A sends two gets of one key back to back (200 ms each); client B waits for it for
  // 10 s and shares A's first. When that times out, A's second get is read as A is answered,
  // and takes the key's shared entry: B goes up again alone, and both of A's gets are answered.
  relay_pair p(1);
  const int port = p.nodes[0]->port();
  auto fd = rdzv::detail::connect_with_retry("127.0.0.1", port, 2s);
  namespace wire = rdzv::wire;
  std::string out = wire::writer().u8(1).str(p.token).str("pipelined").done();
  for (int i = 0; i < 2; ++i) out += wire::writer().u8(static_cast<std::uint8_t>(wire::op::get)).str("k").u32(200).done();
  std::string b_value;
  std::thread b([&] {
    std::this_thread::sleep_for(50ms);
    rdzv::tcp_store s(p.client(port));
    b_value = s.get("k", 10s);
  });
  (void)!::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL);
  // The hello's answer, then two timeouts (status 2), within 3 s.
  std::string in;
  int timeouts = 0;
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (timeouts < 2 && std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{fd.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
    while (in.size() >= 4 && in.size() >= 4u + wire::frame_length(in)) {
      const auto len = wire::frame_length(in);
      if (len > 0 && static_cast<wire::status>(in[4]) == wire::status::timeout) ++timeouts;
      in.erase(0, 4u + len);
    }
  }
  BOOST_TEST(timeouts == 2);
  rdzv::tcp_store direct(p.client(p.job->port()));
  direct.set("k", "v");
  b.join();
  BOOST_TEST(b_value == "v");
}

BOOST_AUTO_TEST_CASE(adds_through_a_relay_give_every_client_its_own_value) {
  relay_pair p(1);
  constexpr int n = 16, each = 50;
  std::vector<std::vector<long long>> seen(n);
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      rdzv::tcp_store s(p.client(p.nodes[0]->port()));
      for (int k = 0; k < each; ++k) seen[static_cast<std::size_t>(i)].push_back(s.add("counter", 1 + (i % 3)));
    });
  for (auto& t : ts) t.join();
  // Every value a client got is one the counter took, in increasing order per client, and
  // the final value is the sum of every delta.
  std::vector<long long> all;
  for (int i = 0; i < n; ++i) {
    const auto& v = seen[static_cast<std::size_t>(i)];
    BOOST_TEST(std::is_sorted(v.begin(), v.end()));
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end());
  BOOST_TEST((std::adjacent_find(all.begin(), all.end()) == all.end()));  // no value twice
  long long total = 0;
  for (int i = 0; i < n; ++i) total += each * (1 + (i % 3));
  rdzv::tcp_store direct(p.client(p.job->port()));
  BOOST_TEST(direct.add("counter", 0) == total);
  BOOST_TEST(all.back() == total);
  BOOST_TEST_MESSAGE("adds through the relay: " << p.nodes[0]->requests() << " requests, "
                                                << p.nodes[0]->upstream_requests() << " sent up");
}

BOOST_AUTO_TEST_CASE(a_relay_refuses_a_wrong_token_and_drops_a_malformed_client_alone) {
  std::vector<std::string> lines;
  std::mutex mu;
  relay_pair p(1, [&](const std::string& l) {
    std::lock_guard lock(mu);
    lines.push_back(l);
  });
  const int port = p.nodes[0]->port();
  BOOST_CHECK_THROW(rdzv::tcp_store(p.client(port, "not-the-token")), kft::config_error);
  rdzv::tcp_store good(p.client(port));
  good.set("k", "v");
  // An authenticated client sends an unknown op, then a get with a missing field: the relay
  // drops it; its connection to the job's store and its other clients go on.
  for (std::string body : {std::string("\x63", 1), std::string("\x03\x01\x00\x00\x00k", 6)}) {
    auto fd = rdzv::detail::connect_with_retry("127.0.0.1", port, 2s);
    const std::string hello = rdzv::wire::writer().u8(1).str(p.token).str("junk").done();
    (void)!::send(fd.get(), hello.data(), hello.size(), MSG_NOSIGNAL);
    const std::string frame = rdzv::wire::writer().raw(body).done();
    (void)!::send(fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL);
    char buf[64];
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    ssize_t n = 1;
    std::size_t total = 0;
    while (n > 0 && std::chrono::steady_clock::now() < deadline) {  // the hello's answer, then the close
      n = ::recv(fd.get(), buf, sizeof buf, 0);
      if (n > 0) total += static_cast<std::size_t>(n);
    }
    BOOST_TEST(n == 0);      // closed by the relay
    BOOST_TEST(total == 5u);  // (only the hello's "ok")
  }
  BOOST_TEST(good.get("k", 1s) == "v");
  BOOST_TEST(p.job->connected() == 1);
  std::lock_guard lock(mu);
  BOOST_TEST(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
               return l.find("malformed request") != std::string::npos;
             }) == 2);
}

BOOST_AUTO_TEST_CASE(a_relay_that_loses_the_store_closes_its_clients) {
  relay_pair p(1, [](const std::string&) {});
  rdzv::tcp_store s(p.client(p.nodes[0]->port()));
  s.set("a", "1");
  std::string error;
  std::thread waiter([&] {
    try {
      (void)s.get("never", 30s);
    } catch (const kft::transport_error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  const double took = seconds_of([&] {
    p.job.reset();  // the job's store is gone
    waiter.join();
  });
  BOOST_TEST(error.find("lost the rendezvous store") != std::string::npos, error);
  BOOST_TEST(took < 5.0);
  BOOST_CHECK_THROW(rdzv::tcp_store(p.client(p.nodes[0]->port())).set("b", "2"), kft::transport_error);
}
