// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/factory.hpp
/// @brief `make_process_group`: the right process group for this job, from what discovery
/// found. The one place below the tools that reads kft's environment settings; every transport
/// takes its settings as arguments.
///
///     auto me = kft::discover();
///     auto store = kft::rendezvous::connect_store(me);
///     auto pg = kft::group::make_process_group(me, store.client);
///     std::printf("%s\n", pg.description().c_str());   // "shared memory: 1 node x 4 ranks"
///
/// | the job | group |
/// | --- | --- |
/// | every rank on one node | the node's shared-memory communicator |
/// | several nodes, MPI initialised (mpirun, srun --mpi=pmix) | `cpu_group<mpi::communicator>` (`mpi_group`) |
/// | several nodes, no MPI (kftrun agents, torchrun, a TrainJob's pods) | `cpu_group<gloo::communicator>` (`gloo_group`) |
/// | `KFT_HOST_ID` set | the same choice of MPI or Gloo: the topology exchange finds the nodes (one node: shm inside it) |
/// | several nodes, neither MPI running nor Gloo built | refused, saying what to do |
///
/// `KFT_INTER_NODE=mpi|gloo` overrides the choice between MPI and Gloo (`auto`, the default:
/// MPI when it is initialised, else Gloo). The group's `description()` says which it is.
///
/// Environment read here: `KFT_SHM_TUNING` (a file from bench/scripts/tune_shm.py),
/// `KFT_SHM_STAGING_BYTES`, `KFT_SHM_SMALL_BYTES`, `KFT_SHM_STREAMING_BYTES`, `KFT_SHM_HUGE_PAGES`,
/// `KFT_SHM_REGION_ALIGN`, `KFT_PROGRESS_AFFINITY`, `KFT_RUN_ID`/`TORCHELASTIC_RUN_ID` (segment
/// names), `KFT_ALGO`, `KFT_MPI_CHECK`, `KFT_INTER_NODE`, `KFT_SOCKET_IFNAME`, `KFT_HOST_ID`
/// (through topology), and
/// `KFT_TIMEOUT`: every transport's default deadline (`group_options::timeout` wins over it),
/// `KFT_TRACE_ENTRIES` and `KFT_TRACE_DIR` (the flight recorder), `KFT_STATUS_NAME` (kftrun's live
/// status, kft/core/live_status.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include <kft/config.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/core/live_status.hpp>
#include <kft/core/parse.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/group/cpu_group.hpp>
#include <kft/group/node.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/store.hpp>
#if KFT_WITH_MPI
#include <kft/group/mpi_group.hpp>
#endif
#if KFT_WITH_GLOO
#include <kft/group/gloo_group.hpp>
#endif

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief Settings a caller may give; the environment's are applied on top.
struct group_options {
  shm::config shm;                                 ///< the node's shared-memory communicator
  cpu_group_config group{.flat_large = algo::ring};  ///< across nodes
  /// Every transport's default deadline (shared memory, MPI, Gloo); 0 = `shm.timeout` for
  /// shared memory and each inter-node transport's own, where `KFT_TIMEOUT` applies to a timeout
  /// still at its default.
  std::chrono::milliseconds timeout{0};
};

/// @brief The flight recorder's settings (kft/core/flight_recorder.hpp): `KFT_TRACE_ENTRIES`
/// (the ring's size, 2048; 0: none) and `KFT_TRACE_DIR` (where dumps go; unset: none).
/// @throws config_error naming a malformed value
inline trace::settings trace_settings(const environment& env = environment::process()) {
  trace::settings s;
  if (auto v = env.get("KFT_TRACE_ENTRIES"); v && !v->empty())
    s.entries = static_cast<std::size_t>(kft::detail::parse_integer("KFT_TRACE_ENTRIES", *v, 0, 1 << 24, "the flight recorder's ring size"));
  s.dir = env.get("KFT_TRACE_DIR").value_or("");
  return s;
}

namespace detail {
inline process_group make_untraced(const world_info& w, std::shared_ptr<rendezvous::store> store, group_options o,
                                   const environment& env);
}

/// @brief Collective over the job: the process group of this rank (see the table above). It
/// keeps a flight recorder of its calls (`trace_settings`).
/// @throws config_error when the job spans nodes and no inter-node transport is available, or
/// a setting is malformed
inline process_group make_process_group(const world_info& w, std::shared_ptr<rendezvous::store> store,
                                        group_options o = {}, const environment& env = environment::process()) {
  const auto traced = trace_settings(env);
  trace::configure(traced, w.rank, w.world_size, env.get("KFT_HOST_ID").value_or(w.hostname));
  // (kftrun's live status: a thread answering where this rank is; kft/core/live_status.hpp)
  if (const auto status = env.get("KFT_STATUS_NAME"); status && !status->empty()) trace::serve_status(*status, w.rank);
  auto pg = detail::make_untraced(w, std::move(store), std::move(o), env);
  // (its id in the dumps: "job", then "job#2", ... for further groups this process makes: the
  // ranks make them in the same order)
  static std::atomic<int> made{0};
  const int n = ++made;
  pg.record(traced, n == 1 ? std::string("job") : "job#" + std::to_string(n));
  return pg;
}

inline process_group detail::make_untraced(const world_info& w, std::shared_ptr<rendezvous::store> store,
                                           group_options o, const environment& env) {
  bool mpi_running = false;
#if KFT_WITH_MPI
  {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    mpi_running = initialized && !finalized;
  }
#endif
  std::string inter = env.get("KFT_INTER_NODE").value_or("auto");
  if (inter.empty()) inter = "auto";
  if (inter != "auto" && inter != "mpi" && inter != "gloo")
    throw config_error("KFT_INTER_NODE", inter, "is not auto, mpi or gloo", error_site::of("process group"));
  const bool use_mpi = inter == "mpi" || (inter == "auto" && mpi_running);
  // KFT_HOST_ID names the node a rank is on, over what the launcher says (one machine split
  // into "nodes", or hosts whose names collide): then the topology exchange inside the CPU
  // group decides, not the launcher's local size.
  const bool host_ids = w.world_size > 1 && env.get("KFT_HOST_ID").has_value() && (mpi_running || KFT_WITH_GLOO);
  const bool one_node =
      !host_ids && (w.world_size == 1 || w.node_count == 1 || (w.local_size && *w.local_size == w.world_size));
  if (o.timeout.count() > 0) o.shm.timeout = o.timeout;
  const bool joining = env.get("KFT_JOIN").value_or("").size() && env.get("KFT_JOIN") != "0";
  if (joining && !one_node && use_mpi)
    throw config_error("KFT_JOIN", *env.get("KFT_JOIN"),
                       "asks to join a running group, which an MPI group cannot admit (MPI without ULFM); a node's "
                       "shared-memory group and the Gloo group across nodes can",
                       error_site::in({}, w.rank, w.world_size, "process group"));
  if (joining && one_node) {
    // A restarted worker (kftrun --on-failure heal): it joins the running node group at a step
    // boundary instead of building generation 0 with everyone. (Across nodes: below.)
    if (!w.local_rank || !w.local_size)
      throw config_error("KFT_JOIN", *env.get("KFT_JOIN"),
                         "asks to join a running node group, but the launcher gave no LOCAL_RANK and LOCAL_WORLD_SIZE",
                         error_site::in({}, w.rank, w.world_size, "process group"));
    auto cfg = node_config(w, std::move(o.shm), env);
    const auto wait = cfg.timeout;
    return process_group::join(std::move(store), std::move(cfg), *w.local_rank, *w.local_size, wait);
  }
  if (one_node) {
    auto comm = node_communicator(std::move(store), w, std::move(o.shm), env);
    const std::string what = "shared memory: 1 node x " + std::to_string(comm.size()) +
                             (comm.size() == 1 ? " rank" : " ranks");
    return process_group(std::move(comm), what);
  }
  const auto site = error_site::in({}, w.rank, w.world_size, "process group");
  if (use_mpi) {
#if KFT_WITH_MPI
    if (!mpi_running)
      throw config_error("KFT_INTER_NODE", inter,
                         "asks for MPI between nodes, but MPI is not initialised (call MPI_Init, and start the job "
                         "with mpirun or srun --mpi=pmix)",
                         site);
    mpi_group_config cfg;
    cfg.group = o.group;
    cfg.shm = std::move(o.shm);
    cfg = mpi_group_config_from(env, std::move(cfg));
    if (o.timeout.count() > 0) cfg.mpi.timeout = o.timeout;
    auto g = mpi_group(MPI_COMM_WORLD, env, cfg);
    const std::string what = "shared memory per node + MPI between nodes: " + g->layout().describe();
    return process_group(std::move(g), what);
#else
    throw config_error("KFT_INTER_NODE", inter, "asks for MPI, but kft was built without MPI (KFT_WITH_MPI=OFF)", site);
#endif
  }
#if KFT_WITH_GLOO
  gloo_group_config cfg;
  cfg.group = o.group;
  cfg.shm = std::move(o.shm);
  cfg = gloo_group_config_from(env, std::move(cfg));
  if (o.timeout.count() > 0) cfg.gloo.timeout = o.timeout;
  cfg.nic = gloo_interface(w, env);
  const std::string nic = cfg.nic->describe();
  // Going on without a lost rank (process_group::shrink) and growing back (grow, join_rebuilt):
  // the members build the group again over each membership, each generation under a store
  // scope of its own.
  const std::string run = env.get("KFT_RUN_ID").value_or(env.get("TORCHELASTIC_RUN_ID").value_or("job"));
  process_group::rebuilder again = [store, w, env, cfg, run, nic](int rank, int size, std::uint64_t generation) {
    world_info next = w;
    next.rank = rank;
    next.world_size = size;
    gloo_group_config c = cfg;
    c.scope = "gloo-group/" + run + "/g" + std::to_string(generation) + "/";
    c.shm.name = "kft-" + run + "-g" + std::to_string(generation);
    auto g = gloo_group(store, next, env, c);
    const std::string text = "shared memory per node + Gloo between nodes (TCP on " + nic + "): " + g->layout().describe();
    return process_group(std::move(g), text);
  };
  if (joining) {
    // A restarted worker (kftrun --on-failure heal) joins the running group across nodes as its
    // job rank, at a step boundary, and builds the generation it was admitted to with the others.
    const auto wait = cfg.gloo.timeout;
    return process_group::join_rebuilt(std::move(store), "gloo/" + run, w.rank, w.world_size, wait, std::move(again));
  }
  auto g = gloo_group(store, w, env, cfg);
  const std::string what = "shared memory per node + Gloo between nodes (TCP on " + nic + "): " + g->layout().describe();
  process_group pg(std::move(g), what);
  pg.rebuild_with(std::move(again), "gloo/" + run);
  return pg;
#else
  throw config_error("", "",
                     "the job spans " + (w.node_count ? std::to_string(*w.node_count) : std::string("several")) +
                         " nodes and has no inter-node CPU transport: MPI is not initialised (start the job with "
                         "mpirun or srun --mpi=pmix and call MPI_Init) and kft was built without Gloo "
                         "(KFT_WITH_GLOO=OFF; Debian: apt-get install libgloo-dev)",
                     site);
#endif
}

}  // namespace group
KFT_NAMESPACE_END
