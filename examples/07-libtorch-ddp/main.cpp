// SPDX-License-Identifier: Apache-2.0
// Example 07: a libtorch (PyTorch C++) model trained data-parallel with kft's DDP.
//
//   kftrun --nproc-per-node 2 -- build/examples/07-libtorch-ddp                 (your own loop)
//   kftrun --nproc-per-node 2 -- build/examples/07-libtorch-ddp --loop trainer  (kft's trainer)
//
// The model is torch::nn::Sequential(Linear(784, 256), ReLU, Linear(256, 128), ReLU,
// Linear(128, 10)), the loss torch's cross_entropy, the data Debian's Fashion-MNIST. With
// `--loop own` (the default) it is the loop a libtorch user writes, plus one line: the module is
// wrapped in kft::libtorch::distributed_data_parallel, whose gradients are views into kft's
// buckets and are averaged while loss.backward() runs; the optimizer is torch::optim::SGD and
// each rank takes its share of every global batch from kft's distributed sampler (PyTorch's
// DistributedSampler semantics). With `--loop trainer` the same module goes through
// kft::libtorch::module_model into kft::ddp::trainer (kft's SGD, checkpoints, replica checks).
//
// --init-params / --save-params read and write the parameters as raw little-endian f32 in
// named_parameters() order: tests/integration/libtorch_equivalence.py starts Python PyTorch
// DDP and this program from the same weights and compares where they end.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <kft/core/atomic_file.hpp>
#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/sampler.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>
#include <kft/libtorch/ddp.hpp>
#include <kft/libtorch/model.hpp>

#include "../05-fashion-mnist/idx.hpp"

namespace {

using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 128),
                               torch::nn::ReLU(), torch::nn::Linear(128, 10));
}

// One split as tensors: images n x 784 (u8), labels n (i64).
struct split {
  torch::Tensor images, labels;
  std::int64_t n = 0;
};
split as_tensors(const fmnist::dataset& d) {
  split s;
  s.n = static_cast<std::int64_t>(d.n);
  s.images = torch::from_blob(const_cast<std::uint8_t*>(d.images.data()), {s.n, static_cast<std::int64_t>(d.dim)},
                              torch::kUInt8)
                 .clone();
  s.labels = torch::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {s.n}, torch::kUInt8).to(torch::kInt64);
  return s;
}

// The samples `idx` of a split, normalised with the data set's mean and deviation (as example 05
// and bench/workloads/fashion_mnist_torch.py do, in the same operations).
std::pair<torch::Tensor, torch::Tensor> batch_of(const split& s, std::span<const std::uint32_t> idx) {
  std::vector<std::int64_t> i(idx.begin(), idx.end());
  auto t = torch::tensor(i, torch::kInt64);
  auto x = (s.images.index_select(0, t).to(torch::kFloat32) * (1.0 / 255.0) - 0.2860) * (1.0 / 0.3530);
  return {x, s.labels.index_select(0, t)};
}

kft::libtorch::batch_result run_batch(torch::nn::Sequential& net, const split& s, std::span<const std::uint32_t> idx) {
  auto [x, y] = batch_of(s, idx);
  auto out = net->forward(x);
  auto loss = torch::nn::functional::cross_entropy(out, y);
  const auto correct = out.argmax(1).eq(y).sum().item<std::int64_t>();
  return {loss, static_cast<std::uint64_t>(correct), idx.size()};
}

std::size_t parameter_bytes(torch::nn::Module& m) {
  std::size_t b = 0;
  for (const auto& p : m.parameters()) b += static_cast<std::size_t>(p.numel()) * sizeof(float);
  return b;
}

void load_params(torch::nn::Module& m, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw kft::config_error("--init-params", path, "cannot be read", kft::error_site::of("07-libtorch-ddp"));
  const std::size_t want = parameter_bytes(m);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() != want)
    throw kft::config_error("--init-params", path,
                            "holds " + std::to_string(bytes.size()) + " bytes; the model's parameters are " +
                                std::to_string(want) + " bytes of f32",
                            kft::error_site::of("07-libtorch-ddp"));
  torch::NoGradGuard no_grad;
  std::size_t at = 0;
  for (auto& p : m.parameters()) {
    std::memcpy(p.data_ptr<float>(), bytes.data() + at, static_cast<std::size_t>(p.numel()) * sizeof(float));
    at += static_cast<std::size_t>(p.numel()) * sizeof(float);
  }
}

void save_params(torch::nn::Module& m, const std::string& path) {
  std::string bytes;
  for (const auto& p : m.parameters())
    bytes.append(static_cast<const char*>(p.data_ptr()), static_cast<std::size_t>(p.numel()) * sizeof(float));
  kft::write_file_atomically(path, bytes, "--save-params");
}

// Test loss and accuracy over every rank (rank r evaluates samples r, r + N, ...).
std::pair<double, double> evaluate(torch::nn::Sequential& net, const split& test, kft::group::process_group& pg) {
  torch::NoGradGuard no_grad;
  net->eval();
  double tot[3] = {0, 0, 0};
  std::vector<std::uint32_t> idx;
  for (std::int64_t p = pg.rank(); p < test.n;) {
    idx.clear();
    for (; p < test.n && idx.size() < 1000; p += pg.size()) idx.push_back(static_cast<std::uint32_t>(p));
    auto r = run_batch(net, test, idx);
    tot[0] += r.loss.item<double>() * static_cast<double>(r.count);
    tot[1] += static_cast<double>(r.correct);
    tot[2] += static_cast<double>(r.count);
  }
  net->train();
  pg.allreduce(tot, tot, 3, kft::dtype::f64, kft::op_kind::sum, kft::options{});
  return {tot[0] / tot[2], tot[1] / tot[2]};
}

struct settings {
  std::string data = "/usr/share/datasets/fashion-mnist", loop = "own", init, save, log_json;
  std::uint64_t epochs = 5, batch = 64, seed = 0, max_steps = 0;
  double lr = 0.05, momentum = 0.9, target = 0.87;
  int threads = 0, evals_per_epoch = 4;
  bool no_shuffle = false, require_target = false, quiet = false;
  std::uint64_t bucket_cap_mib = 25;
};

// The loop a libtorch user writes, with the module wrapped for DDP.
double own_loop(const settings& s, torch::nn::Sequential& net, kft::group::process_group& pg, const split& train,
                const split& test) {
  kft::libtorch::ddp_options o;
  o.reducer.limits.bucket_bytes_cap = s.bucket_cap_mib << 20;
  kft::libtorch::distributed_data_parallel ddp(pg, net, o);  // rank 0's weights on every rank
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(s.lr).momentum(s.momentum));

  const bool talk = pg.rank() == 0 && !s.quiet;
  const auto world = static_cast<std::uint64_t>(pg.size());
  const std::uint64_t global = s.batch * world;
  const std::uint64_t steps_per_epoch = (static_cast<std::uint64_t>(train.n) + global - 1) / global;
  const std::uint64_t eval_every = std::max<std::uint64_t>(1, steps_per_epoch / static_cast<std::uint64_t>(s.evals_per_epoch));
  if (talk) {
    std::printf("kft libtorch ddp: Fashion-MNIST MLP 784-256-128-10 (torch::nn::Sequential), %d rank(s) (%s), %d torch thread(s) per rank\n",
                pg.size(), pg.description().c_str(), torch::get_num_threads());
    std::printf("  %zu parameters in %zu tensors, %zu bucket(s); torch::optim::SGD(lr %g, momentum %g); batch %llu per rank, %llu global\n",
                parameter_bytes(*net) / 4, ddp.names().size(), ddp.reducer().buckets().size(), s.lr, s.momentum,
                static_cast<unsigned long long>(s.batch), static_cast<unsigned long long>(global));
    std::printf("| epoch | train loss | train acc | test loss | test acc | time (s) | samples/s |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::fflush(stdout);
  }
  kft::ddp::distributed_sampler sampler({.size = static_cast<std::uint64_t>(train.n), .seed = s.seed, .shuffle = !s.no_shuffle});
  std::vector<std::uint32_t> mine;
  std::uint64_t step = 0, samples = 0, epochs_run = 0;
  double train_s = 0.0, final_acc = 0.0;
  std::optional<double> to_target, epoch_to_target;  // the training time, and the fractional epoch, of the crossing
  bool stop = false;
  for (std::uint64_t e = 0; e < s.epochs && !stop; ++e) {
    sampler.set_epoch(e);
    double stats[3] = {0, 0, 0};
    double epoch_s = 0.0;
    std::uint64_t in_epoch = 0;
    while (auto b = sampler.next(global)) {
      ++in_epoch;
      sampler.rank_indices(*b, pg.rank(), pg.size(), mine);
      sampler.advance(*b);
      const auto t0 = clk::now();
      ddp.zero_grad();
      auto r = run_batch(net, train, mine);
      r.loss.backward();  // the buckets are averaged across the ranks during this call
      opt.step();
      epoch_s += since(t0);
      stats[0] += r.loss.item<double>() * static_cast<double>(r.count);
      stats[1] += static_cast<double>(r.correct);
      stats[2] += static_cast<double>(r.count);
      samples += b->size;
      ++step;
      if (step % eval_every == 0 && !to_target) {
        const auto [loss, acc] = evaluate(net, test, pg);
        if (acc >= s.target) {
          to_target = train_s + epoch_s;
          epoch_to_target = static_cast<double>(e) + static_cast<double>(in_epoch) / static_cast<double>(steps_per_epoch);
        }
      }
      if (s.max_steps && step >= s.max_steps) {
        stop = true;
        break;
      }
    }
    train_s += epoch_s;
    ++epochs_run;
    pg.allreduce(stats, stats, 3, kft::dtype::f64, kft::op_kind::sum, kft::options{});
    const auto [test_loss, test_acc] = evaluate(net, test, pg);
    final_acc = test_acc;
    if (!to_target && test_acc >= s.target) {
      to_target = train_s;
      epoch_to_target = static_cast<double>(e + 1);
    }
    if (talk) {
      std::printf("| %llu | %.4f | %.4f | %.4f | %.4f | %.2f | %.0f |\n", static_cast<unsigned long long>(e + 1),
                  stats[0] / stats[2], stats[1] / stats[2], test_loss, test_acc, epoch_s, stats[2] / epoch_s);
      std::fflush(stdout);
    }
  }
  // The replicas are identical, or DDP is broken: compare a hash of every parameter.
  std::vector<std::uint64_t> mine_h, all_h(static_cast<std::size_t>(pg.size()));
  std::uint64_t h = 0;
  for (const auto& p : net->parameters()) h = kft::ddp::hash64(p.data_ptr(), static_cast<std::size_t>(p.numel()) * 4, h);
  pg.allgather(&h, all_h.data(), 1, kft::dtype::i64, kft::options{});
  for (int r = 1; r < pg.size(); ++r)
    if (all_h[static_cast<std::size_t>(r)] != all_h[0])
      throw kft::mismatch_error("rank " + std::to_string(r) + "'s parameters differ from rank 0's after training",
                                kft::error_site::of("07-libtorch-ddp"));
  if (pg.rank() == 0) {
    char target[64] = "not reached";
    if (to_target) std::snprintf(target, sizeof target, "%.2f s", *to_target);
    std::printf("summary: %llu steps, %.2f s training, final test accuracy %.4f, %.0f samples/s, time to %.2f: %s, replicas identical (hash %016llx)\n",
                static_cast<unsigned long long>(step), train_s, final_acc, static_cast<double>(samples) / train_s, s.target,
                target, static_cast<unsigned long long>(all_h[0]));
    std::fflush(stdout);
    if (!s.log_json.empty()) {
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"event\":\"summary\",\"ranks\":%d,\"steps\":%llu,\"epochs\":%llu,\"seconds_per_epoch\":%.6f,"
                    "\"train_seconds\":%.6f,\"seconds_to_target\":%s,\"epoch_to_target\":%s,\"final_accuracy\":%.6f,"
                    "\"samples_per_s\":%.3f}\n",
                    pg.size(), static_cast<unsigned long long>(step), static_cast<unsigned long long>(epochs_run),
                    train_s / static_cast<double>(std::max<std::uint64_t>(1, epochs_run)), train_s,
                    to_target ? std::to_string(*to_target).c_str() : "null",
                    epoch_to_target ? std::to_string(*epoch_to_target).c_str() : "null", final_acc,
                    static_cast<double>(samples) / train_s);
      kft::write_file_atomically(s.log_json, line, "--log-json");
    }
  }
  return final_acc;
}

// The same module through kft's trainer.
double trainer_loop(const settings& s, torch::nn::Sequential& net, kft::group::process_group& pg, const split& train,
                    const split& test, int threads) {
  kft::libtorch::module_model model(net, [&](std::span<const std::uint32_t> idx) {
    return run_batch(net, net->is_training() ? train : test, idx);
  });
  kft::ddp::trainer_options to;
  to.epochs = s.epochs;
  to.batch = s.batch;
  to.seed = s.seed;
  to.shuffle = !s.no_shuffle;
  to.max_steps = s.max_steps;
  to.quiet = s.quiet;
  to.threads = threads;
  to.target_accuracy = s.target;
  to.reducer.limits.bucket_bytes_cap = s.bucket_cap_mib << 20;
  to.label = "Fashion-MNIST MLP 784-256-128-10 (libtorch)";
  const std::uint64_t global = s.batch * static_cast<std::uint64_t>(pg.size());
  const std::uint64_t steps_per_epoch = (static_cast<std::uint64_t>(train.n) + global - 1) / global;
  to.eval_every = std::max<std::uint64_t>(1, steps_per_epoch / static_cast<std::uint64_t>(s.evals_per_epoch));
  kft::ddp::sgd opt({.lr = static_cast<float>(s.lr), .momentum = static_cast<float>(s.momentum)});
  kft::ddp::trainer t(pg, model, opt, to);
  return t.fit(static_cast<std::uint64_t>(train.n), static_cast<std::uint64_t>(test.n)).final_accuracy;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST in libtorch, data-parallel with kft's DDP (run it under kftrun or torchrun)"};
  settings s;
  app.add_option("--data", s.data, "directory with the four *-ubyte.gz files")->capture_default_str();
  app.add_option("--loop", s.loop, "own: a libtorch loop with the module wrapped; trainer: kft's trainer")
      ->check(CLI::IsMember({"own", "trainer"}))
      ->capture_default_str();
  app.add_option("--epochs", s.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", s.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", s.momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--seed", s.seed, "seed of the initial weights (torch::manual_seed) and the sample order")->capture_default_str();
  app.add_flag("--no-shuffle", s.no_shuffle, "samples in file order (PyTorch's DistributedSampler(shuffle=False))");
  app.add_option("--max-steps", s.max_steps, "stop after this many steps (0: no limit)")->capture_default_str();
  app.add_option("--threads", s.threads, "torch threads per rank (default: cores / ranks on the node)")->check(CLI::Range(1, 1024));
  app.add_option("--bucket-cap-mib", s.bucket_cap_mib, "the reducer's bucket cap")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--init-params", s.init, "start from these parameters (raw f32, named_parameters() order)");
  app.add_option("--save-params", s.save, "rank 0 writes the final parameters here (raw f32)");
  app.add_option("--target", s.target, "test accuracy whose time is reported")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_flag("--require-target", s.require_target, "exit 3 when the final test accuracy is below --target");
  app.add_option("--evals-per-epoch", s.evals_per_epoch, "test evaluations per epoch")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_flag("--quiet", s.quiet, "print only the summary");
  app.add_option("--log-json", s.log_json, "own loop: rank 0 writes its summary as one JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    kft::init_options io;
    io.group.shm.pool_bytes = 64u << 20;  // bucket storage inside the shared segment
    auto job = kft::init(argc, argv, std::move(io));  // kftrun, torchrun, mpirun, srun or alone
    const kft::world_info& me = job.world();
    auto& pg = job.group();
    const int threads = s.threads ? s.threads : kft::ddp::compute_threads(me.local_size.value_or(1));
    torch::set_num_threads(threads);

    const fmnist::dataset train_raw = fmnist::load_split(s.data, "train"), test_raw = fmnist::load_split(s.data, "t10k");
    const split train = as_tensors(train_raw), test = as_tensors(test_raw);

    torch::manual_seed(s.seed);
    auto net = make_mlp();
    if (!s.init.empty()) load_params(*net, s.init);
    const double acc = s.loop == "own" ? own_loop(s, net, pg, train, test) : trainer_loop(s, net, pg, train, test, threads);
    if (!s.save.empty() && pg.rank() == 0) save_params(*net, s.save);
    if (s.require_target && acc < s.target) {
      if (pg.rank() == 0)
        std::fprintf(stderr, "07-libtorch-ddp: final test accuracy %.4f is below the target %.2f\n", acc, s.target);
      return 3;
    }
    return 0;
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const kft::usage_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "07-libtorch-ddp: %s\n", e.what());
    return 1;
  }
}
