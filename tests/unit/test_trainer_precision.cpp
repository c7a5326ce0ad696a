// SPDX-License-Identifier: Apache-2.0
// Mixed precision in the trainer: bf16 and f16 parameters with f32 master weights, gradients in
// the parameter's type or in f32, loss scaling for f16 (an overflow on one rank skips the step on
// every rank and backs the scale off), deterministic mode over 16-bit parameters, checkpoints
// that keep the master weights and refuse another precision's state, and the bad inputs. Ranks
// are threads over the shared-memory transport.
#define BOOST_TEST_MODULE kft_trainer_precision
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/mixed.hpp>
#include <kft/ddp/optim.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/group/process_group.hpp>

#include "../common/rank_errors.hpp"
#include "../common/shm_ranks.hpp"

using namespace std::chrono_literals;
namespace ddp = kft::ddp;
namespace fs = std::filesystem;
using kft::dtype;

namespace {

std::vector<std::string> with_ranks(int p, const std::function<void(kft::group::process_group&)>& body) {
  return kft_test::with_shm_ranks(p, body, {.pool = 8u << 20, .timeout = 30s});
}

using kft_test::none;

fs::path temp_dir(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("kft-precision-" + std::to_string(::getpid()) + "-" + tag);
  fs::remove_all(d);
  return d;
}

// A weight vector stored as T (float, kft::bfloat16 or kft::half), and its tensor_ref.
template <class T>
struct weights {
  std::vector<T> v;
  explicit weights(std::size_t n, float init = 0.0f) : v(n, T(init)) {}
  ddp::tensor_ref ref(const std::string& name) {
    if constexpr (std::is_same_v<T, float>) return {name, v};
    else if constexpr (std::is_same_v<T, kft::bfloat16>) return ddp::tensor_ref::bf16(name, v);
    else return ddp::tensor_ref::f16(name, v);
  }
  float operator[](std::size_t k) const { return static_cast<float>(v[k]); }
};

// Linear regression y = a . x + 0.5 over D features of sample i; w stored as T, the bias f32
// (so a model mixes both kinds of buckets). The gradient is computed in f32 and handed over with
// gradients::write (which applies the loss scale and rounds to the bucket's type). `poison` makes
// rank `poison_rank`'s gradient infinite in step `poison_step` (an overflow on one rank).
constexpr std::size_t D = 16;
float feature(std::uint32_t i, std::size_t k) { return std::sin(0.37f * static_cast<float>(i) * static_cast<float>(k + 1) + static_cast<float>(k)); }
float target(std::uint32_t i) {
  float y = 0.5f;
  for (std::size_t k = 0; k < D; ++k) y += std::cos(static_cast<float>(k)) * feature(i, k);
  return y;
}
template <class T>
struct linear {
  weights<T> w{D};
  std::vector<float> b = std::vector<float>(1, 0.0f);
  int rank = 0, poison_rank = -1;
  std::uint64_t calls = 0, poison_call = 0;  // poison the gradient of the poison_call-th forward_backward
  std::vector<float> gw = std::vector<float>(D), gb = std::vector<float>(1);
  std::vector<dtype> seen_types;             // the gradient types the model was given
  float seen_scale = 0.0f;
  std::vector<ddp::tensor_ref> parameters() { return {w.ref("w"), {"b", b}}; }
  ddp::stats run(std::span<const std::uint32_t> idx, ddp::gradients* g) {
    ddp::stats s;
    std::fill(gw.begin(), gw.end(), 0.0f);
    gb[0] = 0.0f;
    for (auto i : idx) {
      float pred = b[0];
      for (std::size_t k = 0; k < D; ++k) pred += w[k] * feature(i, k);
      const float err = pred - target(i);
      s.loss_sum += static_cast<double>(err) * err;
      s.count += 1;
      for (std::size_t k = 0; k < D; ++k) gw[k] += 2.0f * err * feature(i, k);
      gb[0] += 2.0f * err;
    }
    if (g) {
      const float n = static_cast<float>(idx.size());
      for (auto& v : gw) v /= n;
      gb[0] /= n;
      if (rank == poison_rank && ++calls == poison_call) gw[3] = std::numeric_limits<float>::infinity();
      seen_types = {g->type(0), g->type(1)};
      seen_scale = g->loss_scale();
      g->write(1, gb);
      g->ready(1);
      g->write(0, gw);
      g->ready(0);
    }
    return s;
  }
  ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) { return run(idx, &g); }
  ddp::stats evaluate(std::span<const std::uint32_t> idx) { return run(idx, nullptr); }
};

struct run_result {
  ddp::fit_summary sum;
  std::vector<std::uint64_t> hashes;  // per rank
  std::vector<dtype> bucket_types, seen_types;
  float seen_scale = 0.0f;
  std::vector<float> w;  // rank 0's weights, widened
};

template <class T>
run_result train(int world, ddp::trainer_options o, std::uint64_t train_n = 256, std::uint64_t test_n = 64,
                 int poison_rank = -1, std::uint64_t poison_call = 0, std::vector<std::string>* errors_out = nullptr) {
  run_result res;
  res.hashes.assign(static_cast<std::size_t>(world), 0);
  o.quiet = true;
  auto errors = with_ranks(world, [&](kft::group::process_group& g) {
    linear<T> m;
    m.rank = g.rank();
    m.poison_rank = poison_rank;
    m.poison_call = poison_call;
    ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
    ddp::trainer t(g, m, opt, o);
    auto s = t.fit(train_n, test_n);
    res.hashes[static_cast<std::size_t>(g.rank())] = t.parameters_hash();
    if (g.rank() == 0) {
      res.sum = s;
      for (std::size_t i = 0; i < 2; ++i) res.bucket_types.push_back(t.reduction().param(i).type);
      res.seen_types = m.seen_types;
      res.seen_scale = m.seen_scale;
      for (std::size_t k = 0; k < D; ++k) res.w.push_back(m.w[k]);
    }
  });
  if (errors_out) *errors_out = errors;
  else BOOST_TEST_REQUIRE(none(errors));
  return res;
}

bool same(const std::vector<std::uint64_t>& h) {
  for (auto x : h)
    if (x != h[0]) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(master_weights_keep_updates_smaller_than_a_bf16_step) {
  // loss = sum(w): every gradient is 1. With lr 1e-4 each step moves a weight by 1e-4, far below
  // half a bf16 step at 1.0 (2^-9): bf16 weights updated in place would never move. The f32
  // master weights accumulate the steps; after 200 the bf16 values are their rounding.
  struct constant_gradient {
    weights<kft::bfloat16> w{8, 1.0f};
    std::vector<float> ones = std::vector<float>(8, 1.0f);
    std::vector<ddp::tensor_ref> parameters() { return {w.ref("w")}; }
    ddp::stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
      ddp::stats s;
      for (std::size_t k = 0; k < 8; ++k) s.loss_sum += w[k];
      s.count = static_cast<double>(idx.size());
      g.write(0, ones);
      g.ready(0);
      return s;
    }
  };
  std::vector<std::vector<std::uint16_t>> bits(2);
  auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    constant_gradient m;
    ddp::sgd opt({.lr = 1e-4f});
    ddp::trainer_options o;
    o.quiet = true;
    o.batch = 1;
    o.epochs = 1;
    ddp::trainer t(g, m, opt, o);
    t.fit(400);  // 200 steps of 2 samples
    for (auto v : m.w.v) bits[static_cast<std::size_t>(g.rank())].push_back(v.bits);
  });
  BOOST_TEST_REQUIRE(none(errors));
  float master = 1.0f;
  for (int s = 0; s < 200; ++s) master -= 1e-4f * (1.0f * 1.0f);  // sgd: w -= lr (g x scale)
  const std::uint16_t want = kft::bfloat16::from_float(master);
  BOOST_TEST(want != kft::bfloat16::from_float(1.0f));  // the test can fail: the bits must move
  for (const auto& r : bits)
    for (auto b : r) BOOST_TEST(b == want);
}

BOOST_AUTO_TEST_CASE(bf16_and_f16_parameters_train_like_f32) {
  ddp::trainer_options o;
  o.batch = 16;
  o.epochs = 20;
  const auto f32 = train<float>(3, o);
  const auto bf16 = train<kft::bfloat16>(3, o);
  const auto f16 = train<kft::half>(3, o);
  ddp::trainer_options of = o;
  of.f32_gradients = true;
  const auto bf16_f32 = train<kft::bfloat16>(3, of);
  // Gradient buckets in the parameter's type, or f32 when asked; the bias stays f32.
  BOOST_TEST((f32.bucket_types == std::vector<dtype>{dtype::f32, dtype::f32}));
  BOOST_TEST((bf16.bucket_types == std::vector<dtype>{dtype::bf16, dtype::f32}));
  BOOST_TEST((f16.bucket_types == std::vector<dtype>{dtype::f16, dtype::f32}));
  BOOST_TEST((bf16_f32.bucket_types == std::vector<dtype>{dtype::f32, dtype::f32}));
  BOOST_TEST((bf16.seen_types == bf16.bucket_types));
  // Loss scaling is on for f16 gradients only (automatic), and f16 runs report it.
  BOOST_TEST(bf16.sum.loss_scale == 0.0);
  BOOST_TEST(f16.sum.loss_scale > 0.0);
  BOOST_TEST(f16.seen_scale == static_cast<float>(f16.sum.loss_scale));
  // Replicas identical; every precision learns to about the f32 loss (the bf16 rounding of the
  // weights limits how far: a relative 2^-9 of each weight).
  for (const auto* r : {&f32, &bf16, &f16, &bf16_f32}) {
    BOOST_TEST(same(r->hashes));
    BOOST_TEST(r->sum.final_loss < 0.02 * r->sum.evals.front().loss);
  }
  // Loss scaling asked for with f32 parameters: f32 gradients x the scale, the same learning.
  ddp::trainer_options os = o;
  os.loss_scale.use = ddp::loss_scaling::mode::on;
  os.loss_scale.initial = 1024;
  const auto f32_scaled = train<float>(3, os);
  BOOST_TEST((f32_scaled.bucket_types == std::vector<dtype>{dtype::f32, dtype::f32}));
  BOOST_TEST(f32_scaled.seen_scale == 1024.0f);
  BOOST_TEST(f32_scaled.sum.skipped_steps == 0u);
  BOOST_TEST(std::fabs(f32_scaled.sum.final_loss - f32.sum.final_loss) < 1e-4 + 0.1 * f32.sum.final_loss);
  BOOST_TEST(bf16.sum.final_loss < 4 * f32.sum.final_loss + 1e-3);
  BOOST_TEST(f16.sum.final_loss < 4 * f32.sum.final_loss + 1e-4);
  for (std::size_t k = 0; k < D; ++k) {
    BOOST_TEST(std::fabs(bf16.w[k] - f32.w[k]) < 0.02f);
    BOOST_TEST(std::fabs(f16.w[k] - f32.w[k]) < 0.005f);
  }
}

BOOST_AUTO_TEST_CASE(half_params_gives_an_f32_model_bf16_parameters) {
  // linear<float> behind the adapter (its bias kept f32) computes exactly what linear<bf16>
  // computes: the same parameters, bit for bit, on 2 ranks, with bf16 gradient buckets.
  ddp::trainer_options o;
  o.batch = 16;
  o.epochs = 3;
  o.quiet = true;
  const auto direct = train<kft::bfloat16>(2, o);
  std::vector<std::uint64_t> hashes(2);
  std::vector<dtype> types;
  auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    linear<float> m;
    ddp::half_params<linear<float>> h(m, dtype::bf16, [](const ddp::tensor_ref& t) { return t.name == "b"; });
    ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
    ddp::trainer t(g, h, opt, o);
    t.fit(256, 64);
    hashes[static_cast<std::size_t>(g.rank())] = t.parameters_hash();
    if (g.rank() == 0) types = {t.reduction().param(0).type, t.reduction().param(1).type};
  });
  BOOST_TEST_REQUIRE(none(errors));
  BOOST_TEST((types == std::vector<dtype>{dtype::bf16, dtype::f32}));
  BOOST_TEST(hashes[0] == direct.hashes[0]);
  BOOST_TEST(hashes[1] == direct.hashes[0]);
}

BOOST_AUTO_TEST_CASE(an_f16_overflow_on_one_rank_skips_the_step_on_every_rank) {
  ddp::trainer_options o;
  o.batch = 16;
  o.epochs = 2;
  o.loss_scale.initial = 1024;
  o.loss_scale.interval = 1000;
  // Rank 1's 5th gradient overflows: every rank skips that step, the scale halves, and the
  // replicas stay identical. The same run without the overflow takes one more optimizer step.
  const auto poisoned = train<kft::half>(3, o, 256, 64, /*rank*/ 1, /*call*/ 5);
  const auto clean = train<kft::half>(3, o);
  BOOST_TEST(same(poisoned.hashes));
  BOOST_TEST(poisoned.sum.skipped_steps == 1u);
  BOOST_TEST(poisoned.sum.loss_scale == 512.0);
  BOOST_TEST(clean.sum.skipped_steps == 0u);
  BOOST_TEST(clean.sum.loss_scale == 1024.0);
  BOOST_TEST(poisoned.sum.steps == clean.sum.steps);  // a skipped step is still a step of the loop
  BOOST_TEST(poisoned.hashes[0] != clean.hashes[0]);
  // Growth: after `interval` good steps the scale doubles (12 steps: 64 -> x2 at 4, 8, 12).
  o.loss_scale.initial = 64;
  o.loss_scale.interval = 4;
  const auto grown = train<kft::half>(2, o, 192);
  BOOST_TEST(grown.sum.steps == 12u);
  BOOST_TEST(grown.sum.loss_scale == 512.0);
  // A scale too large for f16 at the start: the first steps overflow (x backoff each) until the
  // gradients fit, then training goes on.
  o.loss_scale.initial = 1e9;
  o.loss_scale.interval = 1000;
  o.epochs = 6;
  const auto big = train<kft::half>(2, o);
  BOOST_TEST(big.sum.skipped_steps >= 5u);
  BOOST_TEST(big.sum.loss_scale == 1e9 * std::pow(0.5, static_cast<double>(big.sum.skipped_steps)));
  BOOST_TEST(big.sum.final_loss < 0.1 * big.sum.evals.front().loss);
}

BOOST_AUTO_TEST_CASE(gradients_that_overflow_at_every_scale_stop_training) {
  // Rank 0's gradient is infinite in every step, at any scale: after 64 skipped steps in a row
  // every rank stops, naming it, instead of skipping forever.
  std::vector<std::string> errors;
  errors = with_ranks(2, [&](kft::group::process_group& g) {
    linear<kft::half> m;
    m.rank = g.rank();
    m.poison_rank = 0;
    ddp::sgd opt;
    ddp::trainer_options oo;
    oo.quiet = true;
    oo.batch = 1;
    ddp::trainer t(g, m, opt, oo);
    std::vector<std::uint32_t> idx{static_cast<std::uint32_t>(g.rank())};
    for (int s = 0; s < 100; ++s) {
      m.calls = 0;
      m.poison_call = 1;  // poison every step
      t.step(idx);
    }
  });
  for (const auto& e : errors)
    BOOST_TEST(e.find("64 steps in a row skipped for non-finite gradients on 1 rank(s)") != std::string::npos, e);
  BOOST_TEST(errors[0].find("here the first is 'w'") != std::string::npos, errors[0]);
}

BOOST_AUTO_TEST_CASE(deterministic_mode_over_bf16_parameters_is_bit_identical_on_any_number_of_ranks) {
  ddp::trainer_options o;
  o.epochs = 2;
  o.deterministic = true;
  o.global_batch = 16;
  o.micro_shards = 4;
  std::vector<std::uint64_t> h;
  for (int world : {1, 2, 4}) {
    const auto r = train<kft::bfloat16>(world, o);
    BOOST_TEST(same(r.hashes));
    BOOST_TEST((r.bucket_types == std::vector<dtype>{dtype::i64, dtype::i64}));
    BOOST_TEST((r.seen_types == std::vector<dtype>{dtype::f32, dtype::f32}));  // f32, then fixed point
    h.push_back(r.hashes[0]);
  }
  BOOST_TEST(h[0] == h[1]);
  BOOST_TEST(h[0] == h[2]);
}

BOOST_AUTO_TEST_CASE(zero1_over_bf16_parameters_matches_the_replicated_optimizer) {
  ddp::trainer_options o;
  o.batch = 16;
  o.epochs = 12;
  const auto plain = train<kft::bfloat16>(2, o);
  o.zero_stage = 1;
  const auto zero = train<kft::bfloat16>(2, o);
  BOOST_TEST(same(zero.hashes));
  BOOST_TEST(zero.sum.final_loss < 0.05 * zero.sum.evals.front().loss);
  for (std::size_t k = 0; k < D; ++k) BOOST_TEST(std::fabs(zero.w[k] - plain.w[k]) < 0.02f);
}

BOOST_AUTO_TEST_CASE(checkpoints_keep_master_weights_and_refuse_another_precision) {
  const fs::path dir = temp_dir("ckpt");
  ddp::trainer_options o;
  o.batch = 16;
  o.epochs = 2;
  o.checkpoint_dir = dir;
  const auto first = train<kft::bfloat16>(2, o);
  // The file holds f32 master weights whose bf16 rounding is the model's weights, and the types.
  const auto latest = ddp::latest_checkpoint(dir);
  BOOST_TEST_REQUIRE(latest.has_value());
  ddp::checkpoint_reader c(std::vector<unsigned char>(latest->bytes), "latest");
  BOOST_TEST(c.get_string("trainer.types") == "bf16,f32");
  std::vector<float> master(D);
  c.get_floats(ddp::trainer_state::parameter_key("w"), master);
  bool rounded = true, finer = false;
  for (std::size_t k = 0; k < D; ++k) {
    rounded &= kft::bfloat16::from_float(master[k]) == kft::bfloat16(first.w[k]).bits;
    finer |= master[k] != first.w[k];  // the master holds bits the bf16 weights do not
  }
  BOOST_TEST(rounded);
  BOOST_TEST(finer);
  // Resuming it: as bf16, on another number of ranks, fine; as f32 or f16, refused by name.
  o.resume = true;
  o.epochs = 3;
  const auto more = train<kft::bfloat16>(3, o);
  BOOST_TEST(more.sum.resumed_from == first.sum.steps);
  std::vector<std::string> errors;
  train<float>(1, o, 256, 64, -1, 0, &errors);
  BOOST_TEST(errors[0].find("holds parameter 'w' as bf16, with its optimizer state; this model's 'w' is f32") !=
                 std::string::npos,
             errors[0]);
  train<kft::half>(1, o, 256, 64, -1, 0, &errors);
  BOOST_TEST(errors[0].find("holds parameter 'w' as bf16, with its optimizer state; this model's 'w' is f16 (f32 "
                            "master weights)") != std::string::npos,
             errors[0]);
  // An f32 run's checkpoint resumed by a bf16 model.
  const fs::path dir32 = temp_dir("ckpt32");
  o.resume = false;
  o.epochs = 1;
  o.checkpoint_dir = dir32;
  train<float>(1, o);
  o.resume = true;
  train<kft::bfloat16>(1, o, 256, 64, -1, 0, &errors);
  BOOST_TEST(errors[0].find("holds parameter 'w' as f32, with its optimizer state; this model's 'w' is bf16") !=
                 std::string::npos,
             errors[0]);
  fs::remove_all(dir);
  fs::remove_all(dir32);
}

BOOST_AUTO_TEST_CASE(bad_precision_settings_are_named) {
  auto error_of = [](auto model, ddp::trainer_options o) {
    return with_ranks(1, [&](kft::group::process_group& g) {
      ddp::sgd opt;
      o.quiet = true;
      ddp::trainer t(g, model, opt, o);
    })[0];
  };
  ddp::trainer_options o;
  o.deterministic = true;
  o.loss_scale.use = ddp::trainer_options::loss_scaling::mode::on;
  std::string e = error_of(linear<kft::bfloat16>{}, o);
  BOOST_TEST(e.find("loss scaling (loss_scale.use = on) in deterministic mode") != std::string::npos, e);
  o = {};
  o.loss_scale.backoff = 1.5;
  e = error_of(linear<kft::half>{}, o);
  BOOST_TEST(e.find("backoff 1.5,") != std::string::npos, e);
  BOOST_TEST(e.find("0 < backoff < 1") != std::string::npos, e);
  // A tensor_ref that says bf16 but carries f32 values.
  struct confused {
    std::vector<float> w = std::vector<float>(4);
    std::vector<ddp::tensor_ref> parameters() { return {{"w", w, {}, dtype::bf16}}; }
    ddp::stats forward_backward(std::span<const std::uint32_t>, ddp::gradients&) { return {}; }
  };
  e = error_of(confused{}, {});
  BOOST_TEST(e.find("parameter 'w' is bf16 but has f32 values (tensor_ref::value)") != std::string::npos, e);
  // A model reading a bf16 gradient as f32.
  struct reads_f32 {
    weights<kft::bfloat16> w{4};
    std::vector<ddp::tensor_ref> parameters() { return {w.ref("w")}; }
    ddp::stats forward_backward(std::span<const std::uint32_t>, ddp::gradients& g) {
      g[0][0] = 1.0f;
      return {};
    }
  };
  e = with_ranks(1, [&](kft::group::process_group& g) {
    reads_f32 m;
    ddp::sgd opt;
    ddp::trainer_options q;
    q.quiet = true;
    ddp::trainer t(g, m, opt, q);
    t.fit(8);
  })[0];
  BOOST_TEST(e.find("gradient buffer is bf16, asked for as f32") != std::string::npos, e);
}
