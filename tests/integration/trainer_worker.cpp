// SPDX-License-Identifier: Apache-2.0
// trainer_worker: kft::ddp::trainer in real processes, for trainer_process_test.py.
//
//   trainer_worker --ckpt DIR --steps N --every K [--kill-rank R --kill-step S] [--kill-in-checkpoint S]
//                  [--uneven FRACTION] [--fault PHASE:RANK:ACTION] [--global-batch B --shards S]
//
// Trains example 05's MLP (32-512-512-10, a ~2 MB checkpoint) on synthetic data in
// deterministic mode (global batch 64 in 4 shards by default), checkpointing every K steps into DIR and
// resuming from it. Fault injection, on the job's first attempt only (TORCHELASTIC_RESTART_COUNT
// = 0): rank R sends itself SIGKILL after step S; or rank 0 sends itself SIGKILL half-way
// through writing step S's checkpoint. --uneven: rank 1 trains FRACTION fewer batches in its
// own loop (step + join). Prints "rank r: steps N resumed_from X hash H".
//
// --fault (the fault matrix, tests/integration/fault_matrix.py): ACTION = kill (SIGKILL) or
// stop (SIGSTOP of the whole process), by rank RANK, at PHASE = backward (the 10th backward
// pass, after half its gradients were handed to the reducer: some buckets are in flight, the
// rest not yet ready) or checkpoint (half-way through writing the first checkpoint; only rank
// 0 writes). Arguments it does not know are ignored (the tests add a marker).
#include <cblas.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/ddp/trainer.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>

#include "../../examples/05-fashion-mnist/mlp.hpp"

namespace {

struct fault_spec {
  std::string phase, action;
  int rank = -1;
};

void act(const std::string& action) {
  if (action == "kill") ::raise(SIGKILL);
  if (action == "stop") ::kill(::getpid(), SIGSTOP);  // the whole process, every thread
}

// The example's model, acting out `fault` half-way through one backward pass.
struct faulty_model {
  fmnist::mlp& m;
  const fault_spec& fault;
  int rank;
  int calls = 0;

  std::vector<kft::ddp::tensor_ref> parameters() { return m.parameters(); }
  kft::ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) { return m.evaluate(idx); }
  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, kft::ddp::gradients& g) {
    if (fault.phase != "backward" || rank != fault.rank || ++calls != 10) return m.forward_backward(idx, g);
    struct relay {
      const kft::ddp::gradients* outer;
      const std::string* action;
      std::size_t seen = 0;
    } r{&g, &fault.action};
    std::vector<std::span<float>> views;
    for (std::size_t i = 0; i < g.size(); ++i) views.push_back(g[i]);
    kft::ddp::gradients inner(views, g.accumulate(), [](void* ctx, std::size_t i) {
      auto* x = static_cast<relay*>(ctx);
      x->outer->ready(i);
      if (++x->seen == x->outer->size() / 2) {
        std::printf("fault: %s in the middle of backward (%zu of %zu gradients ready)\n", x->action->c_str(), x->seen,
                    x->outer->size());
        std::fflush(stdout);
        act(*x->action);
      }
    }, &r);
    return m.forward_backward(idx, inner);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft trainer test worker"};
  std::string ckpt;
  std::uint64_t steps = 40, every = 10, kill_step = 0, kill_in_ckpt = 0, global_batch = 64, shards = 4;
  int kill_rank = -1;
  double uneven = -1;
  app.add_option("--ckpt", ckpt);
  app.add_option("--steps", steps);
  app.add_option("--every", every);
  app.add_option("--kill-rank", kill_rank);
  app.add_option("--kill-step", kill_step);
  app.add_option("--kill-in-checkpoint", kill_in_ckpt);
  app.add_option("--uneven", uneven);
  app.add_option("--global-batch", global_batch, "deterministic mode's global batch");
  app.add_option("--shards", shards, "deterministic mode's micro-shards (a multiple of the ranks)");
  std::string fault_text;
  app.add_option("--fault", fault_text, "PHASE:RANK:ACTION, e.g. backward:1:stop");
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);
  fault_spec fault;
  if (!fault_text.empty()) {
    const auto a = fault_text.find(':'), b = fault_text.rfind(':');
    if (a == std::string::npos || a == b) {
      std::fprintf(stderr, "trainer_worker: --fault %s: expected PHASE:RANK:ACTION\n", fault_text.c_str());
      return 2;
    }
    fault = {fault_text.substr(0, a), fault_text.substr(b + 1), std::stoi(fault_text.substr(a + 1, b - a - 1))};
  }
  try {
    openblas_set_num_threads(1);
    kft::init_options io;
    io.group.shm.pool_bytes = 64u << 20;
    auto job = kft::init(argc, argv, std::move(io));
    auto& pg = job.group();
    const bool first_attempt = std::string(std::getenv("TORCHELASTIC_RESTART_COUNT") ? std::getenv("TORCHELASTIC_RESTART_COUNT") : "0") == "0";

    const auto train = fmnist::synthetic(2048, 32, 1), test = fmnist::synthetic(256, 32, 2);
    fmnist::mlp m({32, 512, 512, 10}, &train, &test, 3);
    kft::ddp::sgd opt({.lr = 0.02f, .momentum = 0.9f});
    kft::ddp::trainer_options o;
    o.quiet = true;
    o.epochs = 100;
    o.max_steps = steps;
    if (uneven < 0) {
      o.deterministic = true;
      o.global_batch = global_batch;
      o.micro_shards = shards;
      o.checkpoint_dir = ckpt;
      o.checkpoint_every = every;
      o.resume = true;
      std::uint64_t current = 0;
      o.on_step = [&](std::uint64_t s) {
        current = s;
        if (first_attempt && pg.rank() == kill_rank && s == kill_step) {
          std::printf("rank %d: SIGKILL after step %llu\n", pg.rank(), static_cast<unsigned long long>(s));
          std::fflush(stdout);
          ::raise(SIGKILL);
        }
      };
      o.checkpoint_progress = [&](std::size_t done, std::size_t total) {
        if (first_attempt && fault.phase == "checkpoint" && pg.rank() == fault.rank && done * 2 >= total && done < total) {
          std::printf("fault: %s while writing step %llu's checkpoint (%zu of %zu bytes)\n", fault.action.c_str(),
                      static_cast<unsigned long long>(current), done, total);
          std::fflush(stdout);
          act(fault.action);
        }
        if (first_attempt && kill_in_ckpt && current == kill_in_ckpt && done < total) {
          std::printf("rank %d: SIGKILL while writing step %llu's checkpoint (%zu of %zu bytes)\n", pg.rank(),
                      static_cast<unsigned long long>(current), done, total);
          std::fflush(stdout);
          ::raise(SIGKILL);
        }
      };
      faulty_model fm{m, fault, pg.rank()};
      kft::ddp::trainer t(pg, fm, opt, o);
      auto s = t.fit(train.n, test.n);
      std::printf("rank %d: steps %llu resumed_from %llu hash %llu\n", pg.rank(), static_cast<unsigned long long>(s.steps),
                  static_cast<unsigned long long>(s.resumed_from), static_cast<unsigned long long>(t.parameters_hash()));
    } else {
      o.batch = 32;
      kft::ddp::trainer t(pg, m, opt, o);
      const std::uint64_t mine = pg.rank() == 1 ? static_cast<std::uint64_t>(static_cast<double>(steps) * (1.0 - uneven)) : steps;
      std::vector<std::uint32_t> idx(32);
      for (std::uint64_t b = 0; b < mine; ++b) {
        for (std::size_t i = 0; i < idx.size(); ++i)
          idx[i] = static_cast<std::uint32_t>((b * 97 + static_cast<std::uint64_t>(pg.rank()) * 32 + i) % train.n);
        t.step(idx);
      }
      const auto shadowed = t.join();
      t.verify_replicas("the end");
      std::printf("rank %d: steps %llu shadowed %llu hash %llu\n", pg.rank(), static_cast<unsigned long long>(t.step_count()),
                  static_cast<unsigned long long>(shadowed), static_cast<unsigned long long>(t.parameters_hash()));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_worker: %s\n", e.what());
    return 1;
  }
}
