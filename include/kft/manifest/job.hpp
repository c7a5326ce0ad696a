// SPDX-License-Identifier: Apache-2.0
/// @file kft/manifest/job.hpp
/// @brief One job description, checked once, from which `kft-manifest` writes a Kubeflow
/// TrainJob, its ClusterTrainingRuntime, an MPIJob or a Slurm batch script.
///
/// Every rule here is one an API server, a controller or Slurm would enforce later (or worse,
/// silently ignore): names that are DNS-1035 labels and leave room for the pod names the
/// controllers derive, Kubernetes quantities, env names the Trainer webhook reserves. A bad
/// value is a `config_error` naming the option (`--name`, `--memory`, ...), before anything is
/// written. Fields read from a job file are named by where they are in it instead (`origins`).
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace manifest {

/// @brief Gang scheduling through a Trainer runtime's podGroupPolicy.
enum class gang { none, coscheduling, volcano };

/// @brief The image `tools/image/build.sh` builds and tags by default, `localhost/kft:<version>`
/// (push it to a registry and pass `--image` for a real cluster: docs/kubernetes.md).
inline std::string default_image() { return std::string("localhost/kft:") + KFT_VERSION_STRING; }

/// @brief What the job is and needs; field names follow the tool's flags.
struct job {
  std::string name;                          ///< --name: TrainJob/MPIJob/Slurm job name
  std::string ns = "default";                ///< --namespace
  std::string image = default_image();      ///< --image (default: what tools/image/build.sh builds)
  std::string image_pull_policy;             ///< --image-pull-policy: Always, IfNotPresent, Never (empty: cluster default)
  int nodes = 1;                             ///< --nodes
  int nproc_per_node = 1;                    ///< --nproc-per-node (MPI slots per node)
  int gpus_per_node = 0;                     ///< --gpus-per-node
  std::string gpu_resource = "nvidia.com/gpu";  ///< --gpu-resource
  std::string cpus;                          ///< --cpus: CPU request per node, a quantity
  std::string cpu_limit;                     ///< --cpu-limit: CPU limit per node (default: none, spare cycles usable)
  std::string memory;                        ///< --memory: request and limit per node, a quantity
  std::vector<std::pair<std::string, std::string>> env;  ///< --env K=V (in order)
  std::string queue;                         ///< --queue: Kueue LocalQueue
  std::string priority_class;                ///< --priority-class: Kueue WorkloadPriorityClass (MPIJob: scheduling priorityClass)
  gang gang_scheduling = gang::none;         ///< --gang
  std::string scheduler_name;                ///< --scheduler-name (runtime pod templates)
  std::optional<int> max_restarts;           ///< --max-restarts: JobSet maxRestarts / MPIJob backoffLimit
  std::optional<long long> active_deadline;  ///< --active-deadline seconds
  std::optional<int> ttl;                    ///< --ttl seconds after finishing
  std::string ssh_mount_path = "/home/mpiuser/.ssh";  ///< --ssh-mount-path (MPIJob)
  std::string runtime = "kft-torch";         ///< --runtime: the ClusterTrainingRuntime a TrainJob uses
  std::map<std::string, std::string> labels;       ///< --label K=V (job metadata; TrainJob also pods)
  std::map<std::string, std::string> annotations;  ///< --annotation K=V
  std::string launcher = "srun";             ///< --launcher (sbatch): srun or mpirun
  std::string time_limit;                    ///< --time (sbatch), Slurm's [D-]HH:MM:SS or minutes
  std::string output;                        ///< --output (sbatch) file pattern
  int cpus_per_task = 0;                     ///< --cpus-per-task (sbatch; 0 = Slurm's default)
  std::vector<std::string> program;          ///< after `--`: the program and its arguments
};

namespace detail {

inline bool dns1035(const std::string& s) {
  static const std::regex re("^[a-z]([-a-z0-9]*[a-z0-9])?$");
  return s.size() <= 63 && std::regex_match(s, re);
}

inline bool dns1123_subdomain(const std::string& s) {
  static const std::regex re("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
  return !s.empty() && s.size() <= 253 && std::regex_match(s, re);
}

// Kubernetes' label key: [prefix/]name, prefix a DNS subdomain, name <= 63 of [A-Za-z0-9._-]
// starting and ending alphanumeric.
inline bool qualified_name(const std::string& k) {
  static const std::regex name("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$");
  const auto slash = k.find('/');
  const std::string n = slash == std::string::npos ? k : k.substr(slash + 1);
  if (slash != std::string::npos && !dns1123_subdomain(k.substr(0, slash))) return false;
  return !n.empty() && n.size() <= 63 && std::regex_match(n, name);
}

inline bool label_value(const std::string& v) {
  static const std::regex re("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$");
  return v.size() <= 63 && std::regex_match(v, re);
}

// The API server's resource.Quantity syntax (the CRDs' pattern for int-or-string quantities).
// Long inputs are refused before the regex: std::regex recurses once per character.
inline bool quantity(const std::string& q) {
  if (q.empty() || q.size() > 128) return false;
  static const std::regex re("^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$");
  return std::regex_match(q, re) && q[0] != '-';
}

// [-._a-zA-Z][-._a-zA-Z0-9]* (a loop, not a regex: names can be long).
inline bool env_name(const std::string& n) {
  auto ok = [](char c, bool first) {
    return c == '-' || c == '.' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && c >= '0' && c <= '9');
  };
  if (n.empty() || !ok(n[0], true)) return false;
  return std::all_of(n.begin() + 1, n.end(), [&](char c) { return ok(c, false); });
}

/// A user's value as a message echoes it: whole up to `keep` bytes, else cut, with its size,
/// control bytes escaped (kft::detail::excerpt), so that a 10 MB value makes a one-line message.
inline std::string shown(const std::string& v, std::size_t keep = 80) { return kft::detail::excerpt(v, keep); }

[[noreturn]] inline void bad(const std::string& option, const std::string& value, const std::string& why) {
  throw config_error(option, shown(value), why, error_site::of("kft-manifest"));
}

}  // namespace detail

/// @brief What is being written: the checks differ a little (e.g. an image is needed for
/// Kubernetes, not for Slurm).
enum class target { trainjob, runtime, mpijob, sbatch };

/// @brief Where fields came from when not from flags, for the messages: an option (`--name`), or an
/// option and an entry's key (`--env FOO`, `--label team`), mapped to what to name instead, e.g.
/// `--job-file job.yaml, line 3, column 7: name`.
using origins = std::map<std::string, std::string>;

namespace detail {

// validate's errors: named after the option, or after the place the value came from.
struct reporter {
  const origins& from;

  [[noreturn]] void operator()(const std::string& option, const std::string& value, const std::string& why) const {
    const auto it = from.find(option);
    bad(it == from.end() ? option : it->second, value, why);
  }
  // One --env/--label/--annotation entry: KEY=VALUE after the option, VALUE after its place.
  [[noreturn]] void entry(const std::string& option, const std::string& key, const std::string& value,
                          const std::string& why) const {
    const auto it = from.find(option + " " + key);
    if (it == from.end()) bad(option, key + "=" + value, why);
    bad(it->second, value, why);
  }
};

}  // namespace detail

/// @brief Checks `j` for `t`. @throws config_error naming the option (or, for the fields in
/// `from`, the place in the job file) and the value at fault
inline void validate(const job& j, target t, const origins& from = {}) {
  const detail::reporter bad{from};
  const bool k8s = t != target::sbatch;
  if (j.name.empty() && t != target::runtime) bad("--name", j.name, "is required");
  if (k8s && t != target::runtime && !detail::dns1035(j.name))
    bad("--name", j.name, "is not a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, at most 63)");
  if (t == target::sbatch && j.name.find_first_of(" \t\n'\"\\$`") != std::string::npos)
    bad("--name", j.name, "must not contain spaces, quotes or shell characters");
  if (j.nodes < 1) bad("--nodes", std::to_string(j.nodes), "must be at least 1");
  if (j.nproc_per_node < 1) bad("--nproc-per-node", std::to_string(j.nproc_per_node), "must be at least 1");
  if (j.gpus_per_node < 0) bad("--gpus-per-node", std::to_string(j.gpus_per_node), "must not be negative");
  if (j.gpus_per_node > 0 && j.gpu_resource.empty())
    bad("--gpu-resource", "", "is empty, but --gpus-per-node asks for GPUs: name the resource (e.g. nvidia.com/gpu)");
  if (k8s && !j.gpu_resource.empty() && !detail::qualified_name(j.gpu_resource))
    bad("--gpu-resource", j.gpu_resource, "is not a Kubernetes resource name");
  // The pods the controllers create must have DNS-1035 names too (JobSet's webhook, the MPI
  // operator's validation): the job name has to leave room for the suffixes they add.
  if (t == target::trainjob) {
    const std::string pod = j.name + "-node-0-" + std::to_string(j.nodes - 1) + "-abcde";
    if (pod.size() > 63)
      bad("--name", j.name,
          "is too long for " + std::to_string(j.nodes) + " node(s): JobSet names pods <name>-node-0-<index>-xxxxx (" +
              pod + " is " + std::to_string(pod.size()) + " characters; the limit is 63)");
  }
  if (t == target::mpijob) {
    const std::string worker = j.name + "-worker-" + std::to_string(j.nodes - 1);
    const std::string launcher = j.name + "-launcher-abcde";
    if (!detail::dns1035(worker) || launcher.size() > 63)
      bad("--name", j.name,
          "is too long: the MPI operator names pods " + worker + " and " + j.name + "-launcher-xxxxx (at most 63 characters)");
  }
  if (t == target::runtime && !detail::dns1123_subdomain(j.runtime))
    bad("--runtime", j.runtime, "is not a valid object name (DNS-1123 subdomain)");
  if (t == target::trainjob && (j.runtime.empty() || j.runtime.size() > 253))
    bad("--runtime", j.runtime, "must name a ClusterTrainingRuntime (1-253 characters)");
  if (k8s && !detail::dns1123_subdomain(j.ns) && !detail::dns1035(j.ns))
    bad("--namespace", j.ns, "is not a DNS-1123 label");
  if (k8s && j.image.empty()) bad("--image", "", "must name a container image (default: " + default_image() + ")");
  if (!j.image_pull_policy.empty() && j.image_pull_policy != "Always" && j.image_pull_policy != "IfNotPresent" &&
      j.image_pull_policy != "Never")
    bad("--image-pull-policy", j.image_pull_policy, "is not Always, IfNotPresent or Never");
  if (!j.cpus.empty() && !detail::quantity(j.cpus))
    bad("--cpus", j.cpus, "is not a Kubernetes quantity (e.g. 4, 500m, 2.5)");
  if (!j.cpu_limit.empty() && !detail::quantity(j.cpu_limit))
    bad("--cpu-limit", j.cpu_limit, "is not a Kubernetes quantity (e.g. 4, 500m, 2.5)");
  if (!j.memory.empty() && !detail::quantity(j.memory))
    bad("--memory", j.memory, "is not a Kubernetes quantity (e.g. 16Gi, 512Mi)");
  std::vector<std::string> seen;
  for (const auto& [k, v] : j.env) {
    if (!detail::env_name(k)) bad.entry("--env", k, v, "has an invalid variable name");
    if (std::find(seen.begin(), seen.end(), k) != seen.end())
      bad.entry("--env", k, v, "sets " + detail::shown(k) + " twice");
    seen.push_back(k);
    if (k8s && (k.rfind("PET_", 0) == 0 || k.rfind("OMPI_MCA_", 0) == 0))
      bad.entry("--env", k, v,
                "is reserved: the Trainer webhook rejects PET_* and OMPI_MCA_* in trainer.env (the controller sets them)");
    if (k == "KFT_RDZV_TOKEN") bad.entry("--env", k, "...", "is set from the job's Secret; do not pass it in clear");
  }
  for (const auto& [k, v] : j.labels) {
    if (!detail::qualified_name(k)) bad.entry("--label", k, v, "has an invalid label key");
    if (!detail::label_value(v)) bad.entry("--label", k, v, "has an invalid label value (at most 63 of [A-Za-z0-9._-])");
  }
  for (const auto& [k, v] : j.annotations)
    if (!detail::qualified_name(k)) bad.entry("--annotation", k, v, "has an invalid annotation key");
  if (!j.queue.empty() && !detail::label_value(j.queue)) bad("--queue", j.queue, "is not a valid label value");
  if (!j.priority_class.empty() && !detail::dns1123_subdomain(j.priority_class))
    bad("--priority-class", j.priority_class, "is not a valid object name");
  if (j.max_restarts && *j.max_restarts < 0) bad("--max-restarts", std::to_string(*j.max_restarts), "must not be negative");
  if (j.active_deadline && *j.active_deadline < 1)
    bad("--active-deadline", std::to_string(*j.active_deadline), "must be at least 1 second");
  if (j.ttl && *j.ttl < 0) bad("--ttl", std::to_string(*j.ttl), "must not be negative");
  if (t == target::mpijob && (j.ssh_mount_path.empty() || j.ssh_mount_path[0] != '/'))
    bad("--ssh-mount-path", j.ssh_mount_path, "must be an absolute path");
  if (!j.scheduler_name.empty() && !detail::dns1123_subdomain(j.scheduler_name))
    bad("--scheduler-name", j.scheduler_name, "is not a valid scheduler name");
  if (t == target::sbatch) {
    if (j.launcher != "srun" && j.launcher != "mpirun") bad("--launcher", j.launcher, "is not srun or mpirun");
    static const std::regex slurm_time("^([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}$");
    if (!j.time_limit.empty() && (j.time_limit.size() > 32 || !std::regex_match(j.time_limit, slurm_time)))
      bad("--time", j.time_limit, "is not a Slurm time limit (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS)");
    if (j.cpus_per_task < 0) bad("--cpus-per-task", std::to_string(j.cpus_per_task), "must not be negative");
    if (j.output.find('\n') != std::string::npos) bad("--output", j.output, "must be one line");
    static const std::regex slurm_mem("^[0-9]+(Ki|Mi|Gi|Ti)?$");
    if (!j.memory.empty() && (j.memory.size() > 32 || !std::regex_match(j.memory, slurm_mem)))
      bad("--memory", j.memory, "cannot be said in Slurm's --mem: use whole Ki, Mi, Gi or Ti (e.g. 16Gi)");
  }
  if (t != target::runtime && j.program.empty()) bad("--", "", "no program given: put it after `--`");
}

}  // namespace manifest
KFT_NAMESPACE_END
