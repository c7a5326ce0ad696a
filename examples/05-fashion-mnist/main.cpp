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
#include <cblas.h>

#include <cstdio>
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
  CLI11_PARSE(app, argc, argv);
  try {
    if (to.resume && ckpt_dir.empty()) throw CLI::ValidationError("--resume", "needs --checkpoint-dir");
    std::vector<int> widths{784};
    for (int w : fmnist::parse_widths(hidden)) widths.push_back(w);
    widths.push_back(10);

    // Joins the job however it was started (kftrun, torchrun, mpirun, srun, a TrainJob pod, or
    // alone): MPI initialised under an MPI launcher, the ranks met, the process group built.
    kft::init_options io;
    io.group.shm.pool_bytes = 256u << 20;  // bucket storage inside the shared segment
    auto job = kft::init(argc, argv, std::move(io));
    const kft::world_info& me = job.world();
    auto& pg = job.group();

    if (!threads) threads = kft::ddp::compute_threads(me.local_size.value_or(1));
    openblas_set_num_threads(threads);

    const fmnist::dataset train = fmnist::load_split(data, "train"), test = fmnist::load_split(data, "t10k");
    fmnist::mlp model(widths, &train, &test, to.seed + 1);

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
    std::optional<kft::ddp::half_params<fmnist::mlp>> half;
    if (precision != "f32") half.emplace(model, precision == "bf16" ? kft::dtype::bf16 : kft::dtype::f16);
    auto fit = [&](auto& m) {
      if (optimizer == "sgd") {
        kft::ddp::sgd opt({.lr = lr, .momentum = momentum, .weight_decay = weight_decay});
        kft::ddp::trainer t(pg, m, opt, to);
        return t.fit(train.n, test.n);
      }
      kft::ddp::adam opt({.lr = lr, .weight_decay = weight_decay});
      kft::ddp::trainer t(pg, m, opt, to);
      return t.fit(train.n, test.n);
    };
    const kft::ddp::fit_summary s = half ? fit(*half) : fit(model);
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
