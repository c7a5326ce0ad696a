// SPDX-License-Identifier: Apache-2.0
// kft-manifest's writers: YAML through yaml-cpp's emitter (every free-text scalar double-quoted
// by the library, so "yes", "on", "1:2" and "a b" stay strings) and the Slurm script through
// single-quote shell quoting.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include <kft/manifest/job.hpp>

namespace manifest_tool {

using kft::manifest::job;

// Free text: always double-quoted (the emitter escapes what needs escaping).
inline void text(YAML::Emitter& e, const std::string& s) { e << YAML::DoubleQuoted << s; }

// A key with a quoted text value.
inline void kv(YAML::Emitter& e, const std::string& k, const std::string& v) {
  e << YAML::Key << k << YAML::Value;
  text(e, v);
}

inline void string_list(YAML::Emitter& e, const std::vector<std::string>& items) {
  e << YAML::BeginSeq;
  for (const auto& s : items) text(e, s);
  e << YAML::EndSeq;
}

inline void string_map(YAML::Emitter& e, const std::map<std::string, std::string>& m) {
  e << YAML::BeginMap;
  for (const auto& [k, v] : m) kv(e, k, v);
  e << YAML::EndMap;
}

// requests/limits for one node's main container. GPUs are requested and limited alike (the
// device plugin requires it); memory likewise (a limit below the request is invalid); CPUs are
// limited only when asked (--cpu-limit), so a node's spare cycles stay usable.
inline void resources(YAML::Emitter& e, const job& j, bool with_gpus) {
  const bool gpus = with_gpus && j.gpus_per_node > 0;
  if (j.cpus.empty() && j.cpu_limit.empty() && j.memory.empty() && !gpus) {
    e << YAML::BeginMap << YAML::EndMap;
    return;
  }
  e << YAML::BeginMap;
  e << YAML::Key << "requests" << YAML::Value << YAML::BeginMap;
  if (!j.cpus.empty() || !j.cpu_limit.empty()) kv(e, "cpu", j.cpus.empty() ? j.cpu_limit : j.cpus);
  if (!j.memory.empty()) kv(e, "memory", j.memory);
  if (gpus) kv(e, j.gpu_resource, std::to_string(j.gpus_per_node));
  e << YAML::EndMap;
  if (!j.memory.empty() || gpus || !j.cpu_limit.empty()) {
    e << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
    if (!j.cpu_limit.empty()) kv(e, "cpu", j.cpu_limit);
    if (!j.memory.empty()) kv(e, "memory", j.memory);
    if (gpus) kv(e, j.gpu_resource, std::to_string(j.gpus_per_node));
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
}

inline void env_list(YAML::Emitter& e, const job& j, bool rdzv_secret) {
  e << YAML::BeginSeq;
  for (const auto& [k, v] : j.env) {
    e << YAML::BeginMap;
    kv(e, "name", k);
    kv(e, "value", v);
    e << YAML::EndMap;
  }
  if (rdzv_secret) {  // multi-node kftrun needs a shared secret; it comes from a Secret, never in clear
    e << YAML::BeginMap;
    kv(e, "name", "KFT_RDZV_TOKEN");
    e << YAML::Key << "valueFrom" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "secretKeyRef" << YAML::Value << YAML::BeginMap;
    kv(e, "name", j.name + "-kft-rdzv");
    kv(e, "key", "token");
    e << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  }
  e << YAML::EndSeq;
}

// apiVersion, kind and the opening of metadata with the name (and namespace, when given); the
// caller adds labels and closes metadata.
inline void head(YAML::Emitter& e, const char* api_version, const char* kind, const std::string& name,
                 const std::string& ns) {
  kv(e, "apiVersion", api_version);
  kv(e, "kind", kind);
  e << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  kv(e, "name", name);
  if (!ns.empty()) kv(e, "namespace", ns);
}

// Pod-template metadata from --label/--annotation (nothing when neither is given).
inline void pod_metadata(YAML::Emitter& e, const job& j) {
  if (j.labels.empty() && j.annotations.empty()) return;
  e << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  if (!j.labels.empty()) {
    e << YAML::Key << "labels" << YAML::Value;
    string_map(e, j.labels);
  }
  if (!j.annotations.empty()) {
    e << YAML::Key << "annotations" << YAML::Value;
    string_map(e, j.annotations);
  }
  e << YAML::EndMap;
}

inline void job_labels(YAML::Emitter& e, const job& j) {
  std::map<std::string, std::string> labels = j.labels;
  if (!j.queue.empty()) labels["kueue.x-k8s.io/queue-name"] = j.queue;
  if (!j.priority_class.empty()) labels["kueue.x-k8s.io/priority-class"] = j.priority_class;
  labels["app.kubernetes.io/managed-by"] = "kft-manifest";
  e << YAML::Key << "labels" << YAML::Value;
  string_map(e, labels);
  if (!j.annotations.empty()) {
    e << YAML::Key << "annotations" << YAML::Value;
    string_map(e, j.annotations);
  }
}

// The program under kftrun, which reads the PET_* variables the Trainer injects.
inline std::vector<std::string> kftrun_command(const job& j) {
  std::vector<std::string> c = {"kftrun", "--"};
  c.insert(c.end(), j.program.begin(), j.program.end());
  return c;
}

inline std::string trainjob(const job& j) {
  YAML::Emitter e;
  if (j.nodes > 1)
    e << YAML::Comment("kftrun's rendezvous token comes from Secret " + j.name + "-kft-rdzv (key token); create it once:\n" +
                       "kubectl create secret generic " + j.name + "-kft-rdzv -n " + j.ns +
                       " --from-literal=token=$(openssl rand -hex 16)")
      << YAML::Newline;
  e << YAML::BeginMap;
  head(e, "trainer.kubeflow.org/v1alpha1", "TrainJob", j.name, j.ns);
  job_labels(e, j);
  e << YAML::EndMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "runtimeRef" << YAML::Value << YAML::BeginMap;
  kv(e, "name", j.runtime);
  kv(e, "kind", "ClusterTrainingRuntime");
  kv(e, "apiGroup", "trainer.kubeflow.org");
  e << YAML::EndMap;
  if (j.active_deadline) e << YAML::Key << "activeDeadlineSeconds" << YAML::Value << *j.active_deadline;
  e << YAML::Key << "trainer" << YAML::Value << YAML::BeginMap;
  kv(e, "image", j.image);
  e << YAML::Key << "command" << YAML::Value;
  string_list(e, kftrun_command(j));
  e << YAML::Key << "numNodes" << YAML::Value << j.nodes;
  e << YAML::Key << "numProcPerNode" << YAML::Value << j.nproc_per_node;  // an integer: "auto" is gone since v2.2
  e << YAML::Key << "resourcesPerNode" << YAML::Value;
  resources(e, j, true);
  if (!j.env.empty() || j.nodes > 1) {
    e << YAML::Key << "env" << YAML::Value;
    env_list(e, j, j.nodes > 1);
  }
  e << YAML::EndMap;
  // Pod-level labels and annotations (and the pull policy) reach the pods only through a
  // runtime patch, under a domain-prefixed manager.
  if (!j.labels.empty() || !j.annotations.empty()) {
    e << YAML::Key << "runtimePatches" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
    kv(e, "manager", "kft.dev/kft-manifest");
    e << YAML::Key << "trainingRuntimeSpec" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "replicatedJobs" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
    kv(e, "name", "node");
    e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
    pod_metadata(e, j);
    e << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndSeq;  // pod template .. item
    e << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  }
  e << YAML::EndMap << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

inline std::string runtime(const job& j) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  head(e, "trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", j.runtime, "");  // cluster-scoped
  e << YAML::Key << "labels" << YAML::Value << YAML::BeginMap;
  kv(e, "trainer.kubeflow.org/framework", "torch");  // PET_* injection: kftrun reads them
  kv(e, "app.kubernetes.io/managed-by", "kft-manifest");
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "mlPolicy" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "numNodes" << YAML::Value << j.nodes;
  e << YAML::Key << "torch" << YAML::Value << YAML::BeginMap << YAML::EndMap;
  e << YAML::EndMap;
  if (j.gang_scheduling != kft::manifest::gang::none) {
    e << YAML::Key << "podGroupPolicy" << YAML::Value << YAML::BeginMap;
    if (j.gang_scheduling == kft::manifest::gang::coscheduling) {
      e << YAML::Key << "coscheduling" << YAML::Value << YAML::BeginMap;
      e << YAML::Key << "scheduleTimeoutSeconds" << YAML::Value << 120;
      e << YAML::EndMap;
    } else {
      e << YAML::Key << "volcano" << YAML::Value << YAML::BeginMap << YAML::EndMap;
    }
    e << YAML::EndMap;
  }
  e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  if (j.ttl) e << YAML::Key << "ttlSecondsAfterFinished" << YAML::Value << *j.ttl;
  if (j.max_restarts) {
    e << YAML::Key << "failurePolicy" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "maxRestarts" << YAML::Value << *j.max_restarts;
    e << YAML::EndMap;
  }
  e << YAML::Key << "replicatedJobs" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  kv(e, "name", "node");
  e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "labels" << YAML::Value << YAML::BeginMap;
  kv(e, "trainer.kubeflow.org/trainjob-ancestor-step", "trainer");
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  if (!j.scheduler_name.empty()) kv(e, "schedulerName", j.scheduler_name);
  e << YAML::Key << "containers" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  kv(e, "name", "node");
  kv(e, "image", j.image);
  if (!j.image_pull_policy.empty()) kv(e, "imagePullPolicy", j.image_pull_policy);
  if (!j.program.empty()) {
    e << YAML::Key << "command" << YAML::Value;
    string_list(e, kftrun_command(j));
  }
  e << YAML::EndMap << YAML::EndSeq;
  e << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  e << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

inline std::string mpijob(const job& j) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  head(e, "kubeflow.org/v2beta1", "MPIJob", j.name, j.ns);
  job_labels(e, j);
  e << YAML::EndMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "slotsPerWorker" << YAML::Value << j.nproc_per_node;
  kv(e, "mpiImplementation", "OpenMPI");
  kv(e, "launcherCreationPolicy", "WaitForWorkersReady");  // mpirun starts once every sshd answers
  kv(e, "sshAuthMountPath", j.ssh_mount_path);
  e << YAML::Key << "runPolicy" << YAML::Value << YAML::BeginMap;
  kv(e, "cleanPodPolicy", "Running");
  if (j.max_restarts) e << YAML::Key << "backoffLimit" << YAML::Value << *j.max_restarts;
  if (j.ttl) e << YAML::Key << "ttlSecondsAfterFinished" << YAML::Value << *j.ttl;
  if (j.active_deadline) e << YAML::Key << "activeDeadlineSeconds" << YAML::Value << *j.active_deadline;
  if (!j.queue.empty() || !j.priority_class.empty() || j.gang_scheduling != kft::manifest::gang::none) {
    e << YAML::Key << "schedulingPolicy" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "minAvailable" << YAML::Value << j.nodes + 1;  // every worker and the launcher
    if (!j.queue.empty()) kv(e, "queue", j.queue);
    if (!j.priority_class.empty()) kv(e, "priorityClass", j.priority_class);
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  e << YAML::Key << "mpiReplicaSpecs" << YAML::Value << YAML::BeginMap;
  auto pod = [&](const char* role, bool launcher) {
    e << YAML::Key << role << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "replicas" << YAML::Value << (launcher ? 1 : j.nodes);
    kv(e, "restartPolicy", launcher ? "OnFailure" : "Never");
    e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
    pod_metadata(e, j);
    e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
    if (!j.scheduler_name.empty()) kv(e, "schedulerName", j.scheduler_name);
    e << YAML::Key << "containers" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
    kv(e, "name", launcher ? "launcher" : "worker");
    kv(e, "image", j.image);
    if (!j.image_pull_policy.empty()) kv(e, "imagePullPolicy", j.image_pull_policy);
    if (launcher) {
      // mpirun reads the operator's hostfile (OMPI_MCA_orte_default_hostfile) and its slots.
      std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(j.nodes * j.nproc_per_node)};
      cmd.insert(cmd.end(), j.program.begin(), j.program.end());
      e << YAML::Key << "command" << YAML::Value;
      string_list(e, cmd);
    }  // workers: no command, so the operator runs sshd
    if (!j.env.empty()) {
      e << YAML::Key << "env" << YAML::Value;
      env_list(e, j, false);
    }
    e << YAML::Key << "resources" << YAML::Value;
    if (launcher) {  // the launcher only runs mpirun: no GPUs, a little CPU
      e << YAML::BeginMap << YAML::Key << "requests" << YAML::Value << YAML::BeginMap;
      kv(e, "cpu", "100m");
      e << YAML::EndMap << YAML::EndMap;
    } else {
      resources(e, j, true);
    }
    e << YAML::EndMap << YAML::EndSeq;
    e << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  };
  pod("Launcher", true);
  pod("Worker", false);
  e << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

// POSIX shell single quotes: everything literal; a ' becomes '\''.
inline std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::string sbatch(const job& j) {
  std::string s = "#!/bin/bash\n# Generated by kft-manifest: submit with `sbatch <this file>`.\n";
  s += "#SBATCH --job-name=" + j.name + "\n";
  s += "#SBATCH --nodes=" + std::to_string(j.nodes) + "\n";
  s += "#SBATCH --ntasks-per-node=" + std::to_string(j.nproc_per_node) + "\n";
  if (j.gpus_per_node > 0) s += "#SBATCH --gpus-per-node=" + std::to_string(j.gpus_per_node) + "\n";
  if (j.cpus_per_task > 0) s += "#SBATCH --cpus-per-task=" + std::to_string(j.cpus_per_task) + "\n";
  if (!j.memory.empty()) {
    // Slurm's --mem takes K/M/G/T (powers of 1024): Kubernetes' Gi/Mi map onto them.
    std::string m = j.memory;
    if (m.size() > 2 && m.back() == 'i') m.pop_back();
    s += "#SBATCH --mem=" + m + "\n";
  }
  if (!j.time_limit.empty()) s += "#SBATCH --time=" + j.time_limit + "\n";
  if (!j.output.empty()) s += "#SBATCH --output=" + j.output + "\n";
  if (!j.queue.empty()) s += "#SBATCH --partition=" + j.queue + "\n";
  s += "set -euo pipefail\n";
  for (const auto& [k, v] : j.env) s += "export " + k + "=" + shell_quote(v) + "\n";
  std::string cmd = j.launcher == "mpirun" ? "mpirun" : "srun --mpi=pmix";
  for (const auto& a : j.program) cmd += " " + shell_quote(a);
  s += cmd + "\n";
  return s;
}

}  // namespace manifest_tool
