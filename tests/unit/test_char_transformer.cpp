// SPDX-License-Identifier: Apache-2.0
// Example 09's character-level GPT (examples/09-char-transformer/gpt.hpp) and its corpus reader:
// the analytic gradient of every tensor against central differences, the order of the
// gradients' hand-over (head first, embeddings last, each once), accumulation, the loss at
// initialisation, a few hundred Adam steps learning a repeated text, no heap allocation in a
// steady-state step, and the corpus's files, vocabulary, split and errors.
//
// Two cases run only when named (the PyTorch twin, tests/integration/char_transformer_twin.py,
// and a measurement by hand):
//   test_char_transformer --run_test=twin_dump -- --out FILE --config V,CTX,D,LAYERS,HEADS,BATCH,SEED[,PERTURB]
//   test_char_transformer --run_test=throughput -- [--batch 8] [--steps 10] [--threads 1]
// (PERTURB: not 0, the values after the initialisation are redrawn from that seed, as the
// gradient check does: gains 1 +- 0.3, the rest +-0.4.) twin_dump writes, little-endian:
// "KFTGPT01"; u32 vocab, ctx, d, layers, heads, stride; u64 seed; u32 token count, the training tokens (u8); u32 batch, the windows (u32 each); f64 loss_sum,
// f64 count, f64 correct; u32 parameters, then for each: u32 name length, the name, u64 size,
// its initial values (f32 x size), its gradient of the batch's mean loss (f32 x size).
#define BOOST_TEST_MODULE kft_char_transformer
#include <boost/test/unit_test.hpp>

#include <cblas.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include <kft/ddp/model.hpp>
#include <kft/ddp/sampler.hpp>

#include "../../examples/09-char-transformer/corpus.hpp"
#include "../../examples/09-char-transformer/gpt.hpp"

// The model's buffers are std::vectors: counting this thread's operator new calls sees any
// allocation a step makes.
#include "../common/alloc_counter.hpp"

namespace ddp = kft::ddp;
namespace fs = std::filesystem;
using chargpt::char_gpt;
using chargpt::gpt_config;

namespace {

struct one_blas_thread {
  one_blas_thread() { openblas_set_num_threads(1); }
};

// Gradient buffers for a model, and the order their ready() calls came in.
struct grad_set {
  std::vector<std::vector<float>> store;
  std::vector<std::span<float>> views;
  std::vector<std::size_t> order;
  explicit grad_set(char_gpt& m) {
    for (const auto& p : m.parameters()) store.emplace_back(p.value.size(), 0.0f);
    for (auto& s : store) views.emplace_back(s);
    order.reserve(4 * views.size());
  }
  ddp::gradients get(bool accumulate) {
    order.clear();
    auto record = [](void* self, std::size_t i) { static_cast<grad_set*>(self)->order.push_back(i); };
    return ddp::gradients(views, accumulate, record, this);
  }
  ddp::stats step(char_gpt& m, std::span<const std::uint32_t> samples, bool accumulate = false) {
    auto g = get(accumulate);
    return m.forward_backward(samples, g);
  }
};

std::vector<std::uint8_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  ddp::splitmix64 g{seed};
  std::vector<std::uint8_t> t(n);
  for (auto& x : t) x = static_cast<std::uint8_t>(g.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

std::vector<std::uint32_t> iota(std::uint32_t n) {
  std::vector<std::uint32_t> v(n);
  for (std::uint32_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Random values well away from the initialisation (gains 1 +- 0.3, the rest +-0.4: non-unit
// gains, non-zero biases), so that every path carries a gradient of a size that matters.
void perturb(char_gpt& m, std::uint64_t seed) {
  ddp::splitmix64 r{seed};
  for (auto& p : m.parameters()) {
    const bool gain = p.name.ends_with(".g");
    for (auto& v : p.value) {
      const float u = static_cast<float>(r.next() >> 40) / 16777216.0f * 2.0f - 1.0f;
      v = gain ? 1.0f + 0.3f * u : 0.4f * u;
    }
  }
}

// e's message holds both a and b.
bool says(const std::exception& e, const std::string& a, const std::string& b) {
  const std::string w = e.what();
  return w.find(a) != std::string::npos && w.find(b) != std::string::npos;
}

const gpt_config tiny{.vocab = 11, .ctx = 8, .d = 16, .layers = 2, .heads = 2, .seed = 7};

// The value after `--` named `flag` on the command line (the twin's and the measurement's options).
std::string option(const char* flag, std::string fallback) {
  auto& m = boost::unit_test::framework::master_test_suite();
  for (int i = 1; i + 1 < m.argc; ++i)
    if (std::strcmp(m.argv[i], flag) == 0) return m.argv[i + 1];
  return fallback;
}

}  // namespace

BOOST_GLOBAL_FIXTURE(one_blas_thread);

BOOST_AUTO_TEST_CASE(shapes_names_and_the_default_size) {
  const gpt_config def{};
  BOOST_TEST_MESSAGE(chargpt::describe(def));
  BOOST_TEST(chargpt::parameter_count(def) * 4 >= 10'000'000u, "the default has >= 10 MB of f32 gradients");
  const auto tokens = random_tokens(100, tiny.vocab, 1);
  char_gpt m(tiny, tokens, tokens);
  const auto ps = m.parameters();
  std::size_t sum = 0;
  for (const auto& p : ps) sum += p.value.size();
  BOOST_TEST(sum == chargpt::parameter_count(tiny));
  BOOST_TEST(m.parameter_count() == sum);
  BOOST_TEST(ps.size() == 2u + 12u * 2u + 4u);
  BOOST_TEST(ps.front().name == "tok_emb");
  BOOST_TEST(ps[4].name == "h0.attn.qkv.w");
  BOOST_TEST(ps.back().name == "head.b");
  BOOST_TEST(m.train_windows() == (100u - 9u) / 8u + 1u);
  // The same seed gives the same weights; another seed others.
  char_gpt same(tiny, tokens, tokens);
  auto other_cfg = tiny;
  other_cfg.seed = 8;
  char_gpt other(other_cfg, tokens, tokens);
  BOOST_TEST(std::equal(ps[4].value.begin(), ps[4].value.end(), same.parameters()[4].value.begin()));
  BOOST_TEST(!std::equal(ps[4].value.begin(), ps[4].value.end(), other.parameters()[4].value.begin()));
  // Errors that say what is wrong.
  auto bad = tiny;
  bad.heads = 3;
  BOOST_CHECK_EXCEPTION(char_gpt(bad, tokens, tokens), std::invalid_argument,
                        [](const std::exception& e) { return says(e, "d 16 is not", "multiple of heads 3"); });
  auto small = tiny;
  small.vocab = 5;
  BOOST_CHECK_EXCEPTION(char_gpt(small, tokens, tokens), std::invalid_argument,
                        [](const std::exception& e) { return says(e, "training token", "not below vocab 5"); });
  const std::uint32_t past[] = {static_cast<std::uint32_t>(m.valid_windows())};
  BOOST_CHECK_EXCEPTION(m.evaluate(past), std::out_of_range,
                        [](const std::exception& e) { return says(e, "validation window 12", "of 12"); });
}

BOOST_AUTO_TEST_CASE(gradients_match_central_differences) {
  const auto tokens = random_tokens(3 * 8 + 1, tiny.vocab, 11);
  char_gpt m(tiny, tokens, tokens);
  perturb(m, 99);  // gradients of a size finite differences in float can resolve
  auto ps = m.parameters();
  ddp::splitmix64 r{98};
  const auto all = iota(static_cast<std::uint32_t>(m.train_windows()));
  BOOST_REQUIRE(all.size() == 3u);
  grad_set gs(m);
  gs.step(m, all);
  auto loss = [&] {
    const auto s = m.evaluate(all);  // the validation tokens are the training tokens here
    return s.loss_sum / s.count;
  };
  const double base = loss();
  BOOST_TEST_MESSAGE("loss " << base);
  const float eps = 1e-2f;
  double worst = 0.0;
  std::string worst_name;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto& grad = gs.store[i];
    // The largest element and a few drawn at random.
    std::vector<std::size_t> at{static_cast<std::size_t>(
        std::max_element(grad.begin(), grad.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
        grad.begin())};
    for (int k = 0; k < 6; ++k) at.push_back(static_cast<std::size_t>(r.below(grad.size())));
    for (const std::size_t j : at) {
      float& w = ps[i].value[j];
      const float keep = w;
      w = keep + eps;
      const double up = loss();
      w = keep - eps;
      const double down = loss();
      w = keep;
      const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
      const double analytic = grad[j];
      // Relative, with a floor: float's rounding in the loss (~1e-7 of it) over 2 eps.
      const double err = std::fabs(numeric - analytic) / std::max({std::fabs(numeric), std::fabs(analytic), 1e-3});
      if (err > worst) worst = err, worst_name = ps[i].name + "[" + std::to_string(j) + "]";
      BOOST_TEST(err < 1e-2, ps[i].name << "[" << j << "]: analytic " << analytic << ", numeric " << numeric);
      ++checked;
    }
  }
  BOOST_TEST_MESSAGE(checked << " elements checked; worst relative error " << worst << " at " << worst_name);
}

BOOST_AUTO_TEST_CASE(each_gradient_is_ready_once_head_first_embeddings_last) {
  const auto tokens = random_tokens(50, tiny.vocab, 2);
  char_gpt m(tiny, tokens, tokens);
  const auto ps = m.parameters();
  grad_set gs(m);
  const std::uint32_t batch[] = {0, 2, 4};
  for (int rep = 0; rep < 2; ++rep) {
    gs.step(m, batch, rep == 1);
    const auto& o = gs.order;
    BOOST_REQUIRE(o.size() == ps.size());
    std::vector<int> seen(ps.size(), 0);
    for (const auto i : o) ++seen[i];
    BOOST_TEST(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }), "every parameter exactly once");
    BOOST_TEST(ps[o.front()].name == "head.w");
    BOOST_TEST(ps[o[1]].name == "head.b");
    BOOST_TEST(ps[o[2]].name == "ln_f.g");
    BOOST_TEST(ps[o[o.size() - 2]].name == "tok_emb");
    BOOST_TEST(ps[o.back()].name == "pos_emb");
    // Block h1 entirely before block h0, each from its MLP back to its first LayerNorm.
    std::vector<std::string> names;
    for (const auto i : o) names.push_back(ps[i].name);
    const auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
    BOOST_TEST(pos("h1.ln1.b") < pos("h0.mlp.proj.w"));
    BOOST_TEST(pos("h1.mlp.proj.w") < pos("h1.attn.qkv.w"));
    BOOST_TEST(pos("h0.ln1.b") < pos("tok_emb"));
  }
}

BOOST_AUTO_TEST_CASE(accumulate_adds_to_the_gradients) {
  const auto tokens = random_tokens(60, tiny.vocab, 3);
  char_gpt m(tiny, tokens, tokens);
  const std::uint32_t a[] = {1, 3}, b[] = {0, 5, 6};
  grad_set only_b(m), both(m);
  only_b.step(m, b);
  both.step(m, a);
  const auto first = both.store;
  both.step(m, b, true);
  double worst = 0.0;
  for (std::size_t i = 0; i < both.store.size(); ++i)
    for (std::size_t j = 0; j < both.store[i].size(); ++j) {
      const double want = static_cast<double>(first[i][j]) + only_b.store[i][j];
      worst = std::max(worst, std::fabs(both.store[i][j] - want) / std::max(std::fabs(want), 1e-6));
    }
  BOOST_TEST(worst < 1e-5, "accumulated gradient vs the sum of the two: worst relative difference " << worst);
  // Without accumulate the buffers are overwritten, whatever they held.
  for (auto& s : both.store) std::fill(s.begin(), s.end(), 1e6f);
  both.step(m, b);
  BOOST_TEST(both.store == only_b.store);
}

BOOST_AUTO_TEST_CASE(loss_at_initialisation_is_about_log_vocab) {
  const gpt_config c{.vocab = 65, .ctx = 32, .d = 64, .layers = 2, .heads = 4, .seed = 3};
  const auto tokens = random_tokens(8 * 32 + 1, c.vocab, 4);
  char_gpt m(c, tokens, tokens);
  grad_set gs(m);
  const auto all = iota(static_cast<std::uint32_t>(m.train_windows()));
  const auto s = gs.step(m, all);
  BOOST_TEST(s.count == 8.0 * 32.0);
  BOOST_TEST(std::fabs(s.mean_loss() - std::log(65.0)) < 0.02, "loss " << s.mean_loss() << ", log(65) " << std::log(65.0));
  const auto e = m.evaluate(all);
  BOOST_TEST(std::fabs(e.loss_sum - s.loss_sum) < 1e-9 * s.loss_sum, "evaluate measures what training did");
  BOOST_TEST(e.values[0] == s.values[0]);
}

BOOST_AUTO_TEST_CASE(adam_learns_a_repeated_text) {
  std::string text;
  while (text.size() < 4000) text += "the quick brown fox jumps over the lazy dog. ";
  const auto c = chargpt::corpus_of(std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  const gpt_config cfg{.vocab = c.vocab.size(), .ctx = 16, .d = 32, .layers = 2, .heads = 2, .seed = 5, .stride = 1};
  char_gpt m(cfg, c.train, c.valid);
  auto ps = m.parameters();
  grad_set gs(m);
  std::vector<std::vector<float>> m1, m2;
  for (const auto& s : gs.store) m1.emplace_back(s.size(), 0.0f), m2.emplace_back(s.size(), 0.0f);
  ddp::splitmix64 r{17};
  std::vector<std::uint32_t> batch(16);
  const double log_v = std::log(static_cast<double>(cfg.vocab));
  double first = 0.0, last = 0.0;
  const int steps = 300;
  for (int step = 1; step <= steps; ++step) {
    for (auto& x : batch) x = static_cast<std::uint32_t>(r.below(m.train_windows()));
    const auto s = gs.step(m, batch);
    if (step == 1) first = s.mean_loss();
    last = s.mean_loss();
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.999f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(step)), c2 = 1.0f - std::pow(b2, static_cast<float>(step));
    for (std::size_t i = 0; i < ps.size(); ++i)
      for (std::size_t j = 0; j < ps[i].value.size(); ++j) {
        const float g = gs.store[i][j];
        m1[i][j] = b1 * m1[i][j] + (1 - b1) * g;
        m2[i][j] = b2 * m2[i][j] + (1 - b2) * g * g;
        ps[i].value[j] -= lr * (m1[i][j] / c1) / (std::sqrt(m2[i][j] / c2) + 1e-8f);
      }
  }
  const auto v = m.evaluate(iota(static_cast<std::uint32_t>(std::min<std::size_t>(m.valid_windows(), 64))));
  BOOST_TEST_MESSAGE("vocab " << cfg.vocab << " (log " << log_v << "): loss " << first << " at step 1, " << last
                              << " at step " << steps << ", validation " << v.mean_loss() << ", accuracy "
                              << v.values[0] / v.count);
  BOOST_TEST(first > 0.9 * log_v);
  BOOST_TEST(v.mean_loss() < 0.25 * log_v, "validation loss " << v.mean_loss() << " against log(vocab) " << log_v);
  BOOST_TEST(v.values[0] / v.count > 0.8, "validation accuracy " << v.values[0] / v.count);
  // generate(): the likeliest continuation of a prompt is the text the model learned; a draw at
  // temperature 1 is the same for the same seed, and holds only tokens of the vocabulary.
  const auto prompt = c.vocab.encode("the quick brown ");
  const std::string greedy = c.vocab.decode(m.generate(prompt, 24, 1, 0.0f));
  int same = 0;
  for (std::size_t i = 0; i < greedy.size(); ++i) same += greedy[i] == "fox jumps over the lazy "[i];
  BOOST_TEST(same >= 20, "greedy continuation '" << greedy << "'");
  const auto a = m.generate(prompt, 40, 7), b = m.generate(prompt, 40, 7);
  BOOST_TEST(a == b);
  BOOST_TEST(a.size() == 40u);
  for (const auto t : a) BOOST_TEST(t < cfg.vocab);
  BOOST_CHECK_THROW(m.generate({}, 5, 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(validation_windows_follow_their_own_stride) {
  const gpt_config c{.vocab = 19, .ctx = 16, .d = 32, .layers = 1, .heads = 2, .seed = 3};
  const auto tokens = random_tokens(400, c.vocab, 8);
  gpt_config spread = c, dense = c;
  spread.valid_stride = 7;
  dense.valid_stride = 1;
  char_gpt a(spread, tokens, tokens), b(dense, tokens, tokens);
  BOOST_TEST(a.train_windows() == (400u - 17u) / 16u + 1u);  // training windows keep stride = ctx
  BOOST_TEST(a.valid_windows() == (400u - 17u) / 7u + 1u);
  BOOST_TEST(b.valid_windows() == 400u - 16u);
  const std::uint32_t three[] = {3}, twenty_one[] = {21};  // both start at token 21
  BOOST_TEST(a.evaluate(three).loss_sum == b.evaluate(twenty_one).loss_sum);
  const std::uint32_t past[] = {static_cast<std::uint32_t>(a.valid_windows())};
  BOOST_CHECK_THROW(a.evaluate(past), std::out_of_range);
}

BOOST_AUTO_TEST_CASE(a_steady_state_step_allocates_nothing) {
  const gpt_config c{.vocab = 23, .ctx = 16, .d = 32, .layers = 2, .heads = 4, .seed = 9};
  const auto tokens = random_tokens(40 * 16 + 1, c.vocab, 6);
  char_gpt m(c, tokens, tokens);
  grad_set gs(m);
  const std::uint32_t eight[] = {0, 3, 5, 7, 11, 13, 17, 19}, three[] = {2, 4, 6};
  const auto all = iota(static_cast<std::uint32_t>(m.valid_windows()));
  gs.step(m, eight);  // the first step at the largest batch sizes the buffers
  const long before = kft_test::thread_allocations;
  for (int s = 0; s < 5; ++s) {
    auto g = gs.get(s % 2 == 1);
    m.forward_backward(eight, g);
    auto h = gs.get(false);
    m.forward_backward(three, h);
  }
  const auto e = m.evaluate(all);  // in parts of at most 8 windows
  const long during = kft_test::thread_allocations - before;
  BOOST_TEST(e.count == static_cast<double>(all.size() * 16));
  BOOST_TEST(during == 0, "heap allocations in 10 steps and an evaluation: " << during);
  // The counter is live: a bigger batch grows the buffers.
  std::vector<std::uint32_t> nine(eight, eight + 8);
  nine.push_back(21);
  const long grown0 = kft_test::thread_allocations;
  gs.step(m, nine);
  BOOST_TEST(kft_test::thread_allocations - grown0 > 1);
}

namespace {

// A directory removed at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("kft-corpus-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path put(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(corpus_files_vocabulary_split_and_errors) {
  temp_dir d;
  d.put("b-second", "klmnopqrst");
  d.put("a-first", "0123456789");
  d.put("a-first.dat", "INDEX");
  d.put("a-first.u8", "UTF8");
  fs::create_directories(d.path / "sub");
  const auto c = chargpt::read_corpus(d.path);
  BOOST_REQUIRE(c.files.size() == 2u);
  BOOST_TEST(c.files[0].filename() == "a-first");
  BOOST_TEST(c.files[1].filename() == "b-second");
  BOOST_TEST(c.vocab.size() == 20);
  BOOST_TEST(c.vocab.bytes.front() == '0');
  BOOST_TEST(c.vocab.bytes.back() == 't');
  BOOST_TEST(c.train.size() == 18u);
  BOOST_TEST(c.valid.size() == 2u);
  BOOST_TEST(c.vocab.decode(c.train) + c.vocab.decode(c.valid) == "0123456789klmnopqrst");
  BOOST_TEST(c.vocab.encode(std::string_view("0t")) == (std::vector<std::uint8_t>{0, 19}));
  BOOST_CHECK_EXCEPTION(c.vocab.encode(std::string_view("z")), std::invalid_argument,
                        [](const std::exception& e) { return says(e, "byte 122", "not in it"); });
  // One file alone; several paths in order.
  BOOST_TEST(chargpt::read_corpus(d.path / "b-second").bytes() == 10u);
  const auto two = chargpt::read_corpus(std::vector<fs::path>{d.path / "b-second", d.path / "a-first"}, 0.5);
  BOOST_TEST(two.vocab.decode(two.train) == "klmnopqrst");
  // Errors name the path.
  const auto missing = (d.path / "nothing-here").string();
  BOOST_CHECK_EXCEPTION(chargpt::read_corpus(missing), std::runtime_error,
                        [&](const std::exception& e) { return says(e, missing, "no such file"); });
  const auto empty = d.put("c-empty", "").string();
  BOOST_CHECK_EXCEPTION(chargpt::read_corpus(d.path), std::runtime_error,
                        [&](const std::exception& e) { return says(e, empty, "empty"); });
  BOOST_CHECK_EXCEPTION(chargpt::read_corpus(d.path / "sub"), std::runtime_error,
                        [&](const std::exception& e) { return says(e, (d.path / "sub").string(), "without text files"); });
}

// For the PyTorch twin: see the file comment for the options and the format.
BOOST_AUTO_TEST_CASE(twin_dump, *boost::unit_test::disabled()) {
  const std::string out = option("--out", "");
  BOOST_REQUIRE_MESSAGE(!out.empty(), "--out FILE is required after --");
  int v[8] = {};
  const std::string spec = option("--config", "11,8,16,2,2,3,7");
  const int got =
      std::sscanf(spec.c_str(), "%d,%d,%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
  BOOST_REQUIRE_MESSAGE(got == 7 || got == 8, "--config V,CTX,D,LAYERS,HEADS,BATCH,SEED[,PERTURB]: " << spec);
  const gpt_config c{.vocab = v[0], .ctx = v[1], .d = v[2], .layers = v[3], .heads = v[4],
                     .seed = static_cast<std::uint64_t>(v[6])};
  const auto batch = static_cast<std::uint32_t>(v[5]);
  // Windows 0, 2, 4, ... of random tokens (every other one, so the batch is not the whole text).
  const auto tokens = random_tokens(static_cast<std::size_t>(2 * batch) * static_cast<std::size_t>(c.ctx) + 1, c.vocab,
                                    static_cast<std::uint64_t>(v[6]) + 1000);
  char_gpt m(c, tokens, tokens);
  std::vector<std::uint32_t> samples;
  for (std::uint32_t i = 0; i < batch; ++i) samples.push_back(2 * i);
  if (v[7] != 0) perturb(m, static_cast<std::uint64_t>(v[7]));
  const auto ps = m.parameters();
  std::vector<std::vector<float>> init;
  for (const auto& p : ps) init.emplace_back(p.value.begin(), p.value.end());
  grad_set gs(m);
  const auto s = gs.step(m, samples);
  std::ofstream f(out, std::ios::binary);
  auto u32 = [&](std::uint32_t x) { f.write(reinterpret_cast<const char*>(&x), 4); };
  auto f64 = [&](double x) { f.write(reinterpret_cast<const char*>(&x), 8); };
  f.write("KFTGPT01", 8);
  for (const int x : {c.vocab, c.ctx, c.d, c.layers, c.heads, m.config().stride}) u32(static_cast<std::uint32_t>(x));
  f.write(reinterpret_cast<const char*>(&c.seed), 8);
  u32(static_cast<std::uint32_t>(tokens.size()));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size()));
  u32(batch);
  f.write(reinterpret_cast<const char*>(samples.data()), static_cast<std::streamsize>(4 * samples.size()));
  f64(s.loss_sum);
  f64(s.count);
  f64(s.values[0]);
  u32(static_cast<std::uint32_t>(ps.size()));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    u32(static_cast<std::uint32_t>(ps[i].name.size()));
    f.write(ps[i].name.data(), static_cast<std::streamsize>(ps[i].name.size()));
    const std::uint64_t n = init[i].size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(reinterpret_cast<const char*>(init[i].data()), static_cast<std::streamsize>(4 * n));
    f.write(reinterpret_cast<const char*>(gs.store[i].data()), static_cast<std::streamsize>(4 * n));
  }
  BOOST_REQUIRE_MESSAGE(f.good(), "cannot write " << out);
  BOOST_TEST_MESSAGE(chargpt::describe(c) << ": batch " << batch << ", mean loss " << s.mean_loss() << " -> " << out);
}

// Steps per second of forward_backward at the default config (a measurement, by hand).
BOOST_AUTO_TEST_CASE(throughput, *boost::unit_test::disabled()) {
  const int batch = std::stoi(option("--batch", "8")), steps = std::stoi(option("--steps", "10"));
  openblas_set_num_threads(std::stoi(option("--threads", "1")));
  gpt_config c{};
  c.vocab = 96;
  const auto tokens = random_tokens(static_cast<std::size_t>(batch) * 4 * static_cast<std::size_t>(c.ctx) + 1, c.vocab, 1);
  char_gpt m(c, tokens, tokens);
  grad_set gs(m);
  std::vector<std::uint32_t> samples(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<std::uint32_t>(i);
  gs.step(m, samples);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) gs.step(m, samples);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto e0 = std::chrono::steady_clock::now();
  m.evaluate(samples);
  const double eval = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
  std::printf("%s\nbatch %d x %d tokens, %d BLAS thread(s): %.3f s per forward_backward, %.2f steps/s, %.0f tokens/s; "
              "forward alone %.3f s\n",
              chargpt::describe(c).c_str(), batch, c.ctx, openblas_get_num_threads(), secs / steps, steps / secs,
              steps * batch * c.ctx / secs, eval);
}
