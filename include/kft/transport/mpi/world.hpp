/// @file kft/transport/mpi/world.hpp
/// @brief The CPU job across nodes (component `kft::mpi`): shared memory inside each node, MPI
/// across nodes, and the choice between flat and hierarchical allreduce.
///
///     MPI_Init(&argc, &argv);
///     kft::mpi::world w;                    // collective over MPI_COMM_WORLD
///     w.allreduce(std::span<const float>(g), std::span<float>(g), kft::ops::sum);
///     w.layout().describe();                // "2 nodes x 4 ranks"
///
/// Construction exchanges host identities (`kft::topology::host_id()`: host name + boot id, or
/// `KFT_HOST_ID`), groups ranks by node, builds a shm communicator per node (through a store
/// bootstrapped over the node's MPI ranks), one MPI communicator per rail (the ranks with the
/// same local index) and keeps a duplicate of the whole communicator for flat collectives.
///
/// The choice (`choose`, forced by `options::algorithm` or `KFT_ALGO=flat|hierarchical|auto`):
///  - one node: the shm communicator alone;
///  - several nodes with the same number of ranks each: hierarchical;
///  - uneven nodes (e.g. 2 + 1): flat, with a one-line warning from rank 0 at construction
///    (a forced `hierarchical` falls back the same way: never a wrong result).
/// Flat is kft's ring over every rank from `hierarchical.small_bytes` up (bandwidth-optimal,
/// both link directions busy), MPI's own allreduce below it (fewer steps).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/world.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kft/collectives/allreduce_hierarchical.hpp>
#include <kft/discovery/mpi.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#include <kft/topology/mpi.hpp>
#include <kft/transport/mpi/communicator.hpp>
#include <kft/transport/shm/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi {

/// @brief Settings of a `world`.
struct world_config {
  shm::config shm;                   ///< the per-node shared-memory communicator
  config mpi;                        ///< the flat and rail MPI communicators
  hierarchical_config hierarchical;  ///< pipeline chunk and small-message threshold
  std::optional<std::string> host;   ///< this rank's host identity (default: topology::host_id())
  bool warn = true;                  ///< rank 0 prints the one-line fallback warning
};

/// @brief Parses `KFT_ALGO` (auto, flat, hierarchical); absent = auto.
/// @throws config_error naming the variable and value
inline algo algo_from_env(const environment& env = environment::process()) {
  const auto v = env.get("KFT_ALGO");
  if (!v || v->empty() || *v == "auto") return algo::automatic;
  if (*v == "flat") return algo::flat;
  if (*v == "hierarchical") return algo::hierarchical;
  throw config_error("KFT_ALGO", *v, "is not auto, flat or hierarchical", error_site::of("allreduce"));
}

class world {
 public:
  /// @brief Collective over `comm`.
  explicit world(MPI_Comm comm = MPI_COMM_WORLD, world_config cfg = {})
      : cfg_(std::move(cfg)), flat_(comm, cfg_.mpi), forced_(algo_from_env()) {
    // N processes that each initialised MPI alone (kftrun, or another MPI's launcher) would
    // otherwise run as N silent one-rank jobs.
    discovery::verify_mpi_world(environment::process());
    layout_ = topology::exchange(flat_.native(), cfg_.host ? *cfg_.host : topology::host_id());

    // The node's ranks meet through a store of their own (127.0.0.1 when MPI sees them on one
    // machine), then map one shared segment.
    node_ = flat_.split(layout_.node(), layout_.local_rank());
    store_ = rendezvous::mpi_bootstrap(node_.native());
    shm::config sc = cfg_.shm;
    if (sc.name == "kft") sc.name = "kft-node" + std::to_string(layout_.node());
    intra_ = std::make_unique<shm::communicator>(store_.client, layout_.local_rank(), layout_.local_size(), sc);
    rail_ = flat_.split(layout_.local_rank(), layout_.node());
    if (layout_.nodes() > 1 && !layout_.uniform()) {
      fallback_ = layout_.describe() + ": nodes hold different numbers of ranks, so allreduce runs flat over "
                                       "MPI (hierarchical needs the same count on every node)";
      if (cfg_.warn && flat_.rank() == 0) std::fprintf(stderr, "kft: %s\n", fallback_.c_str());
    }
    hier_.emplace(*intra_, rail_, cfg_.hierarchical);
  }
  world(world&&) = delete;  // the hierarchical algorithm holds references into this object
  world& operator=(world&&) = delete;
  ~world() {
    // Drop the shm segment before the store that hosts its rendezvous keys.
    hier_.reset();
    intra_.reset();
  }

  int rank() const noexcept { return flat_.rank(); }
  int size() const noexcept { return flat_.size(); }
  const topology::layout& layout() const noexcept { return layout_; }
  /// @brief Every rank of the job, for flat collectives.
  communicator& flat() noexcept { return flat_; }
  /// @brief The ranks of this node.
  shm::communicator& intra() noexcept { return *intra_; }
  /// @brief The ranks with this rank's local index, one per node.
  communicator& rail() noexcept { return rail_; }

  /// @brief Why hierarchical allreduce is off for this job (uneven nodes), or empty.
  const std::string& fallback_reason() const noexcept { return fallback_; }

  /// @brief What `algo::automatic` runs: `one_shot`/`two_shot` (single node: the shm choice),
  /// `hierarchical` or `flat`.
  algo choose(std::size_t bytes, algo requested = algo::automatic) const {
    if (requested == algo::automatic) requested = forced_;
    if (requested == algo::flat) return algo::flat;
    if (layout_.nodes() == 1) {
      if (requested == algo::one_shot || requested == algo::two_shot) return requested;
      return intra_->choose(shm::collective::allreduce, bytes);
    }
    if (!layout_.uniform()) return algo::flat;  // also when hierarchical was asked: never wrong
    return algo::hierarchical;
  }

  /// @brief out = in reduced over every rank. in == out is in place.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    const algo a = choose(count * size_of(t), o.algorithm);
    switch (a) {
      case algo::flat: {  // kft's ring over every rank for large messages, MPI's own below
        options f = o;
        f.algorithm = count * size_of(t) >= cfg_.hierarchical.small_bytes ? algo::ring : algo::automatic;
        return flat_.allreduce(in, out, count, t, op, f);
      }
      case algo::hierarchical: return (*hier_)(in, out, count, t, op, o);
      default: {
        options s = o;
        s.algorithm = a;
        return intra_->allreduce(in, out, count, t, op, s);
      }
    }
  }
  template <class T, reduction Op>
  void allreduce(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    if (in.size() != out.size())
      throw usage_error("allreduce: buffer sizes do not match (" + std::to_string(in.size()) + " vs " +
                            std::to_string(out.size()) + " elements)",
                        error_site::of("allreduce"));
    allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op>
  void allreduce(std::span<T> inout, Op op, const options& o = {}) {
    allreduce(std::span<const T>(inout), inout, op, o);
  }

 private:
  world_config cfg_;
  communicator flat_;
  algo forced_;
  topology::layout layout_;
  communicator node_{MPI_COMM_SELF};
  rendezvous::store_handle store_;
  std::unique_ptr<shm::communicator> intra_;
  communicator rail_{MPI_COMM_SELF};
  std::optional<hierarchical_allreduce<shm::communicator, communicator>> hier_;
  std::string fallback_;
};

}  // namespace mpi
KFT_NAMESPACE_END
