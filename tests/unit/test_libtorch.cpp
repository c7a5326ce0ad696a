// SPDX-License-Identifier: Apache-2.0
// kft's DDP for libtorch modules (kft/libtorch/), ranks as threads over the shared-memory
// group: gradients are views into the reducer's buckets and come out of backward() averaged,
// buckets are launched while backward still runs, no_sync accumulates, rank 0's weights reach
// every rank, the one bucket rebuild re-points the views, models that differ are named, bad
// tensors are refused, and kft's trainer trains a module through module_model (N ranks x b
// samples = 1 rank x N b).
#define BOOST_TEST_MODULE kft_libtorch
#include <boost/test/unit_test.hpp>

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/libtorch/ddp.hpp>
#include <kft/libtorch/model.hpp>

#include "../common/shm_ranks.hpp"

namespace ddp = kft::ddp;
namespace lt = kft::libtorch;
using kft_test::first_error;
using kft_test::with_shm_ranks;

namespace {

struct init_threads {
  init_threads() { torch::set_num_threads(1); }
} const once;

torch::nn::Sequential small_mlp(int hidden = 16) {
  return torch::nn::Sequential(torch::nn::Linear(8, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, 4));
}

// Rank r's inputs and targets in step s (fixed numbers, different per rank).
std::pair<torch::Tensor, torch::Tensor> data(int r, int s, int n = 6) {
  auto g = torch::arange(n * 8, torch::kFloat32).reshape({n, 8});
  auto x = torch::sin(g * 0.37f + static_cast<float>(r) * 1.3f + static_cast<float>(s) * 0.71f);
  auto y = torch::cos(torch::arange(n * 4, torch::kFloat32).reshape({n, 4}) * 0.5f + static_cast<float>(r + 3 * s));
  return {x, y};
}

torch::Tensor loss_of(torch::nn::Sequential& m, int r, int s) {
  auto [x, y] = data(r, s);
  return torch::mse_loss(m->forward(x), y);
}

// The gradients of one rank's loss on a plain copy of `weights` (no DDP), flattened in order.
std::vector<torch::Tensor> reference_grads(const std::vector<torch::Tensor>& weights, int r, int s) {
  auto m = small_mlp();
  {
    torch::NoGradGuard ng;
    auto ps = m->parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i].copy_(weights[i]);
  }
  loss_of(m, r, s).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : m->parameters()) g.push_back(p.grad().clone());
  return g;
}

std::vector<torch::Tensor> clone_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool close(const torch::Tensor& a, const torch::Tensor& b, double rtol = 1e-5, double atol = 1e-7) {
  return torch::allclose(a, b, rtol, atol);
}

std::uint64_t hash_of(torch::nn::Module& m) {
  std::uint64_t h = 0;
  for (const auto& p : m.parameters()) h = ddp::hash64(p.data_ptr(), static_cast<std::size_t>(p.numel()) * 4, h);
  return h;
}

}  // namespace

BOOST_AUTO_TEST_CASE(rank0_weights_reach_every_rank_and_backward_returns_averaged_bucket_views) {
  for (bool in_backward : {true, false}) {
    const int p = 3;
    std::atomic<int> wrong{0};
    std::mutex log;
    const auto errors = with_shm_ranks(p, [&](kft::group::process_group& g) {
      torch::manual_seed(static_cast<std::uint64_t>(11 + g.rank()));  // different weights on every rank
      auto net = small_mlp();
      lt::ddp_options o;
      o.finish_in_backward = in_backward;
      lt::distributed_data_parallel d(g, net, o);
      // Rank 0's weights everywhere.
      std::vector<std::uint64_t> hashes(static_cast<std::size_t>(p));
      const std::uint64_t h = hash_of(*net);
      g.allgather(&h, hashes.data(), 1, kft::dtype::i64, kft::options{});
      for (auto x : hashes) wrong += x != hashes[0];
      const auto w = clone_params(*net);
      for (int step = 0; step < 3; ++step) {
        d.zero_grad();
        loss_of(net, g.rank(), step).backward();
        if (!in_backward) d.finish();
        // The average over the ranks of each rank's own gradient.
        std::vector<torch::Tensor> avg;
        for (int r = 0; r < p; ++r) {
          auto gr = reference_grads(w, r, step);
          if (avg.empty()) avg = gr;
          else
            for (std::size_t i = 0; i < gr.size(); ++i) avg[i] += gr[i];
        }
        auto ps = net->parameters();
        for (std::size_t i = 0; i < ps.size(); ++i) {
          const bool view = ps[i].grad().data_ptr() == d.reducer().gradient_data(i);
          const bool ok = close(ps[i].grad(), avg[i] / p);
          if (!view || !ok) {
            std::lock_guard<std::mutex> l(log);
            BOOST_TEST_MESSAGE("rank " << g.rank() << " step " << step << " tensor " << i << ": view " << view
                                       << ", max diff " << (ps[i].grad() - avg[i] / p).abs().max().item<float>());
            ++wrong;
          }
        }
      }
    });
    BOOST_TEST(first_error(errors) == "");
    BOOST_TEST(wrong.load() == 0, "finish_in_backward = " << in_backward);
  }
}

// A hook that counts launches, to see that buckets leave before backward has reached the first layer.
struct counting_hook {
  std::atomic<int>* launched;
  template <class G>
  auto launch(G& g, ddp::bucket_view& b) {
    ++*launched;
    return g.allreduce_async(b.data, b.data, b.count, b.type, kft::op_kind::avg, b.opts);
  }
  void complete(ddp::bucket_view&) {}
};

BOOST_AUTO_TEST_CASE(buckets_are_launched_while_backward_runs) {
  const int p = 2;
  std::vector<int> seen(p, -1), buckets(p, 0);
  const auto errors = with_shm_ranks(p, [&](kft::group::process_group& g) {
    std::atomic<int> launched{0};
    auto net = small_mlp(256);  // 2.bias + 2.weight (4 KiB) close bucket 0, 0.bias + 0.weight (9 KiB) bucket 1
    // A hook of our own on the first layer's weight, whose gradient is the last to be final,
    // added before the wrapper's (hooks run in the order they were added): how many buckets had
    // been launched when backward reached it?
    int at_first_layer = -1;
    auto acc = torch::autograd::impl::grad_accumulator(net->parameters()[0]);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          at_first_layer = launched.load();
          return out;
        }));
    lt::ddp_options o;
    o.reducer.limits = {.first_bucket_bytes = 4096, .bucket_bytes_cap = 4096};
    o.reducer.rebuild_buckets = false;
    lt::distributed_data_parallel<kft::group::process_group, counting_hook> d(g, net, o, counting_hook{&launched});
    d.zero_grad();
    loss_of(net, g.rank(), 0).backward();
    seen[static_cast<std::size_t>(g.rank())] = at_first_layer;
    buckets[static_cast<std::size_t>(g.rank())] = static_cast<int>(d.reducer().buckets().size());
    BOOST_TEST_MESSAGE("rank " << g.rank() << ": " << d.reducer().buckets().size() << " buckets, " << at_first_layer
                               << " launched before the first layer's gradient was final, " << launched.load()
                               << " after backward");
  });
  BOOST_TEST(first_error(errors) == "");
  for (int r = 0; r < p; ++r) {
    BOOST_TEST(buckets[static_cast<std::size_t>(r)] == 2);
    BOOST_TEST(seen[static_cast<std::size_t>(r)] == 1);  // bucket 0 left while backward was still running
  }
}

BOOST_AUTO_TEST_CASE(no_sync_accumulates_and_the_next_backward_averages_the_sum) {
  const int p = 2;
  std::atomic<int> wrong{0};
  const auto errors = with_shm_ranks(p, [&](kft::group::process_group& g) {
    torch::manual_seed(5);
    auto net = small_mlp();
    lt::distributed_data_parallel d(g, net);
    const auto w = clone_params(*net);
    d.zero_grad();
    {
      auto quiet = d.no_sync();
      loss_of(net, g.rank(), 0).backward();  // stays local
    }
    loss_of(net, g.rank(), 1).backward();  // adds, then averages the sum
    auto ps = net->parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      torch::Tensor want = torch::zeros_like(ps[i]);
      for (int r = 0; r < p; ++r) want += reference_grads(w, r, 0)[i] + reference_grads(w, r, 1)[i];
      wrong += !close(ps[i].grad(), want / p);
    }
  });
  BOOST_TEST(first_error(errors) == "");
  BOOST_TEST(wrong.load() == 0);
}

// Parameter a is registered first but used last, so its gradient is final first: the observed
// order differs from the reverse registration order and the buckets are rebuilt after step 1.
struct swapped : torch::nn::Module {
  swapped() {
    a = register_parameter("a", torch::randn({64, 4}) * 0.1);
    b = register_parameter("b", torch::randn({8, 64}) * 0.1);
    c = register_parameter("c", torch::randn({64}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(x.matmul(b) + c).matmul(a); }
  torch::Tensor a, b, c;
};

BOOST_AUTO_TEST_CASE(the_bucket_rebuild_repoints_the_gradient_views) {
  const int p = 2;
  std::atomic<int> wrong{0}, rebuilt{0};
  const auto errors = with_shm_ranks(p, [&](kft::group::process_group& g) {
    torch::manual_seed(3);
    auto net = std::make_shared<swapped>();
    lt::ddp_options o;
    o.reducer.limits = {.first_bucket_bytes = 1024, .bucket_bytes_cap = 1024};
    lt::distributed_data_parallel d(g, net, o);
    const auto v0 = d.reducer().layout_version();
    for (int step = 0; step < 3; ++step) {
      // the reference: the average gradient over the ranks, on a plain copy
      std::vector<torch::Tensor> want;
      for (int r = 0; r < p; ++r) {
        swapped plain;
        {
          torch::NoGradGuard ng;
          plain.a.copy_(net->a);
          plain.b.copy_(net->b);
          plain.c.copy_(net->c);
        }
        auto [x, y] = data(r, step);
        torch::mse_loss(plain.forward(x), y).backward();
        std::vector<torch::Tensor> gr{plain.a.grad(), plain.b.grad(), plain.c.grad()};
        if (want.empty()) want = gr;
        else
          for (std::size_t i = 0; i < 3; ++i) want[i] += gr[i];
      }
      d.zero_grad();
      auto [x, y] = data(g.rank(), step);
      torch::mse_loss(net->forward(x), y).backward();
      std::vector<torch::Tensor> got{net->a.grad(), net->b.grad(), net->c.grad()};
      for (std::size_t i = 0; i < 3; ++i) {
        wrong += !close(got[i], want[i] / p);
        wrong += got[i].data_ptr() != d.reducer().gradient_data(i);
      }
      torch::NoGradGuard ng;
      for (auto& t : net->parameters()) t.sub_(t.grad() * 0.1);
    }
    if (g.rank() == 0) rebuilt = d.reducer().layout_version() != v0;
  });
  BOOST_TEST(first_error(errors) == "");
  BOOST_TEST(rebuilt.load() == 1);
  BOOST_TEST(wrong.load() == 0);
}

BOOST_AUTO_TEST_CASE(models_that_differ_between_ranks_are_named) {
  const auto errors = with_shm_ranks(2, [&](kft::group::process_group& g) {
    auto net = g.rank() == 0 ? small_mlp(16) : small_mlp(17);
    lt::distributed_data_parallel d(g, net);
  });
  for (const auto& e : errors) {
    BOOST_TEST_MESSAGE(e);
    BOOST_TEST(e.find("parameter 0 ('0.weight'): rank 0 has f32 x 128") != std::string::npos);
  }
}

struct odd : torch::nn::Module {
  explicit odd(int kind) {
    if (kind == 0) w = register_parameter("w", torch::randn({3, 4}).t());  // not contiguous
    if (kind == 1) w = register_parameter("frozen", torch::randn({3}), /*requires_grad=*/false);
  }
  torch::Tensor w;
};

BOOST_AUTO_TEST_CASE(tensors_it_cannot_carry_are_refused_by_name) {
  const auto errors = with_shm_ranks(1, [&](kft::group::process_group& g) {
    try {
      lt::distributed_data_parallel d(g, std::make_shared<odd>(0));
      throw std::runtime_error("a non-contiguous parameter was accepted");
    } catch (const kft::usage_error& e) {
      BOOST_TEST(std::string(e.what()).find("parameter 'w' is not contiguous") != std::string::npos, e.what());
    }
    try {
      lt::distributed_data_parallel d(g, std::make_shared<odd>(1));
      throw std::runtime_error("a module without trainable parameters was accepted");
    } catch (const kft::usage_error& e) {
      BOOST_TEST(std::string(e.what()).find("no parameter that requires a gradient") != std::string::npos, e.what());
    }
    auto half = small_mlp();
    half->to(torch::kFloat64);  // f64 is carried by the reducer, but kft's trainer is f32
    auto fn = [&](std::span<const std::uint32_t>) { return lt::batch_result{}; };
    try {
      lt::module_model m(half, fn);
      throw std::runtime_error("an f64 module was accepted by the trainer adapter");
    } catch (const kft::usage_error& e) {
      BOOST_TEST(std::string(e.what()).find("parameter '0.weight' is f64") != std::string::npos, e.what());
    }
  });
  BOOST_TEST(first_error(errors) == "");
}

// kft's trainer on a libtorch module: 2 ranks x 8 samples = 1 rank x 16 samples (the same global
// batches, averaged gradients), and the replicas agree (the trainer checks them).
BOOST_AUTO_TEST_CASE(the_trainer_trains_a_module_through_module_model) {
  const std::uint64_t n = 256;
  auto x_all = torch::sin(torch::arange(static_cast<std::int64_t>(n) * 8, torch::kFloat32).reshape({static_cast<std::int64_t>(n), 8}) * 0.13f);
  auto y_all = (x_all.sum(1) > 0).to(torch::kInt64) + (x_all.select(1, 0) > 0.3).to(torch::kInt64);  // 3 classes
  auto run = [&](int world, std::uint64_t batch) {
    std::vector<torch::Tensor> out;
    double first = 0, last = 0;
    const auto errors = with_shm_ranks(world, [&](kft::group::process_group& g) {
      // The ranks are threads sharing libtorch's one default generator: seeding and drawing under a
      // lock gives rank 0 the same initial weights as the 1-rank run (without it the draws of the
      // two threads interleave and the comparison below fails at random).
      torch::nn::Sequential net = [] {
        static std::mutex init;
        const std::lock_guard lock(init);
        torch::manual_seed(7);
        return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 3));
      }();
      auto fn = [&](std::span<const std::uint32_t> idx) {
        std::vector<std::int64_t> i(idx.begin(), idx.end());
        auto t = torch::tensor(i, torch::kInt64);
        auto logits = net->forward(x_all.index_select(0, t));
        auto y = y_all.index_select(0, t);
        return lt::batch_result{torch::nn::functional::cross_entropy(logits, y),
                                static_cast<std::uint64_t>(logits.argmax(1).eq(y).sum().item<std::int64_t>()), idx.size()};
      };
      lt::module_model m(net, fn);
      ddp::sgd opt({.lr = 0.2f, .momentum = 0.9f});
      ddp::trainer_options o;
      o.batch = batch;
      o.epochs = 3;
      o.quiet = true;
      o.verify_every = 5;
      ddp::trainer t(g, m, opt, o);
      const auto before = t.evaluate(n);
      const auto s = t.fit(n, n);
      if (g.rank() == 0) {
        out = clone_params(*net);
        first = before.loss_sum / static_cast<double>(before.count);
        last = s.final_loss;
      }
    });
    BOOST_TEST(first_error(errors) == "");
    BOOST_TEST_MESSAGE(world << " rank(s): loss " << first << " -> " << last);
    BOOST_TEST(last < 0.7 * first);
    return out;
  };
  const auto one = run(1, 16), two = run(2, 8);
  BOOST_REQUIRE(one.size() == two.size());
  for (std::size_t i = 0; i < one.size(); ++i)
    BOOST_TEST(close(one[i], two[i], 1e-4, 1e-6), "tensor " << i << " max diff " << (one[i] - two[i]).abs().max().item<float>());
}
