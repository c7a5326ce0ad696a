// SPDX-License-Identifier: Apache-2.0
// The trainer's parts on their own: the distributed sampler, the optimizers against PyTorch's
// update rules, checkpoint files, the IDX reader.
#define BOOST_TEST_MODULE kft_trainer_parts
#include <boost/test/unit_test.hpp>

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
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

// ---- sampler ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sampler_every_index_once_per_epoch_across_ranks) {
  for (std::uint64_t n : {1000ull, 997ull, 64ull})
    for (int world : {1, 2, 3, 4})
      for (std::uint64_t per_rank : {16ull, 7ull}) {
        ddp::distributed_sampler s({.size = n, .seed = 5});
        std::map<std::uint32_t, int> seen;
        std::uint64_t padded = 0;
        std::vector<std::uint32_t> mine;
        while (auto b = s.next(per_rank * static_cast<std::uint64_t>(world))) {
          for (int r = 0; r < world; ++r) {
            s.rank_indices(*b, r, world, mine);
            BOOST_TEST(mine.size() == (b->size + world - 1) / world);  // every rank the same count
            for (auto i : mine) ++seen[i];
          }
          padded += ((b->size + world - 1) / world) * world - b->size;
          s.advance(*b);
        }
        BOOST_TEST(seen.size() == n);  // every index
        std::uint64_t dup = 0;
        for (auto [i, c] : seen) {
          BOOST_TEST(i < n);
          dup += static_cast<std::uint64_t>(c - 1);
        }
        BOOST_TEST(dup == padded);  // only padding repeats
        BOOST_TEST(padded < static_cast<std::uint64_t>(world));
      }
}

BOOST_AUTO_TEST_CASE(sampler_drop_last_and_padding_rules) {
  ddp::distributed_sampler keep({.size = 10, .seed = 1, .shuffle = false});
  ddp::distributed_sampler drop({.size = 10, .seed = 1, .shuffle = false, .drop_last = true});
  BOOST_TEST(keep.batches_left(4) == 3u);
  BOOST_TEST(drop.batches_left(4) == 2u);
  std::vector<std::uint32_t> out;
  // keep: the last global batch holds positions 8, 9; with 4 ranks it is padded by wrapping to
  // the epoch's start: ranks get 8, 9, 0, 1 (PyTorch's rule).
  keep.advance({0, 8});
  auto b = keep.next(4);
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST(b->size == 2u);
  std::vector<std::uint32_t> got;
  for (int r = 0; r < 4; ++r) {
    keep.rank_indices(*b, r, 4, out);
    BOOST_REQUIRE(out.size() == 1u);
    got.push_back(out[0]);
  }
  BOOST_TEST((got == std::vector<std::uint32_t>{8, 9, 0, 1}));
  drop.advance({0, 8});
  BOOST_TEST(!drop.next(4).has_value());
  // Strided split inside a batch (rank r takes r, r + N, ...).
  ddp::distributed_sampler s({.size = 12, .seed = 1, .shuffle = false});
  s.rank_indices({0, 6}, 1, 3, out);
  BOOST_TEST((out == std::vector<std::uint32_t>{1, 4}));
  BOOST_CHECK_THROW(s.rank_indices({0, 6}, 3, 3, out), kft::usage_error);
  BOOST_CHECK_THROW(ddp::distributed_sampler({.size = 0}), kft::usage_error);
}

BOOST_AUTO_TEST_CASE(sampler_order_depends_on_seed_and_epoch_not_world_size) {
  const auto a = ddp::permutation(1000, 3, 0), b = ddp::permutation(1000, 3, 1), c = ddp::permutation(1000, 4, 0);
  BOOST_TEST(a != b);
  BOOST_TEST(a != c);
  BOOST_TEST(ddp::permutation(1000, 3, 0) == a);  // reproducible
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::uint32_t i = 0; i < 1000; ++i) BOOST_TEST(sorted[i] == i);
  // The documented generator, step by step, for a 3-element shuffle (seed 0, epoch 0).
  std::uint64_t st = 0 ^ (1 * 0xD1B54A32D192ED03ull);
  auto next = [&] {
    std::uint64_t z = (st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<std::uint32_t> p{0, 1, 2};
  for (std::size_t i = 2; i > 0; --i) {
    const long double frac = static_cast<long double>(next()) / 18446744073709551616.0L;
    std::swap(p[i], p[static_cast<std::size_t>(frac * static_cast<long double>(i + 1))]);
  }
  BOOST_TEST(ddp::permutation(3, 0, 0) == p);
}

BOOST_AUTO_TEST_CASE(sampler_resume_on_another_world_size_continues_the_sequence) {
  // 2 ranks for 5 global batches of 40, then a "checkpoint", then 3 ranks with batches of 30:
  // over the epoch every sample exactly once (1000 = 200 + 800, 800 = 26 x 30 + 20, padding
  // only in the last batch).
  ddp::distributed_sampler a({.size = 1000, .seed = 9});
  std::multiset<std::uint32_t> seen;
  std::vector<std::uint32_t> out;
  for (int k = 0; k < 5; ++k) {
    auto b = a.next(40);
    for (int r = 0; r < 2; ++r) {
      a.rank_indices(*b, r, 2, out);
      seen.insert(out.begin(), out.end());
    }
    a.advance(*b);
  }
  const ddp::sampler_state saved = a.state();
  BOOST_TEST(saved.cursor == 200u);
  ddp::distributed_sampler c({.size = 1000, .seed = 9});
  c.restore(saved);
  std::uint64_t pad = 0;
  while (auto b = c.next(30)) {
    for (int r = 0; r < 3; ++r) {
      c.rank_indices(*b, r, 3, out);
      seen.insert(out.begin(), out.end());
    }
    pad += (b->size + 2) / 3 * 3 - b->size;
    c.advance(*b);
  }
  BOOST_TEST(pad == 1u);  // the last batch of 20: 21 slots
  std::set<std::uint32_t> unique(seen.begin(), seen.end());
  BOOST_TEST(unique.size() == 1000u);
  BOOST_TEST(seen.size() == 1001u);
  ddp::distributed_sampler other({.size = 1000, .seed = 10});
  BOOST_CHECK_THROW(other.restore(saved), kft::usage_error);
}

// ---- optimizers --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sgd_and_adam_follow_pytorchs_update_rules) {
  // Three steps on 3 values, against the rules written out in double precision.
  const std::vector<std::vector<float>> grads = {{0.5f, -1.0f, 2.0f}, {0.25f, 0.0f, -1.0f}, {1.0f, 1.0f, 1.0f}};
  {
    ddp::sgd o({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
    std::vector<float> w{1.0f, 2.0f, 3.0f};
    std::vector<std::size_t> sizes{3};
    o.bind(sizes);
    std::vector<double> rw(w.begin(), w.end()), buf(3);
    for (std::size_t s = 0; s < grads.size(); ++s) {
      o.begin_step();
      BOOST_TEST(o.step(0, w, grads[s], 1.0f));
      for (std::size_t k = 0; k < 3; ++k) {
        const double d = grads[s][k] + 0.01 * rw[k];
        buf[k] = s == 0 ? d : 0.9 * buf[k] + d;
        rw[k] -= 0.1 * buf[k];
      }
    }
    for (std::size_t k = 0; k < 3; ++k) BOOST_TEST(w[k] == rw[k], boost::test_tools::tolerance(1e-5));
  }
  {
    ddp::adam o({.lr = 0.01f, .weight_decay = 0.1f});
    std::vector<float> w{1.0f, 2.0f, 3.0f};
    std::vector<std::size_t> sizes{3};
    o.bind(sizes);
    std::vector<double> rw(w.begin(), w.end()), m(3), v(3);
    for (std::size_t s = 0; s < grads.size(); ++s) {
      o.begin_step();
      BOOST_TEST(o.step(0, w, grads[s], 2.0f));  // scale 2: the gradient counts double
      const double t = static_cast<double>(s + 1);
      for (std::size_t k = 0; k < 3; ++k) {
        const double g = 2.0 * grads[s][k];
        rw[k] *= 1.0 - 0.01 * 0.1;
        m[k] = 0.9 * m[k] + 0.1 * g;
        v[k] = 0.999 * v[k] + 0.001 * g * g;
        rw[k] -= 0.01 * (m[k] / (1 - std::pow(0.9, t))) / (std::sqrt(v[k] / (1 - std::pow(0.999, t))) + 1e-8);
      }
    }
    for (std::size_t k = 0; k < 3; ++k) BOOST_TEST(w[k] == rw[k], boost::test_tools::tolerance(1e-5));
  }
  {  // a NaN or an infinity in a gradient is reported
    ddp::sgd o({.lr = 0.1f});
    std::vector<float> w{1.0f, 2.0f};
    std::vector<std::size_t> sizes{2};
    o.bind(sizes);
    o.begin_step();
    BOOST_TEST(!o.step(0, w, std::vector<float>{1.0f, std::numeric_limits<float>::quiet_NaN()}, 1.0f));
    BOOST_TEST(!o.step(0, w, std::vector<float>{std::numeric_limits<float>::infinity(), 0.0f}, 1.0f));
    BOOST_CHECK_THROW(o.step(0, w, std::vector<float>{1.0f}, 1.0f), kft::usage_error);
    BOOST_CHECK_THROW(o.step(1, w, std::vector<float>{1.0f, 1.0f}, 1.0f), kft::usage_error);
  }
}

BOOST_AUTO_TEST_CASE(adam_keeps_the_scalar_rules_bits_in_every_lane) {
  // 4 steps on 4 parameters whose sizes leave 0-3 values past the last 4-lane block; each value
  // must equal the scalar rule's float arithmetic, in its order, bit for bit.
  const std::vector<std::size_t> sizes{1, 6, 13, 32};
  for (const bool decoupled : {true, false}) {
    ddp::adam o({.lr = 0.003f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.02f, .decoupled = decoupled});
    o.bind(sizes);
    std::uint32_t x = 12345;
    auto next = [&x] {
      x = x * 1664525u + 1013904223u;
      return static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f;
    };
    std::vector<std::vector<float>> w, m, v;
    for (auto n : sizes) {
      w.emplace_back(n);
      for (auto& e : w.back()) e = next();
      m.emplace_back(n, 0.0f);
      v.emplace_back(n, 0.0f);
    }
    auto rw = w;
    for (int s = 1; s <= 4; ++s) {
      o.begin_step();
      const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.9f), s));
      const float bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(0.95f), s)));
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        std::vector<float> g(sizes[i]);
        for (auto& e : g) e = next();
        BOOST_TEST(o.step(i, w[i], g, 0.5f));
        const float lr = 0.003f, wd = 0.02f, step_size = lr / bc1;
        const float decay = decoupled ? 1.0f - lr * wd : 1.0f, l2 = decoupled ? 0.0f : wd;
        for (std::size_t k = 0; k < sizes[i]; ++k) {
          volatile float gk = g[k] * 0.5f + l2 * rw[i][k];  // volatile: no contraction into FMAs here
          volatile float mk = 0.9f * m[i][k] + (1.0f - 0.9f) * gk;
          volatile float vk = 0.95f * v[i][k] + (1.0f - 0.95f) * gk * gk;
          m[i][k] = mk;
          v[i][k] = vk;
          volatile float denom = std::sqrt(static_cast<float>(vk)) / bc2 + 1e-8f;
          rw[i][k] = rw[i][k] * decay - step_size * mk / denom;
        }
      }
    }
    std::size_t differ = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t k = 0; k < sizes[i]; ++k) differ += std::bit_cast<std::uint32_t>(w[i][k]) != std::bit_cast<std::uint32_t>(rw[i][k]);
    BOOST_TEST(differ == 0u);
    BOOST_TEST(o.state().buffers[1][3] == v[3], boost::test_tools::per_element());
  }
  // A NaN or an infinity is reported wherever it sits: each lane of a block and the tail.
  for (std::size_t at = 0; at < 7; ++at)
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      ddp::adam o;
      std::vector<std::size_t> one{7};
      o.bind(one);
      o.begin_step();
      std::vector<float> w(7, 1.0f), g(7, 0.5f);
      g[at] = bad;
      BOOST_TEST(!o.step(0, w, g, 1.0f), "a non-finite gradient value at " << at << " went unseen");
      g[at] = 0.25f;
      BOOST_TEST(o.step(0, w, g, 1.0f));
    }
}

// ---- checkpoint files --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(checkpoints_are_atomic_and_the_newest_valid_one_is_found) {
  temp_dir d;
  auto make = [](std::uint64_t v) {
    ddp::checkpoint_writer w;
    w.put_u64("step", v);
    std::vector<float> x(1000, static_cast<float>(v));
    w.put_floats("x", x);
    return w.finish();
  };
  for (std::uint64_t s : {10u, 20u, 30u}) ddp::write_atomic(d.path, ddp::checkpoint_name(s), make(s));
  BOOST_TEST(ddp::checkpoint_steps(d.path) == (std::vector<std::uint64_t>{30, 20, 10}));
  auto f = ddp::latest_checkpoint(d.path);
  BOOST_REQUIRE(f.has_value());
  BOOST_TEST(f->step == 30u);
  ddp::checkpoint_reader r(f->bytes, "x");
  BOOST_TEST(r.get_u64("step") == 30u);
  std::vector<float> x(1000);
  r.get_floats("x", x);
  BOOST_TEST(x[999] == 30.0f);
  std::vector<float> wrong(10);
  BOOST_CHECK_THROW(r.get_floats("x", wrong), kft::usage_error);
  BOOST_CHECK_THROW(r.get("missing"), kft::usage_error);

  // A corrupt newest file (one flipped byte) and a truncated one are skipped, with reasons.
  {
    std::fstream io(d.path / ddp::checkpoint_name(30), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);
    io.put('\x7f');
  }
  auto full = make(40);
  full.resize(full.size() / 2);
  {
    std::ofstream out(d.path / ddp::checkpoint_name(40), std::ios::binary);
    out.write(reinterpret_cast<const char*>(full.data()), static_cast<std::streamsize>(full.size()));
  }
  // A temporary file of a writer that died is never a candidate.
  { std::ofstream(d.path / ".ckpt-000000000050.kft.tmp-123") << "half"; }
  std::vector<std::string> skipped;
  f = ddp::latest_checkpoint(d.path, &skipped);
  BOOST_REQUIRE(f.has_value());
  BOOST_TEST(f->step == 20u);
  BOOST_REQUIRE(skipped.size() == 2u);
  BOOST_TEST(skipped[0].find("truncated") != std::string::npos, skipped[0]);
  BOOST_TEST(skipped[1].find("checksum") != std::string::npos, skipped[1]);
  BOOST_TEST(!ddp::checkpoint_step(".ckpt-000000000050.kft.tmp-123").has_value());
  BOOST_TEST(ddp::checkpoint_step("ckpt-000000000050.kft").value() == 50u);
  BOOST_TEST(!ddp::latest_checkpoint(d.path / "nothing-here").has_value());
  // write_atomic's progress callback sees every byte, and an unwritable directory is named.
  std::size_t last = 0;
  ddp::write_atomic(d.path, "p.kft", make(1), [&](std::size_t done, std::size_t) { last = done; });
  BOOST_TEST(last == make(1).size());
  try {
    ddp::write_atomic("/proc/kft-no-such-dir", "x.kft", make(1));
    BOOST_FAIL("writing into /proc succeeded");
  } catch (const kft::error& e) {
    BOOST_TEST(std::string(e.what()).find("/proc/kft-no-such-dir") != std::string::npos, e.what());
  }
}

// ---- IDX reader ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(idx_reader_parses_and_names_what_is_wrong) {
  std::vector<std::uint8_t> good{0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
  auto a = fmnist::parse_idx(good, "t.idx");
  BOOST_TEST((a.dims == std::vector<std::uint32_t>{2, 3}));
  BOOST_TEST(a.count() == 2u);
  BOOST_TEST(a.row() == 3u);
  BOOST_TEST(a.data[5] == 6);
  auto fails_with = [](std::vector<std::uint8_t> b, const std::string& part) {
    try {
      fmnist::parse_idx(b, "bad.idx");
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      return m.find("bad.idx") != std::string::npos && m.find(part) != std::string::npos;
    }
    return false;
  };
  auto wrong_type = good;
  wrong_type[2] = 0x0D;
  auto short_data = good;
  short_data.pop_back();
  BOOST_TEST(fails_with(wrong_type, "element type"));
  BOOST_TEST(fails_with(short_data, "promises 6 bytes"));
  BOOST_TEST(fails_with({1, 0, 8, 1}, "magic"));
  BOOST_TEST(fails_with({0, 0}, "header"));
  BOOST_TEST(fails_with({0, 0, 8, 2, 0, 0}, "cut off"));
  // Through zlib, from a gzip file; a missing file names Debian's package.
  temp_dir d;
  const auto gz = d.path / "x.gz";
  gzFile f = gzopen(gz.c_str(), "wb");
  gzwrite(f, good.data(), static_cast<unsigned>(good.size()));
  gzclose(f);
  BOOST_TEST(fmnist::load_idx(gz).data == a.data);
  try {
    fmnist::load_split(d.path, "train");
    BOOST_FAIL("loading a split from an empty directory succeeded");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("apt-get install dataset-fashion-mnist") != std::string::npos, e.what());
  }
}

