// SPDX-License-Identifier: Apache-2.0
// The DDP trainer with ranks as threads over the shared-memory transport: equivalence with one
// rank, accumulation, deterministic mode across world sizes and bucket caps, uneven inputs, the
// timeline, resume on another number of ranks, NaN and desync detection, bad options. Its parts
// are in test_trainer_parts.cpp, ZeRO-1 and the device path in test_trainer_zero.cpp, other
// tasks (metrics, targets, observers) in test_trainer_tasks.cpp.
#define BOOST_TEST_MODULE kft_trainer
#include <boost/test/unit_test.hpp>

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <span>
#include <string>
#include <vector>

#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/optim.hpp>
#include <kft/ddp/sampler.hpp>
#include <kft/ddp/trainer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

#include "../common/shm_ranks.hpp"
#include "../../examples/05-fashion-mnist/idx.hpp"
#include "../../examples/05-fashion-mnist/mlp.hpp"

#include "../common/trainer_fixture.hpp"

// ---- the trainer --------------------------------------------------------------------------

// N ranks x batch b for K steps = 1 rank x batch N b. Not bit-exact: the batch's gradient sums
// run in another order (each rank's GEMM over b samples, then the average over ranks, against
// one GEMM over N b), a relative error of a few float epsilons per step; after 30 steps of SGD
// with momentum on a small MLP it stays below 1e-4 of the weights' scale.
BOOST_AUTO_TEST_CASE(n_ranks_equal_one_rank_with_n_times_the_batch) {
  auto reference = [](int world, std::uint64_t batch) {
    std::vector<float> out;
    auto errs = with_ranks(world, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
      ddp::trainer_options o;
      o.batch = batch;
      o.epochs = 1;
      o.max_steps = 30;
      o.quiet = true;
      o.verify_every = 10;
      ddp::trainer t(g, m, opt, o);
      t.fit(train_set().n, test_set().n);
      if (g.rank() == 0) out = flat(m);
    });
    BOOST_TEST(none(errs));
    return out;
  };
  const auto one = reference(1, 32);
  for (int world : {2, 4}) {
    const auto many = reference(world, 32 / static_cast<std::uint64_t>(world));
    BOOST_REQUIRE(many.size() == one.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < one.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(one[i] - many[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(one[i])));
    }
    BOOST_TEST_MESSAGE(world << " ranks: largest difference " << worst << " (weights up to " << scale << ")");
    BOOST_TEST(worst <= 1e-4 * scale);
    BOOST_TEST(one != many);  // (and not trivially equal: the orders differ)
  }
}

// Gradient accumulation: 2 ranks x 2 micro-batches of 8 per step train on the same 32 samples
// per step as 2 ranks x 16 (the sampler's consecutive global batches), one optimizer step each,
// and only the last micro-batch sends anything. Equal up to the summation order (as above).
BOOST_AUTO_TEST_CASE(accumulation_equals_the_larger_batch) {
  auto train = [](std::uint64_t batch, std::uint64_t accumulate, std::uint64_t& steps) {
    std::vector<float> out;
    auto errs = with_ranks(2, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
      ddp::trainer_options o;
      o.batch = batch;
      o.accumulate = accumulate;
      o.max_steps = 20;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
      t.fit(train_set().n, test_set().n);
      if (g.rank() == 0) {
        out = flat(m);
        steps = t.step_count();
      }
    });
    BOOST_TEST(none(errs));
    return out;
  };
  std::uint64_t s1 = 0, s2 = 0;
  const auto big = train(16, 1, s1), acc = train(8, 2, s2);
  BOOST_TEST(s1 == 20u);
  BOOST_TEST(s2 == 20u);
  BOOST_REQUIRE(big.size() == acc.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < big.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(big[i] - acc[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(big[i])));
  }
  BOOST_TEST_MESSAGE("accumulation: largest difference " << worst << " (weights up to " << scale << ")");
  BOOST_TEST(worst <= 1e-4 * scale);
}

// Deterministic mode: the same global batch in the same fixed shards gives the same bits for
// 1, 2 and 4 ranks and for any bucket cap.
BOOST_AUTO_TEST_CASE(deterministic_mode_is_world_size_and_bucket_cap_invariant) {
  auto run = [](int world, std::size_t cap, std::uint64_t& hash) {
    auto errs = with_ranks(world, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::adam opt({.lr = 0.01f});
      ddp::trainer_options o;
      o.deterministic = true;
      o.global_batch = 48;
      o.micro_shards = 4;
      o.epochs = 2;
      o.max_steps = 30;  // 21 steps per epoch, the last of 40 samples: crosses both
      o.quiet = true;
      o.reducer.limits.bucket_bytes_cap = cap;
      o.reducer.limits.first_bucket_bytes = std::min<std::size_t>(cap, 1u << 20);
      ddp::trainer t(g, m, opt, o);
      t.fit(train_set().n, test_set().n);
      if (g.rank() == 0) hash = t.parameters_hash();
    });
    BOOST_TEST(none(errs));
  };
  std::uint64_t base = 0;
  run(1, 25u << 20, base);
  BOOST_TEST(base != 0u);
  for (auto [world, cap] : std::vector<std::pair<int, std::size_t>>{{2, 25u << 20}, {4, 25u << 20}, {2, 1024}, {4, 256}}) {
    std::uint64_t h = 0;
    run(world, cap, h);
    BOOST_TEST(h == base, world << " ranks, bucket cap " << cap << " B");
  }
  // Without deterministic mode the 2-rank result differs from the 1-rank one in some bit
  // (the test above would not notice a mode that does nothing).
  std::uint64_t plain1 = 0, plain2 = 0;
  for (int world : {1, 2}) {
    auto errs = with_ranks(world, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::adam opt({.lr = 0.01f});
      ddp::trainer_options o;
      o.batch = 48 / static_cast<std::uint64_t>(world);
      o.max_steps = 30;
      o.epochs = 2;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
      t.fit(train_set().n, test_set().n);
      if (g.rank() == 0) (world == 1 ? plain1 : plain2) = t.parameters_hash();
    });
    BOOST_TEST(none(errs));
  }
  BOOST_TEST(plain1 != plain2);
}

// One rank runs out of data early (0%, 10%, 50% fewer batches): nobody hangs, the shadowing
// rank takes the same optimizer steps, and every replica ends identical (the trainer's final
// verification would throw otherwise).
BOOST_AUTO_TEST_CASE(uneven_inputs_finish_without_a_hang) {
  for (double fewer : {0.0, 0.1, 0.5}) {
    std::vector<std::uint64_t> hashes(3), steps(3), shadowed(3);
    auto errs = with_ranks(3, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
      ddp::trainer_options o;
      o.batch = 8;
      o.quiet = true;
      o.verify_every = 3;  // periodic checks while ranks shadow, too
      ddp::trainer t(g, m, opt, o);
      const int batches = g.rank() == 1 ? static_cast<int>(20 * (1.0 - fewer)) : 20;
      std::vector<std::uint32_t> idx(8);
      for (int b = 0; b < batches; ++b) {
        for (std::size_t i = 0; i < 8; ++i) idx[i] = static_cast<std::uint32_t>((b * 24 + g.rank() * 8 + static_cast<int>(i)) % 1000);
        t.step(idx);
      }
      const auto r = static_cast<std::size_t>(g.rank());
      shadowed[r] = t.join();
      t.verify_replicas("the test's end");
      hashes[r] = t.parameters_hash();
      steps[r] = t.step_count();
    });
    BOOST_TEST(none(errs), "fewer " << fewer);
    BOOST_TEST(hashes[0] == hashes[1]);
    BOOST_TEST(hashes[0] == hashes[2]);
    BOOST_TEST(steps[0] == 20u);
    BOOST_TEST(steps[1] == 20u);  // its own steps plus the shadowed ones
    BOOST_TEST(shadowed[1] == static_cast<std::uint64_t>(20 - static_cast<int>(20 * (1.0 - fewer))));
    BOOST_TEST(shadowed[0] == 0u);
  }
}

// KFT_TIMELINE=dir: the trainer writes every rank's timeline with its own compute spans
// (backward, finish, optimizer) beside the reducer's bucket events; without it, nothing.
BOOST_AUTO_TEST_CASE(kft_timeline_records_the_trainers_steps) {
  auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  auto train = [] {
    return with_ranks(2, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f});
      ddp::trainer_options o;
      o.batch = 8;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
      std::vector<std::uint32_t> idx(8);
      for (int b = 0; b < 5; ++b) {
        for (std::size_t i = 0; i < 8; ++i) idx[i] = static_cast<std::uint32_t>(b * 16 + g.rank() * 8 + static_cast<int>(i));
        t.step(idx);
      }
    });
  };
  temp_dir on, off;
  ::setenv("KFT_TIMELINE", on.path.c_str(), 1);
  auto errs = train();
  ::unsetenv("KFT_TIMELINE");
  BOOST_TEST(none(errs));
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(on.path / ("timeline-rank" + std::to_string(r) + ".json"));
    BOOST_TEST_REQUIRE(f.good(), "no timeline for rank " << r);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    BOOST_TEST(count(text, "\"name\":\"backward\"") == 5u, "rank " << r);
    BOOST_TEST(count(text, "\"name\":\"finish\"") == 5u, "rank " << r);
    BOOST_TEST(count(text, "\"name\":\"optimizer\"") == 5u, "rank " << r);
    BOOST_TEST(count(text, "\"cat\":\"comm\"") >= 5u, "rank " << r);  // every step's bucket(s)
  }
  const fs::path untouched = off.path;
  BOOST_TEST(none(train()));  // KFT_TIMELINE unset: the trainer writes nothing
  BOOST_TEST(fs::is_empty(untouched));
  BOOST_TEST(!fs::exists(fs::current_path() / "timeline-rank0.json"));
}

// KFT_TIMELINE is checked when the trainer starts: a missing directory (whose parent exists) is
// created and gets the traces at the end of fit(); a path that is a file stops the trainer at
// construction with an error naming the variable and the path.
BOOST_AUTO_TEST_CASE(kft_timeline_directory_is_made_or_refused_at_the_start) {
  auto train = [] {
    return with_ranks(2, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f});
      ddp::trainer_options o;
      o.batch = 8;
      o.epochs = 1;
      o.max_steps = 4;
      o.quiet = true;
      ddp::trainer t(g, m, opt, o);
      t.fit(train_set().n, test_set().n);
    });
  };
  temp_dir base;
  const fs::path fresh = base.path / "made-by-kft";
  ::setenv("KFT_TIMELINE", fresh.c_str(), 1);
  auto errs = train();
  BOOST_TEST(none(errs));
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(fs::exists(fresh / ("timeline-rank" + std::to_string(r) + ".json")), "rank " << r);

  const fs::path file = base.path / "a-file";
  std::ofstream(file) << "not a directory\n";
  ::setenv("KFT_TIMELINE", file.c_str(), 1);
  errs = train();
  const fs::path deep = base.path / "no-parent" / "dir";
  ::setenv("KFT_TIMELINE", deep.c_str(), 1);
  auto errs_deep = train();
  ::unsetenv("KFT_TIMELINE");
  BOOST_TEST_REQUIRE(errs.size() == 2u);
  for (const auto& e : errs) {
    BOOST_TEST(e.find("KFT_TIMELINE=\"" + file.string() + "\" is not a directory") != std::string::npos, e);
  }
  for (const auto& e : errs_deep) {
    BOOST_TEST(e.find("KFT_TIMELINE=\"" + deep.string() + "\" does not exist and cannot be created") != std::string::npos, e);
  }
  BOOST_TEST(!fs::exists(deep));
}

// Checkpoint on 2 ranks at step 12, resume on 4 ranks (deterministic): the parameters after 30
// steps are the bits of an unbroken 2-rank run.
BOOST_AUTO_TEST_CASE(resume_on_another_number_of_ranks_continues_bit_identically) {
  temp_dir d;
  auto opts = [&](std::uint64_t max_steps) {
    ddp::trainer_options o;
    o.deterministic = true;
    o.global_batch = 40;
    o.micro_shards = 4;
    o.epochs = 2;
    o.max_steps = max_steps;
    o.quiet = true;
    o.checkpoint_dir = d.path;
    o.checkpoint_every = 6;
    o.resume = true;
    return o;
  };
  std::uint64_t unbroken = 0, resumed = 0, resumed_from = 0;
  auto train = [&](int world, std::uint64_t max_steps, std::uint64_t* hash) {
    auto errs = with_ranks(world, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
      ddp::trainer t(g, m, opt, opts(max_steps));
      auto s = t.fit(train_set().n, test_set().n);
      if (g.rank() == 0 && hash) *hash = t.parameters_hash();
      if (g.rank() == 0) resumed_from = s.resumed_from;
    });
    BOOST_TEST(none(errs));
  };
  train(2, 30, &unbroken);
  fs::remove_all(d.path);
  train(2, 12, nullptr);  // stops after step 12's checkpoint
  BOOST_TEST(ddp::checkpoint_steps(d.path).front() == 12u);
  train(4, 30, &resumed);
  BOOST_TEST(resumed_from == 12u);
  BOOST_TEST(resumed == unbroken);
}

// A NaN loss on one rank stops every rank at that step; that rank names itself and the step.
BOOST_AUTO_TEST_CASE(a_nan_loss_stops_every_rank_at_that_step) {
  struct poisoned {
    fmnist::mlp m = small_model();
    int rank = 0, calls = 0;
    std::vector<ddp::tensor_ref> parameters() { return m.parameters(); }
    ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
      auto s = m.forward_backward(idx, g);
      if (++calls == 3 && rank == 1) {
        s.loss_sum = std::numeric_limits<double>::quiet_NaN();
        g[0][5] = std::numeric_limits<float>::quiet_NaN();
      }
      return s;
    }
    ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) { return m.evaluate(idx); }
  };
  std::vector<int> numerics(2);
  auto errs = with_ranks(2, [&](kft::group::process_group& g) {
    poisoned p;
    p.rank = g.rank();
    ddp::sgd opt({.lr = 0.05f});
    ddp::trainer_options o;
    o.batch = 8;
    o.quiet = true;
    ddp::trainer t(g, p, opt, o);
    std::vector<std::uint32_t> idx{1, 2, 3, 4, 5, 6, 7, 8};
    try {
      for (int s = 0; s < 10; ++s) t.step(idx);
    } catch (const ddp::numerics_error&) {
      numerics[static_cast<std::size_t>(g.rank())] = 1;
      throw;
    }
  });
  BOOST_TEST(numerics[0] == 1);
  BOOST_TEST(numerics[1] == 1);
  BOOST_TEST(errs[1].find("rank 1/2") != std::string::npos, errs[1]);
  BOOST_TEST(errs[1].find("step 3") != std::string::npos, errs[1]);
  BOOST_TEST(errs[1].find("NaN or infinite on this rank") != std::string::npos, errs[1]);
  BOOST_TEST(errs[1].find("'fc1.weight'") != std::string::npos, errs[1]);
  BOOST_TEST(errs[0].find("other rank(s) had a NaN") != std::string::npos, errs[0]);
}

// Replicas that drift apart are caught by the periodic comparison, naming the parameter and
// the rank (here: rank 2's copy of fc2.bias is changed behind the trainer's back).
BOOST_AUTO_TEST_CASE(a_desync_is_caught_and_named) {
  auto errs = with_ranks(3, [&](kft::group::process_group& g) {
    auto m = small_model();
    ddp::sgd opt({.lr = 0.05f});
    ddp::trainer_options o;
    o.batch = 8;
    o.quiet = true;
    o.verify_every = 4;
    ddp::trainer t(g, m, opt, o);
    std::vector<std::uint32_t> idx{1, 2, 3, 4, 5, 6, 7, 8};
    for (int s = 0; s < 10; ++s) {
      if (s == 5 && g.rank() == 2) m.parameters()[3].value[0] += 1e-3f;
      t.step(idx);
    }
  });
  for (const auto& e : errs) {
    BOOST_TEST(e.find("replicas differ") != std::string::npos, e);
    BOOST_TEST(e.find("step 8") != std::string::npos, e);
    BOOST_TEST(e.find("'fc2.bias'") != std::string::npos, e);
    BOOST_TEST(e.find("rank(s) 2 ") != std::string::npos, e);
  }
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_their_values) {
  auto errs = with_ranks(2, [&](kft::group::process_group& g) {
    auto m = small_model();
    ddp::sgd opt;
    ddp::trainer_options o;
    o.deterministic = true;
    o.micro_shards = 3;
    ddp::trainer t(g, m, opt, o);
  });
  for (const auto& e : errs) BOOST_TEST(e.find("micro_shards (3) to be a multiple of the number of ranks (2)") != std::string::npos, e);
  BOOST_CHECK_THROW(ddp::sgd({.lr = -1.0f}), kft::usage_error);
  BOOST_CHECK_THROW(ddp::adam({.beta1 = 1.0f}), kft::usage_error);
}

