// SPDX-License-Identifier: Apache-2.0
// The DDP trainer and its parts: the distributed sampler, the optimizers, checkpoint files, the
// IDX reader, and the trainer itself with ranks as threads over the shared-memory transport
// (equivalence with one rank, deterministic mode across world sizes and bucket caps, uneven
// inputs, resume on another number of ranks, NaN and desync detection).
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

using namespace std::chrono_literals;
namespace ddp = kft::ddp;
namespace fs = std::filesystem;

namespace {

std::atomic<int> segment_counter{0};

std::vector<std::string> with_ranks(int p, const std::function<void(kft::group::process_group&)>& body) {
  return kft_test::with_shm_ranks(p, body, {.pool = 16u << 20, .timeout = 60s});
}

bool none(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    if (!e.empty()) {
      BOOST_TEST_MESSAGE("rank error: " << e);
      return false;
    }
  return true;
}

struct fixture {
  fixture() { openblas_set_num_threads(1); }  // ranks are threads: one BLAS thread each
};
BOOST_GLOBAL_FIXTURE(fixture);

// A small problem: 32-pixel synthetic "images", an MLP 32-24-16-10.
const fmnist::dataset& train_set() {
  static const fmnist::dataset d = fmnist::synthetic(1000, 32, 7);
  return d;
}
const fmnist::dataset& test_set() {
  static const fmnist::dataset d = fmnist::synthetic(300, 32, 8);
  return d;
}
fmnist::mlp small_model() { return fmnist::mlp({32, 24, 16, 10}, &train_set(), &test_set(), 11); }

std::vector<float> flat(fmnist::mlp& m) {
  std::vector<float> v;
  for (auto& t : m.parameters()) v.insert(v.end(), t.value.begin(), t.value.end());
  return v;
}

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("kft-trainer-" + std::to_string(::getpid()) + "-" + std::to_string(segment_counter++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

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
