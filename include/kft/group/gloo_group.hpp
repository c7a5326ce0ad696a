// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/gloo_group.hpp
/// @brief The CPU job across nodes with Gloo between them (component `kft::gloo`): for jobs no
/// MPI launcher started (kftrun agents, torchrun, a Kubeflow TrainJob's pods).
///
///     auto me = kft::discover();
///     auto store = kft::rendezvous::connect_store(me);
///     auto g = kft::group::gloo_group(store.client, me);   // collective over the job
///     g->allreduce(std::span<float>(grad), kft::ops::avg);
///
/// Construction exchanges host identities through the job's store (`topology::exchange`:
/// host name + boot id, or `KFT_HOST_ID`), groups ranks by node, maps one shared-memory segment
/// per node, opens one Gloo TCP device on the interface `KFT_SOCKET_IFNAME` names (default: the
/// one that routes to the store's host, `gloo::choose_interface`), and connects two Gloo
/// communicators through the store: every rank (flat collectives) and this rank's rail (the
/// ranks with its local index, one per node: the hierarchical allreduce's inter-node step).
/// Each construction meets under a scope of its own, so a job may build several groups.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/group/gloo_group.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <kft/core/environment.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/group/cpu_group.hpp>
#include <kft/group/node.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/topology/layout.hpp>
#include <kft/transport/gloo/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief A CPU group with Gloo between nodes.
using gloo_cpu_group = cpu_group<gloo::communicator>;

/// @brief Settings of `gloo_group` (the environment's, applied by `gloo_group_config_from`).
struct gloo_group_config {
  cpu_group_config group{};                      ///< flat = Gloo's ring
  shm::config shm;                               ///< the per-node shared-memory communicator
  gloo::config gloo;                             ///< the flat and rail Gloo communicators
  std::optional<std::string> host;               ///< this rank's host identity (default: topology::host_id())
  std::optional<gloo::interface_choice> nic;     ///< the interface (default: `gloo_interface`)
  /// The store scope its ranks meet under; empty: one of its own per construction (a counter
  /// per rank). A group built again over a shrunk membership names one (its ranks are
  /// renumbered, so their counters would not agree).
  std::string scope;
};

/// @brief Where the job's store lives, seen from this rank: the address Gloo's interface is
/// chosen towards (`KFT_STORE_ADDR`, else the launcher's master address, else 127.0.0.1).
inline std::string store_host(const world_info& w, const environment& env = environment::process()) {
  if (auto a = env.get("KFT_STORE_ADDR"); a && !a->empty()) return *a;
  if (w.master_addr && !w.master_addr->empty()) return *w.master_addr;
  return "127.0.0.1";
}

/// @brief The interface Gloo's connections use for this rank (`KFT_SOCKET_IFNAME`, else the
/// route to the store's host).
/// @throws config_error naming the setting (see `gloo::choose_interface`)
inline gloo::interface_choice gloo_interface(const world_info& w, const environment& env = environment::process()) {
  return gloo::choose_interface(env.get("KFT_SOCKET_IFNAME"), store_host(w, env));
}

/// @brief `base` with the environment's settings: `KFT_ALGO`, `KFT_SHM_*`, and `KFT_TIMEOUT`
/// (the Gloo communicators' `timeout` and `report_grace`) where a timeout holds its default
/// (`apply_timeout`).
inline gloo_group_config gloo_group_config_from(const environment& env, gloo_group_config base = {}) {
  base.group.strategy = strategy_from(env);
  base.shm = shm_config(env, std::move(base.shm));
  const derived_timeouts job = timeouts(env);
  apply_timeout(base.gloo.timeout, job);
  apply_timeout(base.gloo.report_grace, job, &derived_timeouts::report_grace);
  return base;
}

/// @brief Collective over the job's `w.world_size` ranks meeting in `store`. `KFT_TIMEOUT` in
/// `env` applies to `settings` given too, where a timeout holds its default.
/// @throws config_error for a bad setting or interface, timeout_error when a rank does not
/// arrive, transport_error when Gloo cannot connect
inline std::unique_ptr<gloo_cpu_group> gloo_group(std::shared_ptr<rendezvous::store> store, const world_info& w,
                                                  const environment& env = environment::process(),
                                                  std::optional<gloo_group_config> settings = std::nullopt) {
  if (!store) throw usage_error("gloo_group needs the job's store", error_site::of("gloo group"));
  gloo_group_config cfg = settings ? std::move(*settings) : gloo_group_config_from(env);
  const derived_timeouts job = timeouts(env);
  apply_timeout(cfg.gloo.timeout, job);
  apply_timeout(cfg.gloo.report_grace, job, &derived_timeouts::report_grace);
  apply_timeout(cfg.shm.timeout, job);
  const auto nic = cfg.nic ? *cfg.nic : gloo_interface(w, env);
  // A scope per construction (every rank builds its groups in the same order).
  const std::string scope = !cfg.scope.empty() ? cfg.scope
                            : "gloo-group/" + std::to_string(store->add("gloo-group/calls/" + std::to_string(w.rank), 1)) + "/";
  auto scoped = [&](const std::string& sub) { return std::make_shared<rendezvous::prefix_store>(store, scope + sub); };

  // (a named scope: the exchange's own per-rank counters too, ranks renumbered by a shrink)
  const std::shared_ptr<rendezvous::store> topo = cfg.scope.empty() ? store : scoped("topology/");
  auto lay = topology::exchange(*topo, w.rank, w.world_size, cfg.host ? *cfg.host : topology::host_id(env),
                                cfg.gloo.timeout);
  const std::string node_label = "node " + std::to_string(lay.node());
  rendezvous::store_handle node_store;
  node_store.client = scoped("node" + std::to_string(lay.node()) + "/");
  shm::config sc = cfg.shm;
  if (sc.name == "kft") sc.name = "kft-node" + std::to_string(lay.node());
  sc.identity = {w.rank, w.world_size, node_label};
  auto intra = std::make_unique<shm::communicator>(node_store.client, lay.local_rank(), lay.local_size(), sc);

  // Messages name hosts as people know them: KFT_HOST_ID where it splits a machine, else the host name.
  const std::string host = env.get("KFT_HOST_ID").value_or(w.hostname);
  auto device = gloo::make_device(nic);
  gloo::config fc = cfg.gloo;
  fc.identity = {w.rank, w.world_size, ""};
  fc.host = host;
  gloo::communicator flat(scoped("flat/"), w.rank, w.world_size, device, fc);
  const int k = lay.local_rank();
  const auto members = lay.rail(k);
  const int at = static_cast<int>(std::find(members.begin(), members.end(), w.rank) - members.begin());
  gloo::config rc = cfg.gloo;
  rc.identity = {w.rank, w.world_size, "rail " + std::to_string(k)};
  rc.host = host;
  gloo::communicator rail(scoped("rail" + std::to_string(k) + "/"), at, static_cast<int>(members.size()), device, rc);
  cpu_group_parts<gloo::communicator> parts{.layout = std::move(lay),
                                            .node_store = std::move(node_store),
                                            .intra = std::move(intra),
                                            .flat = std::move(flat),
                                            .rail = std::move(rail)};
  return std::make_unique<gloo_cpu_group>(std::move(parts), cfg.group);
}

}  // namespace group
KFT_NAMESPACE_END
