// SPDX-License-Identifier: Apache-2.0
// EXPECT: m.evaluate\(idx\)
// A model without evaluate(): the trainer's concept names the missing member.
#include <cstdint>
#include <span>
#include <vector>

#include <kft/ddp/trainer.hpp>

struct half_model {
  std::vector<float> w = std::vector<float>(4);
  std::vector<kft::ddp::tensor_ref> parameters() { return {{"w", w}}; }
  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t>, kft::ddp::gradients&) { return {}; }
};

void use(kft::group::process_group& g) {
  half_model m;
  kft::ddp::sgd opt;
  kft::ddp::trainer t(g, m, opt);
}
