// SPDX-License-Identifier: Apache-2.0
// Example 08: data-parallel training of an MLP on Fashion-MNIST with kft's DDP trainer, on GPUs.
//
//   kftrun --nproc-per-node 2 -- build/examples/08-fashion-mnist-gpu
//   kftrun --nproc-per-node 2 -- build/examples/08-fashion-mnist-gpu --synthetic 20000 --epochs 3 --hidden 64
//
// Example 05's model and training, moved onto the device. The model (mlp_cuda.cuh,
// 784-256-128-10: matrix products through cuBLAS, the batch gathered and normalised, the bias,
// ReLU and softmax cross-entropy by small kernels, all on one stream) and the optimizer
// (kft::ddp::cuda_sgd, the update as kernels on the same stream) are layer 1; layer 2 is
// kft::ddp::trainer over two groups: a CUDA IPC communicator that averages the gradients in
// device buckets (each bucket's allreduce on the communicator's stream, after a CUDA event the
// backward pass records, no host wait per bucket), and the job's host process group for the
// trainer's own small collectives (statistics, replica hashes). Every rank trains on its share
// of each global batch, gradients travel while the backward pass runs, replicas are compared
// every 100 steps, and rank 0 prints a table per epoch and a summary.
//
// One node only (CUDA IPC), rank r on GPU r % GPUs. Ranks sharing one GPU time-slice it unless
// NVIDIA's MPS daemon runs (nvidia-cuda-mps-control -d): start it for more ranks than GPUs.
// Without a CUDA device the program says so and exits 77 (skipped).
// The data are Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), or with
// --synthetic N random images labelled by a fixed linear map (no files).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/ddp/cuda.hpp>
#include <kft/ddp/cuda_optim.cuh>
#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>
#include <kft/transport/cuda_ipc/communicator.cuh>

#include "idx.hpp"
#include "mlp.hpp"  // fmnist::synthetic
#include "mlp_cuda.cuh"
#include "widths.hpp"

namespace {

constexpr const char* program = "08-fashion-mnist-gpu";


// The compute stream (non-blocking: it does not wait for the legacy default stream).
class cuda_stream {
 public:
  cuda_stream() { fmnist::gpu::check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

int run(int argc, char** argv) {
  CLI::App app{"Data-parallel MLP training on Fashion-MNIST on the GPUs of one node (cuBLAS, CUDA IPC) with kft's "
               "DDP trainer (run it under kftrun)"};
  std::string data = "/usr/share/datasets/fashion-mnist", hidden = "256,128", log_json;
  std::uint64_t synthetic = 0;
  kft::ddp::trainer_options to;
  to.epochs = 5;
  float lr = 0.05f, momentum = 0.9f, weight_decay = 0.0f;
  int evals_per_epoch = 4;
  double target = 0.87;
  bool require_target = false;
  std::uint64_t bucket_cap_mib = 25;
  int gemm_reps = 200;
  app.add_option("--data", data, "directory with the four *-ubyte.gz files")->capture_default_str();
  app.add_option("--synthetic", synthetic,
                 "train on N synthetic images (and test on N/5) instead of the files: random pixels labelled by a "
                 "fixed linear map")
      ->check(CLI::Range(std::uint64_t{10}, std::uint64_t{10'000'000}));
  app.add_option("--hidden", hidden, "hidden layer widths, comma-separated")->capture_default_str();
  app.add_option("--epochs", to.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", to.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", momentum, "SGD momentum")->check(CLI::Range(0.0f, 0.999f))->capture_default_str();
  app.add_option("--weight-decay", weight_decay, "weight decay")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--seed", to.seed, "seed of the sample order and the initial weights")->capture_default_str();
  app.add_option("--target", target, "test accuracy whose time is reported")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_flag("--require-target", require_target, "exit 3 when the final test accuracy is below --target");
  app.add_option("--evals-per-epoch", evals_per_epoch, "test evaluations per epoch")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--bucket-cap-mib", bucket_cap_mib, "the reducer's bucket cap")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--verify-every", to.verify_every, "steps between replica comparisons")->capture_default_str();
  app.add_option("--gemm-reps", gemm_reps,
                 "after training, rank 0 times the cuBLAS products of one step's batch alone, over N steps, and "
                 "prints them beside the time per step (0: not)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_flag("--quiet", to.quiet, "print only the summary");
  app.add_option("--log-json", log_json, "append JSON lines (start, eval, epoch, summary) to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<int> widths{784};
    for (int w : fmnist::parse_widths(hidden)) widths.push_back(w);
    widths.push_back(10);

    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("%s: no CUDA device: skipped\n", program);
      return 77;
    }

    auto job = kft::init(argc, argv);  // kftrun, torchrun or alone (one node: CUDA IPC)
    const kft::world_info& me = job.world();
    auto& pg = job.group();  // the trainer's host control group
    const int local_rank = me.local_rank.value_or(0), local_size = me.local_size.value_or(1);
    if (pg.size() != local_size)
      throw kft::usage_error(std::string(program) + ": " + std::to_string(pg.size()) + " ranks, " +
                             std::to_string(local_size) + " of them on this node: the GPU example runs on one node "
                             "(its gradients travel over CUDA IPC); start it with kftrun --nproc-per-node N on one machine");
    const int device = local_rank % devices;
    fmnist::gpu::check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    fmnist::gpu::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    cuda_stream stream;
    kft::cuda_ipc::config cfg;
    cfg.name = "fmnist";
    cfg.timeout = job.timeout();  // the job's (kftrun --timeout, KFT_TIMEOUT), as the group has it
    // The communicator's ranks are the control group's (the trainer checks that both agree);
    // on one node they are the local ranks.
    kft::cuda_ipc::communicator dev(*job.store(), pg.rank(), pg.size(), device, cfg);

    const fmnist::dataset train = synthetic ? fmnist::synthetic(synthetic, 784, to.seed) : fmnist::load_split(data, "train");
    const fmnist::dataset test =
        synthetic ? fmnist::synthetic(synthetic / 5, 784, to.seed + 1) : fmnist::load_split(data, "t10k");
    fmnist::mlp_cuda model(widths, &train, &test, to.seed + 1, stream.get());
    kft::ddp::cuda_sgd opt({.lr = lr, .momentum = momentum, .weight_decay = weight_decay}, stream.get());

    to.target_accuracy = target;
    to.log_json = log_json;
    to.reducer.limits.bucket_bytes_cap = bucket_cap_mib << 20;
    to.reducer.stream = static_cast<void*>(stream.get());
    to.label = "Fashion-MNIST MLP " + [&] {
      std::string s;
      for (std::size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
      return s;
    }() + " on " + prop.name + (synthetic ? " (synthetic data)" : "");
    const std::uint64_t global = to.batch * static_cast<std::uint64_t>(pg.size());
    const std::uint64_t steps_per_epoch = (train.n + global - 1) / global;
    to.eval_every = std::max<std::uint64_t>(1, steps_per_epoch / static_cast<std::uint64_t>(evals_per_epoch));
    if (evals_per_epoch == 1) to.eval_every = 0;

    kft::ddp::trainer t(dev, pg, model, opt, to);
    const kft::ddp::fit_summary s = t.fit(train.n, test.n);
    if (gemm_reps > 0 && pg.rank() == 0 && s.steps > 0) {
      // What overlap could hide: the step's matrix products alone, on this rank's batch.
      const double gemm = model.gemm_seconds(static_cast<int>(to.batch), gemm_reps);
      const double step = s.train_seconds / static_cast<double>(s.steps);
      std::printf("%s: %.3f ms a step over %llu steps (%d rank(s), batch %llu a rank; exposed communication %.3f ms a "
                  "step); the step's cuBLAS products alone (%zu forward, %zu weight-gradient, %zu input-gradient) "
                  "%.3f ms, %.1f%% of the step\n",
                  program, step * 1e3, static_cast<unsigned long long>(s.steps), pg.size(),
                  static_cast<unsigned long long>(to.batch), s.exposed_comm_seconds / static_cast<double>(s.steps) * 1e3,
                  model.layers(), model.layers(), model.layers() - 1, gemm * 1e3, 100.0 * gemm / step);
    }
    if (require_target && s.final_accuracy < target) {
      if (pg.rank() == 0)
        std::fprintf(stderr, "%s: final test accuracy %.4f is below the target %.2f\n", program, s.final_accuracy, target);
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
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
