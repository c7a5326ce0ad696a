// SPDX-License-Identifier: Apache-2.0
// examples/10-single-to-ddp: a training loop in one process (single.cpp) and the same loop on
// every rank of a job (ddp.cpp): example 05's MLP on Fashion-MNIST, SGD with momentum, batches of
// 64 per rank, 2 epochs. They differ in three places, where PyTorch's do: join the job, wrap the
// model, shard the data (docs/ddp.md shows the diff; the suite checks the page against the files).
//
//   single [DATA_DIR]        kftrun --nproc-per-node 2 -- ddp [DATA_DIR]
#include <cblas.h>

#include <cstdio>
#include <string>
#include <vector>

#include <kft/ddp/data_parallel.hpp>
#include <kft/ddp/optim.hpp>
#include <kft/ddp/sampler.hpp>

#include "../05-fashion-mnist/idx.hpp"
#include "../05-fashion-mnist/mlp.hpp"

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  openblas_set_num_threads(1);
  const auto train = fmnist::load_split(data, "train"), test = fmnist::load_split(data, "t10k");
  fmnist::mlp model({784, 256, 128, 10}, &train, &test, 1);
  auto params = model.parameters();
  kft::ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
  opt.bind([&] {
    std::vector<std::size_t> sizes;
    for (const auto& p : params) sizes.push_back(p.value.size());
    return sizes;
  }());

  kft::ddp::local_gradients grads(params);
  kft::ddp::distributed_sampler sampler({.size = train.n, .seed = 1});
  std::vector<std::uint32_t> batch;
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.set_epoch(epoch);
    kft::ddp::batch_stats seen;
    while (auto b = sampler.next(64)) {
      sampler.rank_indices(*b, 0, 1, batch);
      seen += model.forward_backward(batch, grads.step());
      grads.finish();
      opt.begin_step();
      for (std::size_t i = 0; i < params.size(); ++i) opt.step(i, params[i].value, grads[i], 1.0f);
      sampler.advance(*b);
    }
    std::printf("epoch %llu: train loss %.4f, accuracy %.4f\n", static_cast<unsigned long long>(epoch + 1),
                seen.loss_sum / static_cast<double>(seen.count),
                static_cast<double>(seen.correct) / static_cast<double>(seen.count));
  }
  std::vector<std::uint32_t> all(test.n);
  for (std::uint32_t i = 0; i < test.n; ++i) all[i] = i;
  const auto t = model.evaluate(all);
  std::printf("test accuracy %.4f\n", static_cast<double>(t.correct) / static_cast<double>(t.count));
}
