// SPDX-License-Identifier: Apache-2.0
/// @file kft/collectives/allreduce_hierarchical.hpp
/// @brief `hierarchical_allreduce<Intra, Inter>`: reduce inside the node, cross nodes with one
/// shard per local rank (every node's links busy at once), gather inside the node.
///
///     kft::hierarchical_allreduce<kft::shm::communicator, kft::mpi::communicator> ar(node, rail);
///     ar(in, out, count, kft::dtype::f32, kft::op_kind::sum);
///
/// For a message of N bytes on M nodes of L ranks each, per chunk of the message:
///  1. `intra.reduce_scatter`: local rank k ends with shard k (N/L bytes) reduced over its node;
///  2. `inter.allreduce` of shard k on rail k (the ranks with local index k, one per node);
///  3. `intra.allgather`: every local rank gets all L reduced shards.
/// A node sends 2(M-1)/M x N bytes across nodes with a ring on each rail (L rails x N/L each),
/// against 2(p-1)/p x N per rank for a flat ring over all p = L x M ranks (docs/algorithms.md).
/// Chunks are pipelined: while chunk i crosses nodes (step 2, on this thread, with
/// `hierarchical_config::inter_algorithm`, kft's ring by default: both directions of every
/// link busy), the intra communicator's progress thread runs step 1 of chunk i+1 and step 3
/// of chunk i-1.
///
/// Generic over kft's contract (transport/concepts.hpp): `Intra` is an `async_communicator`
/// (its reduce-scatter and allgather run asynchronously), `Inter` a `communicator`. Every node must have the same number of ranks (callers check the
/// topology and fall back to a flat algorithm otherwise). Elements that do not divide evenly
/// into L shards, and messages below `small_bytes`, take the latency path: intra allreduce,
/// then every rail allreduces the whole remainder.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include <kft/core/options.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/transport/checks.hpp>

KFT_NAMESPACE_BEGIN

/// @brief Settings of the hierarchical allreduce.
struct hierarchical_config {
  std::size_t chunk_bytes = 4u << 20;   ///< pipeline chunk (the whole message when smaller)
  std::size_t small_bytes = 64u << 10;  ///< below this, intra allreduce + inter allreduce
  algo inter_algorithm = algo::ring;     ///< the pipelined shards' crossing (the latency path uses auto)
};

template <class Intra, class Inter>
class hierarchical_allreduce {
 public:
  hierarchical_allreduce(Intra& intra, Inter& inter, hierarchical_config cfg = {})
      : intra_(intra), inter_(inter), cfg_(cfg) {}

  /// @brief out = in reduced over every rank of every node. in == out is in place. `inter` must
  /// have one rank per node (intra.size() x inter.size() = the job's size).
  void operator()(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    if (count == 0) return;
    if constexpr (requires { Intra::device_buffers; }) {
      if (Intra::device_buffers && op == op_kind::avg)
        throw usage_error("avg on device buffers: the generic hierarchical allreduce divides on the host; use "
                              "kft::nccl::hierarchical_allreduce (it pre-scales inside NCCL)",
                          error_site::of("allreduce"));
    }
    const std::size_t es = size_of(t), L = static_cast<std::size_t>(intra_.size());
    // avg: sums at both levels and one division by the job's size (an average of per-node
    // averages would truncate integers twice).
    const op_kind level_op = op == op_kind::avg ? op_kind::sum : op;
    const int divisor = op == op_kind::avg ? intra_.size() * inter_.size() : 0;
    options intra_o = o, inter_o = o, latency_o = o;
    intra_o.algorithm = algo::automatic;
    inter_o.algorithm = cfg_.inter_algorithm;
    latency_o.algorithm = algo::automatic;
    const auto* src = static_cast<const unsigned char*>(in);
    auto* dst = static_cast<unsigned char*>(out);
    std::size_t main = count * es < cfg_.small_bytes ? 0 : count - count % L;
    if (main > 0) pipelined(src, dst, main, t, level_op, divisor, intra_o, inter_o);
    if (main < count) {  // the latency path: whole message, or the last count % L elements
      intra_.allreduce(src + main * es, dst + main * es, count - main, t, level_op, intra_o);
      inter_.allreduce(dst + main * es, dst + main * es, count - main, t, level_op, latency_o);
      divide(dst + main * es, count - main, t, divisor);
    }
  }

  template <class T, reduction Op>
  void operator()(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    detail::require_same_count(in.size(), out.size(), "hierarchical allreduce", error_site::of("allreduce"));
    (*this)(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }

  const hierarchical_config& configuration() const noexcept { return cfg_; }

 private:
  // count is a multiple of L.
  static void divide(void* data, std::size_t count, dtype t, int divisor) {
    if (divisor <= 0) return;
    const void* src[1] = {data};
    kernels::reduce(data, src, 1, count, t, op_kind::avg, divisor);
  }

  void pipelined(const unsigned char* src, unsigned char* dst, std::size_t count, dtype t, op_kind op, int divisor,
                 const options& intra_o, const options& inter_o) {
    const std::size_t es = size_of(t), L = static_cast<std::size_t>(intra_.size()),
                      k = static_cast<std::size_t>(intra_.rank());
    std::size_t chunk = std::max<std::size_t>(cfg_.chunk_bytes / es / L, 1) * L;
    chunk = std::min(chunk, count);
    const std::size_t chunks = (count + chunk - 1) / chunk;
    auto span_of = [&](std::size_t i) {
      const std::size_t off = i * chunk;
      return std::pair{off, std::min(chunk, count - off)};  // both multiples of L
    };
    auto reduce_scatter = [&](std::size_t i) {
      const auto [off, n] = span_of(i);
      return intra_.reduce_scatter_async(src + off * es, dst + (off + k * (n / L)) * es, n / L, t, op, intra_o);
    };
    using intra_work = decltype(reduce_scatter(0));
    auto shard_of = [&](std::size_t i) {
      const auto [off, n] = span_of(i);
      return dst + (off + k * (n / L)) * es;
    };
    std::vector<intra_work> gathers;
    std::optional<intra_work> next;
    gathers.reserve(chunks);
    try {
      (void)next.emplace(reduce_scatter(0));  // (void): nvcc counts emplace's reference as a nodiscard value
      for (std::size_t i = 0; i < chunks; ++i) {
        next->wait();
        next.reset();
        if (i + 1 < chunks) (void)next.emplace(reduce_scatter(i + 1));  // runs while chunk i crosses
        const auto [off, n] = span_of(i);
        unsigned char* shard = shard_of(i);
        inter_.allreduce(shard, shard, n / L, t, op, inter_o);
        divide(shard, n / L, t, divisor);
        gathers.push_back(intra_.allgather_async(shard, dst + off * es, n / L, t, intra_o));
      }
      for (auto& g : gathers) g.wait();
    } catch (...) {
      // Queued intra-node steps still point into the caller's buffers: let them finish (or
      // fail on the broken communicator) before the caller sees the error.
      if (next) drain(*next);
      for (auto& g : gathers) drain(g);
      throw;
    }
  }

  template <class W>
  static void drain(W& w) noexcept {
    try {
      w.wait();
    } catch (...) {
    }
  }

  Intra& intra_;
  Inter& inter_;
  hierarchical_config cfg_;
};

KFT_NAMESPACE_END
