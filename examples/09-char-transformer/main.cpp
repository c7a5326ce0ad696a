// SPDX-License-Identifier: Apache-2.0
// Example 09: data-parallel training of a character-level GPT on Debian's fortunes with kft's
// DDP trainer, to a stated validation loss.
//
//   kftrun --nproc-per-node 2 -- build/examples/09-char-transformer
//   mpirun -np 2 build/examples/09-char-transformer     (the same binary, unchanged)
//   build/examples/09-char-transformer --data some.txt  (one process, another text)
//
// The model (gpt.hpp: a pre-LayerNorm decoder, 4 blocks of width 256 by default, 3.2 M
// parameters = 13 MB of f32 gradients, matrix products through OpenBLAS) and the reader of the
// text (corpus.hpp) are layer 1; kft::ddp::trainer glues them to the job's process group: every
// rank trains on its share of each global batch of windows, the gradients are averaged in
// buckets while the backward pass runs, AdamW steps, and the validation loss is measured every
// --eval-every steps on --eval-windows windows spread over the validation text (the last 10%).
// The time to the target is the training time (evaluations excluded) until the first
// evaluation at or below --target. bench/workloads/char_lm_peers.py runs this beside PyTorch DDP.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/ddp/mixed.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>

#include "corpus.hpp"
#include "gpt.hpp"

namespace {

constexpr const char* fortunes_dir = "/usr/share/games/fortunes";

// The printable form of generated text: bytes as they are, other control bytes as '?'.
std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    out += (u >= 32 || ch == '\n' || ch == '\t') ? ch : '?';
  }
  return out;
}

// Says what went wrong and returns the exit status: 2 for a usage or configuration error, 1
// for the rest (kft's messages name their rank and operation; the others get the program's name).
int failed(const std::exception& e) {
  const bool usage = dynamic_cast<const kft::usage_error*>(&e) || dynamic_cast<const kft::config_error*>(&e);
  std::fprintf(stderr, "%s%s\n", dynamic_cast<const kft::error*>(&e) ? "" : "09-char-transformer: ", e.what());
  return usage ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel training of a character-level GPT on a text (default: Debian's fortunes) with kft's DDP "
               "trainer (run it under kftrun, mpirun or srun)"};
  std::vector<std::string> data{fortunes_dir};
  std::string log_json, precision = "f32";
  chargpt::gpt_config gc;
  kft::ddp::trainer_options to;
  to.batch = 8;
  to.epochs = 1;
  to.max_steps = 600;
  to.eval_every = 50;
  float lr = 2e-3f, weight_decay = 0.01f, beta2 = 0.95f;
  std::uint64_t warmup = 50;
  std::string decay = "none";
  double lr_floor = 0.1;
  int threads = 0, sample = 200;
  float temperature = 0.8f;
  double target = 2.3, valid_fraction = 0.1;
  std::uint64_t eval_windows = 128, bucket_cap_mib = 25;
  bool require_target = false;
  app.add_option("--data", data, "text files or directories (their files not ending .dat or .u8), read in order")
      ->capture_default_str();
  app.add_option("--valid-fraction", valid_fraction, "the text's last fraction, for validation")
      ->check(CLI::Range(0.01, 0.5))
      ->capture_default_str();
  app.add_option("--layers", gc.layers, "transformer blocks")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--d", gc.d, "model width")->check(CLI::Range(8, 4096))->capture_default_str();
  app.add_option("--heads", gc.heads, "attention heads (must divide --d)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--ctx", gc.ctx, "tokens per window")->check(CLI::Range(2, 4096))->capture_default_str();
  app.add_option("--batch", to.batch, "windows per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--epochs", to.epochs, "epochs (one is 18k windows of the fortunes)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-steps", to.max_steps, "stop after this many steps (0: no limit)")->capture_default_str();
  app.add_option("--lr", lr, "AdamW's learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--beta2", beta2, "AdamW's second-moment decay")->check(CLI::Range(0.0f, 0.9999f))->capture_default_str();
  app.add_option("--decay", decay, "after the warm-up: none (constant lr), linear or cosine to --lr-floor at the last step")
      ->check(CLI::IsMember({"none", "linear", "cosine"}))
      ->capture_default_str();
  app.add_option("--lr-floor", lr_floor, "the decay's last rate, as a fraction of --lr")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "steps of a linear learning-rate warm-up from lr / warmup (0: none)")
      ->capture_default_str();
  app.add_option("--weight-decay", weight_decay, "AdamW's decoupled weight decay")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_option("--eval-every", to.eval_every, "steps between validation losses (0: each epoch's end)")
      ->capture_default_str();
  app.add_option("--eval-windows", eval_windows, "validation windows, spread evenly over the validation text")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--target", target, "the validation loss (nats per character) whose time is reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--require-target", require_target, "exit 3 when no evaluation reached --target");
  app.add_option("--seed", to.seed, "seed of the window order and the initial weights")->capture_default_str();
  app.add_option("--threads", threads, "BLAS threads per rank (default: cores / ranks on the node)")->check(CLI::Range(1, 1024));
  app.add_option("--bucket-cap-mib", bucket_cap_mib, "the reducer's bucket cap")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--precision", precision, "weights and embeddings in f32, or bf16 / f16 with f32 master weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_flag("--f32-gradients", to.f32_gradients, "with --precision bf16/f16: reduce the gradients in f32");
  app.add_option("--baseline-rate", to.baseline_samples_per_s, "one rank's windows/s, for the weak-scaling efficiency");
  app.add_option("--sample", sample, "characters rank 0 writes after training, continuing the validation text (0: none)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--temperature", temperature, "the sample's temperature (0: the likeliest character)")
      ->check(CLI::Range(0.0f, 10.0f))
      ->capture_default_str();
  app.add_flag("--quiet", to.quiet, "print only the summary");
  app.add_option("--log-json", log_json, "append JSON lines (start, eval, epoch, summary) to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    if (gc.d % gc.heads != 0)
      throw CLI::ValidationError("--heads", std::to_string(gc.heads) + " does not divide --d " + std::to_string(gc.d));
    for (const auto& p : data)
      if (!std::filesystem::exists(p))
        throw std::runtime_error(p + " does not exist" +
                                 (p == fortunes_dir ? ": install Debian's fortunes (apt-get install fortunes)" : "") +
                                 " (--data names text files or directories)");

    // Joins the job however it was started (kftrun, torchrun, mpirun, srun, a TrainJob pod, or
    // alone). The gradient buckets live in the shared segment: room for them, and for a rebuild.
    gc.vocab = 256;  // (the most a corpus can use: sizes the pool before the text is read)
    kft::init_options io;
    io.group.shm.pool_bytes = 3 * 4 * chargpt::parameter_count(gc) + (16u << 20);
    auto job = kft::init(argc, argv, std::move(io));
    const kft::world_info& me = job.world();
    auto& pg = job.group();

    if (!threads) threads = kft::ddp::compute_threads(me.local_size.value_or(1));
    openblas_set_num_threads(threads);

    std::vector<std::filesystem::path> paths(data.begin(), data.end());
    const chargpt::corpus text = chargpt::read_corpus(paths, valid_fraction);
    gc.vocab = text.vocab.size();
    gc.seed = to.seed + 1;
    // eval_windows windows spread over the validation text (all of them when it has no more).
    const std::size_t need = static_cast<std::size_t>(gc.ctx) + 1;
    if (text.valid.size() < need || text.train.size() < need)
      throw std::runtime_error("the text is too short: " + std::to_string(text.train.size()) + " training and " +
                               std::to_string(text.valid.size()) + " validation characters, windows need " +
                               std::to_string(need));
    const std::size_t spans = text.valid.size() - need;
    if (eval_windows > 1 && spans / (eval_windows - 1) > static_cast<std::size_t>(gc.ctx))
      gc.valid_stride = static_cast<int>(spans / (eval_windows - 1));
    chargpt::char_gpt model(gc, text.train, text.valid);
    const std::uint64_t test = std::min<std::uint64_t>(eval_windows, model.valid_windows());

    if (pg.rank() == 0 && !to.quiet) {
      std::printf("corpus: %zu characters in %zu file(s) (%s%s), %d distinct; %zu training windows of %d, %llu "
                  "validation windows (every %d characters of the last %.0f%%)\n%s\n",
                  text.bytes(), text.files.size(), data.front().c_str(), data.size() > 1 ? ", ..." : "",
                  text.vocab.size(), model.train_windows(), gc.ctx, static_cast<unsigned long long>(test),
                  model.config().valid_stride, 100.0 * valid_fraction, chargpt::describe(model.config()).c_str());
      std::fflush(stdout);
    }

    to.threads = threads;
    to.log_json = log_json;
    to.target = {"loss", target, true};
    to.reducer.limits.bucket_bytes_cap = bucket_cap_mib << 20;
    to.label = "char GPT " + std::to_string(gc.layers) + " x " + std::to_string(gc.d) + " (" + std::to_string(gc.heads) +
               " heads, ctx " + std::to_string(gc.ctx) + ")";
    // The trainer's schedule (kft/ddp/schedule.hpp): step s (1-based) runs at lr x s / warmup
    // during the warm-up, then at lr, or decays to lr x --lr-floor at the last step.
    kft::ddp::adam opt({.lr = lr, .beta2 = beta2, .weight_decay = weight_decay});
    to.lr = {.peak = lr, .warmup = warmup};
    if (decay != "none") {
      const std::uint64_t per_epoch = (model.train_windows() + to.batch * static_cast<std::uint64_t>(pg.size()) - 1) /
                                      (to.batch * static_cast<std::uint64_t>(pg.size()));
      to.lr.total = to.max_steps ? to.max_steps : to.epochs * per_epoch;
      to.lr.floor = lr_floor;
      to.lr.decay = decay == "linear" ? kft::ddp::lr_schedule::shape::linear : kft::ddp::lr_schedule::shape::cosine;
      if (to.lr.total <= warmup)
        throw CLI::ValidationError("--decay", "the run's " + std::to_string(to.lr.total) +
                                                  " steps end within the warm-up (--warmup " + std::to_string(warmup) + ")");
    }
    // --precision bf16 / f16: weights and embeddings in 16 bits (f32 master weights in the
    // trainer, 16-bit gradients unless --f32-gradients); LayerNorm gains and biases stay f32.
    // The model computes in f32 on the 16-bit values (kft/ddp/mixed.hpp).
    std::optional<kft::ddp::half_params<chargpt::char_gpt>> half;
    if (precision != "f32")
      half.emplace(model, precision == "bf16" ? kft::dtype::bf16 : kft::dtype::f16, [](const kft::ddp::tensor_ref& p) {
        return p.name.ends_with(".g") || p.name.ends_with(".b");
      });
    auto fit = [&](auto& m) {
      kft::ddp::trainer t(pg, m, opt, to);
      return t.fit(model.train_windows(), test);
    };
    const kft::ddp::fit_summary s = half ? fit(*half) : fit(model);
    if (half) half->sync();  // the model's f32 tensors from the final 16-bit values

    if (sample > 0 && pg.rank() == 0 && !to.quiet) {
      // The prompt: the first ctx/2 characters of the validation text's first whole fortune
      // (after its first "%\n" line, when it has one).
      const std::string valid = text.vocab.decode(text.valid);
      const std::size_t sep = valid.find("\n%\n"), at = sep == std::string::npos ? 0 : sep + 3;
      const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(gc.ctx) / 2, valid.size() - at);
      const std::span<const std::uint8_t> prompt(text.valid.data() + at, n);
      const auto more = model.generate(prompt, static_cast<std::size_t>(sample), to.seed, temperature);
      std::printf("sample: %zu characters of a validation fortune, then the model's %d (after '|>', temperature %g):\n"
                  "%s|>%s\n",
                  n, sample, static_cast<double>(temperature), printable(valid.substr(at, n)).c_str(),
                  printable(text.vocab.decode(more)).c_str());
      std::fflush(stdout);
    }
    if (require_target && !s.seconds_to_target) {
      if (pg.rank() == 0)
        std::fprintf(stderr, "09-char-transformer: no validation loss reached the target %g (the last: %.4f)\n", target,
                     s.final_loss);
      return 3;
    }
    return 0;
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    return failed(e);
  }
}
