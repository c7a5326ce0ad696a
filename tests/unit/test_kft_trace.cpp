// SPDX-License-Identifier: Apache-2.0
// kft-trace's analysis (tools/kft-trace/analyze.hpp) on dumps written by hand: the first
// divergent call and its smaller side, the stuck call with who is inside and who never entered,
// chains of waits followed to a rank with no dump (through a cycle too), and bad input named by
// file and line. The real hangs are tests/integration/trace_hang_test.py and
// tests/netns/gloo-faults.sh.
#define BOOST_TEST_MODULE kft_trace
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "../../tools/kft-trace/analyze.hpp"

namespace kt = kft_trace;

namespace {

// One rank's dump: `calls` as "op:count:state" for seq 1, 2, ...
kt::dump make(int rank, int world, const std::vector<std::string>& calls, std::vector<int> waiting = {},
              std::string why = "deadline") {
  std::ostringstream s;
  s << R"({"kft_trace":1,"rank":)" << rank << R"(,"world_size":)" << world << R"(,"host":"h","pid":1,"why":")" << why
    << R"(","now_ns":1000000000,"unix_ms":5,"error":"e)" << rank << R"(","waiting_for":[)";
  for (std::size_t i = 0; i < waiting.size(); ++i) s << (i ? "," : "") << waiting[i];
  s << "]}\n";
  s << R"({"group":"g on host )" << rank << R"(","group_id":"job","group_rank":)" << rank << R"(,"group_size":)" << world
    << R"(,"recorded":)" << calls.size() << R"(,"capacity":8})" << "\n";
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto a = calls[i].find(':'), b = calls[i].rfind(':');
    s << R"({"group_id":"job","generation":0,"id":)" << i + 1 << R"(,"seq":)" << i + 1 << R"(,"op":")"
      << calls[i].substr(0, a) << R"(","dtype":"f32","count":)" << calls[i].substr(a + 1, b - a - 1)
      << R"(,"root":-1,"algorithm":"auto","enqueue_ns":1,"start_ns":2,"end_ns":0,"timed":true,"state":")"
      << calls[i].substr(b + 1) << "\"}\n";
  }
  std::istringstream in(s.str());
  return kt::parse(in, "rank" + std::to_string(rank) + ".jsonl");
}

std::vector<int> culprits(const nlohmann::json& r) {  // (sorted)
  std::vector<int> out;
  for (const auto& c : r["culprits"]) out.push_back(c["rank"]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_smaller_side_of_the_first_divergent_call_is_named) {
  const std::vector<kt::dump> d{make(0, 3, {"allreduce:8:completed", "allreduce:8:failed"}),
                                make(1, 3, {"allreduce:8:completed", "allreduce:7:failed"}, {0}),
                                make(2, 3, {"allreduce:8:completed", "allreduce:8:failed"}, {1})};
  const auto r = kt::analyze(d);
  const auto& g = r["groups"][0];
  BOOST_TEST(g["group"] == "job");  // (by id: the names differ by host)
  BOOST_TEST(g["divergence"]["seq"] == 2);
  BOOST_TEST((culprits(r) == std::vector<int>{1}));
  BOOST_TEST(r["culprits"][0]["why"].get<std::string>().find("f32 x 7") != std::string::npos);
}

// Identical calls folded into one entry (seq..seq_last) compare call by call: rank 1's run of
// 1024-float allreduces is cut by a 1023-float one at #40, inside the others' run of #1-#60.
BOOST_AUTO_TEST_CASE(folded_runs_are_compared_call_by_call) {
  auto run = [](int rank, const std::string& calls_json) {
    std::istringstream in(R"({"kft_trace":1,"rank":)" + std::to_string(rank) +
                          R"(,"world_size":2,"why":"mismatch","now_ns":5000000000}
)" + calls_json);
    return kt::parse(in, "rank" + std::to_string(rank) + ".jsonl");
  };
  const std::string tail = R"(,"dtype":"f32","root":-1,"start_ns":1,"end_ns":2,"state":)";
  const std::vector<kt::dump> d{
      run(0, R"({"group_id":"job","generation":0,"seq":1,"seq_last":60,"calls":60,"op":"allreduce","count":1024)" + tail +
                 R"("running"})" "\n"),
      run(1, R"({"group_id":"job","generation":0,"seq":1,"seq_last":39,"calls":39,"op":"allreduce","count":1024)" + tail +
                 R"("completed"})" "\n" R"({"group_id":"job","generation":0,"seq":40,"op":"allreduce","count":1023)" +
                 tail + R"("failed"})" "\n")};
  const auto r = kt::analyze(d);
  BOOST_TEST(r["groups"][0]["divergence"]["seq"] == 40);
  BOOST_TEST((culprits(r) == std::vector<int>{0, 1}), r["culprits"].dump());  // (a tie: one rank each side, both named)
  BOOST_TEST(r["groups"][0]["stuck"]["seq"] == 40);      // (rank 1's failed #40; rank 0 is past it: #60)
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_entered_the_stuck_call_is_named) {
  // Rank 2 finished #2 and went elsewhere; 0 and 1 wait in #3 (no links in their dumps).
  const std::vector<kt::dump> d{make(0, 3, {"allreduce:8:completed", "allreduce:8:completed", "broadcast:4:running"}),
                                make(1, 3, {"allreduce:8:completed", "allreduce:8:completed", "broadcast:4:running"}),
                                make(2, 3, {"allreduce:8:completed", "allreduce:8:completed"}, {}, "SIGUSR1")};
  const auto r = kt::analyze(d);
  const auto& s = r["groups"][0]["stuck"];
  BOOST_TEST(s["seq"] == 3);
  BOOST_TEST(s["inside"].size() == 2u);
  BOOST_REQUIRE(s["not_entered"].size() == 1u);
  BOOST_TEST(s["not_entered"][0]["rank"] == 2);
  BOOST_TEST((culprits(r) == std::vector<int>{2}));
}

BOOST_AUTO_TEST_CASE(chains_are_followed_to_the_rank_with_no_dump) {
  // 4 ranks: 1 -> 0 -> 2 -> 3 (no dump); rank 2 also lists 0 (a dense hint), which is on the path.
  const std::vector<kt::dump> d{make(0, 4, {"allreduce:8:running"}, {2}), make(1, 4, {"allreduce:8:running"}, {0}),
                                make(2, 4, {"allreduce:8:failed"}, {0, 3})};
  const auto r = kt::analyze(d);
  BOOST_TEST((r["no_dump"].get<std::vector<int>>() == std::vector<int>{3}));
  BOOST_TEST((culprits(r) == std::vector<int>{3}));
  bool whole = false;
  for (const auto& c : r["chains"]) whole |= c.get<std::vector<int>>() == std::vector<int>{1, 0, 2, 3};
  BOOST_TEST(whole, r["chains"].dump());
  BOOST_TEST(r["culprits"][0]["why"].get<std::string>().find("e2") != std::string::npos);  // (rank 2's error)
}

// Both ranks of a host stopped: every wait leads to rank 2, yet rank 3 wrote no dump either
// while the others are stuck, and is named too.
BOOST_AUTO_TEST_CASE(every_silent_rank_of_a_stuck_job_is_named) {
  const std::vector<kt::dump> d{make(0, 4, {"allreduce:8:running"}, {2}), make(1, 4, {"allreduce:8:running"}, {0})};
  const auto r = kt::analyze(d);
  BOOST_TEST((culprits(r) == std::vector<int>{2, 3}), r["culprits"].dump());
}

BOOST_AUTO_TEST_CASE(a_cycle_of_waits_ends_without_a_wrong_culprit) {
  // 0 and 1 wait for each other (both dumped, nothing missing): no chain ends at a rank with
  // no dump, and no rank is named for it.
  const std::vector<kt::dump> d{make(0, 2, {"allreduce:8:running"}, {1}), make(1, 2, {"allreduce:8:running"}, {0})};
  const auto r = kt::analyze(d);
  BOOST_TEST(culprits(r).empty(), r["culprits"].dump());
  BOOST_TEST(kt::describe(r, "d").find("no culprit found") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_input_is_named_by_file_and_line) {
  auto refused = [](const std::string& text, const std::string& want) {
    std::istringstream in(text);
    try {
      (void)kt::parse(in, "rank7.jsonl");
    } catch (const kt::bad_input& e) {
      BOOST_TEST(std::string(e.what()).find(want) != std::string::npos, e.what() << " should say " << want);
      return;
    }
    BOOST_ERROR("not refused: " << text);
  };
  refused("", "rank7.jsonl: empty");
  refused("{\"rank\":1}\n", "rank7.jsonl:1: not a kft flight-recorder dump");
  refused("{\"kft_trace\":2,\"rank\":1}\n", "format 2");
  refused("{\"kft_trace\":1,\"rank\":\"x\",\"world_size\":2,\"why\":\"a\",\"now_ns\":1}\n", "\"rank\" is \"x\"");
  refused("{\"kft_trace\":1,\"rank\":1,\"world_size\":2,\"why\":\"a\",\"now_ns\":1}\n{\"group_id\":\"j\",\"op\":\"x\"}\n",
          "rank7.jsonl:2: no \"generation\" field");
  refused("{\"kft_trace\":1,\"rank\":1,\"world_size\":2,\"why\":\"a\",\"now_ns\":1}\nnot json\n", "rank7.jsonl:2: not JSON");
}
