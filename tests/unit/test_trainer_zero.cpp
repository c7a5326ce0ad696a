// SPDX-License-Identifier: Apache-2.0
// ZeRO stage 1 (zero.hpp) against the replicated optimizer, its bytes, its checkpoints on other
// numbers of ranks; and the trainer's device path on CPUs (a stand-in group that declares device
// buffers and counts the host <-> "device" copies).
#define BOOST_TEST_MODULE kft_trainer_zero
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

// A stand-in for a GPU group, so the trainer's device path runs on CPUs: the job's process
// group behind a type that declares device buffers, and a bucket-memory policy for it that
// keeps host memory but counts the host <-> "device" copies the trainer makes. (The real one,
// kft/ddp/cuda.hpp, needs a GPU; docs/gpu.md.)
namespace kft_test {
struct device_like_group {
  static constexpr bool device_buffers = true;
  kft::group::process_group& g;
  int rank() const { return g.rank(); }
  int size() const { return g.size(); }
  std::uint64_t sequence() const { return g.sequence(); }
  void allreduce(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& x = {}) {
    g.allreduce(i, o, n, t, op, x);
  }
  void broadcast(const void* i, void* o, std::size_t n, kft::dtype t, int root, const kft::options& x = {}) {
    g.broadcast(i, o, n, t, root, x);
  }
  void reduce_scatter(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& x = {}) {
    g.reduce_scatter(i, o, n, t, op, x);
  }
  void allgather(const void* i, void* o, std::size_t n, kft::dtype t, const kft::options& x = {}) {
    g.allgather(i, o, n, t, x);
  }
  void barrier(const kft::options& x = {}) { g.barrier(x); }
  auto allreduce_async(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& x = {}) {
    return g.allreduce_async(i, o, n, t, op, x);
  }
  auto broadcast_async(const void* i, void* o, std::size_t n, kft::dtype t, int root, const kft::options& x = {}) {
    return g.broadcast_async(i, o, n, t, root, x);
  }
  auto reduce_scatter_async(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op,
                            const kft::options& x = {}) {
    return g.reduce_scatter_async(i, o, n, t, op, x);
  }
  auto allgather_async(const void* i, void* o, std::size_t n, kft::dtype t, const kft::options& x = {}) {
    return g.allgather_async(i, o, n, t, x);
  }
  auto barrier_async(const kft::options& x = {}) { return g.barrier_async(x); }
  void abort(std::string_view why) noexcept { g.abort(why); }
};
inline thread_local std::uint64_t device_uploads = 0, device_downloads = 0;
// sgd with a device optimizer's end_step(): the first parameter whose gradient was not finite.
struct sgd_with_end_step {
  kft::ddp::sgd s;
  std::size_t first_bad = std::numeric_limits<std::size_t>::max();
  void bind(std::span<const std::size_t> sizes) { s.bind(sizes); }
  void begin_step() {
    s.begin_step();
    first_bad = std::numeric_limits<std::size_t>::max();
  }
  bool step(std::size_t i, std::span<float> w, std::span<const float> g, float scale) {
    if (!s.step(i, w, g, scale)) first_bad = std::min(first_bad, i);
    return true;  // as on a device: the verdict comes from end_step()
  }
  std::size_t end_step() { return first_bad; }
  kft::ddp::optimizer_state& state() { return s.state(); }
  std::string name() const { return "sgd with end_step"; }
};
}  // namespace kft_test

template <>
struct kft::ddp::bucket_memory<kft_test::device_like_group> {
  static constexpr bool on_device = true;
  bucket_memory(kft_test::device_like_group&, void*) {}
  void* allocate(std::size_t bytes) { return std::calloc(1, std::max<std::size_t>(bytes, 64)); }
  static void release(void* p) noexcept { std::free(p); }
  void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  void upload(void* dst, const void* host, std::size_t bytes) {
    ++kft_test::device_uploads;
    std::memcpy(dst, host, bytes);
  }
  void download(void* host, const void* src, std::size_t bytes) const {
    ++kft_test::device_downloads;
    std::memcpy(host, src, bytes);
  }
  void before_launch() {}
  void after_finish() {}
};


// ---- ZeRO stage 1 -------------------------------------------------------------------------

namespace {

// A process group that counts the bytes each rank sends, in the bus model nccl-tests uses:
// allreduce 2 (N-1)/N of the buffer, reduce-scatter and allgather (N-1)/N of the whole, a
// broadcast the buffer. Everything else is forwarded.
struct counting_group {
  kft::group::process_group& g;
  double bytes = 0.0;
  int rank() const { return g.rank(); }
  int size() const { return g.size(); }
  std::uint64_t sequence() const { return g.sequence(); }
  std::string description() const { return g.description(); }
  void* allocate_shared(std::size_t b) { return g.allocate_shared(b); }
  kft::error_site next_site(kft::collective c) const { return g.next_site(c); }
  double frac() const { return static_cast<double>(g.size() - 1) / g.size(); }
  void add(double b) { bytes += b; }
  void allreduce(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& opt) {
    add(2 * frac() * static_cast<double>(n * kft::size_of(t)));
    g.allreduce(i, o, n, t, op, opt);
  }
  void broadcast(const void* i, void* o, std::size_t n, kft::dtype t, int root, const kft::options& opt) {
    add(static_cast<double>(n * kft::size_of(t)));
    g.broadcast(i, o, n, t, root, opt);
  }
  void reduce_scatter(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& opt) {
    add(frac() * static_cast<double>(n * g.size() * kft::size_of(t)));
    g.reduce_scatter(i, o, n, t, op, opt);
  }
  void allgather(const void* i, void* o, std::size_t n, kft::dtype t, const kft::options& opt) {
    add(frac() * static_cast<double>(n * g.size() * kft::size_of(t)));
    g.allgather(i, o, n, t, opt);
  }
  void barrier(const kft::options& opt) { g.barrier(opt); }
  void abort(std::string_view why) noexcept { g.abort(why); }
  auto allreduce_async(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& opt) {
    add(2 * frac() * static_cast<double>(n * kft::size_of(t)));
    return g.allreduce_async(i, o, n, t, op, opt);
  }
  auto broadcast_async(const void* i, void* o, std::size_t n, kft::dtype t, int root, const kft::options& opt) {
    add(static_cast<double>(n * kft::size_of(t)));
    return g.broadcast_async(i, o, n, t, root, opt);
  }
  auto reduce_scatter_async(const void* i, void* o, std::size_t n, kft::dtype t, kft::op_kind op, const kft::options& opt) {
    add(frac() * static_cast<double>(n * g.size() * kft::size_of(t)));
    return g.reduce_scatter_async(i, o, n, t, op, opt);
  }
  auto allgather_async(const void* i, void* o, std::size_t n, kft::dtype t, const kft::options& opt) {
    add(frac() * static_cast<double>(n * g.size() * kft::size_of(t)));
    return g.allgather_async(i, o, n, t, opt);
  }
  auto barrier_async(const kft::options& opt) { return g.barrier_async(opt); }
};
static_assert(kft::async_communicator<counting_group>);

struct zero_run {
  std::vector<float> params;
  std::uint64_t hash = 0;
  std::size_t state_bytes = 0;
  double bytes = 0.0;
  std::uint64_t resumed_from = 0;
};

// Trains small_model() for `steps` steps on `world` ranks; rank 0's results.
template <class Opt>
zero_run train_zero(int world, int zero, Opt make_opt, ddp::trainer_options o) {
  zero_run out;
  auto errs = with_ranks(world, [&](kft::group::process_group& pg) {
    counting_group g{pg};
    auto m = small_model();
    auto opt = make_opt();
    o.zero_stage = zero;
    o.quiet = true;
    ddp::trainer t(g, m, opt, o);
    const double before = g.bytes;  // (the start: broadcasts of parameters and state)
    const auto sum = t.fit(train_set().n, test_set().n);
    if (g.rank() == 0) {
      out.resumed_from = sum.resumed_from;
      out.params = flat(m);
      out.hash = t.parameters_hash();
      out.state_bytes = t.optimizer_state_bytes();
      out.bytes = g.bytes - before;
    }
  });
  BOOST_TEST(none(errs));
  return out;
}

auto make_sgd = [] { return ddp::sgd({.lr = 0.05f, .momentum = 0.9f}); };
auto make_adamw = [] { return ddp::adam({.lr = 0.01f, .weight_decay = 0.01f}); };

ddp::trainer_options zero_opts(std::uint64_t batch) {
  ddp::trainer_options o;
  o.batch = batch;
  o.epochs = 2;
  o.max_steps = 30;
  o.verify_every = 10;
  o.reducer.limits = {.first_bucket_bytes = 2048, .bucket_bytes_cap = 4096};  // several buckets, params split
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(zero1_ends_where_the_replicated_optimizer_ends) {
  for (int world : {2, 3}) {
    for (bool adam : {false, true}) {
      auto o = zero_opts(16);
      const auto rep = adam ? train_zero(world, 0, make_adamw, o) : train_zero(world, 0, make_sgd, o);
      const auto zero = adam ? train_zero(world, 1, make_adamw, o) : train_zero(world, 1, make_sgd, o);
      BOOST_REQUIRE(rep.params.size() == zero.params.size());
      double worst = 0, scale = 0;
      std::size_t bits = 0;
      for (std::size_t i = 0; i < rep.params.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(rep.params[i] - zero.params[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(rep.params[i])));
        bits += std::memcmp(&rep.params[i], &zero.params[i], 4) != 0;
      }
      BOOST_TEST_MESSAGE(world << " ranks, " << (adam ? "adamw" : "sgd") << ": ZeRO-1 vs replicated max |diff| "
                               << worst << ", " << bits << " of " << rep.params.size() << " values differ in a bit");
      BOOST_TEST(worst <= 1e-5 * scale, world << " ranks, " << (adam ? "adamw" : "sgd"));
    }
  }
  // Deterministic mode: the same bits, sharded or not, on 2 and 3 ranks.
  ddp::trainer_options o = zero_opts(16);
  o.deterministic = true;
  o.global_batch = 48;
  o.micro_shards = 6;
  const auto base = train_zero(1, 0, make_adamw, o);
  for (int world : {2, 3}) {
    const auto z = train_zero(world, 1, make_adamw, o);
    BOOST_TEST(z.hash == base.hash, "deterministic ZeRO-1 on " << world << " ranks vs 1 rank unsharded");
  }
}

BOOST_AUTO_TEST_CASE(zero1_holds_a_shard_of_the_state_and_moves_an_allreduces_bytes) {
  for (int world : {2, 3}) {
    auto o = zero_opts(16);
    const auto rep = train_zero(world, 0, make_adamw, o);
    const auto zero = train_zero(world, 1, make_adamw, o);
    // padding: at most N - 1 elements per bucket per state buffer
    const std::size_t slack = 2 * 16 * static_cast<std::size_t>(world) * sizeof(float);
    BOOST_TEST_MESSAGE(world << " ranks: optimizer state " << rep.state_bytes << " B replicated, " << zero.state_bytes
                             << " B with ZeRO-1 (1/N = " << rep.state_bytes / world << "); bytes sent per rank "
                             << rep.bytes << " vs " << zero.bytes << " (" << 100.0 * (zero.bytes / rep.bytes - 1.0) << "%)");
    BOOST_TEST(zero.state_bytes <= rep.state_bytes / static_cast<std::size_t>(world) + slack);
    BOOST_TEST(zero.state_bytes * static_cast<std::size_t>(world) >= rep.state_bytes);  // nothing left out
    BOOST_TEST(std::fabs(zero.bytes / rep.bytes - 1.0) <= 0.01);
  }
}

BOOST_AUTO_TEST_CASE(zero1_checkpoints_resume_on_1_and_3_ranks) {
  temp_dir d;
  auto opts = [&](std::uint64_t max_steps) {
    ddp::trainer_options o;
    o.deterministic = true;
    o.global_batch = 48;
    o.micro_shards = 6;
    o.epochs = 2;
    o.max_steps = max_steps;
    o.checkpoint_dir = d.path;
    o.checkpoint_every = 5;
    o.resume = true;
    o.reducer.limits = {.first_bucket_bytes = 2048, .bucket_bytes_cap = 4096};
    return o;
  };
  const auto unbroken = train_zero(2, 1, make_adamw, opts(24));
  fs::remove_all(d.path);
  train_zero(2, 1, make_adamw, opts(10));  // ZeRO-1 on 2 ranks writes step 10
  BOOST_TEST(ddp::checkpoint_steps(d.path).front() == 10u);
  const fs::path saved = d.path.string() + ".saved";
  fs::copy(d.path, saved);
  const auto one = train_zero(1, 0, make_adamw, opts(24));  // unsharded on 1 rank
  fs::remove_all(d.path);
  fs::copy(saved, d.path);
  const auto three = train_zero(3, 1, make_adamw, opts(24));  // sharded over 3
  fs::remove_all(saved);
  BOOST_TEST(one.resumed_from == 10u);  // (a fresh start would end with the same bits: deterministic mode)
  BOOST_TEST(three.resumed_from == 10u);
  BOOST_TEST(one.hash == unbroken.hash);
  BOOST_TEST(three.hash == unbroken.hash);
}

// The trainer over a device group takes its device branches (counters uploaded and
// downloaded, parameters downloaded to be hashed, the optimizer's verdict from end_step(),
// statistics over the host control group) and ends bit for bit where the host trainer ends
// on the same ranks, samples and order. CPUs stand in for the device here (device_like_group).
BOOST_AUTO_TEST_CASE(device_path_equals_the_host_path_bit_for_bit) {
  auto train = [](bool device, std::uint64_t& uploads, std::uint64_t& downloads) {
    std::vector<float> out;
    std::atomic<std::uint64_t> up{0}, down{0};
    auto errs = with_ranks(2, [&](kft::group::process_group& g) {
      auto m = small_model();
      ddp::trainer_options o;
      o.batch = 16;
      o.epochs = 1;
      o.max_steps = 20;
      o.quiet = true;
      o.verify_every = 5;
      kft_test::device_uploads = kft_test::device_downloads = 0;
      if (device) {
        kft_test::device_like_group dg{g};
        kft_test::sgd_with_end_step opt{ddp::sgd({.lr = 0.05f, .momentum = 0.9f}), {}};
        ddp::trainer t(dg, g, m, opt, o);
        static_assert(decltype(t)::on_device);
        t.fit(train_set().n, test_set().n);
      } else {
        ddp::sgd opt({.lr = 0.05f, .momentum = 0.9f});
        ddp::trainer t(g, m, opt, o);
        static_assert(!decltype(t)::on_device);
        t.fit(train_set().n, test_set().n);
      }
      up += kft_test::device_uploads;
      down += kft_test::device_downloads;
      if (g.rank() == 0) out = flat(m);
    });
    BOOST_TEST(none(errs));
    uploads = up;
    downloads = down;
    return out;
  };
  std::uint64_t hu = 0, hd = 0, du = 0, dd = 0;
  const auto host = train(false, hu, hd);
  const auto device = train(true, du, dd);
  BOOST_REQUIRE(!host.empty());
  BOOST_TEST((host == device));
  BOOST_TEST(hu + hd == 0u);   // the host path copies nothing
  BOOST_TEST(du >= 2u * 20u);  // the counters, every step on each of the 2 ranks
  BOOST_TEST(dd >= 2u * 20u);  // their sums back, and the parameters for every replica check
  BOOST_TEST_MESSAGE("device path: " << du << " uploads, " << dd << " downloads over 2 ranks x 20 steps");
}

BOOST_AUTO_TEST_CASE(device_path_names_a_non_finite_gradient_and_refuses_what_it_lacks) {
  // A gradient that is NaN while the loss is finite: the device optimizer's end_step() names it.
  struct nan_grad {
    fmnist::mlp m = small_model();
    int calls = 0;
    std::vector<ddp::tensor_ref> parameters() { return m.parameters(); }
    ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, ddp::gradients& g) {
      auto s = m.forward_backward(idx, g);
      if (++calls == 2) g[2][1] = std::numeric_limits<float>::infinity();
      return s;
    }
    ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) { return m.evaluate(idx); }
  };
  auto errs = with_ranks(2, [&](kft::group::process_group& g) {
    nan_grad m;
    kft_test::device_like_group dg{g};
    kft_test::sgd_with_end_step opt{ddp::sgd({.lr = 0.05f}), {}};
    ddp::trainer_options o;
    o.batch = 8;
    o.quiet = true;
    ddp::trainer t(dg, g, m, opt, o);
    std::vector<std::uint32_t> idx{1, 2, 3, 4, 5, 6, 7, 8};
    for (int s = 0; s < 4; ++s) t.step(idx);
  });
  for (const auto& e : errs) {
    BOOST_TEST(e.find("averaged gradient of 'fc2.weight'") != std::string::npos, e);
    BOOST_TEST(e.find("step 2") != std::string::npos, e);
  }
  // Options the device path does not have yet, each refused by name; and a control group that
  // is not the gradient group's ranks.
  struct refusal {
    const char* what;
    std::function<void(ddp::trainer_options&)> set;
  };
  temp_dir dir;
  const refusal rs[] = {
      {"deterministic mode", [](ddp::trainer_options& o) { o.deterministic = true; }},
      {"ZeRO stage 1", [](ddp::trainer_options& o) { o.zero_stage = 1; }},
      {"checkpointing", [&](ddp::trainer_options& o) { o.checkpoint_dir = dir.path; }},
      {"find_unused_parameters", [](ddp::trainer_options& o) { o.reducer.find_unused_parameters = true; }},
  };
  for (const auto& r : rs) {
    auto e = with_ranks(1, [&](kft::group::process_group& g) {
      auto m = small_model();
      kft_test::device_like_group dg{g};
      kft_test::sgd_with_end_step opt{ddp::sgd({.lr = 0.05f}), {}};
      ddp::trainer_options o;
      o.quiet = true;
      r.set(o);
      ddp::trainer t(dg, g, m, opt, o);
    });
    BOOST_TEST(e[0].find(r.what) != std::string::npos, e[0]);
    BOOST_TEST(e[0].find("not available on device buffers yet") != std::string::npos, e[0]);
  }
  auto e = with_ranks(2, [&](kft::group::process_group& g) {
    auto m = small_model();
    ddp::sgd opt({.lr = 0.05f});
    auto other = with_ranks(1, [&](kft::group::process_group& one) {
      ddp::trainer_options o;
      o.quiet = true;
      ddp::trainer t(g, one, m, opt, o);
    });
    if (!other[0].empty()) throw std::runtime_error(other[0]);
  });
  for (const auto& x : e) BOOST_TEST(x.find("the control group is rank 0 of 1") != std::string::npos, x);
}

