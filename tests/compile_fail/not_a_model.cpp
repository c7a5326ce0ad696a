// SPDX-License-Identifier: Apache-2.0
// EXPECT: batch_result
// A model whose forward_backward returns a bare loss: the trainer's concept names what it must
// return (stats, or a classifier's batch_stats).
#include <cstdint>
#include <span>
#include <vector>

#include <kft/ddp/trainer.hpp>

struct loss_only_model {
  std::vector<float> w = std::vector<float>(4);
  std::vector<kft::ddp::tensor_ref> parameters() { return {{"w", w}}; }
  double forward_backward(std::span<const std::uint32_t>, kft::ddp::gradients&) { return 0.0; }
};

void use(kft::group::process_group& g) {
  loss_only_model m;
  kft::ddp::sgd opt;
  kft::ddp::trainer t(g, m, opt);
}
