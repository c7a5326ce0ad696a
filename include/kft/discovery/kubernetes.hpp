// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/kubernetes.hpp
/// @brief Plain Kubernetes: Indexed Jobs, JobSet pods and MPI Operator pods.
#pragma once

#include <cctype>
#include <optional>
#include <string>

#include <kft/discovery/backend.hpp>

KFT_NAMESPACE_BEGIN
namespace discovery {

/// @brief Pod-level discovery for Indexed Jobs (`JOB_COMPLETION_INDEX`), JobSet pods (hostname
/// `<jobset>-<job>-<jobIndex>-<podIndex>`) and MPI Operator pods (`K_MPI_JOB_ROLE`).
///
/// Kubernetes tells a pod its index but not how many pods there are, so the pod count comes
/// from `KFT_NNODES` (kft-manifest sets it) or from the MPI Operator's hostfile
/// (`/etc/mpi/hostfile`, or `KFT_MPI_HOSTFILE`). One process per pod is assumed unless
/// `KFT_NPROC_PER_NODE` says more, in which case a launcher (kftrun) must give per-process
/// ranks. The master defaults to pod 0 of the same Job on the JobSet's headless service:
/// `<jobset>-<job>-0-0.<subdomain>`, with the subdomain from `KFT_SUBDOMAIN` or, for
/// Trainer's `<trainjob>-node-<j>-<p>` pods, the TrainJob name.
struct kubernetes_env {
  static constexpr std::string_view name = "kubernetes";
  static constexpr std::string_view source = "Kubernetes pod (JOB_COMPLETION_INDEX, hostname, K_MPI_JOB_ROLE)";

  static std::optional<world_info> detect(const environment& env) {
    const auto role = env.get("K_MPI_JOB_ROLE");
    if (!env.has("JOB_COMPLETION_INDEX") && !role) return std::nullopt;
    constexpr std::string_view ctx = "Kubernetes pod";
    constexpr int max_nodes = 1 << 20;

    if (role && *role == "launcher")
      throw config_error("K_MPI_JOB_ROLE", *role,
                         "marks the MPIJob launcher pod, which starts the ranks with mpirun over its "
                         "hostfile and is not a rank itself; run the program through mpirun");
    if (role && *role != "worker")
      throw config_error("K_MPI_JOB_ROLE", *role, "is neither \"launcher\" nor \"worker\"");

    auto w = detail::start_world<kubernetes_env>(env);
    w.node_name = env.hostname();
    const auto pod = parse_pod_hostname(env.hostname());

    // This pod's index.
    if (env.has("JOB_COMPLETION_INDEX")) {
      w.node_rank = env_int_required(env, "JOB_COMPLETION_INDEX", 0, max_nodes, ctx);
    } else if (pod.index) {
      w.node_rank = pod.index;
    } else {
      throw config_error("K_MPI_JOB_ROLE", *role,
                         "is set, but the pod index is unknown: neither JOB_COMPLETION_INDEX nor a "
                         "hostname ending in -<index> (hostname \"" + env.hostname() + "\")");
    }

    // The number of pods.
    if (env.has("KFT_NNODES")) {
      w.node_count = env_int_required(env, "KFT_NNODES", 1, max_nodes, ctx);
    } else {
      const std::string path = env.get("KFT_MPI_HOSTFILE").value_or("/etc/mpi/hostfile");
      if (auto text = read_text_file(path)) {
        int hosts = 0;
        for (auto line : kft::detail::split(*text, '\n')) {
          auto first = line.find_first_not_of(" \t");
          if (first == std::string_view::npos || line[first] == '#') continue;
          if (line.find("-launcher") != std::string_view::npos) continue;  // runLauncherAsNode entry
          ++hosts;
        }
        if (hosts == 0) throw config_error("KFT_MPI_HOSTFILE", path, "lists no hosts");
        w.node_count = hosts;
        w.notes.push_back("pod count from " + path);
      } else {
        throw config_error("KFT_NNODES", "",
                           "is not set, so the number of pods is unknown (this pod's index is " +
                               std::to_string(*w.node_rank) +
                               "); kft-manifest sets KFT_NNODES, or run under kftrun/torchrun/mpirun");
      }
    }
    detail::require_below(env.has("JOB_COMPLETION_INDEX") ? "JOB_COMPLETION_INDEX" : "pod index",
                          *w.node_rank, env.has("KFT_NNODES") ? "KFT_NNODES" : "hostfile hosts",
                          *w.node_count, ctx);
    if (auto nproc = env_int(env, "KFT_NPROC_PER_NODE", 1, 1 << 16, ctx); nproc && *nproc > 1)
      throw config_error("KFT_NPROC_PER_NODE", std::to_string(*nproc),
                         "asks for several processes per pod, but this process has no per-process "
                         "rank: start it with `kftrun -- program` inside the pod");

    w.rank = *w.node_rank;
    w.world_size = *w.node_count;
    w.local_rank = 0;
    w.local_size = 1;

    if (auto addr = env.get("KFT_MASTER_ADDR")) {
      w.master_addr = *addr;
    } else if (pod.job_prefix) {
      std::string host = *pod.job_prefix + "-0-0";
      auto sub = env.get("KFT_SUBDOMAIN");
      if (!sub && pod.trainjob) sub = *pod.trainjob;
      w.master_addr = sub ? host + "." + *sub : host;
    }
    w.master_port = env_int(env, "KFT_MASTER_PORT", 1, 65535, ctx);
    return w;
  }

  /// @brief What a pod hostname says: `<jobset>-<rjob>-<jobIndex>-<podIndex>` (JobSet),
  /// `<job>-worker-<i>` (MPI Operator).
  struct pod_name_parts {
    std::optional<int> index;               ///< trailing pod index
    std::optional<std::string> job_prefix;  ///< `<jobset>-<rjob>` for JobSet pods
    std::optional<std::string> trainjob;    ///< `<trainjob>` for Trainer's `-node-` pods
  };

  static pod_name_parts parse_pod_hostname(const std::string& host) {
    pod_name_parts parts;
    auto trailing_number = [](std::string_view s, std::size_t& cut) -> std::optional<int> {
      std::size_t i = s.size();
      while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
      if (i == s.size() || i == 0 || s[i - 1] != '-' || s.size() - i > 7) return std::nullopt;
      cut = i - 1;
      return std::stoi(std::string(s.substr(i)));
    };
    std::string_view h = host;
    std::size_t cut = 0;
    parts.index = trailing_number(h, cut);
    if (!parts.index) return parts;
    std::string_view rest = h.substr(0, cut);
    std::size_t cut2 = 0;
    if (trailing_number(rest, cut2)) {  // <jobset>-<rjob>-<jobIndex>-<podIndex>
      parts.job_prefix = std::string(rest.substr(0, cut2));
      std::string_view prefix = *parts.job_prefix;
      constexpr std::string_view node_suffix = "-node";
      if (prefix.size() > node_suffix.size() && prefix.ends_with(node_suffix))
        parts.trainjob = std::string(prefix.substr(0, prefix.size() - node_suffix.size()));
    }
    return parts;
  }
};

}  // namespace discovery
KFT_NAMESPACE_END
