// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/report.hpp
/// @brief What a training run tells the world, beside the trainer rather than inside it (as
/// c10d's Logger sits beside its Reducer): the trainer calls an `observer` at the start, after
/// each step, at each evaluation, at the end of each epoch and at the end, on every rank, with
/// values that are already reduced over the ranks (a step's progress is this rank's own).
///
/// `console_report` is the default observer: on rank 0 a banner, a live progress line on a
/// terminal (stderr), a Markdown table of epochs (stdout), a summary line, and a JSON-lines log
/// (`trainer_options::log_json`). Pass your own observers in `trainer_options::observers`
/// (metrics to a dashboard, early stopping): they outlive the trainer.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/ddp/model.hpp>
#include <kft/ddp/stragglers.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief What is trained, and how (for a banner).
struct run_info {
  int rank = 0, ranks = 1;
  std::string label;               ///< what is trained ("" : not said)
  std::string group;               ///< the process group's description ("" : none)
  int threads = 0;                 ///< compute threads per rank (0: not said)
  std::size_t parameters = 0, tensors = 0, buckets = 0;
  std::string optimizer;
  std::string batch;               ///< e.g. "64 per rank, 128 global"
  std::string sharding;            ///< ZeRO-1's note ("" : replicated optimizer state)
  std::string precision;           ///< mixed precision, in words ("" : every parameter f32)
  std::uint64_t epochs = 0, train_samples = 0, eval_samples = 0;
  bool evaluates = false, deterministic = false;
  std::uint64_t global_batch = 0, resumed_from = 0;
  const metric_set* metrics = nullptr;  ///< the model's metrics (never null in a trainer's call)
};

/// @brief One evaluation, reduced over the ranks.
struct eval_point {
  std::uint64_t step = 0;
  double epoch = 0.0;          ///< fractional epoch
  double train_seconds = 0.0;  ///< training time so far (evaluations excluded)
  double loss = 0.0;           ///< mean loss
  double accuracy = 0.0;       ///< the metric "accuracy" when the model has one, else 0
  std::vector<double> metrics; ///< every metric as reported (metric_set::reported), in the model's order
};

/// @brief One epoch's training statistics, reduced over the ranks.
struct epoch_point {
  std::uint64_t epoch = 0;     ///< 1-based
  double loss = 0.0;           ///< mean training loss
  std::vector<double> metrics; ///< every metric as reported
  double seconds = 0.0;        ///< training time of the epoch (evaluations excluded)
  double samples_per_s = 0.0;  ///< all ranks together
  double exposed_comm_seconds = 0.0;
  const eval_point* eval = nullptr;  ///< the epoch's last evaluation (null without evaluate())
};

/// @brief This rank's progress through an epoch (after each optimizer step).
struct progress_point {
  std::uint64_t epoch = 0, epochs = 0;   ///< 1-based
  std::uint64_t step = 0, steps = 0;     ///< the step within the epoch, and the epoch's steps
  const stats* so_far = nullptr;          ///< this rank's statistics of the epoch so far
  double seconds = 0.0;                   ///< since the epoch started
  std::uint64_t samples = 0;              ///< this rank's samples so far in the epoch
};

/// @brief What `fit` measured.
struct fit_summary {
  std::uint64_t steps = 0;
  std::uint64_t samples = 0;      ///< trained, all ranks together
  double train_seconds = 0.0;
  double wall_seconds = 0.0;
  double exposed_comm_seconds = 0.0;  ///< waiting in finish(), after the backward pass
  double optimizer_seconds = 0.0;     ///< in the optimizer's update loops, the slowest rank's (its shard with ZeRO-1)
  double final_accuracy = 0.0;        ///< the last evaluation's "accuracy" (0: none)
  double final_loss = 0.0;            ///< the last evaluation's loss
  std::vector<double> final_metrics;  ///< the last evaluation's metrics
  std::string target;                 ///< the target, in words ("" : none)
  std::optional<double> seconds_to_target;  ///< training time when the target was first reached
  std::optional<double> epoch_to_target;    ///< the fractional epoch of that evaluation
  bool stopped_at_target = false;           ///< trainer_options::stop_at_target ended the run there
  double samples_per_s = 0.0;
  double weak_scaling_efficiency = 0.0;     ///< vs trainer_options::baseline_samples_per_s x ranks (0: not asked)
  std::vector<eval_point> evals;
  std::uint64_t resumed_from = 0;  ///< the checkpoint's step (0: a fresh start)
  std::uint64_t parameters_hash = 0;
  std::size_t optimizer_state_bytes = 0;
  int zero_stage = 0;
  std::uint64_t skipped_steps = 0;  ///< loss scaling: steps skipped because a gradient overflowed
  double loss_scale = 0.0;          ///< loss scaling: the scale at the end (0: no loss scaling)
  std::uint64_t stragglers = 0;     ///< times a rank was named a straggler (trainer_options::stragglers)
};

/// @brief The group changed shape (trainer_options::shrink_store): ranks were lost (a shrink) or
/// joined (a grow). Told on every rank of the new group, before any state is sent; a joiner is
/// told once, as it is about to be sent the state (`newcomer`: it knows its generation and rank
/// only).
struct membership_point {
  std::uint64_t generation = 0;  ///< how many times the group changed
  std::vector<int> members{};    ///< the ranks now, by founding rank (a newcomer: empty)
  std::vector<int> joined{};     ///< founding ranks that joined in this change
  std::vector<int> lost{};       ///< founding ranks lost in this change
  int rank = 0;                  ///< this rank's rank in the new group
  bool newcomer = false;         ///< this rank joined and holds no state yet
};

/// @brief Told what a run does, on every rank (a checkpoint: on the rank that wrote it); every
/// member has a default that does nothing.
class observer {
 public:
  virtual ~observer() = default;
  virtual void on_start(const run_info&) {}
  virtual void on_progress(const progress_point&) {}
  virtual void on_eval(const eval_point&) {}
  virtual void on_epoch(const epoch_point&) {}
  /// On the rank that wrote it (rank 0).
  virtual void on_checkpoint(std::uint64_t /*step*/, const std::string& /*file*/, std::size_t /*bytes*/) {}
  virtual void on_note(const std::string&) {}  ///< resumes, skipped files: one line of words
  /// A rank started straggling, or recovered (stragglers.hpp): the same event on every rank.
  virtual void on_straggler(const straggler_event&) {}
  /// The group shrank or grew (membership_point): the same event on every rank of the new group.
  virtual void on_membership(const membership_point&) {}
  virtual void on_summary(const fit_summary&) {}
};

/// @brief The default observer: rank 0's banner, progress line, epoch table, summary and JSON log.
class console_report : public observer {
 public:
  /// `quiet`: no banner, progress line or epoch table, only the summary line (docs/ddp.md);
  /// `log_json`: a JSON-lines file appended to ("" : none).
  console_report(int rank, int ranks, bool quiet, std::string log_json)
      : on_(rank == 0), quiet_(quiet), path_(std::move(log_json)) {
    if (on_ && !path_.empty()) {
      log_ = std::fopen(path_.c_str(), "a");
      if (!log_)
        throw usage_error("trainer: cannot open the log file " + path_, error_site::in({}, rank, ranks, "ddp trainer", 0));
    }
  }
  console_report(const console_report&) = delete;
  console_report& operator=(const console_report&) = delete;
  ~console_report() override {
    if (log_) std::fclose(log_);
  }

  void on_note(const std::string& s) override { say(s); }

  /// @brief The group changed (a shrink or a join) and this process is now rank `rank`: the
  /// new rank 0 takes over the report (rows, summary, the JSON log, appended to) where a lost
  /// rank 0 left it; a rank that is no longer 0 stops reporting.
  void set_rank(int rank) {
    const bool on = rank == 0;
    if (on == on_) return;
    on_ = on;
    if (on_ && !path_.empty() && !log_) log_ = std::fopen(path_.c_str(), "a");  // (unwritable: the rows still print)
    if (on_) tty_ = ::isatty(2) == 1;
  }

  void on_start(const run_info& r) override {
    ms_ = r.metrics;  // (on every rank: another may take over the report after a shrink)
    evaluates_ = r.evaluates;
    if (!on_) return;
    say("kft ddp: " + (r.label.empty() ? std::string() : r.label + ", ") + std::to_string(r.ranks) + " rank(s)" +
        (r.group.empty() ? std::string() : " (" + r.group + ")") +
        (r.threads ? ", " + std::to_string(r.threads) + " compute thread(s) per rank" : std::string()) + "\n  " +
        std::to_string(r.parameters) + " parameters in " + std::to_string(r.tensors) + " tensors, " +
        std::to_string(r.buckets) + " bucket(s); " + r.optimizer + "; batch " + r.batch +
        (r.sharding.empty() ? std::string() : "; " + r.sharding) +
        (r.precision.empty() ? std::string() : "; " + r.precision) + "; " + std::to_string(r.train_samples) +
        " training / " + (r.evaluates ? std::to_string(r.eval_samples) + " test samples" : std::string("no test samples")));
    if (!quiet_) {
      tty_ = ::isatty(2) == 1;
      std::string head = "| epoch | train loss |", rule = "| ---: | ---: |";
      for (const auto& m : ms_->list()) head += " train " + m.name + " |", rule += " ---: |";
      if (evaluates_) {
        head += " test loss |", rule += " ---: |";
        for (const auto& m : ms_->list()) head += " test " + m.name + " |", rule += " ---: |";
      }
      head += " time (s) | samples/s | exposed comm |", rule += " ---: | ---: | ---: |";
      std::fprintf(stdout, "%s\n%s\n", head.c_str(), rule.c_str());
      std::fflush(stdout);
    }
    std::string names;
    for (const auto& m : ms_->list()) names += (names.empty() ? "\"" : ",\"") + m.name + "\"";
    log("{\"event\":\"start\",\"ranks\":" + std::to_string(r.ranks) + ",\"threads\":" + std::to_string(r.threads) +
        ",\"parameters\":" + std::to_string(r.parameters) + ",\"buckets\":" + std::to_string(r.buckets) +
        ",\"global_batch\":" + std::to_string(r.global_batch) + ",\"deterministic\":" +
        (r.deterministic ? "true" : "false") + ",\"metrics\":[" + names + "],\"resumed_from\":" +
        std::to_string(r.resumed_from) + "}");
  }

  void on_progress(const progress_point& p) override {
    if (!on_ || quiet_ || !tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (p.step != p.steps && now - last_draw_ < std::chrono::milliseconds(200)) return;
    last_draw_ = now;
    const double frac = p.steps ? static_cast<double>(p.step) / static_cast<double>(p.steps) : 1.0;
    const int width = 30, fill = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.resize(width, '.');
    std::string first;
    if (ms_ && ms_->size()) first = "  " + ms_->list()[0].name + " " + num(ms_->reported(*p.so_far, 0), 3);
    std::fprintf(stderr, "\r  epoch %llu/%llu [%s] %3.0f%%  loss %.4f%s  %.0f samples/s/rank ",
                 static_cast<unsigned long long>(p.epoch), static_cast<unsigned long long>(p.epochs), bar.c_str(),
                 frac * 100.0, p.so_far->mean_loss(), first.c_str(),
                 p.seconds > 0 ? static_cast<double>(p.samples) / p.seconds : 0.0);
    if (p.step == p.steps) std::fprintf(stderr, "\r%*s\r", 120, "");
    std::fflush(stderr);
  }

  void on_eval(const eval_point& p) override {
    std::string line = "{\"event\":\"eval\",\"step\":" + std::to_string(p.step) + ",\"epoch\":" + num(p.epoch) +
                       ",\"train_seconds\":" + num(p.train_seconds) + ",\"test_loss\":" + num(p.loss);
    for (std::size_t k = 0; ms_ && k < ms_->size(); ++k) line += ",\"test_" + ms_->list()[k].name + "\":" + num(p.metrics[k]);
    log(line + "}");
  }

  void on_checkpoint(std::uint64_t step, const std::string& file, std::size_t bytes) override {
    log("{\"event\":\"checkpoint\",\"step\":" + std::to_string(step) + ",\"file\":\"" + text(file) +
        "\",\"bytes\":" + std::to_string(bytes) + "}");
  }

  /// Rank 0 says it on stderr, also when quiet (a slow rank costs every rank its time), after
  /// clearing a live progress line; the JSON log gets a "straggler" or "straggler_recovered" record.
  void on_straggler(const straggler_event& s) override {
    if (!on_) return;
    const std::string who = "rank " + std::to_string(s.rank) + (s.host.empty() ? std::string() : " (" + s.host + ")");
    const std::string pct = num(100.0 * s.excess, 1);
    const std::string line =
        s.recovered ? who + " is no longer a straggler: " + num(s.seconds * 1e3, 3) + " ms of work per step against the others' median " +
                          num(s.median * 1e3, 3) + " ms (" + (s.excess >= 0 ? "+" : "") + pct + "%)"
                    : who + " is a straggler: " + num(s.seconds * 1e3, 3) + " ms of work per step against the others' median " +
                          num(s.median * 1e3, 3) + " ms (+" + pct + "%)";
    if (tty_ && !quiet_) std::fprintf(stderr, "\r%*s\r", 120, "");
    std::fprintf(stderr, "kft: step %llu: %s\n", static_cast<unsigned long long>(s.step), line.c_str());
    std::fflush(stderr);
    log(std::string("{\"event\":\"") + (s.recovered ? "straggler_recovered" : "straggler") + "\",\"step\":" +
        std::to_string(s.step) + ",\"rank\":" + std::to_string(s.rank) + ",\"ranks\":" + std::to_string(s.ranks) +
        ",\"host\":\"" + text(s.host) + "\",\"seconds_per_step\":" + num(s.seconds, 6) + ",\"median_seconds_per_step\":" +
        num(s.median, 6) + ",\"excess\":" + num(s.excess) + "}");
  }

  void on_epoch(const epoch_point& e) override {
    if (!on_) return;
    const double comm = e.seconds > 0 ? 100.0 * e.exposed_comm_seconds / e.seconds : 0.0;
    if (!quiet_) {
      std::string row = "| " + std::to_string(e.epoch) + " | " + num(e.loss) + " |";
      for (double v : e.metrics) row += " " + num(v) + " |";
      if (e.eval) {
        row += " " + num(e.eval->loss) + " |";
        for (double v : e.eval->metrics) row += " " + num(v) + " |";
      }
      row += " " + num(e.seconds, 2) + " | " + num(e.samples_per_s, 0) + " | " + num(comm, 1) + "% |";
      std::fprintf(stdout, "%s\n", row.c_str());
      std::fflush(stdout);
    }
    std::string line = "{\"event\":\"epoch\",\"epoch\":" + std::to_string(e.epoch) + ",\"train_loss\":" + num(e.loss);
    for (std::size_t k = 0; k < e.metrics.size(); ++k) line += ",\"train_" + ms_->list()[k].name + "\":" + num(e.metrics[k]);
    if (e.eval) {
      line += ",\"test_loss\":" + num(e.eval->loss);
      for (std::size_t k = 0; k < e.eval->metrics.size(); ++k)
        line += ",\"test_" + ms_->list()[k].name + "\":" + num(e.eval->metrics[k]);
    }
    log(line + ",\"seconds\":" + num(e.seconds) + ",\"samples_per_s\":" + num(e.samples_per_s, 1) +
        ",\"exposed_comm_seconds\":" + num(e.exposed_comm_seconds) + "}");
  }

  void on_summary(const fit_summary& s) override {
    if (!on_) return;
    const double comm = s.train_seconds > 0 ? 100.0 * s.exposed_comm_seconds / s.train_seconds : 0.0;
    std::string line = "summary: " + std::to_string(s.steps) + " steps, " + num(s.wall_seconds, 2) + " s in all (" +
                       num(s.train_seconds, 2) + " s training)";
    if (evaluates_) {
      line += ", final test loss " + num(s.final_loss);
      for (std::size_t k = 0; ms_ && k < s.final_metrics.size(); ++k)
        line += ", final test " + ms_->list()[k].name + " " + num(s.final_metrics[k]);
    }
    line += ", " + num(s.samples_per_s, 0) + " samples/s, exposed communication " + num(comm, 1) + "%";
    if (s.loss_scale > 0)
      line += ", " + std::to_string(s.skipped_steps) + " step(s) skipped (f16 gradients overflowed; loss scale now " +
              num(s.loss_scale, 0) + ")";
    if (!s.target.empty())
      line += s.seconds_to_target ? ", time to " + s.target + ": " + num(*s.seconds_to_target, 2) + " s (epoch " +
                                        num(*s.epoch_to_target, 2) + ")"
                                  : ", target " + s.target + " not reached";
    if (s.stopped_at_target) line += ", stopped there";
    if (s.stragglers) line += ", " + std::to_string(s.stragglers) + " straggler(s) named";
    if (s.weak_scaling_efficiency > 0) line += ", weak-scaling efficiency vs 1 rank " + num(100.0 * s.weak_scaling_efficiency, 0) + "%";
    std::fprintf(stdout, "%s\n", line.c_str());
    std::fflush(stdout);
    std::string fm;
    for (std::size_t k = 0; ms_ && k < s.final_metrics.size(); ++k) fm += ",\"final_" + ms_->list()[k].name + "\":" + num(s.final_metrics[k]);
    log("{\"event\":\"summary\",\"steps\":" + std::to_string(s.steps) + ",\"wall_seconds\":" + num(s.wall_seconds) +
        ",\"train_seconds\":" + num(s.train_seconds) + ",\"final_loss\":" + num(s.final_loss) +
        (fm.find("\"final_accuracy\"") == std::string::npos ? ",\"final_accuracy\":" + num(s.final_accuracy) : std::string()) + fm +
        ",\"samples_per_s\":" + num(s.samples_per_s, 1) + ",\"exposed_comm_seconds\":" + num(s.exposed_comm_seconds) +
        ",\"seconds_to_target\":" + (s.seconds_to_target ? num(*s.seconds_to_target) : std::string("null")) +
        ",\"epoch_to_target\":" + (s.epoch_to_target ? num(*s.epoch_to_target) : std::string("null")) +
        ",\"weak_scaling_efficiency\":" + (s.weak_scaling_efficiency > 0 ? num(s.weak_scaling_efficiency) : std::string("null")) +
        ",\"optimizer_seconds\":" + num(s.optimizer_seconds) + ",\"optimizer_state_bytes\":" +
        std::to_string(s.optimizer_state_bytes) + ",\"zero_stage\":" + std::to_string(s.zero_stage) +
        ",\"skipped_steps\":" + std::to_string(s.skipped_steps) + ",\"loss_scale\":" + num(s.loss_scale, 1) +
        ",\"stragglers\":" + std::to_string(s.stragglers) +
        ",\"parameters_hash\":\"" + std::to_string(s.parameters_hash) + "\"}");
  }

 private:
  static std::string num(double v, int prec = 4) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", prec, v);
    return b;
  }
  // A JSON string's contents: quotes and backslashes escaped, control characters as \u00XX (a
  // host name or a path may hold any of them).
  static std::string text(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        out += b;
      } else {
        out += c;
      }
    }
    return out;
  }
  void say(const std::string& s) {
    if (on_ && !quiet_) std::fprintf(stdout, "%s\n", s.c_str()), std::fflush(stdout);
  }
  void log(const std::string& json) {
    if (log_) std::fprintf(log_, "%s\n", json.c_str()), std::fflush(log_);
  }

  bool on_, quiet_, tty_ = false, evaluates_ = false;
  std::string path_;
  std::FILE* log_ = nullptr;
  const metric_set* ms_ = nullptr;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ddp
KFT_NAMESPACE_END
