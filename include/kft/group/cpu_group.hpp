// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/cpu_group.hpp
/// @brief The CPU job across nodes: shared memory inside each node, any communicator between
/// them, and the choice between flat and hierarchical allreduce.
///
///     auto g = kft::group::mpi_group();                 // group/mpi_group.hpp: MPI between nodes
///     g->allreduce(std::span<float>(grad), kft::ops::avg);
///     g->layout().describe();                           // "2 nodes x 4 ranks"
///
/// `cpu_group<Inter>` is generic over the inter-node communicator (`Inter` satisfies
/// `kft::communicator`): it holds the node's shm communicator (`intra`), one `Inter` over every
/// rank (`flat`) and one per rail (`rail`: the ranks with the same local index, one per node),
/// which its builder made (`mpi_group` for MPI). The choice (`choose`, forced per call by
/// `options::algorithm` or for the group by `cpu_group_config::strategy`):
///  - one node: the shm communicator alone;
///  - several nodes with the same number of ranks each: hierarchical (intra reduce-scatter ->
///    inter allreduce per rail -> intra allgather, pipelined; `hierarchical_allreduce`);
///  - uneven nodes (e.g. 2 + 1): flat, with a one-line warning from rank 0 at construction
///    (a forced `hierarchical` falls back the same way: never a wrong result).
/// Flat is `Inter`'s allreduce with `cpu_group_config::flat_large` (kft's ring for MPI) from
/// `hierarchical.small_bytes` up, its `automatic` below. Broadcast, reduce-scatter, allgather
/// and barrier run flat. Asynchronous calls run in order on the group's engine.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <kft/async/engine.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/options.hpp>
#include <kft/core/timeout.hpp>
#include <kft/collectives/allreduce_hierarchical.hpp>
#include <kft/rendezvous/connect.hpp>
#include <kft/topology/layout.hpp>
#include <kft/transport/concepts.hpp>
#include <kft/transport/shm/communicator.hpp>
#include <kft/transport/typed_collectives.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief How a `cpu_group` runs.
struct cpu_group_config {
  hierarchical_config hierarchical{};  ///< pipeline chunk and small-message threshold
  algo strategy = algo::automatic;     ///< automatic, flat or hierarchical (`KFT_ALGO` in the factories)
  algo flat_large = algo::automatic;   ///< the flat allreduce's algorithm for large messages
  bool warn = true;                    ///< rank 0 prints the one-line fallback warning
};

/// @brief Parses `KFT_ALGO` (auto, flat, hierarchical); absent = auto.
/// @throws config_error naming the variable and value
inline algo strategy_from(const environment& env) {
  const auto v = env.get("KFT_ALGO");
  if (!v || v->empty() || *v == "auto") return algo::automatic;
  if (*v == "flat") return algo::flat;
  if (*v == "hierarchical") return algo::hierarchical;
  throw config_error("KFT_ALGO", *v, "is not auto, flat or hierarchical", error_site::of("allreduce"));
}

/// @brief What a `cpu_group` is made of (its builder makes them; the group owns them).
template <class Inter>
struct cpu_group_parts {
  topology::layout layout;
  rendezvous::store_handle node_store;  ///< the store the node's segment met through; outlives `intra`
  std::unique_ptr<shm::communicator> intra;
  Inter flat;  ///< every rank of the job
  Inter rail;  ///< this rank's rail: the ranks with its local index
};

namespace detail {

/// The rail as the hierarchical allreduce sees it: while each of its inter-node calls runs,
/// this rank is marked in the node's shared segment as inside it (`shm::communicator::outside`:
/// which call, and the rail's other ranks it waits for), so a node peer's wait for this rank
/// lasts until that call's own deadline and report have passed, and names the chain's end
/// if it still times out. The inter-node error itself reaches the node through `abort`
/// (`cpu_group::run_allreduce`).
template <class Inter>
class marked_rail {
 public:
  marked_rail(shm::communicator& intra, Inter& rail) : intra_(intra), rail_(rail) {}
  int rank() const noexcept { return rail_.rank(); }
  int size() const noexcept { return rail_.size(); }
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    const auto guard = intra_.outside(describe(), bound(o));
    rail_.allreduce(in, out, count, t, op, o);
  }
  // How long a call may take to fail: its deadline, the wait for the peers' reports, and 1 s
  // of slack (the store's answer).
  // A rail without settings of its own takes the node's (the job's timeout, as the group's
  // maker applied it).
  std::chrono::milliseconds bound(const options& o) const {
    std::chrono::milliseconds fallback = intra_.configuration().timeout;
    if constexpr (requires(const Inter& r) { r.configuration().timeout; }) fallback = rail_.configuration().timeout;
    std::chrono::milliseconds grace = derived_timeouts::from(intra_.configuration().timeout).report_grace;
    if constexpr (requires(const Inter& r) { r.configuration().report_grace; }) grace = rail_.configuration().report_grace;
    return timeout_or(o, fallback) + grace + std::chrono::seconds(1);
  }

 private:
  // "gloo allreduce #12 (rail 0, rank 0/2) for job rank 2"
  std::string describe() const {
    const error_site at = rail_.next_site(collective::allreduce);
    std::string s = at.operation + " #" + std::to_string(at.sequence.value_or(0));
    if (!at.group.empty()) s += " (" + at.group + ")";
    if constexpr (requires(const Inter& r) { r.world_rank_of(0); }) {
      std::string others;
      int n = 0;
      for (int r = 0; r < rail_.size(); ++r)
        if (r != rail_.rank()) others += (n++ ? ", " : "") + std::to_string(rail_.world_rank_of(r));
      if (n) s += (n == 1 ? " for job rank " : " for job ranks ") + others;
    }
    return s;
  }
  shm::communicator& intra_;
  Inter& rail_;
};

}  // namespace detail

template <communicator Inter>
class cpu_group : public typed_collectives<cpu_group<Inter>> {
  using typed = typed_collectives<cpu_group<Inter>>;

 public:
  KFT_TYPED_COLLECTIVES(typed);

  cpu_group(cpu_group_parts<Inter> parts, cpu_group_config cfg = {})
      : cfg_(cfg),
        p_(std::move(parts)),
        engine_("cpu group rank " + std::to_string(p_.flat.rank()),
                p_.intra->configuration().bind_progress_thread ? async::placement{p_.intra->rank(), p_.intra->size()}
                                                               : async::placement{}) {
    if (p_.layout.nodes() > 1 && !p_.layout.uniform()) {
      fallback_ = p_.layout.describe() + ": nodes hold different numbers of ranks, so allreduce runs flat (hierarchical "
                                         "needs the same count on every node)";
      if (cfg_.warn && p_.flat.rank() == 0) std::fprintf(stderr, "kft: %s\n", fallback_.c_str());
    }
    marked_.emplace(*p_.intra, p_.rail);
    if (p_.layout.nodes() > 1) p_.intra->expect_outside(marked_->bound({}));
    hier_.emplace(*p_.intra, *marked_, cfg_.hierarchical);
  }
  cpu_group(cpu_group&&) = delete;  // the hierarchical algorithm holds references into this object
  cpu_group& operator=(cpu_group&&) = delete;
  ~cpu_group() {
    engine_.drain();
    hier_.reset();
    p_.intra.reset();  // the shm segment before the store that hosts its rendezvous keys
  }

  int rank() const noexcept { return p_.flat.rank(); }
  int size() const noexcept { return p_.flat.size(); }
  std::uint64_t sequence() const noexcept { return issued_; }
  const topology::layout& layout() const noexcept { return p_.layout; }
  /// @brief The group's ranks this rank knows are gone, as ranks of the group: what a shrink
  /// knows is lost. On this node, those whose processes are gone (the node's shared-memory
  /// communicator sees them); on other nodes, those the inter-node communicators found gone
  /// (when `Inter` tells: Gloo names a peer that closed the connection and recorded nothing).
  std::vector<int> lost_ranks() const {
    std::vector<int> out;
    const auto& mine = p_.layout.local_members();
    for (int l : p_.intra->lost_ranks())
      if (l >= 0 && l < static_cast<int>(mine.size())) out.push_back(mine[static_cast<std::size_t>(l)]);
    if constexpr (requires(const Inter& c) { c.lost_ranks(); }) {
      for (int r : p_.flat.lost_ranks()) out.push_back(r);
      if constexpr (requires(const Inter& c) { c.world_rank_of(0); }) {
        // A rail's member, by its job rank, to the group's rank with that job rank.
        for (int m : p_.rail.lost_ranks()) {
          const int job = p_.rail.world_rank_of(m);
          for (int r = 0; r < p_.flat.size(); ++r)
            if (p_.flat.world_rank_of(r) == job) out.push_back(r);
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  /// @brief Every rank of the job, for flat collectives.
  Inter& flat() noexcept { return p_.flat; }
  /// @brief The ranks of this node.
  shm::communicator& intra() noexcept { return *p_.intra; }
  /// @brief The ranks with this rank's local index, one per node.
  Inter& rail() noexcept { return p_.rail; }
  /// @brief Why hierarchical allreduce is off for this job (uneven nodes), or empty.
  const std::string& fallback_reason() const noexcept { return fallback_; }
  error_site next_site(collective c) const { return p_.flat.next_site(c); }

  /// @brief What `algo::automatic` runs: `one_shot`/`two_shot` (single node: the shm choice),
  /// `hierarchical` or `flat`.
  algo choose(std::size_t bytes, algo requested = algo::automatic) const {
    if (requested == algo::automatic) requested = cfg_.strategy;
    if (requested == algo::flat) return algo::flat;
    if (p_.layout.nodes() == 1) {
      if (requested == algo::one_shot || requested == algo::two_shot) return requested;
      return p_.intra->choose(collective::allreduce, bytes);
    }
    if (!p_.layout.uniform()) return algo::flat;  // also when hierarchical was asked: never wrong
    return algo::hierarchical;
  }

  /// @brief out = in reduced over every rank. in == out is in place.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    engine_.drain();
    ++issued_;
    run_allreduce(in, out, count, t, op, o);
  }
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    engine_.drain();
    ++issued_;
    p_.flat.broadcast(in, out, count, t, root, o);
  }
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    engine_.drain();
    ++issued_;
    p_.flat.reduce_scatter(in, out, recv_count, t, op, o);
  }
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    engine_.drain();
    ++issued_;
    p_.flat.allgather(in, out, send_count, t, o);
  }
  void barrier(const options& o = {}) {
    engine_.drain();
    ++issued_;
    p_.flat.barrier(o);
  }

  async::work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    return submit(collective::allreduce, o, [=, this] { run_allreduce(in, out, count, t, op, o); });
  }
  async::work broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    return submit(collective::broadcast, o, [=, this] { p_.flat.broadcast(in, out, count, t, root, o); });
  }
  async::work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                                   const options& o = {}) {
    return submit(collective::reduce_scatter, o, [=, this] { p_.flat.reduce_scatter(in, out, recv_count, t, op, o); });
  }
  async::work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    return submit(collective::allgather, o, [=, this] { p_.flat.allgather(in, out, send_count, t, o); });
  }
  async::work barrier_async(const options& o = {}) {
    return submit(collective::barrier, o, [=, this] { p_.flat.barrier(o); });
  }

  /// @brief Stops every level: the node's ranks see it at once, the other nodes through the
  /// inter-node communicator's own abort (MPI: at their deadlines).
  void abort(std::string_view reason) noexcept {
    p_.intra->abort(reason);
    p_.rail.abort(reason);
    p_.flat.abort(reason);
  }

 private:
  void run_allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o) {
    const algo a = choose(count * size_of(t), o.algorithm);
    switch (a) {
      case algo::flat: {  // the inter communicator's large-message algorithm, its own choice below
        options f = o;
        f.algorithm = count * size_of(t) >= cfg_.hierarchical.small_bytes ? cfg_.flat_large : algo::automatic;
        return p_.flat.allreduce(in, out, count, t, op, f);
      }
      case algo::hierarchical:
        try {
          return (*hier_)(in, out, count, t, op, o);
        } catch (const usage_error&) {  // this rank's arguments: nothing broke
          throw;
        } catch (const error& e) {
          // A level failed (a deadline, a peer gone, a call that did not match): the node's ranks
          // and this rank's rail learn it now, with this error's text, which names the rank at
          // fault. A node peer waiting for this rank would otherwise time out blaming it (the
          // middle of the chain), and a rail peer would name this rank as silent.
          abort(e.what());
          throw;
        }
      default: {
        options s = o;
        s.algorithm = a;
        return p_.intra->allreduce(in, out, count, t, op, s);
      }
    }
  }
  template <class F>
  async::work submit(collective c, const options& o, F&& f) {
    const auto seq = ++issued_;
    auto timeout = timeout_or(o, p_.intra->configuration().timeout);
    // Across nodes a node peer's wait may give a rank inside its rail's call that call's bound
    // more (marked_rail): the handle's deadline must not fire before the errors of the levels.
    if (c == collective::allreduce && p_.layout.nodes() > 1) timeout += marked_->bound(o);
    return engine_.submit({c, seq, timeout, {}}, std::forward<F>(f));
  }

  cpu_group_config cfg_;
  cpu_group_parts<Inter> p_;
  std::optional<detail::marked_rail<Inter>> marked_;
  std::optional<hierarchical_allreduce<shm::communicator, detail::marked_rail<Inter>>> hier_;
  std::string fallback_;
  async::engine engine_;
  std::uint64_t issued_ = 0;
};

}  // namespace group
KFT_NAMESPACE_END
