// SPDX-License-Identifier: Apache-2.0
// The trainer beyond classifiers: a regression model with named metrics of every kind (sums
// as means, a maximum, a minimum) reduced over the ranks and checked against values computed
// here from the data; training without evaluations; targets on the loss and on a metric;
// observers; and the bad inputs (metrics that differ between ranks, a target the model does
// not report, a test set for a model that cannot evaluate); and streamed records through the
// trainer: every record seen exactly once per epoch across the ranks, with and without a resume
// in the middle of an epoch on another number of ranks, deterministic mode over records, and
// their bad inputs (ranks with different records, a checkpoint of other records or of an
// indexed run). Ranks are threads over the shared-memory transport.
#define BOOST_TEST_MODULE kft_trainer_tasks
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/records.hpp>
#include <kft/ddp/schedule.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/group/process_group.hpp>

#include "../common/rank_errors.hpp"
#include "../common/shm_ranks.hpp"

using namespace std::chrono_literals;
namespace ddp = kft::ddp;

namespace {

std::vector<std::string> with_ranks(int p, const std::function<void(kft::group::process_group&)>& body) {
  return kft_test::with_shm_ranks(p, body, {.pool = 8u << 20, .timeout = 30s});
}

// y = 3 x0 - 2 x1 + 0.5 + noise-free; a linear model w . x + b fitted by the mean squared error.
// Sample i's inputs are a fixed function of i, so every rank (and this test) knows the data.
struct data_point {
  double x0, x1, y;
};
data_point sample(std::uint32_t i) {
  const double x0 = std::sin(0.37 * i), x1 = std::cos(0.11 * i * i + 0.3);
  return {x0, x1, 3.0 * x0 - 2.0 * x1 + 0.5};
}

// A regression: loss = squared error; metrics: abs_error (a mean), max_abs_error (a maximum,
// reported as it is), min_target (a minimum over the samples seen, as it is).
struct regression {
  std::vector<float> w = std::vector<float>(2, 0.0f), b = std::vector<float>(1, 0.0f);
  bool with_metrics = true;
  bool renamed = false;  // a different metric list (the mismatch test)
  std::vector<ddp::tensor_ref> parameters() { return {{"w", w}, {"b", b}}; }
  std::vector<ddp::metric> metrics() const {
    if (!with_metrics) return {};
    return {{renamed ? "abs_err" : "abs_error"},
            {"max_abs_error", ddp::metric_op::max, false},
            {"min_target", ddp::metric_op::min, false}};
  }
  ddp::stats run(std::span<const std::uint32_t> idx, ddp::gradients* g) {
    ddp::stats s;
    s.values[1] = -std::numeric_limits<double>::infinity();
    s.values[2] = std::numeric_limits<double>::infinity();
    double gw0 = 0, gw1 = 0, gb = 0;
    for (auto i : idx) {
      const auto d = sample(i);
      const double pred = w[0] * d.x0 + w[1] * d.x1 + b[0], err = pred - d.y;
      s.loss_sum += err * err;
      s.count += 1;
      s.values[0] += std::fabs(err);
      s.values[1] = std::max(s.values[1], std::fabs(err));
      s.values[2] = std::min(s.values[2], d.y);
      gw0 += 2 * err * d.x0, gw1 += 2 * err * d.x1, gb += 2 * err;
    }
    if (g) {
      const double n = static_cast<double>(idx.size());
      auto put = [&](std::size_t k, std::size_t e, double v) {
        (*g)[k][e] = static_cast<float>((g->accumulate() ? (*g)[k][e] : 0.0f) + v / n);
      };
      put(1, 0, gb);
      g->ready(1);
      put(0, 0, gw0);
      put(0, 1, gw1);
      g->ready(0);
    }
    return s;
  }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) { return run(idx, &g); }
  ddp::stats evaluate(std::span<const std::uint32_t> idx) { return run(idx, nullptr); }
};

// The same model without evaluate(): fit() trains only.
struct train_only {
  regression r;
  std::vector<ddp::tensor_ref> parameters() { return r.parameters(); }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    r.with_metrics = false;
    return r.forward_backward(idx, g);
  }
};

// Records what the trainer tells its observers.
struct recorder : ddp::observer {
  std::vector<ddp::epoch_point> epochs;
  std::vector<ddp::eval_point> evals;
  std::vector<std::uint64_t> progress_steps;
  int starts = 0, summaries = 0;
  std::vector<std::string> metric_names;
  void on_start(const ddp::run_info& r) override {
    ++starts;
    for (const auto& m : r.metrics->list()) metric_names.push_back(m.name);
  }
  void on_progress(const ddp::progress_point& p) override { progress_steps.push_back(p.step); }
  void on_eval(const ddp::eval_point& e) override { evals.push_back(e); }
  void on_epoch(const ddp::epoch_point& e) override {
    epochs.push_back(e);
    if (e.eval) epochs.back().eval = nullptr;  // (the pointer is the trainer's; keep the values only)
  }
  void on_summary(const ddp::fit_summary&) override { ++summaries; }
};

using kft_test::none;

}  // namespace

BOOST_AUTO_TEST_CASE(a_regression_reports_its_metrics_reduced_over_the_ranks) {
  constexpr std::uint64_t train = 240, test = 101;
  for (int world : {1, 3}) {
    std::vector<ddp::fit_summary> sums(static_cast<std::size_t>(world));
    std::vector<recorder> recs(static_cast<std::size_t>(world));
    std::vector<ddp::stats> before(static_cast<std::size_t>(world));
    auto errors = with_ranks(world, [&](kft::group::process_group& g) {
      regression m;
      ddp::sgd opt({.lr = 0.1f});
      ddp::trainer_options o;
      o.batch = 8;
      o.epochs = 3;
      o.quiet = true;
      o.observers = {&recs[static_cast<std::size_t>(g.rank())]};
      ddp::trainer t(g, m, opt, o);
      before[static_cast<std::size_t>(g.rank())] = t.evaluate(test);
      sums[static_cast<std::size_t>(g.rank())] = t.fit(train, test);
    });
    BOOST_TEST_REQUIRE(none(errors));
    // The evaluation of the untrained model (w = 0, b = 0: the error is -y) against the data.
    double sum_abs = 0, max_abs = 0, min_y = 1e300, sq = 0;
    for (std::uint32_t i = 0; i < test; ++i) {
      const double y = sample(i).y;
      sum_abs += std::fabs(y), max_abs = std::max(max_abs, std::fabs(y)), min_y = std::min(min_y, y), sq += y * y;
    }
    for (int r = 0; r < world; ++r) {
      const auto& b = before[static_cast<std::size_t>(r)];
      BOOST_TEST(b.count == static_cast<double>(test));
      BOOST_TEST(b.loss_sum == sq, boost::test_tools::tolerance(1e-9));
      BOOST_TEST(b.values[0] == sum_abs, boost::test_tools::tolerance(1e-9));
      BOOST_TEST(b.values[1] == max_abs);  // a maximum over ranks: exact
      BOOST_TEST(b.values[2] == min_y);    // a minimum over ranks: exact
    }
    // Training: the loss falls far below the start on every rank, and every rank reports the same.
    const auto& s0 = sums[0];
    BOOST_TEST(s0.final_loss < 0.05 * sq / test);
    BOOST_TEST(s0.final_metrics.size() == 3u);
    BOOST_TEST(s0.final_metrics[2] == min_y);  // min_target is a property of the data
    BOOST_TEST(s0.final_metrics[1] >= s0.final_metrics[0]);  // the largest error >= the mean error
    BOOST_TEST(s0.final_accuracy == 0.0);  // no metric called accuracy
    for (int r = 1; r < world; ++r) {
      BOOST_TEST(sums[static_cast<std::size_t>(r)].final_loss == s0.final_loss);
      BOOST_TEST(sums[static_cast<std::size_t>(r)].final_metrics == s0.final_metrics);
    }
    // The observers: every rank told of the start, 3 epochs with the training metrics, one
    // evaluation per epoch, a progress call per step, the summary.
    for (const auto& rec : recs) {
      BOOST_TEST(rec.starts == 1);
      BOOST_TEST(rec.summaries == 1);
      BOOST_TEST((rec.metric_names == std::vector<std::string>{"abs_error", "max_abs_error", "min_target"}));
      BOOST_TEST_REQUIRE(rec.epochs.size() == 3u);
      BOOST_TEST(rec.evals.size() == 3u);
      BOOST_TEST(rec.progress_steps.size() == s0.steps);
      for (const auto& e : rec.epochs) {
        BOOST_TEST(e.metrics.size() == 3u);
        BOOST_TEST(e.metrics[1] >= e.metrics[0]);
      }
      BOOST_TEST(rec.epochs[2].loss < rec.epochs[0].loss);
      BOOST_TEST(rec.evals.back().loss == s0.final_loss);
    }
    // The first epoch's min_target covers every training sample: the minimum over all of them.
    double min_train = 1e300;
    for (std::uint32_t i = 0; i < train; ++i) min_train = std::min(min_train, sample(i).y);
    BOOST_TEST(recs[0].epochs[0].metrics[2] == min_train);
  }
}

BOOST_AUTO_TEST_CASE(targets_on_the_loss_and_on_a_metric_are_timed) {
  // (Boost.Test's checks are not thread-safe: the ranks record, the test thread checks.)
  std::vector<ddp::fit_summary> got(4);
  auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    for (int kind = 0; kind < 4; ++kind) {
      regression m;
      ddp::sgd opt({.lr = 0.1f});
      ddp::trainer_options o;
      o.batch = 8;
      o.epochs = 4;
      o.quiet = true;
      o.eval_every = 5;
      if (kind == 0) o.target = {"loss", 0.05, true};
      if (kind == 1) o.target = {"abs_error", 0.2, true};
      if (kind == 2) o.target = {"loss", -1.0, true};  // never reached
      if (kind == 3) {                                  // kind 0, ended at the target
        o.target = {"loss", 0.05, true};
        o.stop_at_target = true;
      }
      ddp::trainer t(g, m, opt, o);
      auto s = t.fit(200, 50);
      if (g.rank() == 0) got[static_cast<std::size_t>(kind)] = std::move(s);
    }
  });
  BOOST_TEST_REQUIRE(none(errors));
  for (int kind = 0; kind < 2; ++kind) {
    const auto& s = got[static_cast<std::size_t>(kind)];
    BOOST_TEST_REQUIRE(s.seconds_to_target.has_value());
    BOOST_TEST_REQUIRE(s.epoch_to_target.has_value());
    // The first evaluation at or below the target is the one timed, and none before it was.
    std::size_t first = s.evals.size();
    for (std::size_t k = 0; k < s.evals.size() && first == s.evals.size(); ++k) {
      const double v = kind == 0 ? s.evals[k].loss : s.evals[k].metrics[0];
      if (v <= (kind == 0 ? 0.05 : 0.2)) first = k;
    }
    BOOST_TEST_REQUIRE(first < s.evals.size());
    BOOST_TEST(first > 0u);  // the untrained model is not at the target
    BOOST_TEST(*s.seconds_to_target == s.evals[first].train_seconds);
    BOOST_TEST(*s.epoch_to_target == s.evals[first].epoch);
    BOOST_TEST(s.target == (kind == 0 ? "loss <= 0.05" : "abs_error <= 0.2"));
  }
  BOOST_TEST(!got[2].seconds_to_target.has_value());
  // stop_at_target: the run ends at kind 0's crossing evaluation, on every rank (no hang).
  const auto& full = got[0];
  const auto& stopped = got[3];
  BOOST_TEST(stopped.stopped_at_target);
  BOOST_TEST(!full.stopped_at_target);
  BOOST_TEST_REQUIRE(!stopped.evals.empty());
  BOOST_TEST(stopped.steps == stopped.evals.back().step);
  BOOST_TEST(stopped.steps < full.steps);
  BOOST_TEST(stopped.evals.size() < full.evals.size());
  BOOST_TEST(stopped.evals.back().loss == full.evals[stopped.evals.size() - 1].loss);  // the same run until then
  BOOST_TEST(got[2].target == "loss <= -1");
}

BOOST_AUTO_TEST_CASE(a_model_without_evaluate_trains_and_logs_its_loss) {
  const auto log = std::filesystem::temp_directory_path() / ("kft-tasks-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(log);
  std::vector<ddp::fit_summary> sums(2);
  std::vector<std::size_t> metrics(2, 99);
  auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    train_only m;
    ddp::sgd opt({.lr = 0.1f});
    ddp::trainer_options o;
    o.batch = 8;
    o.epochs = 2;
    o.quiet = true;
    o.log_json = log.string();
    ddp::trainer t(g, m, opt, o);
    metrics[static_cast<std::size_t>(g.rank())] = t.metrics().size();
    sums[static_cast<std::size_t>(g.rank())] = t.fit(160);
  });
  BOOST_TEST_REQUIRE(none(errors));
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(metrics[static_cast<std::size_t>(r)] == 0u);
    BOOST_TEST(sums[static_cast<std::size_t>(r)].evals.empty());
    BOOST_TEST(sums[static_cast<std::size_t>(r)].steps == 20u);
  }
  std::ifstream in(log);
  std::string line, text;
  int epochs = 0;
  while (std::getline(in, line)) {
    text += line + "\n";
    if (line.find("\"event\":\"epoch\"") != std::string::npos) {
      ++epochs;
      BOOST_TEST(line.find("\"train_loss\":") != std::string::npos);
      BOOST_TEST(line.find("test_") == std::string::npos);  // no evaluation, no test columns
    }
  }
  BOOST_TEST(epochs == 2);
  BOOST_TEST(text.find("\"metrics\":[]") != std::string::npos);
  std::filesystem::remove(log);
}

BOOST_AUTO_TEST_CASE(bad_inputs_are_named_without_a_hang) {
  // Metrics that differ between ranks: every rank stops at the start, naming the rank.
  auto errors = with_ranks(3, [&](kft::group::process_group& g) {
    regression m;
    m.renamed = g.rank() == 2;
    ddp::sgd opt;
    ddp::trainer_options o;
    o.quiet = true;
    ddp::trainer t(g, m, opt, o);
  });
  for (const auto& e : errors) {
    BOOST_TEST(e.find("metrics differ between ranks: rank(s) 2") != std::string::npos, e);
  }
  BOOST_TEST(errors[2].find("abs_err:sum:mean") != std::string::npos, errors[2]);

  // A target on a metric the model does not report; a test set for a model without evaluate();
  // a target without evaluations. One rank: the error of each, quiet options otherwise.
  auto error_of = [](auto model, ddp::trainer_options::goal target, std::uint64_t test) {
    return with_ranks(1, [&](kft::group::process_group& g) {
      ddp::sgd opt;
      ddp::trainer_options o;
      o.quiet = true;
      o.target = target;
      ddp::trainer t(g, model, opt, o);
      t.fit(16, test);
    })[0];
  };
  std::string e = error_of(regression{}, {"accuracy", 0.9, false}, 16);
  BOOST_TEST(e.find("the target's metric 'accuracy' is not one the model reports (loss, abs_error, max_abs_error, "
                    "min_target)") != std::string::npos, e);
  e = error_of(train_only{}, {}, 16);
  BOOST_TEST(e.find("given 16 test samples but the model has no evaluate(samples)") != std::string::npos, e);
  e = error_of(regression{}, {"loss", 0.1, true}, 0);
  BOOST_TEST(e.find("a target (loss <= 0.1) needs evaluations") != std::string::npos, e);
}

BOOST_AUTO_TEST_CASE(metric_names_are_words_used_once) {
  struct named {
    regression r;
    std::vector<ddp::metric> list;
    std::vector<ddp::tensor_ref> parameters() { return r.parameters(); }
    std::vector<ddp::metric> metrics() const { return list; }
    ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) { return r.forward_backward(idx, g); }
  };
  const std::vector<std::pair<std::vector<ddp::metric>, std::string>> bad = {
      {{{"a b"}}, "metric 0 is named 'a b'"},
      {{{"loss"}}, "metric 0 is named 'loss'"},
      {{{"x"}, {"x"}}, "metric 1 is named 'x'"},
      {{{""}}, "metric 0 is named ''"},
      {std::vector<ddp::metric>(ddp::stats::max_metrics + 1, ddp::metric{"m"}), "reports 9 metrics; at most 8"}};
  for (const auto& [list, says] : bad) {
    auto errors = with_ranks(1, [&](kft::group::process_group& g) {
      named m;
      m.list = list;
      ddp::sgd opt;
      ddp::trainer_options o;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
    });
    BOOST_TEST(errors[0].find(says) != std::string::npos, errors[0]);
  }
}

// ---- streamed records through the trainer ----------------------------------------------------

namespace {

namespace fs = std::filesystem;

// Record r of the files: 4 u32 tokens {r, 7 r + 3, 0, 0}; the model's inputs are sample(r).
constexpr std::uint64_t record_tokens = 4;
struct record_files {
  fs::path dir;
  std::vector<fs::path> train, test;
  std::uint64_t train_records = 0, test_records = 0;
  // Training records: files of `sizes` records, numbered on across them; test: `test_n` more.
  record_files(const std::string& tag, std::vector<std::uint64_t> sizes, std::uint64_t test_n) {
    dir = fs::temp_directory_path() / ("kft-tasks-records-" + std::to_string(::getpid()) + "-" + tag);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::uint32_t id = 0;
    auto write = [&](const fs::path& f, std::uint64_t n) {
      std::ofstream out(f, std::ios::binary);
      for (std::uint64_t k = 0; k < n; ++k, ++id) {
        const std::uint32_t rec[record_tokens] = {id, 7 * id + 3, 0, 0};
        out.write(reinterpret_cast<const char*>(rec), sizeof rec);
      }
    };
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      train.push_back(dir / ("train-" + std::to_string(i) + ".tok"));
      write(train.back(), sizes[i]);
      train_records += sizes[i];
    }
    test.push_back(dir / "test.tok");
    id = 0;
    write(test.back(), test_n);
    test_records = test_n;
  }
  ~record_files() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  ddp::record_options options(std::vector<fs::path> files, std::uint64_t seed = 5) const {
    return {.files = std::move(files), .token = ddp::token_type::u32, .record_tokens = record_tokens, .seed = seed};
  }
};

// Counts of each record seen per epoch (over every rank and every run), and what went wrong.
struct record_log {
  std::mutex mu;
  std::vector<std::vector<int>> seen;  // [epoch][record]
  std::string wrong;                   // a record whose tokens were not its own
  std::uint64_t evaluated = 0;         // records given to evaluate(), summed over ranks and calls
  record_log(std::uint64_t epochs, std::uint64_t records) : seen(epochs, std::vector<int>(records, 0)) {}
};

// The regression above on streamed records: the record's first token names its sample; padding
// rows are left out of the loss and the count; each real row is logged with the epoch.
struct streaming_regression {
  regression r;
  record_log* log = nullptr;
  std::function<std::uint64_t()> epoch;  // the trainer's epoch, once it exists
  std::vector<std::uint32_t> ids;
  std::vector<ddp::tensor_ref> parameters() { return r.parameters(); }
  std::vector<ddp::metric> metrics() const { return r.metrics(); }
  void take(const ddp::record_batch& b, bool training) {
    ids.clear();
    std::lock_guard<std::mutex> lock(log->mu);
    for (std::size_t i = 0; i < b.rows; ++i) {
      if (b.padding[i]) continue;
      const auto row = b.row(i);
      if (row[0] != b.ids[i] || row[1] != 7 * row[0] + 3) log->wrong = "record " + std::to_string(b.ids[i]);
      ids.push_back(row[0]);
      if (training) log->seen.at(epoch())[row[0]] += 1;
    }
    if (!training) log->evaluated += ids.size();
  }
  ddp::stats forward_backward(const ddp::record_batch& b, ddp::gradients& g) {
    take(b, true);
    return r.run(ids, &g);
  }
  ddp::stats evaluate(const ddp::record_batch& b) {
    take(b, false);
    return r.run(ids, nullptr);
  }
};
static_assert(ddp::streaming_model<streaming_regression> && !ddp::indexed_model<streaming_regression>);
static_assert(ddp::evaluable<streaming_regression>);

// One run over the records; returns each rank's error ("" : none) and fills `sums` (rank 0's).
std::vector<std::string> train_records(const record_files& f, record_log& log, int world, ddp::trainer_options o,
                                       ddp::fit_summary* sum = nullptr, std::uint64_t* hash = nullptr,
                                       std::uint64_t seed = 5) {
  return with_ranks(world, [&](kft::group::process_group& g) {
    auto train = ddp::open_records(g, f.options(f.train, seed));
    auto test = ddp::open_records(g, f.options(f.test));
    streaming_regression m;
    m.log = &log;
    ddp::sgd opt({.lr = 0.1f});
    o.quiet = true;
    ddp::trainer t(g, m, opt, o);
    m.epoch = [&] { return t.epoch(); };
    auto s = t.fit(train, &test);
    if (g.rank() == 0 && sum) *sum = s;
    if (g.rank() == 0 && hash) *hash = t.parameters_hash();
  });
}

// Every record seen exactly once in every epoch; "" or the first record that was not.
std::string exactly_once(const record_log& log) {
  for (std::size_t e = 0; e < log.seen.size(); ++e)
    for (std::size_t id = 0; id < log.seen[e].size(); ++id)
      if (log.seen[e][id] != 1)
        return "epoch " + std::to_string(e) + ": record " + std::to_string(id) + " seen " +
               std::to_string(log.seen[e][id]) + " times";
  return log.wrong;
}

}  // namespace

BOOST_AUTO_TEST_CASE(streamed_records_train_each_record_once_per_epoch) {
  // 101 records in two files. 3 ranks x 4 records: 9 global batches, the last of 5 records
  // (ranks get 2, 2 and 1 real rows); 4 ranks x 1: the last global batch is 1 record, and
  // ranks 1..3 get a share that is all padding (not trained on). Evaluation over 23 test
  // records in batches of 4 per rank.
  record_files f("once", {37, 64}, 23);
  for (auto [world, batch] : {std::pair{1, 4u}, std::pair{3, 4u}, std::pair{4, 1u}}) {
    record_log log(2, f.train_records);
    ddp::trainer_options o;
    o.batch = batch;
    o.epochs = 2;
    o.eval_batch = 4;
    ddp::fit_summary sum;
    BOOST_TEST_REQUIRE(none(train_records(f, log, world, o, &sum)));
    BOOST_TEST(exactly_once(log) == "", "world " << world);
    const std::uint64_t global = static_cast<std::uint64_t>(world) * batch;
    BOOST_TEST(sum.steps == 2 * ((f.train_records + global - 1) / global));
    BOOST_TEST(sum.samples == 2 * f.train_records);
    BOOST_TEST_REQUIRE(sum.evals.size() == 2u);
    // Evaluations: every test record once per evaluation (the padding rows left out); the
    // model learns.
    BOOST_TEST(log.evaluated == 2 * f.test_records);
    BOOST_TEST(sum.final_loss < 0.5 * sum.evals.front().loss);
  }
}

BOOST_AUTO_TEST_CASE(a_streamed_run_resumes_exactly_on_another_number_of_ranks) {
  record_files f("resume", {37, 64}, 23);
  // 3 ranks x 4: 9 steps an epoch. Stop and checkpoint after step 4 (48 records into epoch 0)
  // or after step 9 (the epoch's very end), then go on with 2 ranks (global batch 8) to the end
  // of epoch 2: every record once per epoch over both runs, and the same seen on 1 rank.
  for (std::uint64_t stop : {4u, 9u, 13u}) {
    const fs::path ckpt = f.dir / ("ckpt-" + std::to_string(stop));
    record_log log(2, f.train_records);
    ddp::trainer_options o;
    o.batch = 4;
    o.epochs = 2;
    o.checkpoint_dir = ckpt;
    o.checkpoint_every = stop;
    o.max_steps = stop;
    BOOST_TEST_REQUIRE(none(train_records(f, log, 3, o)));
    o.max_steps = 0;
    o.resume = true;
    o.checkpoint_every = 0;
    ddp::fit_summary sum;
    BOOST_TEST_REQUIRE(none(train_records(f, log, 2, o, &sum)));
    BOOST_TEST(exactly_once(log) == "", "stopped after step " << stop);
    BOOST_TEST(sum.resumed_from == stop);
  }
}

BOOST_AUTO_TEST_CASE(deterministic_training_over_records_is_the_same_on_any_number_of_ranks) {
  record_files f("determ", {37, 64}, 23);
  std::vector<std::uint64_t> hashes;
  for (int world : {1, 2, 4}) {
    record_log log(2, f.train_records);
    ddp::trainer_options o;
    o.epochs = 2;
    o.deterministic = true;
    o.global_batch = 12;
    o.micro_shards = 4;
    std::uint64_t h = 0;
    BOOST_TEST_REQUIRE(none(train_records(f, log, world, o, nullptr, &h)));
    BOOST_TEST(exactly_once(log) == "", "world " << world);
    hashes.push_back(h);
  }
  BOOST_TEST(hashes[0] == hashes[1]);
  BOOST_TEST(hashes[0] == hashes[2]);
}

BOOST_AUTO_TEST_CASE(streamed_bad_inputs_are_named_without_a_hang) {
  record_files f("bad", {37, 64}, 23);
  // Rank 1 has only the first file (it would run dry): every rank stops in fit(), naming it.
  {
    record_log log(1, f.train_records);
    auto errors = with_ranks(2, [&](kft::group::process_group& g) {
      ddp::record_source train(f.options(g.rank() == 1 ? std::vector<fs::path>{f.train[0]} : f.train));
      streaming_regression m;
      m.log = &log;
      ddp::sgd opt;
      ddp::trainer_options o;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
      m.epoch = [&] { return t.epoch(); };
      t.fit(train);
    });
    for (const auto& e : errors)
      BOOST_TEST(e.find("the record source of rank(s) 1 differs from rank 0's") != std::string::npos, e);
  }
  // A checkpoint of the same files with another seed: refused in fit(), naming the seed.
  const fs::path ckpt = f.dir / "ckpt";
  {
    record_log log(1, f.train_records);
    ddp::trainer_options o;
    o.batch = 4;
    o.checkpoint_dir = ckpt;
    o.checkpoint_every = 3;
    o.max_steps = 3;
    BOOST_TEST_REQUIRE(none(train_records(f, log, 2, o)));
    o.resume = true;
    o.max_steps = 0;
    auto errors = train_records(f, log, 2, o, nullptr, nullptr, /*seed=*/6);
    for (const auto& e : errors)
      BOOST_TEST(e.find("was written for other records: the seed: 5 on the checkpoint, 6 on this run's records") !=
                     std::string::npos,
                 e);
  }
  // An indexed run's checkpoint resumed by a streaming model, and the other way round.
  {
    const fs::path indexed = f.dir / "ckpt-indexed";
    auto errors = with_ranks(1, [&](kft::group::process_group& g) {
      regression m;
      ddp::sgd opt;
      ddp::trainer_options o;
      o.quiet = true;
      o.checkpoint_dir = indexed;
      ddp::trainer t(g, m, opt, o);
      t.fit(16);
    });
    BOOST_TEST_REQUIRE(none(errors));
    record_log log(1, f.train_records);
    ddp::trainer_options o;
    o.checkpoint_dir = indexed;
    o.resume = true;
    auto e = train_records(f, log, 1, o)[0];
    BOOST_TEST(e.find("holds no record position (written by a run over indexed samples") != std::string::npos, e);
    e = with_ranks(1, [&](kft::group::process_group& g) {
      regression m;
      ddp::sgd opt;
      ddp::trainer_options ro;
      ro.quiet = true;
      ro.checkpoint_dir = ckpt;
      ro.resume = true;
      ddp::trainer t(g, m, opt, ro);
    })[0];
    BOOST_TEST(e.find("was written by a run over streamed records; this model takes sample indices") != std::string::npos,
               e);
  }
}

// ---- the learning-rate schedule -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_lr_schedule_is_the_documented_formula) {
  const double p = 0.5;
  ddp::lr_schedule c{.peak = p, .warmup = 4, .total = 12, .floor = 0.1};
  BOOST_TEST(c.at(1) == 0.25 * p);
  BOOST_TEST(c.at(4) == p);
  BOOST_TEST(c.at(6) == p * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))), boost::test_tools::tolerance(1e-15));
  BOOST_TEST(c.at(12) == 0.1 * p);
  BOOST_TEST(c.at(100) == 0.1 * p);
  ddp::lr_schedule l = c;
  l.decay = ddp::lr_schedule::shape::linear;
  BOOST_TEST(l.at(6) == p * (0.1 + 0.9 * 0.75), boost::test_tools::tolerance(1e-15));
  ddp::lr_schedule w{.peak = p, .warmup = 10};  // no decay: the peak after the warm-up
  BOOST_TEST(w.at(5) == 0.5 * p);
  BOOST_TEST(w.at(1000) == p);
  BOOST_TEST(c.words() == "lr warm-up 4 steps to 0.5, cosine to 0.1x at step 12");
  auto bad = [](ddp::lr_schedule s) {
    try {
      s.check();
    } catch (const kft::usage_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(bad({.peak = 1, .warmup = 5, .total = 5}).find("total 5 <= warmup 5") != std::string::npos);
  BOOST_TEST(bad({.peak = 1, .floor = 2}).find("floor 2 (a fraction of the peak, 0..1)") != std::string::npos);
  BOOST_TEST(bad({.peak = -1}).find("peak -1") != std::string::npos);
}

namespace {
// SGD that records the rate of every step it takes.
struct recording_sgd : ddp::sgd {
  using ddp::sgd::sgd;
  std::vector<float> lrs;
  void begin_step() {
    lrs.push_back(options().lr);
    ddp::sgd::begin_step();
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(the_trainer_applies_the_schedule_and_resumes_it) {
  const auto dir = std::filesystem::temp_directory_path() / ("kft-tasks-lr-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const ddp::lr_schedule sched{.peak = 0.2, .warmup = 3, .total = 10, .floor = 0.05};
  std::vector<std::vector<float>> seen(2);  // rank 0's rates: the first run, the resumed one
  std::vector<std::string> banner(1);
  for (int part = 0; part < 2; ++part) {
    auto errors = with_ranks(2, [&](kft::group::process_group& g) {
      regression m;
      recording_sgd opt({.lr = 0.01f});
      ddp::trainer_options o;
      o.quiet = true;
      o.batch = 8;
      o.epochs = 1;  // 200 samples / 16: 13 steps
      o.lr = sched;
      o.checkpoint_dir = dir;
      o.checkpoint_every = 6;
      o.max_steps = part == 0 ? 6 : 0;
      o.resume = part == 1;
      ddp::trainer t(g, m, opt, o);
      t.fit(200);
      if (g.rank() == 0) seen[static_cast<std::size_t>(part)] = opt.lrs;
    });
    BOOST_TEST_REQUIRE(none(errors));
  }
  BOOST_TEST_REQUIRE(seen[0].size() == 6u);
  BOOST_TEST_REQUIRE(seen[1].size() == 7u);
  for (std::size_t k = 0; k < 6; ++k) BOOST_TEST(seen[0][k] == static_cast<float>(sched.at(k + 1)));
  for (std::size_t k = 0; k < 7; ++k) BOOST_TEST(seen[1][k] == static_cast<float>(sched.at(k + 7)));
  BOOST_TEST(seen[1].back() == static_cast<float>(0.2 * 0.05));  // steps 11-13: the floor
  std::filesystem::remove_all(dir);
}
