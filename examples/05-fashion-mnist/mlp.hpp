// SPDX-License-Identifier: Apache-2.0
// mlp.hpp: a multi-layer perceptron (ReLU hidden layers, softmax cross-entropy) whose matrix
// products go through CBLAS (OpenBLAS), written as a kft::ddp::model: its backward pass hands
// each layer's gradients to the trainer as soon as they are final, last layer first, so the
// reducer sends them while the earlier layers are still being differentiated.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <kft/ddp/sampler.hpp>
#include <kft/ddp/trainer.hpp>

#include "idx.hpp"

namespace fmnist {

class mlp {
 public:
  /// widths: input, hidden..., classes (784, 256, 128, 10). Weights as PyTorch's nn.Linear
  /// initialises them: uniform in +-1/sqrt(fan_in), from `seed`.
  mlp(std::vector<int> widths, const dataset* train, const dataset* test, std::uint64_t seed)
      : w_(std::move(widths)), train_(train), test_(test) {
    if (w_.size() < 2) throw std::invalid_argument("mlp: needs an input and an output width");
    if (train && static_cast<std::size_t>(w_.front()) != train->dim)
      throw std::invalid_argument("mlp: input width " + std::to_string(w_.front()) + " but the images have " +
                                  std::to_string(train->dim) + " pixels");
    kft::ddp::splitmix64 g{seed};
    for (std::size_t l = 0; l + 1 < w_.size(); ++l) {
      const int in = w_[l], out = w_[l + 1];
      const float bound = 1.0f / std::sqrt(static_cast<float>(in));
      auto uni = [&] { return (static_cast<float>(g.next() >> 40) / 16777216.0f * 2.0f - 1.0f) * bound; };
      weights_.emplace_back(static_cast<std::size_t>(in) * out);
      for (auto& x : weights_.back()) x = uni();
      biases_.emplace_back(static_cast<std::size_t>(out));
      for (auto& x : biases_.back()) x = uni();
    }
  }

  std::size_t layers() const { return weights_.size(); }

  std::vector<kft::ddp::tensor_ref> parameters() {
    std::vector<kft::ddp::tensor_ref> p;
    for (std::size_t l = 0; l < layers(); ++l) {
      p.push_back({"fc" + std::to_string(l + 1) + ".weight", weights_[l]});
      p.push_back({"fc" + std::to_string(l + 1) + ".bias", biases_[l]});
    }
    return p;
  }

  kft::ddp::batch_stats forward_backward(std::span<const std::uint32_t> idx, kft::ddp::gradients& g) {
    const int b = static_cast<int>(idx.size());
    auto stats = forward(*train_, idx);
    // d(mean loss)/d(logits) = (softmax - onehot) / b, already in z_.back() as probabilities.
    const int classes = w_.back();
    float* dz = z_.back().data();
    const float inv_b = 1.0f / static_cast<float>(b);
    for (int r = 0; r < b; ++r) {
      float* row = dz + static_cast<std::size_t>(r) * classes;
      row[label(*train_, idx[static_cast<std::size_t>(r)])] -= 1.0f;
      for (int c = 0; c < classes; ++c) row[c] *= inv_b;
    }
    const float beta = g.accumulate() ? 1.0f : 0.0f;
    for (std::size_t l = layers(); l-- > 0;) {
      const int in = w_[l], out = w_[l + 1];
      const float* h = l == 0 ? x_.data() : z_[l - 1].data();  // the layer's input (ReLU output)
      float* dz_l = z_[l].data();
      auto dw = g[2 * l];
      auto db = g[2 * l + 1];
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, b, 1.0f, h, in, dz_l, out, beta, dw.data(), out);
      if (beta == 0.0f) std::fill(db.begin(), db.end(), 0.0f);
      for (int r = 0; r < b; ++r) {
        const float* row = dz_l + static_cast<std::size_t>(r) * out;
        for (int c = 0; c < out; ++c) db[static_cast<std::size_t>(c)] += row[c];
      }
      g.ready(2 * l);
      g.ready(2 * l + 1);
      if (l == 0) break;
      // dH = dZ W^T, then through the ReLU of layer l-1 (its output is z_[l-1], > 0 where it passed).
      dh_.resize(static_cast<std::size_t>(b) * in);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, in, out, 1.0f, dz_l, out, weights_[l].data(), out, 0.0f,
                  dh_.data(), in);
      float* prev = z_[l - 1].data();
      for (std::size_t k = 0; k < static_cast<std::size_t>(b) * in; ++k) prev[k] = prev[k] > 0.0f ? dh_[k] : 0.0f;
    }
    return stats;
  }

  kft::ddp::batch_stats evaluate(std::span<const std::uint32_t> idx) { return forward(*test_, idx); }

 private:
  static int label(const dataset& d, std::uint32_t i) { return d.labels[i]; }

  // Forward pass over samples `idx` of `d`; leaves the ReLU outputs in z_[0..L-2] and the
  // softmax probabilities in z_[L-1].
  kft::ddp::batch_stats forward(const dataset& d, std::span<const std::uint32_t> idx) {
    const int b = static_cast<int>(idx.size());
    const int in0 = w_.front();
    x_.resize(static_cast<std::size_t>(b) * in0);
    for (int r = 0; r < b; ++r) {
      const std::uint8_t* src = d.images.data() + static_cast<std::size_t>(idx[static_cast<std::size_t>(r)]) * d.dim;
      float* dst = x_.data() + static_cast<std::size_t>(r) * in0;
      for (int c = 0; c < in0; ++c) dst[c] = (static_cast<float>(src[c]) * (1.0f / 255.0f) - 0.2860f) * (1.0f / 0.3530f);
    }
    z_.resize(layers());
    for (std::size_t l = 0; l < layers(); ++l) {
      const int in = w_[l], out = w_[l + 1];
      const float* h = l == 0 ? x_.data() : z_[l - 1].data();
      auto& z = z_[l];
      z.resize(static_cast<std::size_t>(b) * out);
      for (int r = 0; r < b; ++r) std::copy(biases_[l].begin(), biases_[l].end(), z.begin() + static_cast<std::ptrdiff_t>(r) * out);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, out, in, 1.0f, h, in, weights_[l].data(), out, 1.0f,
                  z.data(), out);
      if (l + 1 < layers())
        for (auto& v : z) v = v > 0.0f ? v : 0.0f;
    }
    kft::ddp::batch_stats s;
    const int classes = w_.back();
    for (int r = 0; r < b; ++r) {
      float* row = z_.back().data() + static_cast<std::size_t>(r) * classes;
      const int y = label(d, idx[static_cast<std::size_t>(r)]);
      float mx = row[0];
      int arg = 0;
      for (int c = 1; c < classes; ++c)
        if (row[c] > mx) mx = row[c], arg = c;
      double sum = 0.0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - mx));
      s.loss_sum += std::log(sum) - static_cast<double>(row[y] - mx);
      s.correct += arg == y;
      const double inv = 1.0 / sum;
      for (int c = 0; c < classes; ++c) row[c] = static_cast<float>(std::exp(static_cast<double>(row[c] - mx)) * inv);
    }
    s.count = static_cast<std::uint64_t>(b);
    return s;
  }

  std::vector<int> w_;
  const dataset* train_;
  const dataset* test_;
  std::vector<std::vector<float>> weights_, biases_;  // weights_[l]: in x out, row-major
  std::vector<float> x_, dh_;
  std::vector<std::vector<float>> z_;
};

/// A dataset of random "images" whose class is decided by a fixed hidden linear map of the
/// centred pixels (tests: no files). Different seeds draw different images of the same map.
inline dataset synthetic(std::size_t n, std::size_t dim, std::uint64_t seed) {
  dataset d;
  d.n = n;
  d.dim = dim;
  d.images.resize(n * dim);
  d.labels.resize(n);
  kft::ddp::splitmix64 map{0x5EED};
  std::vector<float> proj(dim * 10);
  for (auto& p : proj) p = static_cast<float>(map.next() >> 40) / 16777216.0f - 0.5f;
  kft::ddp::splitmix64 g{seed};
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < dim; ++c) d.images[i * dim + c] = static_cast<std::uint8_t>(g.next() >> 56);
    int best = 0;
    float bv = -1e30f;
    for (int k = 0; k < 10; ++k) {
      float v = 0;
      for (std::size_t c = 0; c < dim; ++c)
        v += proj[c * 10 + static_cast<std::size_t>(k)] * (static_cast<float>(d.images[i * dim + c]) - 127.5f);
      if (v > bv) bv = v, best = k;
    }
    d.labels[i] = static_cast<std::uint8_t>(best);
  }
  return d;
}

}  // namespace fmnist
