// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/nccl_hierarchical.hpp
/// @brief The hierarchical allreduce on device buffers: NCCL inside the node, and across nodes
/// either NCCL (one rail communicator per local rank) or MPI through pinned host memory.
///
///     kft::nccl::communicator node = ...;            // the ranks of this node
///     kft::nccl::communicator rail = ...;            // local rank k of every node
///     kft::group::nccl_hierarchical_allreduce<> ar(node, rail);
///     ar(in, out, count, kft::dtype::bf16, kft::op_kind::avg);
///
///     kft::group::host_staged_allreduce staged(mpi_rail, device);  // <kft/group/host_staged_allreduce.hpp>
///     kft::group::nccl_hierarchical_allreduce<kft::group::host_staged_allreduce> ar2(node, staged);
///
/// `kft::nccl::communicator` provides everything the generic `kft::hierarchical_allreduce`
/// needs, so `kft::hierarchical_allreduce<kft::nccl::communicator, kft::nccl::communicator>`
/// works as it is for sum, prod, min and max, with `hierarchical_config::inter_algorithm =
/// algo::automatic` (NCCL chooses its own algorithm; this class sets it for a NCCL rail). Its `avg` would divide on the host, so it refuses it on device buffers (usage_error): this header's
/// `hierarchical_allreduce` runs an average as a sum whose inputs NCCL pre-multiplies by 1/N
/// (PreMulSum) in the intra-node step, so nothing is divided afterwards. That needs a
/// floating-point dtype; an integer average is refused (NCCL divides integers only in its own
/// single-communicator `ncclAvg`: use a flat allreduce for those).
///
/// Device buffers must be ready for the intra communicator's stream (the generic algorithm's
/// options name none): synchronise the stream that wrote them, or create the communicator with
/// `config::stream` set to it.
///
/// `host_staged_allreduce` (the MPI crossing through pinned host memory) has its own header,
/// kft/group/host_staged_allreduce.hpp, as it needs the MPI component too.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_NCCL
#error "kft/group/nccl_hierarchical.hpp needs the NCCL component: configure kft with KFT_WITH_NCCL=ON and link kft::nccl"
#endif

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <kft/collectives/allreduce_hierarchical.hpp>
#include <kft/core/options.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/nccl/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

namespace detail {

// The intra-node side of an average: every input is pre-multiplied by 1/N inside NCCL's sum,
// so the generic algorithm runs a plain sum and never divides on the host.
class prescaled_intra {
 public:
  prescaled_intra(nccl::communicator& c, double factor) : c_(c), factor_(factor) {}
  int size() const noexcept { return c_.size(); }
  int rank() const noexcept { return c_.rank(); }
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const kft::options& o) {
    c_.allreduce(in, out, count, t, op, with(o, op));
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                               const kft::options& o) {
    return c_.reduce_scatter_async(in, out, recv_count, t, op, with(o, op));
  }
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const kft::options& o) {
    return c_.allgather_async(in, out, send_count, t, o);
  }

 private:
  nccl::options with(const kft::options& o, op_kind op) const {
    nccl::options n;
    n.algorithm = o.algorithm;
    n.timeout = o.timeout;
    n.tag = o.tag;
    if (op == op_kind::sum) n.prescale = factor_;
    return n;
  }
  nccl::communicator& c_;
  double factor_;
};

}  // namespace detail


/// @brief The hierarchical allreduce on device buffers: the generic algorithm with a NCCL
/// communicator inside the node and `Inter` (a NCCL rail communicator, or `host_staged_allreduce`)
/// across nodes, plus averages that never touch the data on the host (see the file comment).
/// `intra` and `inter` must outlive it.
template <class Inter = nccl::communicator>
class nccl_hierarchical_allreduce {
 public:
  nccl_hierarchical_allreduce(nccl::communicator& intra, Inter& inter, hierarchical_config cfg = {})
      : intra_(intra), inter_(inter), cfg_(cfg) {
    if constexpr (std::same_as<Inter, nccl::communicator>) cfg_.inter_algorithm = algo::automatic;
  }

  /// @brief out = in reduced over every rank of every node (device buffers; in == out is in
  /// place). Returns when `out` holds the result.
  /// @throws usage_error for an integer average
  void operator()(const void* in, void* out, std::size_t count, dtype t, op_kind op, const kft::options& o = {}) {
    if (op != op_kind::avg) {
      kft::hierarchical_allreduce<nccl::communicator, Inter>(intra_, inter_, cfg_)(in, out, count, t, op, o);
      return;
    }
    if (!nccl::detail::floating(t))
      throw usage_error("a hierarchical NCCL allreduce cannot average " + std::string(name(t)) +
                            " elements (NCCL divides integers only in a single communicator's ncclAvg); use a flat "
                            "allreduce, or sum and divide",
                        error_site::of("nccl hierarchical allreduce"));
    const double ranks = static_cast<double>(intra_.size()) * static_cast<double>(inter_.size());
    detail::prescaled_intra scaled(intra_, 1.0 / ranks);
    kft::hierarchical_allreduce<detail::prescaled_intra, Inter>(scaled, inter_, cfg_)(in, out, count, t, op_kind::sum,
                                                                                      o);
  }

  template <class T, reduction Op>
  void operator()(std::span<const T> in, std::span<T> out, Op, const kft::options& o = {}) {
    kft::detail::require_same_count(in.size(), out.size(), "hierarchical allreduce",
                                    error_site::of("nccl hierarchical allreduce"));
    (*this)(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }

  const hierarchical_config& configuration() const noexcept { return cfg_; }

 private:
  nccl::communicator& intra_;
  Inter& inter_;
  hierarchical_config cfg_;
};

}  // namespace group
KFT_NAMESPACE_END
