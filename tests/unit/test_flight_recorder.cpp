// SPDX-License-Identifier: Apache-2.0
// The flight recorder (kft/core/flight_recorder.hpp; issue 47): the ring, the clock's stride,
// asynchronous calls' times, the process group's recording, and the dump: its format, SIGUSR1,
// a fatal signal, a deadline.
#define BOOST_TEST_MODULE kft_flight_recorder
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <kft/async/work.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/group/factory.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

namespace fs = std::filesystem;
namespace tr = kft::trace;
using namespace std::chrono_literals;

namespace {

tr::slot_ref issue(tr::recorder& r, std::uint64_t seq, bool queued = false) {
  return r.begin(kft::collective::allreduce, kft::dtype::f32, 1000 + seq, seq, 0, kft::algo::automatic, -1, queued);
}

std::vector<nlohmann::json> read_lines(const fs::path& p) {
  std::ifstream in(p);
  BOOST_REQUIRE_MESSAGE(in, "no dump at " << p);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

kft::world_info place(int rank, int size) {
  kft::world_info w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank;
  w.local_size = size;
  w.node_rank = 0;
  w.node_count = 1;
  w.hostname = "host0";
  w.backend = "test";
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_ring_keeps_the_last_calls_in_order) {
  tr::recorder r("g", 4);
  BOOST_TEST(r.capacity() == 4u);
  for (std::uint64_t s = 1; s <= 6; ++s) tr::recorder::end(issue(r, s), s != 5);
  const auto e = r.entries();
  BOOST_REQUIRE(e.size() == 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    BOOST_TEST(e[i]->seq == i + 3);
    BOOST_TEST(e[i]->count == 1000 + i + 3);
    BOOST_TEST(e[i]->id.load() == i + 3);
  }
  BOOST_TEST((e[2]->st.load() == tr::state::failed));  // seq 5
  BOOST_TEST((e[3]->st.load() == tr::state::completed));
  const auto in_flight = issue(r, 7);
  BOOST_TEST((r.entries().back()->st.load() == tr::state::running));
  tr::recorder::end(in_flight, true);
  BOOST_TEST(tr::recorder("rounded up", 5).capacity() == 8u);
}

// Calls issued back to back share clock readings (two readings would cost more than 1% of
// them); calls issued slowly are each timed.
BOOST_AUTO_TEST_CASE(fast_calls_share_readings_slow_ones_are_each_timed) {
  tr::recorder r("fast", 1024);
  for (std::uint64_t s = 1; s <= 512; ++s) tr::recorder::end(issue(r, s), true);
  BOOST_TEST(r.stride() > 1u);
  int untimed = 0;
  for (const auto* e : r.entries()) {
    if (!e->timed) {
      ++untimed;
      BOOST_TEST(e->end_ns.load() == 0);
      BOOST_TEST(e->start_ns.load() > 0);  // (the last reading: a lower bound)
    }
  }
  BOOST_TEST(untimed > 256);
  tr::recorder slow("slow", 64);
  for (std::uint64_t s = 1; s <= 20; ++s) {
    tr::recorder::end(issue(slow, s), true);
    std::this_thread::sleep_for(1ms);
  }
  BOOST_TEST(slow.stride() == 1u);
  const auto e = slow.entries();
  for (std::size_t i = 1; i < e.size(); ++i) {  // (the first call has no interval to go by)
    BOOST_TEST(e[i]->timed);
    BOOST_TEST(e[i]->end_ns.load() >= e[i]->start_ns.load());
  }
}

// Identical blocking calls in a row share one entry (seq..seq_last, calls); a different call,
// a failed one or an asynchronous one starts a new entry.
BOOST_AUTO_TEST_CASE(identical_calls_in_a_row_share_an_entry) {
  tr::recorder r("fold", 8);
  auto same = [&](std::uint64_t seq, bool queued = false) {
    return r.begin(kft::collective::allreduce, kft::dtype::f64, 1, seq, 0, kft::algo::automatic, -1, queued);
  };
  for (std::uint64_t s = 1; s <= 100; ++s) tr::recorder::end(same(s), true);
  auto e = r.entries();
  BOOST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0]->seq == 1u);
  BOOST_TEST(e[0]->seq_last == 100u);
  BOOST_TEST(e[0]->calls == 100u);
  BOOST_TEST((e[0]->st.load() == tr::state::completed));
  const auto running = same(101);  // (in flight: the entry says running, its last call is 101)
  BOOST_TEST((r.entries().back()->st.load() == tr::state::running));
  BOOST_TEST(r.entries().back()->seq_last == 101u);
  tr::recorder::end(running, false);  // it fails: the next identical call starts a new entry
  tr::recorder::end(same(102), true);
  tr::recorder::end(issue(r, 103), true);  // (another count)
  tr::recorder::end(same(104), true);
  tr::recorder::end(same(106), true);  // (not the next number: a call of another group's path)
  tr::recorder::end(same(107, true), true);  // (asynchronous: never folded)
  e = r.entries();
  BOOST_REQUIRE(e.size() == 6u);
  BOOST_TEST(e[0]->seq_last == 101u);
  BOOST_TEST((e[0]->st.load() == tr::state::failed));
  BOOST_TEST(e[1]->seq == 102u);
  BOOST_TEST(e[1]->calls == 1u);
  BOOST_TEST(e[2]->seq == 103u);
  BOOST_TEST(e[3]->seq == 104u);
  BOOST_TEST(e[4]->seq == 106u);
  BOOST_TEST(e[5]->seq == 107u);
}

// An asynchronous call's entry is queued when issued, then takes its work's start and end.
BOOST_AUTO_TEST_CASE(an_asynchronous_call_takes_its_works_times) {
  tr::recorder r("async", 8);
  auto st = std::make_shared<kft::async::work_state>();
  kft::async::work w(st);
  const auto ref = issue(r, 1, true);
  w.record_into(ref);
  BOOST_TEST((ref.e->st.load() == tr::state::queued));
  st->start();
  BOOST_TEST((ref.e->st.load() == tr::state::running));
  st->complete(std::make_exception_ptr(kft::remote_error("peer gone", kft::error_site::of("test"))));
  BOOST_TEST((ref.e->st.load() == tr::state::failed));
  BOOST_TEST(ref.e->ns_times.load());
  BOOST_TEST(ref.e->start_ns.load() == st->started_ns());
  BOOST_TEST(ref.e->end_ns.load() == st->done_ns());
  BOOST_CHECK_THROW(w.wait(), kft::remote_error);
  // Completed before the recorder attached: written at once.
  auto done = std::make_shared<kft::async::work_state>();
  done->complete();
  kft::async::work w2(done);
  const auto ref2 = issue(r, 2, true);
  w2.record_into(ref2);
  BOOST_TEST((ref2.e->st.load() == tr::state::completed));
  BOOST_TEST(ref2.e->end_ns.load() == done->done_ns());
}

// make_process_group records every call of the group (KFT_TRACE_ENTRIES), blocking and
// asynchronous, with the group's sequence numbers; 0 records nothing; a bad value is named.
BOOST_AUTO_TEST_CASE(the_process_group_records_its_calls) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const kft::environment env(kft::environment::map_type{{"KFT_RUN_ID", "trace-test"}, {"KFT_TRACE_ENTRIES", "16"}});
  std::vector<std::vector<std::string>> seen(2);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      auto pg = kft::group::make_process_group(place(r, 2), store, {}, env);
      BOOST_REQUIRE(pg.recorder() != nullptr);
      std::vector<float> x(100, 1.0f);
      pg.allreduce(std::span<float>(x), kft::ops::sum);
      pg.broadcast(std::span<float>(x), 1);
      auto w = pg.allreduce_async(std::span<float>(x), kft::ops::sum);
      w.wait();
      pg.barrier();
      for (const auto* e : pg.recorder()->entries())
        seen[static_cast<std::size_t>(r)].push_back(std::string(kft::name(e->op)) + " #" + std::to_string(e->seq) + " " +
                                                    std::string(tr::name(e->st.load())) + " root " + std::to_string(e->root) +
                                                    " n " + std::to_string(e->count));
    });
  for (auto& x : t) x.join();
  const std::vector<std::string> want = {"allreduce #1 completed root -1 n 100", "broadcast #2 completed root 1 n 100",
                                         "allreduce #3 completed root -1 n 100", "barrier #4 completed root -1 n 0"};
  BOOST_TEST(seen[0] == want, boost::test_tools::per_element());
  BOOST_TEST(seen[1] == want, boost::test_tools::per_element());
  const kft::environment off(kft::environment::map_type{{"KFT_TRACE_ENTRIES", "0"}});
  BOOST_TEST(kft::group::trace_settings(off).entries == 0u);
  const kft::environment bad(kft::environment::map_type{{"KFT_TRACE_ENTRIES", "lots"}});
  try {
    (void)kft::group::trace_settings(bad);
    BOOST_FAIL("KFT_TRACE_ENTRIES=lots was accepted");
  } catch (const kft::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("KFT_TRACE_ENTRIES") != std::string::npos);
  }
}

// The shared-memory transport writes its blocking calls' entries, begun once the rank's arrival
// is out and ended as they return (trace::arrival_note): the entry is there while the call
// waits, it names the algorithm the transport chose, a call made on the communicator directly
// is recorded too, and calls that fail before their arrival are recorded by the group with the
// right numbers: a broadcast refused for its root before it is numbered, an allreduce refused
// for overlapping buffers after.
BOOST_AUTO_TEST_CASE(the_shared_memory_transport_writes_entries_at_arrival) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const kft::environment env(kft::environment::map_type{{"KFT_RUN_ID", "trace-notes"}, {"KFT_TRACE_ENTRIES", "16"}});
  std::vector<std::vector<std::string>> seen(2);
  std::atomic<bool> looked{false};
  std::string inside;
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      auto pg = kft::group::make_process_group(place(r, 2), store, {}, env);
      auto* shm = pg.get<kft::shm::communicator>();
      BOOST_REQUIRE(shm != nullptr);
      std::vector<float> x(4, 1.0f);
      pg.allreduce(std::span<float>(x), kft::ops::sum);  // #1
      try {
        pg.broadcast(std::span<float>(x), 7);  // refused before it is numbered: no rank runs it
        BOOST_FAIL("a broadcast from root 7 of 2 ranks ran");
      } catch (const kft::usage_error&) {
      }
      try {  // #2, refused by rank 0 for its own buffers after it was numbered: rank 1 refuses it too
        if (r == 0) pg.allreduce(x.data(), x.data() + 1, 2, kft::dtype::f32, kft::op_kind::sum);
        else pg.allreduce(std::span<float>(x), kft::ops::sum);
        BOOST_FAIL("an allreduce that rank 0 refused ran");
      } catch (const kft::usage_error&) {
      }
      shm->barrier();  // #3, on the communicator directly
      // #4: rank 1 comes only once rank 0's entry was seen while its call waited
      std::span<double> y(reinterpret_cast<double*>(x.data()), 2);
      if (r == 1) {
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        while (!looked.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
        pg.allreduce(y, kft::ops::max);
      } else {
        std::thread look([&] {
          const auto give_up = std::chrono::steady_clock::now() + 10s;
          while (std::chrono::steady_clock::now() < give_up) {
            inside = pg.recorder()->last_call_json(1.0);
            if (inside.find("\"seq\":4") != std::string::npos) break;
            std::this_thread::sleep_for(1ms);
          }
          looked = true;
        });
        pg.allreduce(y, kft::ops::max);
        look.join();
      }
      for (const auto* e : pg.recorder()->entries())
        seen[static_cast<std::size_t>(r)].push_back(std::string(kft::name(e->op)) + " #" + std::to_string(e->seq) + " " +
                                                    std::string(tr::name(e->st.load())) + " " +
                                                    std::string(kft::name(e->type)) + " n " + std::to_string(e->count) +
                                                    " " + std::string(kft::name(e->algorithm)));
    });
  for (auto& x : t) x.join();
  const std::vector<std::string> want = {"allreduce #1 completed f32 n 4 one_shot",
                                         "broadcast #2 failed f32 n 4 auto",
                                         "allreduce #2 failed f32 n 2 auto",
                                         "barrier #3 completed u8 n 0 one_shot",
                                         "allreduce #4 completed f64 n 2 one_shot"};
  BOOST_TEST(seen[0] == want, boost::test_tools::per_element());
  BOOST_REQUIRE(seen[1].size() == want.size());
  for (std::size_t i : {0, 1, 3, 4}) BOOST_TEST(seen[1][i] == want[i]);
  // (rank 1's #2 passed its own check, so its entry was written at its arrival)
  BOOST_TEST(seen[1][2] == "allreduce #2 failed f32 n 4 one_shot");
  BOOST_TEST(inside.find("\"state\":\"running\"") != std::string::npos, inside);
  BOOST_TEST(inside.find("\"seq\":4") != std::string::npos, inside);
}

// The dump: JSON lines, the process first, then every entry of every live recorder, oldest
// first; SIGUSR1 rewrites it and the process goes on.
BOOST_AUTO_TEST_CASE(a_dump_and_sigusr1_write_every_ring) {
  const fs::path dir = fresh_dir("kft-trace-test");
  tr::configure({.entries = 8, .dir = dir.string()}, 3, 8, "node\"1");
  tr::recorder a("group \"a\"", 8), b("group b", 8);
  a.place(2, 5);
  b.identify("b");
  for (std::uint64_t s = 1; s <= 3; ++s) tr::recorder::end(issue(a, s), true);
  const auto stuck = issue(b, 1);
  BOOST_REQUIRE(tr::dump("test"));
  auto lines = read_lines(dir / "rank3.jsonl");
  BOOST_REQUIRE(lines.size() == 7u);  // the process, group a and its 3 calls, group b and its call
  BOOST_TEST(lines[0]["rank"] == 3);
  BOOST_TEST(lines[0]["world_size"] == 8);
  BOOST_TEST(lines[0]["host"] == "node1");  // (a quote in a host name is dropped)
  BOOST_TEST(lines[0]["why"] == "test");
  BOOST_TEST(lines[0]["pid"] == ::getpid());
  BOOST_TEST(!lines[0].contains("error"));  // (no call failed)
  BOOST_TEST(lines[1]["group"] == "group \"a\"");
  BOOST_TEST(lines[1]["group_rank"] == 2);
  BOOST_TEST(lines[1]["group_size"] == 5);
  BOOST_TEST(lines[1]["recorded"] == 3);
  BOOST_TEST(!lines[1].contains("op"));
  BOOST_TEST(lines[1]["group_id"] == "group \"a\"");  // (no id given: its name)
  BOOST_TEST(lines[2]["group_id"] == "group \"a\"");
  BOOST_TEST(lines[2]["seq"] == 1);
  BOOST_TEST(lines[4]["seq"] == 3);
  BOOST_TEST(lines[4]["seq_last"] == 3);
  BOOST_TEST(lines[4]["calls"] == 1);
  BOOST_TEST(lines[4]["state"] == "completed");
  BOOST_TEST(lines[4]["op"] == "allreduce");
  BOOST_TEST(lines[4]["dtype"] == "f32");
  BOOST_TEST(lines[5]["group"] == "group b");
  BOOST_TEST(lines[5]["group_size"] == -1);  // (never placed)
  BOOST_TEST(lines[6]["group_id"] == "b");
  BOOST_TEST(lines[6]["state"] == "running");
  BOOST_TEST(lines[6]["end_ns"] == 0);
  const std::int64_t started = lines[6]["start_ns"];
  BOOST_TEST(started > 0);
  BOOST_TEST(started <= static_cast<std::int64_t>(lines[0]["now_ns"]));
  // A failure's error and the ranks it waited for go into the next dumps' first line.
  tr::note_failure("kft: rank 3/8 allreduce #4: timed out waiting for rank(s) 5", {5, 6});
  ::raise(SIGUSR1);  // (the handler dumps and returns)
  lines = read_lines(dir / "rank3.jsonl");
  BOOST_TEST(lines[0]["why"] == "SIGUSR1");
  BOOST_TEST(lines[0]["error"] == "kft: rank 3/8 allreduce #4: timed out waiting for rank(s) 5");
  BOOST_TEST((lines[0]["waiting_for"] == nlohmann::json::array({5, 6})));
  BOOST_TEST(lines.size() == 7u);
  tr::note_failure("", {});  // (the registry is the process's: leave it as found)
  tr::recorder::end(stuck, true);
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().filename().string().starts_with("rank");
  BOOST_TEST(files == 1u);  // (the temporary file was renamed: nothing else is left)
  fs::remove_all(dir);
}

// A fatal signal: the handler dumps, then the process dies of the signal as it would have.
BOOST_AUTO_TEST_CASE(a_fatal_signal_dumps_then_kills) {
  const fs::path dir = fresh_dir("kft-trace-fatal");
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // (Boost.Test's own handler: a program's handler is kept, not replaced)
    tr::configure({.entries = 8, .dir = dir.string()}, 5, 6, "h");
    tr::recorder r("crashing", 8);
    (void)issue(r, 42);
    ::raise(SIGSEGV);
    ::_exit(0);  // (not reached)
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(WTERMSIG(status) == SIGSEGV);
  const auto lines = read_lines(dir / "rank5.jsonl");
  BOOST_REQUIRE(lines.size() >= 2u);
  BOOST_TEST(lines[0]["why"] == "SIGSEGV");
  BOOST_TEST(lines.back()["group_id"] == "crashing");
  BOOST_TEST(lines.back()["seq"] == 42);
  BOOST_TEST(lines.back()["state"] == "running");
  fs::remove_all(dir);
}

// A call that passes its deadline fails and dumps: the entry says failed, the dump why.
BOOST_AUTO_TEST_CASE(a_deadline_dumps) {
  const fs::path dir = fresh_dir("kft-trace-deadline");
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  const kft::environment env(kft::environment::map_type{
      {"KFT_RUN_ID", "trace-deadline"}, {"KFT_TRACE_DIR", dir.string()}, {"KFT_TIMEOUT", "3s"}});
  std::string error;
  std::vector<std::thread> t;
  std::atomic<bool> built{false};
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      auto pg = kft::group::make_process_group(place(r, 2), store, {}, env);
      std::vector<float> x(10, 1.0f);
      pg.allreduce(std::span<float>(x), kft::ops::sum);
      if (r == 1) {  // rank 1 skips the second allreduce: rank 0 waits to its deadline
        while (!built.load()) std::this_thread::sleep_for(10ms);
        return;
      }
      try {
        pg.allreduce(std::span<float>(x), kft::ops::sum, {.algorithm = kft::algo::automatic, .timeout = 500ms, .tag = 0});
      } catch (const kft::timeout_error& e) {
        error = e.what();
      }
      const auto e = pg.recorder()->entries();
      BOOST_TEST((e.back()->st.load() == tr::state::failed));
      BOOST_TEST(e.back()->seq_last == 2u);  // (the two allreduces are alike: one entry, #1-#2)
      built = true;
    });
  for (auto& x : t) x.join();
  BOOST_TEST(!error.empty());
  bool found = false;
  for (const auto& f : fs::directory_iterator(dir)) {
    const auto lines = read_lines(f.path());
    if (lines.empty() || lines[0]["why"] != "deadline") continue;
    // (the error that made the dump, and the rank it waited for: rank 1, which skipped the call)
    BOOST_TEST(lines[0]["error"].get<std::string>().find("timed out") != std::string::npos);
    BOOST_TEST((lines[0]["waiting_for"] == nlohmann::json::array({1})));
    for (std::size_t i = 1; i < lines.size(); ++i)
      found |= lines[i].contains("op") && lines[i]["seq_last"] == 2 && lines[i]["state"] == "failed" &&
               lines[i]["op"] == "allreduce";
  }
  BOOST_TEST(found, "a dump says the deadline and the failed allreduce #2");
  fs::remove_all(dir);
}
