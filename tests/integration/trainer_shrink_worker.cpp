// SPDX-License-Identifier: Apache-2.0
// A rank of a DDP training job that loses a rank and goes on (trainer_options::shrink_store;
// issue 46), under kftrun --on-failure continue, or heal (a replacement joins the running group).
// Driven by tests/integration/trainer_shrink_test.py.
//
//   trainer_shrink_worker OUT_DIR VICTIM KILL_STEP [deterministic [VICTIM2 KILL_STEP2]]
//
// A linear regression on 64 features of 240 synthetic samples, 6 samples per rank per step
// (a global batch of 24 on 4 ranks, 8 each on 3: 10 steps an epoch), 2 epochs, SGD. Rank VICTIM kills itself
// (SIGKILL) as step KILL_STEP's backward pass starts (-1: nobody dies), and job rank VICTIM2
// as step KILL_STEP2's starts once the group has shrunk to 3 (a second loss). Every rank appends
// the samples of each finished step to OUT_DIR/seen.<rank>.<KFT_JOIN> ("epoch step sample"
// lines), and prints "trainer_shrink: rank R of P hash H steps S" at the end (R: the job's rank).
// Under --on-failure heal (KFT_ON_FAILURE=heal) the survivors wait, after step KILL_STEP + 2,
// until the replacement asks to join (so it joins at that step boundary however slowly it
// starts); a replacement that finds the job finished (TRAINER_SHRINK_JOIN_DELAY_MS: it sleeps
// that long first, a slow restart) prints "trainer_shrink: rank R joined too
// late" and exits 0. TRAINER_SHRINK_KILL_IN_EVAL=n: evaluations of 60 test samples every 3
// steps and at each epoch's end, and the victim dies in its n-th evaluation instead.
// TRAINER_SHRINK_KILL_IN (checkpoints every 3 steps into OUT_DIR/ckpt, keeping 2) names where
// the victim (a rank of the group of 4) dies instead of in step KILL_STEP's backward pass:
//   checkpoint  after step KILL_STEP, before that step's checkpoint (the others fail in its
//               collectives: the replica check)
//   write       while it writes step KILL_STEP's checkpoint (the victim must be rank 0, the
//               writer; the others finished the checkpoint and fail in the next step)
//   end         when the last epoch ends: the others fail in the run's summary
// and the worker prints "trainer_shrink: rank R checkpoints S" (the steps of the files left,
// the last line before the hash line; "tmp" for each temporary file left).
// TRAINER_SHRINK_RECORDS=FILE: the same regression on streamed records (a streaming model; FILE
// holds the 240 samples as records of one u16 token, each naming its sample, written by the
// test), opened with open_records on every rank; a replacement gets the records' position
// with the rest of the state when its fit() starts. TRAINER_SHRINK_JOINER_RECORDS=FILE: the
// replacement reads FILE instead (other records: every rank's fit() fails naming them).
// TRAINER_SHRINK_KILL_IN_JOIN=member|joiner (under heal, with two replacements): as the first
// replacement joins, once the group has grown and before the state is sent (the others are in
// the join's collectives), job rank 1 (a member) or that replacement kills itself; =boundary:
// job rank 1 kills itself at the boundary where the survivors, waiting after step KILL_STEP + 2,
// see the replacement's ticket (they admit it without rank 1: the grow is given up, or decided
// without it after the window).
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/records.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>

namespace ddp = kft::ddp;

namespace {

constexpr std::size_t features = 64;
constexpr std::uint32_t samples = 240;

double feature(std::uint32_t i, std::size_t k) { return std::sin(0.37 * i + 0.91 * static_cast<double>(k)); }
double target(std::uint32_t i) {
  double y = 0.25;
  for (std::size_t k = 0; k < features; ++k) y += feature(i, k) * (static_cast<double>(k % 7) - 3.0) / 8.0;
  return y;
}

struct regression {
  std::vector<float> w = std::vector<float>(features, 0.0f), b = std::vector<float>(1, 0.0f);
  kft::group::process_group* pg = nullptr;
  const std::uint64_t* finished = nullptr;  // steps finished so far (the worker's on_step)
  int victim = -1, victim2 = -1, job_rank = -1;
  std::uint64_t kill_step = 0, kill_step2 = 0;
  // This attempt's samples, tagged with the group's generation then (a step redone after a
  // shrink runs again in the next generation: only the last attempt counts).
  std::vector<std::uint32_t> pending;
  std::uint64_t pending_generation = 0;

  std::vector<ddp::tensor_ref> parameters() { return {{"w", w}, {"b", b}}; }
  ddp::stats run(std::span<const std::uint32_t> idx, ddp::gradients* g) {
    ddp::stats s;
    std::vector<double> gw(features, 0.0);
    double gb = 0.0;
    for (auto i : idx) {
      double pred = b[0];
      for (std::size_t k = 0; k < features; ++k) pred += w[k] * feature(i, k);
      const double err = pred - target(i);
      s.loss_sum += err * err;
      s.count += 1;
      for (std::size_t k = 0; k < features; ++k) gw[k] += 2 * err * feature(i, k);
      gb += 2 * err;
    }
    if (g) {
      const double n = static_cast<double>(idx.size());
      for (std::size_t k = 0; k < features; ++k)
        (*g)[0][k] = static_cast<float>((g->accumulate() ? (*g)[0][k] : 0.0f) + gw[k] / n);
      (*g)[1][0] = static_cast<float>((g->accumulate() ? (*g)[1][0] : 0.0f) + gb / n);
      g->ready(1);
      g->ready(0);
    }
    return s;
  }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    if (*finished + 1 == kill_step && pg->rank() == victim && pg->size() == 4) ::raise(SIGKILL);
    if (*finished + 1 == kill_step2 && job_rank == victim2 && pg->size() == 3) ::raise(SIGKILL);
    if (pg->generation() != pending_generation) pending.clear();
    pending_generation = pg->generation();
    pending.insert(pending.end(), idx.begin(), idx.end());
    return run(idx, &g);
  }
  int eval_kill = 0, evals = 0;  // TRAINER_SHRINK_KILL_IN_EVAL: the victim dies in its n-th evaluation
  ddp::stats evaluate(std::span<const std::uint32_t> idx) {
    if (++evals == eval_kill && job_rank == victim) ::raise(SIGKILL);
    return run(idx, nullptr);
  }
};

// The regression on streamed records: each record's token is its sample's number.
struct streamed {
  regression* r = nullptr;
  std::vector<std::uint32_t> ids;
  std::vector<ddp::tensor_ref> parameters() { return r->parameters(); }
  ddp::stats forward_backward(const ddp::record_batch& b, ddp::gradients& g) {
    ids.clear();
    for (std::size_t i = 0; i < b.rows; ++i)
      if (!b.padding[i]) ids.push_back(b.row(i)[0]);
    return r->forward_backward(ids, g);
  }
};
static_assert(ddp::streaming_model<streamed>);

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: trainer_shrink_worker OUT_DIR VICTIM KILL_STEP [deterministic [VICTIM2 KILL_STEP2]]\n");
    return 2;
  }
  try {
    const char* join = std::getenv("KFT_JOIN");
    const char* rank_var = std::getenv("RANK");
    const int launched_rank = rank_var ? std::atoi(rank_var) : -1;
    if (const char* delay = std::getenv("TRAINER_SHRINK_JOIN_DELAY_MS"); join && delay)  // (a slow restart)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(delay)));
    std::optional<kft::session> session;
    try {
      session.emplace(kft::init(argc, argv));
    } catch (const kft::group::join_closed_error& e) {
      std::printf("trainer_shrink: rank %d joined too late (%s)\n", launched_rank, e.what());
      return 0;
    }
    auto& job = *session;
    auto& pg = job.group();
    const int job_rank = launched_rank >= 0 ? launched_rank : pg.rank();
    // A replacement can still come: heal, and kftrun's restarts not used up (a job that kftrun
    // restarted whole, its last restart, gets none; waiting for one there cost the whole 60 s).
    const auto env_int = [](const char* name) { return std::getenv(name) ? std::atoi(std::getenv(name)) : 0; };
    const bool heal = std::string(std::getenv("KFT_ON_FAILURE") ? std::getenv("KFT_ON_FAILURE") : "") == "heal" &&
                      env_int("KFT_RESTART_COUNT") < env_int("TORCHELASTIC_MAX_RESTARTS");
    regression m;
    m.pg = &pg;
    m.victim = std::atoi(argv[2]);
    m.kill_step = static_cast<std::uint64_t>(std::atoll(argv[3]));
    const bool deterministic = argc > 4 && std::string(argv[4]) == "deterministic";
    m.job_rank = job_rank;
    if (argc > 6) {
      m.victim2 = std::atoi(argv[5]);
      m.kill_step2 = static_cast<std::uint64_t>(std::atoll(argv[6]));
    }
    ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
    ddp::trainer_options o;
    o.batch = 6;
    o.epochs = 2;
    o.seed = 7;
    o.quiet = true;
    o.verify_every = 1;
    o.shrink_store = job.store();
    o.deterministic = deterministic;
    if (deterministic) {
      o.global_batch = 24;
      o.micro_shards = 12;
    }
    std::ofstream seen(std::string(argv[1]) + "/seen." + std::to_string(job_rank) + "." + (join ? join : "0"));
    std::uint64_t finished = 0;
    m.finished = &finished;
    std::function<std::uint64_t()> epoch_now;  // the trainer's epoch
    const bool kill_at_boundary = std::getenv("TRAINER_SHRINK_KILL_IN_JOIN") &&
                                  std::string(std::getenv("TRAINER_SHRINK_KILL_IN_JOIN")) == "boundary";
    o.on_step = [&](std::uint64_t step) {
      for (auto i : m.pending) seen << epoch_now() << " " << step << " " << i << "\n";
      seen.flush();
      m.pending.clear();
      finished = step;
      if (heal && step == m.kill_step + 2 && pg.size() < 4) {
        // (collective: every rank asks together, rank 0's answer is everyone's)
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (pg.waiting_to_join(job.store()) == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (kill_at_boundary && job_rank == 1 && !join) ::raise(SIGKILL);  // (the joiner is waiting now)
      }
    };
    if (const char* e = std::getenv("TRAINER_SHRINK_KILL_IN_EVAL")) {  // evaluations every 3 steps, 60 test samples
      m.eval_kill = std::atoi(e);
      o.eval_every = 3;
    }
    // TRAINER_SHRINK_KILL_IN: the victim dies around a checkpoint or at the end instead.
    const std::string kill_in = std::getenv("TRAINER_SHRINK_KILL_IN") ? std::getenv("TRAINER_SHRINK_KILL_IN") : "";
    const std::uint64_t phase_kill = kill_in.empty() ? 0 : m.kill_step;
    const bool victim_now = m.victim >= 0 && !kill_in.empty();
    struct ender : ddp::observer {
      std::function<void()> at_last_epoch;
      std::uint64_t epochs = 0;
      void on_epoch(const ddp::epoch_point& ep) override {
        if (ep.epoch == epochs && at_last_epoch) at_last_epoch();
      }
    } end_killer;
    auto is_victim = [&] { return victim_now && pg.rank() == m.victim && pg.size() == 4; };
    if (!kill_in.empty()) {
      m.kill_step = 0;  // (not in the backward pass)
      o.checkpoint_dir = std::string(argv[1]) + "/ckpt";
      o.checkpoint_every = 3;
      o.keep_checkpoints = 2;
      if (kill_in == "checkpoint") {
        auto inner = o.on_step;
        o.on_step = [&, inner](std::uint64_t step) {
          inner(step);
          if (step == phase_kill && is_victim()) ::raise(SIGKILL);
        };
      } else if (kill_in == "write") {
        o.checkpoint_progress = [&](std::size_t, std::size_t) {
          if (finished == phase_kill && is_victim()) ::raise(SIGKILL);
        };
      } else if (kill_in == "end") {
        end_killer.epochs = o.epochs;
        end_killer.at_last_epoch = [&] {
          if (is_victim()) ::raise(SIGKILL);
        };
        o.observers.push_back(&end_killer);
      } else {
        std::fprintf(stderr, "trainer_shrink_worker: TRAINER_SHRINK_KILL_IN=%s is not checkpoint, write or end\n",
                     kill_in.c_str());
        return 2;
      }
    }
    struct join_killer : ddp::observer {
      std::string who;
      bool member = false, first_replacement = false;
      void on_membership(const ddp::membership_point& p) override {
        if ((who == "member" && member && !p.newcomer && !p.joined.empty()) || (who == "joiner" && first_replacement && p.newcomer))
          ::raise(SIGKILL);
      }
    } join_kill;
    if (const char* w = std::getenv("TRAINER_SHRINK_KILL_IN_JOIN")) {
      join_kill.who = w;
      if (join_kill.who != "member" && join_kill.who != "joiner" && join_kill.who != "boundary") {
        std::fprintf(stderr, "trainer_shrink_worker: TRAINER_SHRINK_KILL_IN_JOIN=%s is not member, joiner or boundary\n", w);
        return 2;
      }
      join_kill.member = !join && job_rank == 1;
      join_kill.first_replacement = join && std::string(join) == "1";
      o.observers.push_back(&join_kill);
    }
    ddp::fit_summary sum;
    if (const char* records = std::getenv("TRAINER_SHRINK_RECORDS")) {
      ddp::record_options ro;
      const char* other = std::getenv("TRAINER_SHRINK_JOINER_RECORDS");
      ro.files = {join && other ? other : records};
      ro.token = ddp::token_type::u16;
      ro.record_tokens = 1;
      ro.seed = 7;
      // (a replacement's open_records opens its files alone: its fit() compares them with the members')
      auto train = ddp::open_records(pg, ro);
      streamed sm;
      sm.r = &m;
      ddp::trainer<streamed, ddp::sgd> t(pg, sm, opt, o);
      epoch_now = [&t] { return t.epoch(); };
      sum = t.fit(train);
    } else {
      ddp::trainer<regression, ddp::sgd> t(pg, m, opt, o);
      epoch_now = [&t] { return t.epoch(); };
      sum = t.fit(samples, m.eval_kill ? 60 : 0);
    }
    if (!kill_in.empty()) {
      std::vector<std::string> left;
      for (const auto& e : std::filesystem::directory_iterator(o.checkpoint_dir)) {
        const std::string f = e.path().filename().string();
        if (auto st = ddp::checkpoint_step(f)) left.push_back(std::to_string(*st));
        else if (f.find(".tmp-") != std::string::npos) left.push_back("tmp");
      }
      std::sort(left.begin(), left.end());
      std::string text;
      for (const auto& l : left) text += (text.empty() ? "" : ",") + l;
      std::printf("trainer_shrink: rank %d checkpoints %s\n", job_rank, text.c_str());
    }
    std::printf("trainer_shrink: rank %d of %d hash %llu steps %llu evals %zu loss %.17g\n", job_rank, pg.size(),
                static_cast<unsigned long long>(sum.parameters_hash), static_cast<unsigned long long>(sum.steps),
                sum.evals.size(), sum.evals.empty() ? 0.0 : sum.evals.back().loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_shrink_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
