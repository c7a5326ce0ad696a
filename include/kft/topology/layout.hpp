// SPDX-License-Identifier: Apache-2.0
/// @file kft/topology/layout.hpp
/// @brief Which ranks share a node: host identities exchanged through the job's store.
///
///     auto lay = kft::topology::exchange(*store, w.rank, w.world_size);
///     lay.nodes();        // 2
///     lay.local_rank();   // my index among the ranks of my node
///     lay.rail(1);        // the global ranks with local index 1, one per node
///
/// A host is identified by its host name and the kernel's boot id (two containers on one machine
/// that share the host name but not /dev/shm still differ by neither, so `KFT_HOST_ID` overrides
/// both; tests use it to split one machine into several "nodes"). Nodes are numbered in the order
/// of their lowest global rank; ranks within a node in global-rank order.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/timeout.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace topology {

/// @brief This process's host identity: `KFT_HOST_ID` when set, else "<hostname>/<boot id>",
/// followed by "/<SLURMD_NODENAME>" under Slurm.
/// @throws config_error when KFT_HOST_ID is set but empty or has a newline
inline std::string host_id(const environment& env = environment::process()) {
  if (auto id = env.get("KFT_HOST_ID")) {
    if (id->empty() || id->find('\n') != std::string::npos || id->size() > 255)
      throw config_error("KFT_HOST_ID", *id, "must be 1-255 characters on one line", error_site::of("topology"));
    return *id;
  }
  char name[HOST_NAME_MAX + 1] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  std::string id = std::string(name) + "/" + boot;
  // Slurm's node: one per host on a real cluster; several "virtual nodes" on one host (slurmd
  // -N) are kept apart, as Slurm and PMIx keep them.
  if (auto node = env.get("SLURMD_NODENAME"); node && !node->empty()) id += "/" + *node;
  return id;
}

/// @brief The job's ranks grouped by node.
class layout {
 public:
  layout() = default;
  /// @brief From every rank's host identity, in global-rank order. `rank` is this process.
  layout(int rank, std::vector<std::string> hosts) : rank_(rank), hosts_(std::move(hosts)) {
    if (hosts_.empty() || rank < 0 || rank >= static_cast<int>(hosts_.size()))
      throw usage_error("topology: rank " + std::to_string(rank) + " outside a world of " +
                            std::to_string(hosts_.size()),
                        error_site::of("topology"));
    std::map<std::string, int> index;
    node_of_.resize(hosts_.size());
    for (std::size_t r = 0; r < hosts_.size(); ++r) {
      auto [it, fresh] = index.emplace(hosts_[r], static_cast<int>(members_.size()));
      if (fresh) members_.emplace_back();
      node_of_[r] = it->second;
      members_[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(r));
    }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(node_of_.size()); }
  int nodes() const noexcept { return static_cast<int>(members_.size()); }
  /// @brief My node's index.
  int node() const { return node_of(rank_); }
  int node_of(int r) const { return node_of_.at(static_cast<std::size_t>(r)); }
  /// @brief Global ranks on node `n`, ascending.
  const std::vector<int>& members(int n) const { return members_.at(static_cast<std::size_t>(n)); }
  const std::vector<int>& local_members() const { return members(node()); }
  int local_size() const { return static_cast<int>(local_members().size()); }
  int local_rank() const { return local_index(rank_); }
  /// @brief r's index among the ranks of its node.
  int local_index(int r) const {
    const auto& m = members(node_of(r));
    return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
  }
  /// @brief Every node holds the same number of ranks (what the hierarchical algorithms need).
  bool uniform() const noexcept {
    return std::all_of(members_.begin(), members_.end(), [&](const auto& m) { return m.size() == members_[0].size(); });
  }
  /// @brief Global ranks with local index `k`, one per node that has one, in node order:
  /// the "rail" that carries local rank k's share across nodes.
  std::vector<int> rail(int k) const {
    std::vector<int> out;
    for (const auto& m : members_)
      if (k < static_cast<int>(m.size())) out.push_back(m[static_cast<std::size_t>(k)]);
    return out;
  }
  const std::string& host_of(int r) const { return hosts_.at(static_cast<std::size_t>(r)); }
  /// @brief "2 nodes x 2 ranks" or "3 nodes, uneven: 2+1".
  std::string describe() const {
    if (members_.empty()) return "no ranks";
    std::string s = std::to_string(nodes()) + (nodes() == 1 ? " node" : " nodes");
    if (uniform()) return s + " x " + std::to_string(members_[0].size()) + (members_[0].size() == 1 ? " rank" : " ranks");
    s += ", uneven: ";
    for (std::size_t n = 0; n < members_.size(); ++n) {
      if (n) s += '+';  // (not `(n ? "+" : "") + to_string(...)`: GCC 12 -O3 warns -Wrestrict on it)
      s += std::to_string(members_[n].size());
    }
    return s;
  }

 private:
  int rank_ = 0;
  std::vector<std::string> hosts_;
  std::vector<int> node_of_;
  std::vector<std::vector<int>> members_;
};

/// @brief Collective over the job: every rank publishes its host identity in `store` and reads
/// everyone's. Keys go under "topology/<n>/" (n counts exchanges, so a job may call it again).
/// `timeout` is the job's (the process groups pass their transport's: `KFT_TIMEOUT` applied).
/// @throws timeout_error naming the ranks that did not publish within `timeout`
inline layout exchange(rendezvous::store& store, int rank, int size, std::string host = host_id(),
                       std::chrono::milliseconds timeout = default_job_timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw usage_error("topology exchange: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          " is not a valid place",
                      error_site::of("topology"));
  const auto round = store.add("topology/calls/" + std::to_string(rank), 1);
  const std::string scope = "topology/" + std::to_string(round) + "/host/";
  store.set(scope + std::to_string(rank), host);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(scope + std::to_string(r));
  std::vector<std::string> hosts;
  try {
    hosts = store.multi_get(keys, timeout);  // one request on the TCP store, whatever `size`
  } catch (const timeout_error&) {
    const auto present = store.keys(scope);  // one request, not one per rank
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r)
      if (!std::binary_search(present.begin(), present.end(), keys[static_cast<std::size_t>(r)]))
        missing += (count++ ? ", " : "") + std::to_string(r);
    if (count == 0) throw;  // everyone arrived just at the deadline: the store's own message
    throw timeout_error((count == 1 ? "rank " : "ranks ") + missing + " of " + std::to_string(size) +
                            " did not publish a host identity within " + kft::detail::describe_duration(timeout) +
                            " (on " + store.describe() + ")",
                        error_site::in({}, rank, size, "topology exchange", static_cast<std::uint64_t>(round)));
  }
  return layout(rank, std::move(hosts));
}

}  // namespace topology
KFT_NAMESPACE_END
