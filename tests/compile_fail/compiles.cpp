// SPDX-License-Identifier: Apache-2.0
// The control: the valid form of the calls the other files get wrong compiles (so a failure
// there is the misuse, not a broken include path).
#include <span>
#include <vector>

#include <kft/ddp/trainer.hpp>
#include <kft/transport/shm/communicator.hpp>

void use(kft::shm::communicator& comm) {
  std::vector<float> a(4), b(4);
  comm.allreduce(std::span<const float>(a), std::span<float>(b), kft::ops::sum);
  auto w = comm.allreduce_async(std::span<float>(b), kft::ops::avg);
  w.wait();
}

// The model not_a_model.cpp gets wrong, whole: a loss in stats (a regression: no metrics, no
// evaluate()), and a classifier's batch_stats with evaluate().
struct regression_model {
  std::vector<float> w = std::vector<float>(4);
  std::vector<kft::ddp::tensor_ref> parameters() { return {{"w", w}}; }
  kft::ddp::stats forward_backward(std::span<const std::uint32_t>, kft::ddp::gradients&) { return {}; }
};
struct classifier_model {
  std::vector<float> w = std::vector<float>(4);
  std::vector<kft::ddp::tensor_ref> parameters() { return {{"w", w}}; }
  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t>, kft::ddp::gradients&) { return {}; }
  kft::ddp::batch_stats evaluate(std::span<const std::uint32_t>) { return {}; }
};

void train(kft::group::process_group& g) {
  regression_model r;
  classifier_model c;
  kft::ddp::sgd opt;
  kft::ddp::trainer a(g, r, opt);
  a.fit(10);
  kft::ddp::trainer b(g, c, opt);
  b.fit(10, 10);
}
