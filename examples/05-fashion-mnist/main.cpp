// SPDX-License-Identifier: Apache-2.0
// Example 05: data-parallel training of an MLP on Fashion-MNIST with kft's DDP trainer.
//
//   kftrun --nproc-per-node 2 -- build/examples/05-fashion-mnist
//   mpirun -np 2 build/examples/05-fashion-mnist          (the same binary, unchanged)
//   srun -n 2 build/examples/05-fashion-mnist
//
// The model (mlp.hpp, 784-256-128-10, matrix products through OpenBLAS) and the optimizer are
// layer 1; kft::ddp::trainer glues them to the job's process group: every rank trains on its
// share of each global batch, gradients are averaged while the backward pass runs, replicas are
// compared every 100 steps, and rank 0 prints a table per epoch and a summary.
// The data are Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
//
// A lost rank (--on-lost-rank): `restart` (the default) ends the run with the error, for a
// launcher to restart the job from a checkpoint; `shrink` (the default under kftrun
// --on-failure continue or heal) goes on without it: the survivors shrink the group, redo the
// interrupted step and train on, and under heal admit kftrun's replacement at a step boundary.
//
//   kftrun --nproc-per-node 3 --on-failure heal --max-restarts 1 --
//       build/examples/05-fashion-mnist --kill-rank 1 --kill-at-step 100   (a fault drill: rank 1 dies)
#include <cblas.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/ddp/mixed.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>

#include "idx.hpp"
#include "mlp.hpp"
#include "widths.hpp"

namespace {

// The MLP with a fault drill (--kill-rank R --kill-at-step S): job rank R kills itself (SIGKILL,
// as the OOM killer or a crash would end it) as step S's forward pass starts, while the other
// ranks go into that step's gradient allreduce. Only the job's first attempt dies: neither a
// worker kftrun restarted (KFT_RESTART_COUNT > 0) nor a replacement (KFT_JOIN) does.
struct drill_mlp : fmnist::mlp {
  using fmnist::mlp::mlp;
  bool victim = false;
  std::uint64_t kill_at_step = 0;
  std::function<std::uint64_t()> steps_done;  // the trainer's finished steps

  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, kft::ddp::gradients& g) {
    if (victim && steps_done && steps_done() + 1 == kill_at_step) ::raise(SIGKILL);
    return fmnist::mlp::forward_backward(idx, g);
  }
};

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel MLP training on Fashion-MNIST with kft's DDP trainer (run it under kftrun, mpirun or srun)"};
  std::string data = "/usr/share/datasets/fashion-mnist", hidden = "256,128", optimizer = "sgd", log_json, ckpt_dir;
  std::string precision = "f32";
  kft::ddp::trainer_options to;
  to.epochs = 5;
  float lr = 0.05f, momentum = 0.9f, weight_decay = 0.0f;
  int threads = 0, evals_per_epoch = 4;
  double target = 0.87;
  bool require_target = false;
  std::uint64_t bucket_cap_mib = 25;
  app.add_option("--data", data, "directory with the four *-ubyte.gz files")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden layer widths, comma-separated")->capture_default_str();
  app.add_option("--epochs", to.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", to.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--accumulate", to.accumulate, "micro-batches per optimizer step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--optimizer", optimizer, "sgd or adamw")->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--lr", lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", momentum, "SGD momentum")->check(CLI::Range(0.0f, 0.999f))->capture_default_str();
  app.add_option("--weight-decay", weight_decay, "weight decay")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--seed", to.seed, "seed of the sample order and the initial weights")->capture_default_str();
  app.add_option("--target", target, "test accuracy whose time is reported")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_flag("--require-target", require_target, "exit 3 when the final test accuracy is below --target");
  app.add_option("--evals-per-epoch", evals_per_epoch, "test evaluations per epoch")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--threads", threads, "BLAS threads per rank (default: cores / ranks on the node)")->check(CLI::Range(1, 1024));
  app.add_option("--bucket-cap-mib", bucket_cap_mib, "the reducer's bucket cap")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--zero", to.zero_stage, "ZeRO stage: 0 replicates the optimizer state, 1 shards it across the ranks")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--precision", precision, "parameters in f32, or bf16 / f16 with f32 master weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_flag("--f32-gradients", to.f32_gradients, "with --precision bf16/f16: reduce the gradients in f32");
  app.add_flag("--deterministic", to.deterministic, "bit-identical results for any number of ranks dividing --micro-shards");
  app.add_option("--global-batch", to.global_batch, "deterministic: samples per step over all ranks (default batch x ranks)");
  app.add_option("--micro-shards", to.micro_shards, "deterministic: fixed shards per global batch (default: ranks)");
  app.add_option("--checkpoint-dir", ckpt_dir, "write checkpoints here (and resume from them with --resume)");
  app.add_option("--checkpoint-every", to.checkpoint_every, "steps between checkpoints (0: each epoch's end)")->capture_default_str();
  app.add_flag("--resume", to.resume, "start from the newest valid checkpoint in --checkpoint-dir, if any");
  app.add_option("--max-steps", to.max_steps, "stop after this many steps (0: no limit)")->capture_default_str();
  app.add_option("--verify-every", to.verify_every, "steps between replica comparisons")->capture_default_str();
  app.add_option("--baseline-rate", to.baseline_samples_per_s, "one rank's samples/s, for the weak-scaling efficiency");
  app.add_flag("--quiet", to.quiet, "print only the summary");
  app.add_option("--log-json", log_json, "append JSON lines (start, eval, epoch, checkpoint, summary) to this file");
  // What a rank's death does. The default follows kftrun's --on-failure (KFT_ON_FAILURE in the
  // workers' environment): shrink under continue or heal, where kftrun keeps the others running.
  const std::string launcher_policy = env_or("KFT_ON_FAILURE", "stop");
  std::string on_lost_rank = launcher_policy == "continue" || launcher_policy == "heal" ? "shrink" : "restart";
  app.add_option("--on-lost-rank", on_lost_rank,
                 "when a rank dies: restart (the run ends with the error; a launcher restarts the job, from a "
                 "checkpoint with --resume) or shrink (the others go on without it and admit a replacement that "
                 "joins; needs kftrun --on-failure continue or heal). Default: shrink under kftrun --on-failure "
                 "continue|heal, else restart")
      ->check(CLI::IsMember({"restart", "shrink"}))
      ->capture_default_str();
  int kill_rank = -1;
  std::uint64_t kill_at_step = 0;
  auto* kill_rank_opt = app.add_option("--kill-rank", kill_rank,
                                       "fault drill: this job rank kills itself (SIGKILL) as step --kill-at-step starts "
                                       "(once: not when restarted, nor as a replacement)")
                            ->check(CLI::NonNegativeNumber);
  auto* kill_step_opt =
      app.add_option("--kill-at-step", kill_at_step, "fault drill: the step (1, 2, ...) whose start --kill-rank does not survive")
          ->check(CLI::PositiveNumber);
  kill_rank_opt->needs(kill_step_opt);
  kill_step_opt->needs(kill_rank_opt);
  CLI11_PARSE(app, argc, argv);
  try {
    if (to.resume && ckpt_dir.empty()) throw CLI::ValidationError("--resume", "needs --checkpoint-dir");
    const bool shrink = on_lost_rank == "shrink";
    const std::string shrink_words =
        std::string("--on-lost-rank shrink") +
        (app.count("--on-lost-rank") ? "" : " (the default under kftrun --on-failure " + launcher_policy + ")");
    if (shrink && to.zero_stage)
      throw CLI::ValidationError(shrink_words, "cannot go with --zero 1: a lost rank takes its shard of the optimizer "
                                               "state with it (pass --zero 0, or --on-lost-rank restart)");
    std::vector<int> widths{784};
    for (int w : fmnist::parse_widths(hidden)) widths.push_back(w);
    widths.push_back(10);

    // The data first: a replacement (below) is admitted into a running group that then waits
    // for it to build its trainer, so it reads the files before it joins.
    const fmnist::dataset train = fmnist::load_split(data, "train"), test = fmnist::load_split(data, "t10k");

    // Joins the job however it was started (kftrun, torchrun, mpirun, srun, a TrainJob pod, or
    // alone): MPI initialised under an MPI launcher, the ranks met, the process group built.
    kft::init_options io;
    io.group.shm.pool_bytes = 256u << 20;  // bucket storage inside the shared segment
    // A replacement (kftrun --on-failure heal sets KFT_JOIN) joins the running group here; when
    // the others finished first there is nothing to join, and nothing is wrong.
    std::optional<kft::session> session;
    try {
      session.emplace(kft::init(argc, argv, std::move(io)));
    } catch (const kft::group::join_closed_error& late) {
      std::printf("05-fashion-mnist: replacement for rank %s came after training finished; nothing to do (%s)\n",
                  env_or("RANK", "?").c_str(), late.what());
      return 0;
    }
    auto& job = *session;
    const kft::world_info& me = job.world();
    auto& pg = job.group();
    if (shrink) {
      if (!job.store() && pg.size() > 1)
        throw CLI::ValidationError(shrink_words, "needs the launcher's store (kftrun or torchrun); under " +
                                                     me.backend + " pass --on-lost-rank restart");
      // Deterministic mode cuts each global batch into --micro-shards fixed shards, which the
      // ranks left after a loss must still divide.
      const std::uint64_t shards = to.micro_shards ? to.micro_shards : static_cast<std::uint64_t>(pg.founding_size());
      const std::uint64_t fewer = static_cast<std::uint64_t>(pg.founding_size() - 1);
      if (to.deterministic && !pg.newcomer() && fewer > 0 && shards % fewer != 0)
        throw CLI::ValidationError(shrink_words, "with --deterministic needs --micro-shards divisible by " +
                                                     std::to_string(fewer) + " too (the ranks left after a loss; it is " +
                                                     std::to_string(shards) + "): pass --micro-shards " +
                                                     std::to_string(std::lcm(shards, fewer)) + ", or --on-lost-rank restart");
      to.shrink_store = job.store();
    }

    if (!threads) threads = kft::ddp::compute_threads(me.local_size.value_or(1));
    openblas_set_num_threads(threads);

    drill_mlp model(widths, &train, &test, to.seed + 1);
    model.victim = kill_at_step && me.rank == kill_rank && env_or("KFT_RESTART_COUNT", "0") == "0" &&
                   env_or("KFT_JOIN", "0") == "0";
    model.kill_at_step = kill_at_step;

    to.threads = threads;
    to.target_accuracy = target;
    to.log_json = log_json;
    to.checkpoint_dir = ckpt_dir;
    to.reducer.limits.bucket_bytes_cap = bucket_cap_mib << 20;
    to.label = "Fashion-MNIST MLP " + [&] {
      std::string s;
      for (std::size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
      return s;
    }();
    const std::uint64_t global = to.deterministic && to.global_batch ? to.global_batch : to.batch * static_cast<std::uint64_t>(pg.size());
    const std::uint64_t steps_per_epoch = (train.n + global * to.accumulate - 1) / (global * to.accumulate);
    to.eval_every = std::max<std::uint64_t>(1, steps_per_epoch / static_cast<std::uint64_t>(evals_per_epoch));
    if (evals_per_epoch == 1) to.eval_every = 0;

    // --precision bf16 / f16: the model's parameters in 16 bits (f32 master weights in the
    // trainer, gradients in 16 bits unless --f32-gradients); the MLP itself computes in f32.
    std::optional<kft::ddp::half_params<drill_mlp>> half;
    if (precision != "f32") half.emplace(model, precision == "bf16" ? kft::dtype::bf16 : kft::dtype::f16);
    auto fit = [&](auto& m) {
      if (optimizer == "sgd") {
        kft::ddp::sgd opt({.lr = lr, .momentum = momentum, .weight_decay = weight_decay});
        kft::ddp::trainer t(pg, m, opt, to);
        model.steps_done = [&t] { return t.step_count(); };
        return t.fit(train.n, test.n);
      }
      kft::ddp::adam opt({.lr = lr, .weight_decay = weight_decay});
      kft::ddp::trainer t(pg, m, opt, to);
      model.steps_done = [&t] { return t.step_count(); };
      return t.fit(train.n, test.n);
    };
    const kft::ddp::fit_summary s = half ? fit(*half) : fit(model);
    model.steps_done = nullptr;
    // The job changed shape (a rank lost, one joined): every rank says where it ended, so the
    // replicas can be compared from the outside too (the trainer compared them at the end).
    if (pg.generation() > 0)
      std::printf("05-fashion-mnist: rank %d ended as rank %d of %d (generation %llu) after %llu steps, parameters "
                  "hash %016llx\n",
                  me.rank, pg.rank(), pg.size(), static_cast<unsigned long long>(pg.generation()),
                  static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.parameters_hash));
    if (require_target && s.final_accuracy < target) {
      if (pg.rank() == 0)
        std::fprintf(stderr, "05-fashion-mnist: final test accuracy %.4f is below the target %.2f\n", s.final_accuracy, target);
      return 3;
    }
    return 0;
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const kft::usage_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "05-fashion-mnist: %s\n", e.what());
    return 1;
  }
}
