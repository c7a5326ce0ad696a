// SPDX-License-Identifier: Apache-2.0
// gpt.hpp: a character-level GPT (a decoder-only transformer) over byte tokens, its matrix
// products through CBLAS (OpenBLAS), written as a kft::ddp::model (kft/ddp/model.hpp).
//
// The model (GPT-2's layout, pre-LayerNorm):
//
//     x = tok_emb[token] + pos_emb[t]                       tok_emb [vocab x d], pos_emb [ctx x d]
//     for each block l (h0 .. h{L-1}):
//       x += attn(LN1(x))     qkv = LN1(x) W_qkv + b_qkv    [d x 3d]; H heads of d/H, causal,
//                             softmax(q k^T / sqrt(d/H)) v, then y W_proj + b_proj [d x d]
//       x += mlp(LN2(x))      GELU(LN2(x) W_fc + b_fc) W_proj + b_proj   [d x 4d], [4d x d]
//     logits = LN_f(x) W_head + b_head                      [d x vocab], not tied to tok_emb
//
// with LayerNorm eps 1e-5 and GELU's tanh approximation (torch's approximate='tanh'). The loss
// is the mean cross-entropy of the next token over all B x ctx positions of a batch.
//
// Parameters, in parameters() order (names as the PyTorch twin's named_parameters(),
// examples/09-char-transformer/char_gpt.py): tok_emb, pos_emb, then per block h<l>.ln1.g,
// .ln1.b, .attn.qkv.w, .attn.qkv.b, .attn.proj.w, .attn.proj.b, .ln2.g, .ln2.b, .mlp.fc.w,
// .mlp.fc.b, .mlp.proj.w, .mlp.proj.b, then ln_f.g, ln_f.b, head.w, head.b. A weight `w` is
// [in x out], row-major (y = x w + b). Initialisation, the same on every rank: tensor i's
// generator is splitmix64 seeded with seed ^ ((i + 1) * 0x9E3779B97F4A7C15); weights and
// embeddings are normal(0, 0.02) by Box-Muller (two draws per value: u1 = ((a >> 11) + 1) 2^-53,
// u2 = (b >> 11) 2^-53, z = sqrt(-2 ln u1) cos(2 pi u2), rounded to float after * 0.02), biases
// 0, LayerNorm gains 1.
//
// Data: a token array (ids < vocab) for training and one for validation, not copied (they
// must outlive the model). Training sample i is the window at token i * stride (stride = ctx
// unless the config says otherwise) of ctx + 1 tokens: inputs the first ctx, targets the last
// ctx; validation sample i the window at token i * valid_stride (0: stride), so a few windows
// can be spread over the whole validation text.
// Activations are [B*ctx x width] row-major, row b*ctx + t; attention probabilities
// [B x H x ctx x ctx].
//
// Compute: every matrix product is one cblas_sgemm (attention: per window and head, on strided
// views of the qkv rows, no copies); the rest are plain loops. Buffers are sized on the first
// batch and grow only when a bigger one comes: a step allocates nothing after that, and
// evaluate() works through its samples in batches of at most that size. OpenBLAS's thread count
// is the caller's to set (openblas_set_num_threads), as in example 05.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kft/ddp/model.hpp>
#include <kft/ddp/sampler.hpp>

namespace chargpt {

/// The shape of a char_gpt. The default has about 3.2 M parameters (12-13 MB of f32 gradients).
struct gpt_config {
  int vocab = 256;   ///< token ids 0 .. vocab-1 (at most 256: tokens are bytes)
  int ctx = 128;     ///< tokens a window predicts (its inputs; it reads ctx + 1)
  int d = 256;       ///< model width
  int layers = 4;    ///< transformer blocks
  int heads = 8;     ///< attention heads (d % heads == 0)
  std::uint64_t seed = 1;
  int stride = 0;    ///< tokens between training windows' starts; 0: ctx
  int valid_stride = 0;  ///< tokens between validation windows' starts; 0: stride
};

/// Parameters of a model of this shape.
inline std::size_t parameter_count(const gpt_config& c) {
  const std::size_t d = static_cast<std::size_t>(c.d), v = static_cast<std::size_t>(c.vocab);
  const std::size_t block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return v * d + static_cast<std::size_t>(c.ctx) * d + static_cast<std::size_t>(c.layers) * block + 2 * d + d * v + v;
}

/// One line: the shape, the parameter count and the gradient bytes.
inline std::string describe(const gpt_config& c) {
  const std::size_t n = parameter_count(c);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "char_gpt: vocab %d, ctx %d, d %d, %d layers x %d heads: %zu parameters (%.1f MB of f32 gradients)",
                c.vocab, c.ctx, c.d, c.layers, c.heads, n, static_cast<double>(n) * 4.0 / 1e6);
  return buf;
}

namespace detail {

constexpr float ln_eps = 1e-5f;

// out[n x m] (+)= in[n x k] w[k x m]
inline void gemm_nn(int n, int m, int k, const float* in, const float* w, float beta, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0f, in, k, w, m, beta, out, m);
}
// dw[k x m] (+)= in[n x k]^T dout[n x m]
inline void gemm_tn(int n, int m, int k, const float* in, const float* dout, float beta, float* dw) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, m, n, 1.0f, in, k, dout, m, beta, dw, m);
}
// din[n x k] = dout[n x m] w[k x m]^T
inline void gemm_nt(int n, int m, int k, const float* dout, const float* w, float* din) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, k, m, 1.0f, dout, m, w, m, 0.0f, din, k);
}

// out[r] += b for every row r of out [n x m].
inline void add_rows(float* out, int n, int m, const float* b) {
  for (int r = 0; r < n; ++r) {
    float* o = out + static_cast<std::size_t>(r) * m;
    for (int c = 0; c < m; ++c) o[c] += b[c];
  }
}

// db (+)= the column sums of g [n x m].
inline void column_sums(const float* g, int n, int m, float* db, bool accumulate) {
  if (!accumulate) std::fill(db, db + m, 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* row = g + static_cast<std::size_t>(r) * m;
    for (int c = 0; c < m; ++c) db[c] += row[c];
  }
}

// y = LN(x) g + b over rows of width d; keeps each row's mean and 1/std.
inline void layernorm(const float* x, int n, int d, const float* g, const float* b, float* y, float* mean, float* rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int r = 0; r < n; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * d;
    float* yr = y + static_cast<std::size_t>(r) * d;
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s += xr[c];
    const float m = s * inv_d;
    float v = 0.0f;
    for (int c = 0; c < d; ++c) v += (xr[c] - m) * (xr[c] - m);
    const float rs = 1.0f / std::sqrt(v * inv_d + ln_eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int c = 0; c < d; ++c) yr[c] = (xr[c] - m) * rs * g[c] + b[c];
  }
}

// Backward of layernorm: dx += d(x) from dy; dg, db (+)= (zeroed first unless accumulating).
inline void layernorm_backward(const float* x, const float* mean, const float* rstd, const float* g, const float* dy,
                               int n, int d, float* dx, float* dg, float* db, bool accumulate) {
  if (!accumulate) {
    std::fill(dg, dg + d, 0.0f);
    std::fill(db, db + d, 0.0f);
  }
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int r = 0; r < n; ++r) {
    const std::size_t o = static_cast<std::size_t>(r) * d;
    const float* xr = x + o;
    const float* dyr = dy + o;
    float* dxr = dx + o;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;  // sums of dy*g and dy*g*xhat
    for (int c = 0; c < d; ++c) {
      const float xh = (xr[c] - m) * rs;
      const float dyg = dyr[c] * g[c];
      a += dyg;
      b += dyg * xh;
      dg[c] += dyr[c] * xh;
      db[c] += dyr[c];
    }
    a *= inv_d;
    b *= inv_d;
    for (int c = 0; c < d; ++c) dxr[c] += rs * (dyr[c] * g[c] - a - (xr[c] - m) * rs * b);
  }
}

// e^x to about 2 ulp (Cephes' expf; x clamped to [-87, 88]), in plain arithmetic the compiler
// can vectorise (glibc's expf and tanhf are calls it cannot). The clamp compares the bits:
// float comparisons keep GCC from vectorising the loop under its default -ftrapping-math.
inline float exp_approx(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  u = u > 0xC2AE0000u ? 0xC2AE0000u : u;                            // below -87: sign set, larger magnitude
  u = static_cast<std::int32_t>(u) > 0x42B00000 ? 0x42B00000u : u;  // above 88
  x = std::bit_cast<float>(u);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;             // x - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)) with u = k0 (x + k1 x^3), computed as
// x s with s = sigmoid(2u) = (1 + tanh(u)) / 2 (no cancellation where tanh(u) is near -1).
constexpr float gelu_k0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float gelu_k1 = 0.044715f;

}  // namespace detail

class char_gpt {
 public:
  /// `train` and `valid` hold token ids (< c.vocab); they are read, not copied.
  char_gpt(gpt_config c, std::span<const std::uint8_t> train, std::span<const std::uint8_t> valid)
      : c_(c), train_(train), valid_(valid) {
    if (c_.stride == 0) c_.stride = c_.ctx;
    if (c_.valid_stride == 0) c_.valid_stride = c_.stride;
    auto bad = [](const std::string& why) { throw std::invalid_argument("char_gpt: " + why); };
    if (c_.vocab < 1 || c_.vocab > 256) bad("vocab " + std::to_string(c_.vocab) + ": 1 to 256 (tokens are bytes)");
    if (c_.ctx < 1 || c_.d < 1 || c_.layers < 1 || c_.heads < 1 || c_.stride < 1 || c_.valid_stride < 1)
      bad("ctx, d, layers, heads and strides must be positive");
    if (c_.d % c_.heads != 0)
      bad("d " + std::to_string(c_.d) + " is not a multiple of heads " + std::to_string(c_.heads));
    for (auto [tokens, what] : {std::pair{train_, "training"}, std::pair{valid_, "validation"}}) {
      const auto mx = std::max_element(tokens.begin(), tokens.end());
      if (mx != tokens.end() && *mx >= c_.vocab)
        bad(std::string(what) + " token " + std::to_string(*mx) + " is not below vocab " + std::to_string(c_.vocab));
    }
    hd_ = c_.d / c_.heads;
    const std::size_t d = static_cast<std::size_t>(c_.d), v = static_cast<std::size_t>(c_.vocab);
    add("tok_emb", v * d);
    add("pos_emb", static_cast<std::size_t>(c_.ctx) * d);
    for (int l = 0; l < c_.layers; ++l) {
      const std::string h = "h" + std::to_string(l) + ".";
      add(h + "ln1.g", d);
      add(h + "ln1.b", d);
      add(h + "attn.qkv.w", d * 3 * d);
      add(h + "attn.qkv.b", 3 * d);
      add(h + "attn.proj.w", d * d);
      add(h + "attn.proj.b", d);
      add(h + "ln2.g", d);
      add(h + "ln2.b", d);
      add(h + "mlp.fc.w", d * 4 * d);
      add(h + "mlp.fc.b", 4 * d);
      add(h + "mlp.proj.w", 4 * d * d);
      add(h + "mlp.proj.b", d);
    }
    add("ln_f.g", d);
    add("ln_f.b", d);
    add("head.w", d * v);
    add("head.b", v);
    values_.assign(total_, 0.0f);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const std::string& n = slots_[i].name;
      float* p = values_.data() + slots_[i].offset;
      const bool gain = n.ends_with(".g"), bias = n.ends_with(".b");
      if (gain) std::fill(p, p + slots_[i].size, 1.0f);
      if (gain || bias) continue;
      kft::ddp::splitmix64 g{c_.seed ^ ((i + 1) * 0x9E3779B97F4A7C15ull)};
      for (std::size_t k = 0; k < slots_[i].size; ++k) {
        const double u1 = static_cast<double>((g.next() >> 11) + 1) * 0x1p-53;
        const double u2 = static_cast<double>(g.next() >> 11) * 0x1p-53;
        p[k] = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      }
    }
  }

  const gpt_config& config() const noexcept { return c_; }
  std::size_t parameter_count() const noexcept { return total_; }
  /// Windows of ctx + 1 tokens in the training / validation tokens.
  std::size_t train_windows() const noexcept { return windows(train_, c_.stride); }
  std::size_t valid_windows() const noexcept { return windows(valid_, c_.valid_stride); }

  std::vector<kft::ddp::tensor_ref> parameters() {
    std::vector<kft::ddp::tensor_ref> p;
    p.reserve(slots_.size());
    for (const auto& s : slots_) p.push_back({s.name, std::span<float>(values_.data() + s.offset, s.size)});
    return p;
  }

  std::vector<kft::ddp::metric> metrics() const { return {{"accuracy"}}; }

  /// Trains on windows `samples` of the training tokens: the gradient of the mean token loss
  /// into `g`, each parameter handed over (g.ready) as soon as it is final.
  kft::ddp::stats forward_backward(std::span<const std::uint32_t> samples, kft::ddp::gradients& g) {
    if (g.size() != slots_.size())
      throw std::invalid_argument("char_gpt: " + std::to_string(g.size()) + " gradient buffers for " +
                                  std::to_string(slots_.size()) + " parameters");
    const int b = static_cast<int>(samples.size());
    reserve(b);
    load(train_, c_.stride, samples, "training");
    const kft::ddp::stats s = forward(b, true);
    backward(b, g);
    return s;
  }

  /// The loss and next-token accuracy on windows `samples` of the validation tokens.
  kft::ddp::stats evaluate(std::span<const std::uint32_t> samples) {
    kft::ddp::stats total;
    if (samples.empty()) return total;
    if (cap_ == 0) reserve(static_cast<int>(std::min<std::size_t>(samples.size(), 8)));
    for (std::size_t at = 0; at < samples.size(); at += static_cast<std::size_t>(cap_)) {
      const auto part = samples.subspan(at, std::min(samples.size() - at, static_cast<std::size_t>(cap_)));
      load(valid_, c_.valid_stride, part, "validation");
      const kft::ddp::stats s = forward(static_cast<int>(part.size()), false);
      total.loss_sum += s.loss_sum;
      total.count += s.count;
      total.values[0] += s.values[0];
    }
    return total;
  }

  /// `n` tokens continuing `prompt` (token ids, not empty), each drawn from the model's
  /// distribution given the last ctx tokens so far, sharpened by `temperature` (0: the
  /// likeliest token); the draws come from splitmix64(`seed`). A demonstration: each token
  /// costs a forward pass over one window.
  std::vector<std::uint8_t> generate(std::span<const std::uint8_t> prompt, std::size_t n, std::uint64_t seed,
                                     float temperature = 1.0f) {
    if (prompt.empty()) throw std::invalid_argument("char_gpt: generate() needs a prompt of at least one token");
    for (const std::uint8_t t : prompt)
      if (t >= c_.vocab)
        throw std::invalid_argument("char_gpt: prompt token " + std::to_string(t) + " is not below vocab " +
                                    std::to_string(c_.vocab));
    if (cap_ == 0) reserve(1);
    std::vector<std::uint8_t> text(prompt.begin(), prompt.end());
    text.reserve(prompt.size() + n);
    kft::ddp::splitmix64 g{seed};
    const std::size_t T = static_cast<std::size_t>(c_.ctx), V = static_cast<std::size_t>(c_.vocab);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t len = std::min(text.size(), T);
      std::copy(text.end() - static_cast<std::ptrdiff_t>(len), text.end(), in_.begin());
      std::fill(in_.begin() + static_cast<std::ptrdiff_t>(len), in_.begin() + static_cast<std::ptrdiff_t>(T), 0);
      std::fill(tgt_.begin(), tgt_.begin() + static_cast<std::ptrdiff_t>(T), 0);
      forward(1, false);  // (causal: the padding after position len - 1 does not change its row)
      const float* p = logits_.data() + (len - 1) * V;  // exp(z - max z): unnormalised probabilities
      std::size_t pick = 0;
      if (temperature <= 0.0f) {
        pick = static_cast<std::size_t>(std::max_element(p, p + V) - p);
      } else {
        double sum = 0.0;
        for (std::size_t c = 0; c < V; ++c) sum += std::pow(static_cast<double>(p[c]), 1.0 / temperature);
        double u = static_cast<double>(g.next() >> 11) * 0x1p-53 * sum;
        for (pick = 0; pick + 1 < V; ++pick) {
          u -= std::pow(static_cast<double>(p[pick]), 1.0 / temperature);
          if (u < 0.0) break;
        }
      }
      text.push_back(static_cast<std::uint8_t>(pick));
    }
    return {text.begin() + static_cast<std::ptrdiff_t>(prompt.size()), text.end()};
  }

 private:
  struct slot {
    std::string name;
    std::size_t offset, size;
  };
  // Parameter indices: 0 tok_emb, 1 pos_emb, block l's k-th at 2 + 12 l + k, then ln_f, head.
  enum : std::size_t { ln1_g, ln1_b, qkv_w, qkv_b, attn_w, attn_b, ln2_g, ln2_b, fc_w, fc_b, mlp_w, mlp_b, per_block };
  std::size_t pi(int l, std::size_t k) const { return 2 + static_cast<std::size_t>(l) * per_block + k; }
  std::size_t lnf_g() const { return pi(c_.layers, 0); }
  std::size_t head_w() const { return lnf_g() + 2; }
  float* w(std::size_t i) { return values_.data() + slots_[i].offset; }

  // What a block keeps from forward for backward (each sized for cap_ windows).
  struct block_acts {
    std::vector<float> ln1, mean1, rstd1, qkv, att, y, xm, ln2, mean2, rstd2, pre, sig, act;
  };

  void add(std::string name, std::size_t n) {
    slots_.push_back({std::move(name), total_, n});
    total_ += n;
  }

  std::size_t windows(std::span<const std::uint8_t> t, int stride) const noexcept {
    const std::size_t need = static_cast<std::size_t>(c_.ctx) + 1;
    return t.size() < need ? 0 : (t.size() - need) / static_cast<std::size_t>(stride) + 1;
  }

  // Buffers for b windows; grows only.
  void reserve(int b) {
    if (b <= cap_) return;
    cap_ = b;
    const std::size_t n = static_cast<std::size_t>(b) * c_.ctx, d = static_cast<std::size_t>(c_.d);
    const std::size_t tt = static_cast<std::size_t>(c_.ctx) * c_.ctx;
    in_.resize(n);
    tgt_.resize(n);
    xs_.resize(static_cast<std::size_t>(c_.layers) + 1);
    for (auto& x : xs_) x.resize(n * d);
    acts_.resize(static_cast<std::size_t>(c_.layers));
    for (auto& a : acts_) {
      for (auto* v : {&a.ln1, &a.y, &a.xm, &a.ln2}) v->resize(n * d);
      for (auto* v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) v->resize(n);
      a.qkv.resize(3 * n * d);
      a.att.resize(static_cast<std::size_t>(b) * c_.heads * tt);
      for (auto* v : {&a.pre, &a.sig, &a.act}) v->resize(4 * n * d);
    }
    lnf_.resize(n * d);
    meanf_.resize(n);
    rstdf_.resize(n);
    logits_.resize(n * static_cast<std::size_t>(c_.vocab));
    dx_.resize(n * d);
    dln_.resize(n * d);
    dy_.resize(n * d);
    dqkv_.resize(3 * n * d);
    dh_.resize(4 * n * d);
    dp_.resize(tt);
  }

  void load(std::span<const std::uint8_t> tokens, int stride, std::span<const std::uint32_t> samples, const char* which) {
    const std::size_t have = windows(tokens, stride), t = static_cast<std::size_t>(c_.ctx);
    for (std::size_t b = 0; b < samples.size(); ++b) {
      if (samples[b] >= have)
        throw std::out_of_range(std::string("char_gpt: ") + which + " window " + std::to_string(samples[b]) + " of " +
                                std::to_string(have));
      const std::uint8_t* src = tokens.data() + static_cast<std::size_t>(samples[b]) * static_cast<std::size_t>(stride);
      std::copy(src, src + t, in_.begin() + static_cast<std::ptrdiff_t>(b * t));
      std::copy(src + 1, src + t + 1, tgt_.begin() + static_cast<std::ptrdiff_t>(b * t));
    }
  }

  // Forward over the b windows loaded; with `train` the logits become d(mean loss)/d(logits).
  kft::ddp::stats forward(int b, bool train) {
    using namespace detail;
    const int T = c_.ctx, d = c_.d, n = b * T, V = c_.vocab;
    kft::ddp::stats s;
    if (b == 0) return s;
    // Embeddings.
    const float* tok = w(0);
    const float* pos = w(1);
    float* x0 = xs_[0].data();
    for (int r = 0; r < n; ++r) {
      const float* e = tok + static_cast<std::size_t>(in_[static_cast<std::size_t>(r)]) * d;
      const float* p = pos + static_cast<std::size_t>(r % T) * d;
      float* o = x0 + static_cast<std::size_t>(r) * d;
      for (int c = 0; c < d; ++c) o[c] = e[c] + p[c];
    }
    const std::size_t nd = static_cast<std::size_t>(n) * d;
    for (int l = 0; l < c_.layers; ++l) {
      block_acts& a = acts_[static_cast<std::size_t>(l)];
      const float* x = xs_[static_cast<std::size_t>(l)].data();
      layernorm(x, n, d, w(pi(l, ln1_g)), w(pi(l, ln1_b)), a.ln1.data(), a.mean1.data(), a.rstd1.data());
      fill_rows(a.qkv.data(), n, 3 * d, w(pi(l, qkv_b)));
      gemm_nn(n, 3 * d, d, a.ln1.data(), w(pi(l, qkv_w)), 1.0f, a.qkv.data());
      attention(b, a);
      std::copy(x, x + nd, a.xm.data());
      add_rows(a.xm.data(), n, d, w(pi(l, attn_b)));
      gemm_nn(n, d, d, a.y.data(), w(pi(l, attn_w)), 1.0f, a.xm.data());
      layernorm(a.xm.data(), n, d, w(pi(l, ln2_g)), w(pi(l, ln2_b)), a.ln2.data(), a.mean2.data(), a.rstd2.data());
      fill_rows(a.pre.data(), n, 4 * d, w(pi(l, fc_b)));
      gemm_nn(n, 4 * d, d, a.ln2.data(), w(pi(l, fc_w)), 1.0f, a.pre.data());
      gelu(a.pre.data(), 4 * nd, a.sig.data(), a.act.data());
      float* xn = xs_[static_cast<std::size_t>(l) + 1].data();
      std::copy(a.xm.data(), a.xm.data() + nd, xn);
      add_rows(xn, n, d, w(pi(l, mlp_b)));
      gemm_nn(n, d, 4 * d, a.act.data(), w(pi(l, mlp_w)), 1.0f, xn);
    }
    layernorm(xs_.back().data(), n, d, w(lnf_g()), w(lnf_g() + 1), lnf_.data(), meanf_.data(), rstdf_.data());
    fill_rows(logits_.data(), n, V, w(head_w() + 1));
    gemm_nn(n, V, d, lnf_.data(), w(head_w()), 1.0f, logits_.data());
    // Cross-entropy; with `train`, logits_ becomes (softmax - onehot) / n.
    const float inv_n = 1.0f / static_cast<float>(n);
    double correct = 0.0;
    for (int r = 0; r < n; ++r) {
      float* z = logits_.data() + static_cast<std::size_t>(r) * V;
      const int y = tgt_[static_cast<std::size_t>(r)];
      int arg = 0;
      for (int c = 1; c < V; ++c)
        if (z[c] > z[arg]) arg = c;
      const float mx = z[arg];
      const float zy = z[y];
      float sum = 0.0f;
      for (int c = 0; c < V; ++c) sum += (z[c] = std::exp(z[c] - mx));
      s.loss_sum += std::log(static_cast<double>(sum)) - static_cast<double>(zy - mx);
      correct += arg == y ? 1.0 : 0.0;
      if (!train) continue;
      const float k = inv_n / sum;
      for (int c = 0; c < V; ++c) z[c] *= k;
      z[y] -= inv_n;
    }
    s.count = static_cast<double>(n);
    s.values[0] = correct;
    return s;
  }

  static void fill_rows(float* out, int n, int m, const float* b) {
    for (int r = 0; r < n; ++r)
      std::memcpy(out + static_cast<std::size_t>(r) * m, b, sizeof(float) * static_cast<std::size_t>(m));
  }

  // y = GELU(x); keeps s = sigmoid(2u) for the backward pass.
  static void gelu(const float* x, std::size_t n, float* s, float* y) {
    using namespace detail;
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i];
      s[i] = 1.0f / (1.0f + exp_approx(-2.0f * gelu_k0 * (v + gelu_k1 * v * v * v)));
      y[i] = v * s[i];
    }
  }

  // Causal self-attention of every window and head: a.qkv -> a.att (probabilities), a.y.
  void attention(int b, block_acts& a) {
    const int T = c_.ctx, d = c_.d, ld = 3 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const std::size_t tt = static_cast<std::size_t>(T) * T;
    for (int w0 = 0; w0 < b; ++w0)
      for (int h = 0; h < c_.heads; ++h) {
        const float* q = a.qkv.data() + static_cast<std::size_t>(w0) * T * ld + static_cast<std::size_t>(h) * hd_;
        const float* k = q + d;
        const float* v = q + 2 * d;
        float* p = a.att.data() + (static_cast<std::size_t>(w0) * c_.heads + h) * tt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd_, scale, q, ld, k, ld, 0.0f, p, T);
        for (int i = 0; i < T; ++i) {
          float* row = p + static_cast<std::size_t>(i) * T;
          float mx = row[0];
          for (int j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
          for (int j = 0; j <= i; ++j) row[j] = detail::exp_approx(row[j] - mx);
          float sum = 0.0f;
          for (int j = 0; j <= i; ++j) sum += row[j];
          const float inv = 1.0f / sum;
          for (int j = 0; j <= i; ++j) row[j] *= inv;
          std::fill(row + i + 1, row + T, 0.0f);
        }
        float* y = a.y.data() + static_cast<std::size_t>(w0) * T * d + static_cast<std::size_t>(h) * hd_;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd_, T, 1.0f, p, T, v, ld, 0.0f, y, d);
      }
  }

  // dy_ (d of a.y) -> dqkv_.
  void attention_backward(int b, const block_acts& a) {
    const int T = c_.ctx, d = c_.d, ld = 3 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const std::size_t tt = static_cast<std::size_t>(T) * T;
    float* ds = dp_.data();
    for (int w0 = 0; w0 < b; ++w0)
      for (int h = 0; h < c_.heads; ++h) {
        const std::size_t qo = static_cast<std::size_t>(w0) * T * ld + static_cast<std::size_t>(h) * hd_;
        const float* q = a.qkv.data() + qo;
        const float* k = q + d;
        const float* v = q + 2 * d;
        float* dq = dqkv_.data() + qo;
        float* dk = dq + d;
        float* dv = dq + 2 * d;
        const float* p = a.att.data() + (static_cast<std::size_t>(w0) * c_.heads + h) * tt;
        const float* dy = dy_.data() + static_cast<std::size_t>(w0) * T * d + static_cast<std::size_t>(h) * hd_;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd_, 1.0f, dy, d, v, ld, 0.0f, ds, T);  // dP
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd_, T, 1.0f, p, T, dy, d, 0.0f, dv, ld);  // dV
        for (int i = 0; i < T; ++i) {  // dS = P (dP - rowsum(P dP)), 0 above the diagonal
          const float* pr = p + static_cast<std::size_t>(i) * T;
          float* sr = ds + static_cast<std::size_t>(i) * T;
          float dot = 0.0f;
          for (int j = 0; j <= i; ++j) dot += pr[j] * sr[j];
          for (int j = 0; j <= i; ++j) sr[j] = pr[j] * (sr[j] - dot);
          std::fill(sr + i + 1, sr + T, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd_, T, scale, ds, T, k, ld, 0.0f, dq, ld);  // dQ
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd_, T, scale, ds, T, q, ld, 0.0f, dk, ld);    // dK
      }
  }

  void backward(int b, kft::ddp::gradients& g) {
    using namespace detail;
    const bool acc = g.accumulate();
    const float beta = acc ? 1.0f : 0.0f;
    const int T = c_.ctx, d = c_.d, n = b * T, V = c_.vocab;
    auto gp = [&](std::size_t i) { return g[i].data(); };
    if (b == 0) {  // no tokens: a zero gradient
      for (std::size_t i = slots_.size(); i-- > 0;) {
        if (!acc) std::fill(g[i].begin(), g[i].end(), 0.0f);
        g.ready(i);
      }
      return;
    }
    // Head and final LayerNorm.
    const std::size_t hw = head_w();
    gemm_tn(n, V, d, lnf_.data(), logits_.data(), beta, gp(hw));
    column_sums(logits_.data(), n, V, gp(hw + 1), acc);
    g.ready(hw);
    g.ready(hw + 1);
    gemm_nt(n, V, d, logits_.data(), w(hw), dln_.data());
    std::fill(dx_.begin(), dx_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(n) * d), 0.0f);
    const std::size_t fg = lnf_g();
    layernorm_backward(xs_.back().data(), meanf_.data(), rstdf_.data(), w(fg), dln_.data(), n, d, dx_.data(), gp(fg),
                       gp(fg + 1), acc);
    g.ready(fg);
    g.ready(fg + 1);
    // Blocks, last first; dx_ holds d(loss)/d(block output).
    for (int l = c_.layers; l-- > 0;) {
      const block_acts& a = acts_[static_cast<std::size_t>(l)];
      // x_{l+1} = xm + act W_mlp + b_mlp
      gemm_tn(n, d, 4 * d, a.act.data(), dx_.data(), beta, gp(pi(l, mlp_w)));
      column_sums(dx_.data(), n, d, gp(pi(l, mlp_b)), acc);
      g.ready(pi(l, mlp_w));
      g.ready(pi(l, mlp_b));
      gemm_nt(n, d, 4 * d, dx_.data(), w(pi(l, mlp_w)), dh_.data());
      const std::size_t n4 = 4 * static_cast<std::size_t>(n) * d;
      for (std::size_t i = 0; i < n4; ++i) {  // through GELU: d(x s(2u))/dx = s + 2 x s (1 - s) u'
        const float v = a.pre[i], sg = a.sig[i];
        dh_[i] *= sg + 2.0f * v * sg * (1.0f - sg) * gelu_k0 * (1.0f + 3.0f * gelu_k1 * v * v);
      }
      gemm_tn(n, 4 * d, d, a.ln2.data(), dh_.data(), beta, gp(pi(l, fc_w)));
      column_sums(dh_.data(), n, 4 * d, gp(pi(l, fc_b)), acc);
      g.ready(pi(l, fc_w));
      g.ready(pi(l, fc_b));
      gemm_nt(n, 4 * d, d, dh_.data(), w(pi(l, fc_w)), dln_.data());
      layernorm_backward(a.xm.data(), a.mean2.data(), a.rstd2.data(), w(pi(l, ln2_g)), dln_.data(), n, d, dx_.data(),
                         gp(pi(l, ln2_g)), gp(pi(l, ln2_b)), acc);
      g.ready(pi(l, ln2_g));
      g.ready(pi(l, ln2_b));
      // xm = x_l + y W_attn + b_attn
      gemm_tn(n, d, d, a.y.data(), dx_.data(), beta, gp(pi(l, attn_w)));
      column_sums(dx_.data(), n, d, gp(pi(l, attn_b)), acc);
      g.ready(pi(l, attn_w));
      g.ready(pi(l, attn_b));
      gemm_nt(n, d, d, dx_.data(), w(pi(l, attn_w)), dy_.data());
      attention_backward(b, a);
      gemm_tn(n, 3 * d, d, a.ln1.data(), dqkv_.data(), beta, gp(pi(l, qkv_w)));
      column_sums(dqkv_.data(), n, 3 * d, gp(pi(l, qkv_b)), acc);
      g.ready(pi(l, qkv_w));
      g.ready(pi(l, qkv_b));
      gemm_nt(n, 3 * d, d, dqkv_.data(), w(pi(l, qkv_w)), dln_.data());
      layernorm_backward(xs_[static_cast<std::size_t>(l)].data(), a.mean1.data(), a.rstd1.data(), w(pi(l, ln1_g)),
                         dln_.data(), n, d, dx_.data(), gp(pi(l, ln1_g)), gp(pi(l, ln1_b)), acc);
      g.ready(pi(l, ln1_g));
      g.ready(pi(l, ln1_b));
    }
    // Embeddings: dx_ is d(loss)/d(tok_emb[token] + pos_emb[t]).
    float* dtok = gp(0);
    float* dpos = gp(1);
    if (!acc) {
      std::fill(g[0].begin(), g[0].end(), 0.0f);
      std::fill(g[1].begin(), g[1].end(), 0.0f);
    }
    for (int r = 0; r < n; ++r) {
      const float* src = dx_.data() + static_cast<std::size_t>(r) * d;
      float* et = dtok + static_cast<std::size_t>(in_[static_cast<std::size_t>(r)]) * d;
      float* ep = dpos + static_cast<std::size_t>(r % T) * d;
      for (int c = 0; c < d; ++c) {
        et[c] += src[c];
        ep[c] += src[c];
      }
    }
    g.ready(0);
    g.ready(1);
  }

  gpt_config c_;
  std::span<const std::uint8_t> train_, valid_;
  int hd_ = 0;
  std::vector<slot> slots_;
  std::size_t total_ = 0;
  std::vector<float> values_;
  int cap_ = 0;  // windows the buffers hold
  std::vector<std::uint8_t> in_, tgt_;
  std::vector<std::vector<float>> xs_;  // residual stream: xs_[l] is block l's input, xs_[L] the last output
  std::vector<block_acts> acts_;
  std::vector<float> lnf_, meanf_, rstdf_, logits_;
  std::vector<float> dx_, dln_, dy_, dqkv_, dh_, dp_;
};

}  // namespace chargpt
