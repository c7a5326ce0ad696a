// SPDX-License-Identifier: Apache-2.0
// kft-manifest's writers: YAML through yaml-cpp's emitter (every free-text scalar double-quoted
// by the library, so "yes", "on", "1:2" and "a b" stay strings) and the Slurm script through
// single-quote shell quoting.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>
#include <vector>

#include <kft/manifest/job.hpp>

#include "../kftrun/exit_codes.hpp"

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

// ---- failure rules (docs/kubernetes.md, "Failure rules") ---------------------------------------
//
// kftrun's exit status is its failure class (tools/kftrun/exit_codes.hpp). The node Job's
// podFailurePolicy turns the classes that must not simply count into a Job failure whose
// message names the exit code; the JobSet's failurePolicy rules match that message. Kubernetes
// writes it (pkg/controller/job/pod_failure_policy.go) as
//   Container <container> for pod <namespace>/<pod> failed with exit code <code> matching FailJob rule at index <i>
//   Pod <namespace>/<pod> has condition <type> matching FailJob rule at index <i>
// and the Job's failure reason is then PodFailurePolicy. Any other failed pod fails the Job by
// its backoffLimit (0: the first one) with reason BackoffLimitExceeded, which no rule below
// matches: JobSet's default, RestartJobSet, counted against maxRestarts.

struct pod_rule {  // one podFailurePolicy rule: FailJob on these exit codes, or on a pod condition
  std::vector<int> exit_codes;  // sorted, unique, no 0 (Kubernetes' rules for `In`)
  std::string condition;        // or: this pod condition (status True)
};

struct jobset_rule {
  std::string name;    // ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
  std::string action;  // FailJobSet, RestartJobSetAndIgnoreMaxRestarts, ...
  std::vector<pod_rule> on;  // the pod failures it catches
};

inline constexpr const char* node_container = "node";  // the runtime's (and Trainer's) container name

inline std::vector<jobset_rule> failure_rules() {
  namespace x = kftrun::exit_code;
  return {
      // Nothing a restart can fix: bad input, a program that is not there.
      {"kft_usage_or_cannot_start", "FailJobSet", {{{x::usage, x::cannot_start}, ""}}},
      // Not the job's fault: a preemption or eviction (SIGTERM, or the pod's DisruptionTarget
      // condition) or another node's agent that vanished.
      {"kft_preempted_or_node_lost",
       "RestartJobSetAndIgnoreMaxRestarts",
       {{{x::node_lost, x::preempted}, ""}, {{}, "DisruptionTarget"}}},
  };
}

// "(2|127)"
inline std::string alternatives(const std::vector<int>& codes) {
  std::string s;
  for (int c : codes) s += (s.empty() ? "(" : "|") + std::to_string(c);
  return s + ")";
}

// The regular expression (RE2) matching the Job failure message of a FailJob pod rule.
inline std::string message_pattern(const pod_rule& r) {
  if (!r.condition.empty()) return "^Pod [^ ]+ has condition " + r.condition + " matching FailJob rule at index [0-9]+$";
  return std::string("^Container ") + node_container + " for pod [^ ]+ failed with exit code " +
         alternatives(r.exit_codes) + " matching FailJob rule at index [0-9]+$";
}

// The batch Job's side: backoffLimit 0, restartPolicy Never (podFailurePolicy requires it), and
// one FailJob rule per pod_rule, in order.
inline void pod_failure_policy(YAML::Emitter& e, const std::vector<jobset_rule>& rules) {
  e << YAML::Key << "podFailurePolicy" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "rules" << YAML::Value << YAML::BeginSeq;
  for (const auto& rule : rules)
    for (const auto& r : rule.on) {
      e << YAML::BeginMap;
      kv(e, "action", "FailJob");
      if (r.condition.empty()) {
        auto codes = r.exit_codes;
        std::sort(codes.begin(), codes.end());
        codes.erase(std::unique(codes.begin(), codes.end()), codes.end());
        e << YAML::Key << "onExitCodes" << YAML::Value << YAML::BeginMap;
        kv(e, "containerName", node_container);
        kv(e, "operator", "In");
        e << YAML::Key << "values" << YAML::Value << YAML::Flow << YAML::BeginSeq;
        for (int c : codes) e << c;
        e << YAML::EndSeq << YAML::EndMap;
      } else {
        e << YAML::Key << "onPodConditions" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
        kv(e, "type", r.condition);
        kv(e, "status", "True");
        e << YAML::EndMap << YAML::EndSeq;
      }
      e << YAML::EndMap;
    }
  e << YAML::EndSeq << YAML::EndMap;
}

inline void jobset_failure_rules(YAML::Emitter& e, const std::vector<jobset_rule>& rules) {
  e << YAML::Key << "rules" << YAML::Value << YAML::BeginSeq;
  for (const auto& rule : rules) {
    e << YAML::BeginMap;
    kv(e, "name", rule.name);
    kv(e, "action", rule.action);
    e << YAML::Key << "onJobFailureReasons" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    text(e, "PodFailurePolicy");
    e << YAML::EndSeq;
    e << YAML::Key << "onJobFailureMessagePatterns" << YAML::Value << YAML::BeginSeq;
    for (const auto& r : rule.on) text(e, message_pattern(r));
    e << YAML::EndSeq;
    e << YAML::Key << "targetReplicatedJobs" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    text(e, "node");
    e << YAML::EndSeq;
    e << YAML::EndMap;
  }
  e << YAML::EndSeq;
}

// kftrun's classes in one comment line each, with what the rules do with them.
inline std::string classes_comment(const std::vector<jobset_rule>& rules) {
  std::string c = "kftrun's exit statuses (tools/kftrun/exit_codes.hpp) and what the failure rules below do with them:";
  for (const auto& k : kftrun::exit_code::all) {
    if (k.status == kftrun::exit_code::success) continue;
    std::string action = "RestartJobSet (counted against maxRestarts)";
    for (const auto& rule : rules)
      for (const auto& r : rule.on)
        if (std::find(r.exit_codes.begin(), r.exit_codes.end(), k.status) != r.exit_codes.end())
          action = rule.action + " (" + rule.name + ")";
    c += "\n  " + std::to_string(k.status) + " " + std::string(k.name) + ": " + action;
  }
  return c + "\n  pod condition DisruptionTarget (preempted, evicted): RestartJobSetAndIgnoreMaxRestarts";
}

inline std::string runtime(const job& j, bool with_failure_rules = true) {
  const auto rules = with_failure_rules ? failure_rules() : std::vector<jobset_rule>{};
  YAML::Emitter e;
  if (with_failure_rules) e << YAML::Comment(classes_comment(rules)) << YAML::Newline;
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
  if (j.max_restarts || with_failure_rules) {
    e << YAML::Key << "failurePolicy" << YAML::Value << YAML::BeginMap;
    if (j.max_restarts) e << YAML::Key << "maxRestarts" << YAML::Value << *j.max_restarts;
    if (with_failure_rules) jobset_failure_rules(e, rules);
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
  if (with_failure_rules) {
    e << YAML::Key << "backoffLimit" << YAML::Value << 0;  // the first failed pod fails the Job
    pod_failure_policy(e, rules);
  }
  e << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  // podFailurePolicy needs restartPolicy Never, set here: JobSet's webhook would default it to OnFailure.
  if (with_failure_rules) kv(e, "restartPolicy", "Never");
  if (!j.scheduler_name.empty()) kv(e, "schedulerName", j.scheduler_name);
  e << YAML::Key << "containers" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  kv(e, "name", node_container);
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

inline std::string mpijob(const job& j, bool with_failure_rules = true) {
  YAML::Emitter e;
  // MPI Operator v0.8 has no exit-code rules: what it can express is below (docs/kubernetes.md).
  if (with_failure_rules)
    e << YAML::Comment(
             "Failure handling: MPIJob v2beta1 has no field for exit-code rules (podFailurePolicy), and the launcher's\n"
             "status is mpirun's, not one of kftrun's classes: a failed launcher counts against runPolicy.backoffLimit\n"
             "(--max-restarts; written as 0 when not given, instead of the Job default of 6). docs/kubernetes.md")
      << YAML::Newline;
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
  if (j.max_restarts || with_failure_rules) e << YAML::Key << "backoffLimit" << YAML::Value << j.max_restarts.value_or(0);
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
  const bool mpiuser = j.ssh_mount_path == "/home/mpiuser/.ssh";  // the default, kft's image's layout
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
    } else if (mpiuser) {
      // The MPI Operator's non-root layout (its base image and examples): sshd as uid 1000 on port
      // 2222 with the mounted key as host key. Left without a command, the operator would run
      // `/usr/sbin/sshd -De`, root's sshd, which looks for keys under /root/.ssh.
      e << YAML::Key << "command" << YAML::Value;
      string_list(e, {"/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"});
    }  // --ssh-mount-path /root/.ssh: no command, so the operator runs root's sshd
    if (mpiuser) {
      e << YAML::Key << "securityContext" << YAML::Value << YAML::BeginMap;
      e << YAML::Key << "runAsUser" << YAML::Value << 1000;
      e << YAML::EndMap;
    }
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
