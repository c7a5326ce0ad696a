// SPDX-License-Identifier: Apache-2.0
// Naming a slow rank (kft/ddp/stragglers.hpp; issue 47 item 5): the detection on synthetic
// windows (the median of the other ranks, the threshold, the windows in a row, recovery and its
// hysteresis, ranks without steps, the warm-up window, bad options), then the trainer with ranks as threads over the
// shared-memory transport and a model whose work is a sleep: a rank whose work grows by 20% at
// a known step is named within 30 steps on every rank's observer and in the JSON log, nobody
// else is, it is named once, and a run with no slow rank names none. (The multi-process test
// with a real CPU quota is tests/integration/straggler_test.py.)
#define BOOST_TEST_MODULE kft_stragglers
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/stragglers.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/group/process_group.hpp>

#include "../common/shm_ranks.hpp"

using namespace std::chrono_literals;
namespace ddp = kft::ddp;

namespace {

// One window: every rank did `steps` steps with the given seconds per step.
std::vector<ddp::straggler_event> feed(ddp::straggler_detector& d, std::uint64_t step, std::vector<double> per_step,
                                       double steps = 10) {
  std::vector<double> sums(per_step.size()), counts(per_step.size(), steps);
  for (std::size_t r = 0; r < per_step.size(); ++r) sums[r] = per_step[r] * steps;
  return d.window(step, sums, counts);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_median_is_the_other_ranks_one) {
  ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 1, .warmup = 0});
  // Two ranks: the other rank's value, so a rank 20% slower than its peer is 20% above it
  // (the median of both would put it only 9% above).
  d.reset(2);
  auto e = feed(d, 10, {1.0, 1.2});
  BOOST_TEST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].rank == 1);
  BOOST_TEST(e[0].ranks == 2);
  BOOST_TEST(e[0].median == 1.0);
  BOOST_TEST(e[0].excess == 0.2, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(!e[0].recovered);
  // Four ranks: the others of rank 3 are {1.0, 1.0, 1.05}, median 1.0 (odd count); rank 1 is
  // 5% above its others' median (1.0): not named.
  d.reset(4);
  e = feed(d, 10, {1.0, 1.05, 1.0, 1.25});
  BOOST_TEST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].rank == 3);
  BOOST_TEST(e[0].median == 1.0);
  // Five ranks: the others of the slow one are four values, the mean of the middle two.
  d.reset(5);
  e = feed(d, 10, {1.0, 1.05, 1.0, 0.8, 1.5});
  BOOST_TEST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].rank == 4);
  BOOST_TEST(e[0].median == (1.0 + 1.0) / 2);
  // Equal values: removing any one copy leaves the same list.
  d.reset(3);
  BOOST_TEST(feed(d, 10, {2.0, 2.0, 2.0}).empty());
}

BOOST_AUTO_TEST_CASE(below_the_threshold_or_one_window_names_nobody) {
  ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 2, .warmup = 0});
  d.reset(3);
  // 9% above: never named, however long.
  for (std::uint64_t w = 1; w <= 20; ++w) BOOST_TEST(feed(d, 10 * w, {1.0, 1.0, 1.09}).empty());
  // A single slow window between normal ones (a hiccup): nobody.
  for (std::uint64_t w = 21; w <= 40; ++w) BOOST_TEST(feed(d, 10 * w, {1.0, w % 3 ? 1.0 : 1.5, 1.0}).empty());
  BOOST_TEST(!d.straggling(1));
}

BOOST_AUTO_TEST_CASE(a_sustained_slowdown_is_named_once_and_recovers_once) {
  ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 2, .warmup = 0});
  d.reset(4);
  d.set_host(2, "node-b");
  BOOST_TEST(feed(d, 10, {1.0, 1.0, 1.0, 1.0}).empty());
  BOOST_TEST(feed(d, 20, {1.0, 1.0, 1.2, 1.0}).empty());  // one window: not yet
  auto e = feed(d, 30, {1.0, 1.0, 1.2, 1.0});              // two: named
  BOOST_TEST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].rank == 2);
  BOOST_TEST(e[0].step == 30u);
  BOOST_TEST(e[0].host == "node-b");
  BOOST_TEST(!e[0].recovered);
  BOOST_TEST(d.straggling(2));
  for (std::uint64_t s = 40; s <= 100; s += 10) BOOST_TEST(feed(d, s, {1.0, 1.0, 1.2, 1.0}).empty());  // once
  // Back to 7% above: below the threshold but not below half of it; still named (hysteresis).
  for (std::uint64_t s = 110; s <= 150; s += 10) BOOST_TEST(feed(d, s, {1.0, 1.0, 1.07, 1.0}).empty());
  BOOST_TEST(d.straggling(2));
  BOOST_TEST(feed(d, 160, {1.0, 1.0, 1.01, 1.0}).empty());  // one fast window: not yet
  e = feed(d, 170, {1.0, 1.0, 1.0, 1.0});
  BOOST_TEST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].rank == 2);
  BOOST_TEST(e[0].recovered);
  BOOST_TEST(!d.straggling(2));
  // Slow again: named again.
  BOOST_TEST(feed(d, 180, {1.0, 1.0, 1.3, 1.0}).empty());
  BOOST_TEST(feed(d, 190, {1.0, 1.0, 1.3, 1.0}).size() == 1u);
  // A new membership forgets it all (a shrink: the ranks are others).
  d.reset(3);
  BOOST_TEST(!d.straggling(2));
  BOOST_TEST(feed(d, 200, {1.0, 1.0, 1.3}).empty());
}

BOOST_AUTO_TEST_CASE(ranks_without_steps_are_not_judged_nor_counted) {
  ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 1, .warmup = 0});
  d.reset(3);
  // Rank 0 has joined (no steps): rank 1 and 2 are compared with each other only.
  std::vector<double> sums{0.0, 10.0, 10.5}, counts{0.0, 10.0, 10.0};
  BOOST_TEST(d.window(10, sums, counts).empty());
  // Only one rank left with steps: nobody to compare with.
  sums = {0.0, 0.0, 50.0}, counts = {0.0, 0.0, 10.0};
  BOOST_TEST(d.window(20, sums, counts).empty());
  // Work per step, not per window: a rank with half the steps and half the time is not slow.
  sums = {10.0, 5.0, 10.0}, counts = {10.0, 5.0, 10.0};
  BOOST_TEST(d.window(30, sums, counts).empty());
}

BOOST_AUTO_TEST_CASE(the_first_window_of_a_membership_is_seen_not_judged) {
  ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 1, .warmup = 1});
  d.reset(2);
  BOOST_TEST(feed(d, 10, {1.0, 1.5}).empty());  // warm-up: seen ...
  BOOST_TEST(d.last_excess()[1] == 0.5, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(d.windows() == 1u);
  BOOST_TEST(feed(d, 20, {1.0, 1.5}).size() == 1u);  // ... then judged
  d.reset(2);  // a new membership warms up again
  BOOST_TEST(feed(d, 30, {1.0, 1.5}).empty());
}

BOOST_AUTO_TEST_CASE(bad_options_and_sizes_are_named) {
  auto has = [](const std::string& what) {
    return [what](const kft::usage_error& e) { return std::string(e.what()).find(what) != std::string::npos; };
  };
  BOOST_CHECK_EXCEPTION(ddp::straggler_detector({.every = 10, .threshold = 0.0, .sustain = 2, .warmup = 1}),
                        kft::usage_error, has("stragglers.threshold = 0"));
  BOOST_CHECK_EXCEPTION(ddp::straggler_detector({.every = 10, .threshold = 0.1, .sustain = 0, .warmup = 1}),
                        kft::usage_error, has("stragglers.sustain = 0"));
  BOOST_CHECK_EXCEPTION(ddp::straggler_detector({.every = 10, .threshold = 0.1, .sustain = 2, .warmup = -1}),
                        kft::usage_error, has("stragglers.warmup = -1"));
  ddp::straggler_detector d;
  d.reset(3);
  std::vector<double> two(2, 1.0);
  BOOST_CHECK_EXCEPTION(d.window(10, two, two), kft::usage_error, has("2 sums and 2 step counts for 3 ranks"));
}

// ---- the trainer, ranks as threads ----

namespace {

// A linear model whose work per sample is a sleep: `base` per step, x `slow_factor` on rank
// `slow_rank` from step `slow_from` on (sleeping costs no CPU: the threads do not compete on a
// small machine, so the slowdown is the one asked for).
struct sleepy {
  std::vector<float> w = std::vector<float>(4, 0.0f);
  int rank = 0, slow_rank = -1;
  std::uint64_t slow_from = 0, steps = 0;
  double slow_factor = 1.2;
  std::chrono::microseconds base{8000};  // (long enough that wake-up delays and rank 0's reporting stay well under 10%)
  std::vector<ddp::tensor_ref> parameters() { return {{"w", w}}; }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    ++steps;
    auto t = base;
    if (rank == slow_rank && steps >= slow_from)
      t = std::chrono::microseconds(static_cast<std::int64_t>(static_cast<double>(base.count()) * slow_factor));
    std::this_thread::sleep_for(t);
    ddp::stats s;
    for (std::size_t k = 0; k < 4; ++k) g[0][k] = 0.001f * static_cast<float>(k);
    g.ready(0);
    s.loss_sum = static_cast<double>(idx.size());
    s.count = static_cast<double>(idx.size());
    return s;
  }
};

struct recorder : ddp::observer {
  std::mutex* m = nullptr;
  std::vector<ddp::straggler_event>* seen = nullptr;
  void on_straggler(const ddp::straggler_event& e) override {
    std::lock_guard<std::mutex> lock(*m);
    seen->push_back(e);
  }
};

struct run_result {
  std::vector<std::string> errors;
  std::vector<std::vector<ddp::straggler_event>> events;  // per rank
  std::vector<ddp::fit_summary> sums;
  std::string log;
};

run_result train(int ranks, int slow_rank, std::uint64_t slow_from, std::uint64_t every = 10) {
  run_result out;
  out.events.resize(static_cast<std::size_t>(ranks));
  out.sums.resize(static_cast<std::size_t>(ranks));
  const auto log = std::filesystem::temp_directory_path() / ("kft-stragglers-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(log);
  std::mutex m;
  out.errors = kft_test::with_shm_ranks(
      ranks,
      [&](kft::group::process_group& g) {
        const auto r = static_cast<std::size_t>(g.rank());
        sleepy model;
        model.rank = g.rank();
        model.slow_rank = slow_rank;
        model.slow_from = slow_from;
        recorder rec;
        rec.m = &m;
        rec.seen = &out.events[r];
        ddp::sgd opt({.lr = 0.01f});
        ddp::trainer_options o;
        o.batch = 2;
        o.epochs = 1;
        o.quiet = true;
        o.log_json = log.string();
        o.stragglers.every = every;
        o.observers = {&rec};
        ddp::trainer t(g, model, opt, o);
        out.sums[r] = t.fit(static_cast<std::uint64_t>(ranks) * 2 * 120);  // 120 steps
      },
      {.pool = 8u << 20, .timeout = 30s});
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) out.log += line + "\n";
  std::filesystem::remove(log);
  return out;
}

bool none(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    if (!e.empty()) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_rank_twenty_percent_slower_is_named_within_30_steps_by_the_trainer) {
  const std::uint64_t from = 41;  // the first slow step
  const auto r = train(3, 2, from);
  BOOST_TEST_REQUIRE(none(r.errors), kft_test::first_error(r.errors));
  for (std::size_t k = 0; k < 3; ++k) {
    BOOST_TEST_INFO("rank " << k);
    BOOST_TEST_REQUIRE(r.events[k].size() == 1u);  // named once, on every rank, nobody else
    const auto& e = r.events[k][0];
    BOOST_TEST(e.rank == 2);
    BOOST_TEST(!e.recovered);
    BOOST_TEST(e.step >= from);
    BOOST_TEST(e.step <= from + 29);
    BOOST_TEST(e.excess > 0.10);
    BOOST_TEST(e.excess < 0.40);
    BOOST_TEST(e.host == ddp::straggler_detector::this_host());
    BOOST_TEST(r.sums[k].stragglers == 1u);
  }
  BOOST_TEST(r.log.find("{\"event\":\"straggler\",\"step\":" + std::to_string(r.events[0][0].step) + ",\"rank\":2,") !=
             std::string::npos, r.log);
  BOOST_TEST(r.log.find("\"stragglers\":1,") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(without_a_slow_rank_nobody_is_named_and_every_0_turns_it_off) {
  auto r = train(3, -1, 0);
  BOOST_TEST_REQUIRE(none(r.errors), kft_test::first_error(r.errors));
  for (const auto& e : r.events) BOOST_TEST(e.empty());
  BOOST_TEST(r.log.find("straggler\"") == std::string::npos, r.log);
  BOOST_TEST(r.log.find("\"stragglers\":0,") != std::string::npos);
  r = train(3, 2, 1, 0);  // slow from the start, but not watched
  BOOST_TEST_REQUIRE(none(r.errors), kft_test::first_error(r.errors));
  for (const auto& e : r.events) BOOST_TEST(e.empty());
}

BOOST_AUTO_TEST_CASE(a_recovered_rank_is_said_once) {
  // Rank 0 is 50% slower until its step 40 (slow_factor applies from step 1), then even.
  run_result out;
  out.events.resize(2);
  std::mutex m;
  out.errors = kft_test::with_shm_ranks(
      2,
      [&](kft::group::process_group& g) {
        struct until : sleepy {
          ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& gr) {
            if (steps >= 40) slow_rank = -1;
            return sleepy::forward_backward(idx, gr);
          }
        } model;
        model.rank = g.rank();
        model.slow_rank = 0;
        model.slow_from = 1;
        model.slow_factor = 1.5;
        recorder rec;
        rec.m = &m;
        rec.seen = &out.events[static_cast<std::size_t>(g.rank())];
        ddp::sgd opt({.lr = 0.01f});
        ddp::trainer_options o;
        o.batch = 2;
        o.quiet = true;
        o.observers = {&rec};
        ddp::trainer t(g, model, opt, o);
        (void)t.fit(2 * 2 * 100);
      },
      {.pool = 8u << 20, .timeout = 30s});
  BOOST_TEST_REQUIRE(none(out.errors), kft_test::first_error(out.errors));
  for (const auto& ev : out.events) {
    BOOST_TEST_REQUIRE(ev.size() == 2u);
    BOOST_TEST(ev[0].rank == 0);
    BOOST_TEST(!ev[0].recovered);
    BOOST_TEST(ev[0].step <= 30u);  // (the first window is warm-up)
    BOOST_TEST(ev[1].rank == 0);
    BOOST_TEST(ev[1].recovered);
    BOOST_TEST(ev[1].step > 40u);
    BOOST_TEST(ev[1].step <= 70u);
  }
}

// The JSON log's strings are escaped: a host name or a checkpoint path with a quote, a
// backslash or a control character still makes one valid JSON line each.
BOOST_AUTO_TEST_CASE(the_json_log_escapes_host_names_and_paths) {
  const auto dir = std::filesystem::temp_directory_path() / ("kft-straggler-log-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "log.jsonl").string();
  const std::string host = "node\"7\\a\tb";
  const std::string file = (dir / "ckpt \"x\"\\1.kft").string();
  {
    ddp::console_report r(0, 2, true, path);
    ddp::straggler_event e;
    e.step = 12;
    e.rank = 1;
    e.ranks = 2;
    e.host = host;
    e.seconds = 0.012;
    e.median = 0.010;
    e.excess = 0.2;
    r.on_straggler(e);
    r.on_checkpoint(12, file, 64);
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  std::filesystem::remove_all(dir);
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  BOOST_TEST(lines[0]["event"] == "straggler");
  BOOST_TEST(lines[0]["host"] == host);
  BOOST_TEST(lines[1]["event"] == "checkpoint");
  BOOST_TEST(lines[1]["file"] == file);
}
