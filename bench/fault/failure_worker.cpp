// SPDX-License-Identifier: Apache-2.0
// One rank of a DDP job with a large state and a cheap step, for what losing a rank costs
// (issue 46 items 3 and 5): bench/fault/failure_cost.py runs it under kftrun with and without a
// failure, and with each way of getting over one (a restart from a checkpoint, going on without
// the rank, healing it from a live peer).
//
//   failure_worker [--state-mb 256] [--steps 40] [--tensors 4] [--batch 3] [--kill-rank R --kill-step S]
//                  [--checkpoint-dir D --checkpoint-every C] [--shrink] [--verify-every N]
//
// The state is --state-mb MB: f32 parameters and SGD's f32 momentum, 8 bytes per parameter (256
// MB: 32M parameters, in --tensors tensors). A step's gradient is synthetic and O(parameters):
// g = 1e-3 w + a v(k) + b, where a and b are the mean of a hash of the step's sample indices
// (deterministic: the same samples give the same bits) and v(k) a fixed pattern over the
// parameter's index; one pass over the parameters, tensors in reverse order, each handed to the
// reducer as soon as it is written. One epoch of --steps steps of --batch samples per rank
// (global batch 4 x batch: 12 splits evenly over 4 and 3 ranks).
//
// --kill-rank R --kill-step S: job rank R kills itself (SIGKILL) as step S's backward pass
// starts, once: only the original process does (not one kftrun restarted, KFT_RESTART_COUNT > 0,
// nor a replacement, KFT_JOIN). It first prints "failure_worker: rank R killed at step S t T"
// (T: CLOCK_REALTIME seconds). --checkpoint-dir: rank 0 writes a checkpoint every C steps and the
// trainer resumes from the newest one at the start (a restarted job). --shrink: the trainer goes
// on without a lost rank and admits a replacement (trainer_options::shrink_store).
//
// The model is built before kft::init, so a replacement has its memory before it asks to join.
// Job rank 0 prints "failure_worker: rank 0 step N end t T" as each step ends (after it, before
// the step's checkpoint is written). Every rank prints at the end
//   failure_worker: rank R of P steps S wall W setup U hash H restart K join J resumed_from F start T0 end T1
// (W: seconds from main's start to the end of fit(); U: to the trainer's construction, a
// checkpoint's load or a replacement's state included; T0, T1: CLOCK_REALTIME). A replacement
// also prints
//   failure_worker: joiner rank R: init X s, state Y s, init + state Z s, at step N t T
// (X: kft::init, which returns once the members admitted it at a step boundary; Y: the trainer's
// constructor, which receives the parameters and optimizer state from a survivor). One that
// finds the job finished prints "failure_worker: rank R joined too late" and exits 0.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kft/ddp/optim.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>

namespace ddp = kft::ddp;
using clk = std::chrono::steady_clock;

namespace {

struct args {
  double state_mb = 256;
  std::uint64_t steps = 40, batch = 3, checkpoint_every = 0, verify_every = 100;
  int tensors = 4, kill_rank = -1;
  std::uint64_t kill_step = 0;
  std::string checkpoint_dir;
  bool shrink = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "failure_worker: %s\nusage: failure_worker [--state-mb MB] [--steps N] [--tensors N] [--batch N] "
               "[--kill-rank R --kill-step S] [--checkpoint-dir D --checkpoint-every C] [--shrink] "
               "[--verify-every N]\n",
               why.c_str());
  std::exit(2);
}

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--shrink") {
      a.shrink = true;
      continue;
    }
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    auto count = [&](std::uint64_t lo) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || n < static_cast<long long>(lo)) usage(k + ": '" + v + "' is not an integer >= " + std::to_string(lo));
      return static_cast<std::uint64_t>(n);
    };
    if (k == "--state-mb") {
      char* end = nullptr;
      a.state_mb = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(a.state_mb > 0) || a.state_mb > 65536) usage("--state-mb: '" + v + "' is not in (0, 65536]");
    } else if (k == "--steps") {
      a.steps = count(1);
    } else if (k == "--tensors") {
      a.tensors = static_cast<int>(count(1));
    } else if (k == "--batch") {
      a.batch = count(1);
    } else if (k == "--kill-rank") {
      a.kill_rank = static_cast<int>(count(0));
    } else if (k == "--kill-step") {
      a.kill_step = count(1);
    } else if (k == "--checkpoint-dir") {
      a.checkpoint_dir = v;
    } else if (k == "--checkpoint-every") {
      a.checkpoint_every = count(1);
    } else if (k == "--verify-every") {
      a.verify_every = count(0);
    } else {
      usage("unknown flag " + k);
    }
  }
  if ((a.kill_rank >= 0) != (a.kill_step > 0)) usage("--kill-rank and --kill-step go together");
  if (a.checkpoint_every && a.checkpoint_dir.empty()) usage("--checkpoint-every needs --checkpoint-dir");
  return a;
}

double now_realtime() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// A sample's two coefficients, from a hash of its index: in [-0.5, 0.5).
float coefficient(std::uint32_t i, std::uint32_t salt) {
  std::uint64_t x = (static_cast<std::uint64_t>(i) << 1 | salt) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f;
}

struct synthetic {
  std::vector<std::vector<float>> w;
  // The failure: job rank `kill_rank` dies as step `kill_step` starts, if `may_die`.
  int job_rank = -1, kill_rank = -1;
  std::uint64_t kill_step = 0;
  bool may_die = false;
  const std::uint64_t* finished = nullptr;  // steps finished so far (on_step)

  synthetic(std::size_t parameters, int tensors) {
    const std::size_t per = (parameters + static_cast<std::size_t>(tensors) - 1) / static_cast<std::size_t>(tensors);
    std::size_t left = parameters;
    for (int t = 0; t < tensors && left; ++t) {
      const std::size_t n = std::min(per, left);
      left -= n;
      auto& v = w.emplace_back(n);
      for (std::size_t k = 0; k < n; ++k) v[k] = pattern(k + static_cast<std::size_t>(t) * per) * 0.01f;
    }
  }
  // A fixed pattern over the parameter's index, in [-0.5, 0.5) (integer arithmetic: vectorizes).
  static float pattern(std::size_t k) {
    const std::uint32_t h = static_cast<std::uint32_t>(k) * 2654435761u;
    return static_cast<float>(static_cast<std::int32_t>(h >> 22) - 512) * (1.0f / 1024.0f);
  }

  std::vector<ddp::tensor_ref> parameters() {
    std::vector<ddp::tensor_ref> r;
    for (std::size_t t = 0; t < w.size(); ++t) r.push_back({"w" + std::to_string(t), w[t]});
    return r;
  }

  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
    if (may_die && job_rank == kill_rank && *finished + 1 == kill_step) {
      std::printf("failure_worker: rank %d killed at step %llu t %.6f\n", job_rank,
                  static_cast<unsigned long long>(kill_step), now_realtime());
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    ddp::stats s;
    float a = 0.0f, b = 0.0f;
    for (auto i : idx) {
      const float ca = coefficient(i, 0), cb = coefficient(i, 1);
      a += ca;
      b += cb;
      s.loss_sum += static_cast<double>(ca) * ca + static_cast<double>(cb) * cb;
      s.count += 1;
    }
    if (!idx.empty()) {
      a /= static_cast<float>(idx.size());
      b /= static_cast<float>(idx.size());
    }
    const std::size_t per = w.front().size();
    for (std::size_t t = w.size(); t-- > 0;) {  // the last tensor first, as a backward pass
      const std::span<float> gt = g[t];
      const float* wt = w[t].data();
      const std::size_t n = w[t].size(), base = t * per;
      if (g.accumulate()) {
        for (std::size_t k = 0; k < n; ++k) gt[k] += 1e-3f * wt[k] + a * pattern(base + k) + b;
      } else {
        for (std::size_t k = 0; k < n; ++k) gt[k] = 1e-3f * wt[k] + a * pattern(base + k) + b;
      }
      g.ready(t);
    }
    return s;
  }
};

std::uint64_t env_count(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto t_main = clk::now();
  const double start_rt = now_realtime();
  const args a = parse(argc, argv);
  const std::uint64_t restart = env_count("KFT_RESTART_COUNT"), join = env_count("KFT_JOIN");
  const char* rank_var = std::getenv("RANK");
  const int launched_rank = rank_var ? std::atoi(rank_var) : -1;
  try {
    // The model first (its memory written): a replacement has it before it asks to join.
    const auto parameters = static_cast<std::size_t>(a.state_mb * 1024 * 1024 / 8);
    synthetic m(parameters, a.tensors);

    std::optional<kft::session> session;
    const auto t_init = clk::now();
    try {
      session.emplace(kft::init(argc, argv));
    } catch (const kft::group::join_closed_error& e) {
      std::printf("failure_worker: rank %d joined too late (%s)\n", launched_rank, e.what());
      return 0;
    }
    const double init_s = since(t_init);
    auto& job = *session;
    auto& pg = job.group();
    const int job_rank = launched_rank >= 0 ? launched_rank : pg.rank();
    m.job_rank = job_rank;
    m.kill_rank = a.kill_rank;
    m.kill_step = a.kill_step;
    m.may_die = restart == 0 && join == 0;
    std::uint64_t finished = 0;
    m.finished = &finished;

    ddp::sgd opt({.lr = 0.01f, .momentum = 0.9f});
    ddp::trainer_options o;
    o.batch = a.batch;
    o.epochs = 1;
    o.seed = 11;
    o.quiet = true;
    o.verify_every = a.verify_every;
    if (a.shrink) o.shrink_store = job.store();
    if (!a.checkpoint_dir.empty()) {
      o.checkpoint_dir = a.checkpoint_dir;
      o.checkpoint_every = a.checkpoint_every;
      o.resume = true;
    }
    o.on_step = [&](std::uint64_t step) {
      finished = step;
      if (job_rank == 0) {  // (the script's timeline: where a failure's time went)
        std::printf("failure_worker: rank 0 step %llu end t %.6f\n", static_cast<unsigned long long>(step), now_realtime());
        std::fflush(stdout);
      }
    };
    const auto t_state = clk::now();
    ddp::trainer<synthetic, ddp::sgd> t(pg, m, opt, o);
    const double state_s = since(t_state);
    finished = t.step_count();
    const double setup_s = since(t_main);
    if (join)
      std::printf("failure_worker: joiner rank %d: init %.3f s, state %.3f s, init + state %.3f s, at step %llu t %.6f\n",
                  job_rank, init_s, state_s, init_s + state_s, static_cast<unsigned long long>(t.step_count()),
                  now_realtime());
    const auto sum = t.fit(a.steps * a.batch * static_cast<std::uint64_t>(pg.founding_size()));
    std::printf("failure_worker: rank %d of %d steps %llu wall %.3f setup %.3f hash %llu restart %llu join %llu "
                "resumed_from %llu start %.6f end %.6f\n",
                job_rank, pg.size(), static_cast<unsigned long long>(sum.steps), since(t_main), setup_s,
                static_cast<unsigned long long>(sum.parameters_hash), static_cast<unsigned long long>(restart),
                static_cast<unsigned long long>(join), static_cast<unsigned long long>(sum.resumed_from), start_rt,
                now_realtime());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failure_worker: rank %d: %s\n", launched_rank, e.what());
    return 1;
  }
  return 0;
}
