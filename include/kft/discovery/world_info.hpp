// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/world_info.hpp
/// @brief Who this process is in the job: the result of discovery.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN

/// @brief This process's place in the job, as one discovery backend decided it.
///
/// `rank` and `world_size` are always known. The local view (ranks on this node) and the
/// node view are optional because some launchers do not tell them: Open MPI's environment
/// has no node index, for instance (its `OMPI_COMM_WORLD_NODE_RANK` is something else).
/// Topology (later, by exchanging host identities) fills what discovery cannot.
struct world_info {
  int rank = 0;        ///< global rank, 0 <= rank < world_size
  int world_size = 1;  ///< number of processes in the job
  std::optional<int> local_rank;  ///< rank among the processes on this node
  std::optional<int> local_size;  ///< number of processes on this node
  std::optional<int> node_rank;   ///< index of this node, 0 <= node_rank < node_count
  std::optional<int> node_count;  ///< number of nodes in the job

  std::string hostname;                  ///< gethostname() of this process
  std::optional<std::string> node_name;  ///< the launcher's name for this node (Slurm node, pod)
  std::optional<std::string> master_addr;  ///< rendezvous address, when the launcher gave one
  std::optional<int> master_port;          ///< rendezvous port, when the launcher gave one

  std::string backend;  ///< the backend that decided: torchrun, mpi, slurm, kubeflow, kubernetes, single
  std::string source;   ///< what exactly it read, e.g. "OMPI_COMM_WORLD_* environment"
  std::vector<std::string> notes;  ///< assumptions made and other sources that disagreed

  /// @brief True when this is the only process of the job.
  bool is_single() const noexcept { return world_size == 1; }
};

/// @brief Several lines of "key: value" text, for people.
inline std::string to_string(const world_info& w) {
  auto opt = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("?"); };
  std::string s;
  s += "backend:      " + w.backend + " (" + w.source + ")\n";
  s += "rank:         " + std::to_string(w.rank) + " of " + std::to_string(w.world_size) + "\n";
  s += "local rank:   " + opt(w.local_rank) + " of " + opt(w.local_size) + "\n";
  s += "node:         " + opt(w.node_rank) + " of " + opt(w.node_count) + "\n";
  s += "hostname:     " + w.hostname + "\n";
  if (w.node_name) s += "node name:    " + *w.node_name + "\n";
  s += "master:       " + (w.master_addr ? *w.master_addr : std::string("?")) + ":" +
       opt(w.master_port) + "\n";
  for (const auto& n : w.notes) s += "note:         " + n + "\n";
  return s;
}

KFT_NAMESPACE_END
