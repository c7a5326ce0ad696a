// kft-manifest: one job description -> a Kubeflow TrainJob, its ClusterTrainingRuntime, an
// MPIJob or a Slurm batch script.
//
//   kft-manifest trainjob --name mnist --image reg/kft:1 --nodes 2 --nproc-per-node 4 -- ./train --epochs 3
//   kft-manifest runtime  --runtime kft-torch --image reg/kft:1 --gang coscheduling
//   kft-manifest mpijob   --job-file job.yaml -o mpijob.yaml
//   kft-manifest sbatch   --job-file job.yaml --time 1:00:00 -o job.sbatch
//
// A job file (YAML) holds the same fields as the flags (their long names without dashes, e.g.
// `nproc-per-node: 4`, `env: {K: V}`, `command: [./train, --epochs, "3"]`); flags override it.
// Bad input is refused before anything is written, naming the option, with exit status 2.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <kft/core/error.hpp>
#include <kft/core/parse.hpp>
#include <kft/manifest/job.hpp>

#include "emit.hpp"

namespace {

using kft::manifest::job;

[[noreturn]] void bad(const std::string& option, const std::string& value, const std::string& why) {
  throw kft::config_error(option, value, why, kft::error_site::of("kft-manifest"));
}

std::pair<std::string, std::string> split_kv(const std::string& option, const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0) bad(option, s, "is not KEY=VALUE");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

kft::manifest::gang parse_gang(const std::string& s) {
  if (s.empty() || s == "none") return kft::manifest::gang::none;
  if (s == "coscheduling") return kft::manifest::gang::coscheduling;
  if (s == "volcano") return kft::manifest::gang::volcano;
  bad("--gang", s, "is not none, coscheduling or volcano");
}

// The job file: keys are the flags' long names. Unknown keys are errors (a typo must not be
// silently dropped).
void load_job_file(const std::string& path, job& j) {
  YAML::Node doc;
  try {
    doc = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    bad("--job-file", path, "cannot be read");
  } catch (const YAML::Exception& e) {
    bad("--job-file", path, std::string("is not valid YAML: ") + e.what());
  }
  if (!doc.IsMap()) bad("--job-file", path, "must be a YAML mapping of option names to values");
  for (const auto& item : doc) {
    const std::string key = item.first.as<std::string>();
    const YAML::Node& v = item.second;
    const std::string opt = "--job-file " + path + ": " + key;
    auto str = [&] {
      if (!v.IsScalar()) bad(opt, "", "must be a single value");
      return v.as<std::string>();
    };
    auto integer = [&]() -> long long {
      try {
        return v.as<long long>();
      } catch (const YAML::Exception&) {
        bad(opt, v.IsScalar() ? v.as<std::string>() : "", "is not an integer");
      }
    };
    auto pairs = [&](auto&& put) {
      if (!v.IsMap()) bad(opt, "", "must be a mapping of names to values");
      for (const auto& kvp : v) put(kvp.first.as<std::string>(), kvp.second.as<std::string>());
    };
    if (key == "name") j.name = str();
    else if (key == "namespace") j.ns = str();
    else if (key == "image") j.image = str();
    else if (key == "image-pull-policy") j.image_pull_policy = str();
    else if (key == "nodes") j.nodes = static_cast<int>(integer());
    else if (key == "nproc-per-node") j.nproc_per_node = static_cast<int>(integer());
    else if (key == "gpus-per-node") j.gpus_per_node = static_cast<int>(integer());
    else if (key == "gpu-resource") j.gpu_resource = str();
    else if (key == "cpus") j.cpus = str();
    else if (key == "cpu-limit") j.cpu_limit = str();
    else if (key == "memory") j.memory = str();
    else if (key == "env") pairs([&](const std::string& k, const std::string& val) { j.env.emplace_back(k, val); });
    else if (key == "queue") j.queue = str();
    else if (key == "priority-class") j.priority_class = str();
    else if (key == "gang") j.gang_scheduling = parse_gang(str());
    else if (key == "scheduler-name") j.scheduler_name = str();
    else if (key == "max-restarts") j.max_restarts = static_cast<int>(integer());
    else if (key == "active-deadline") j.active_deadline = integer();
    else if (key == "ttl") j.ttl = static_cast<int>(integer());
    else if (key == "ssh-mount-path") j.ssh_mount_path = str();
    else if (key == "runtime") j.runtime = str();
    else if (key == "label") pairs([&](const std::string& k, const std::string& val) { j.labels[k] = val; });
    else if (key == "annotation") pairs([&](const std::string& k, const std::string& val) { j.annotations[k] = val; });
    else if (key == "launcher") j.launcher = str();
    else if (key == "time") j.time_limit = str();
    else if (key == "output") j.output = str();
    else if (key == "cpus-per-task") j.cpus_per_task = static_cast<int>(integer());
    else if (key == "command") {
      if (!v.IsSequence()) bad(opt, "", "must be a list: the program and its arguments");
      j.program.clear();
      for (const auto& a : v) j.program.push_back(a.as<std::string>());
    } else {
      bad("--job-file " + path, key, "is not a known field (they are the flags' long names, e.g. nproc-per-node)");
    }
  }
}

// Writes all or nothing: a temporary file next to the target, renamed into place.
void write_out(const std::string& text, const std::string& path) {
  if (path.empty() || path == "-") {
    std::cout << text << std::flush;
    if (!std::cout) throw kft::transport_error("writing to standard output failed", kft::error_site::of("kft-manifest"));
    return;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
      std::filesystem::remove(tmp);
      bad("-o", path, std::string("cannot be written: ") + std::strerror(errno));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    bad("-o", path, "cannot be written: " + ec.message());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft-manifest: one job description -> Kubeflow TrainJob / ClusterTrainingRuntime / MPIJob / Slurm sbatch"};
  app.require_subcommand(1);
  // One set of options, shared by every subcommand.
  job cli;
  std::string job_file, out, gang, ttl, max_restarts, deadline;
  std::vector<std::string> env, labels, annotations;
  std::vector<CLI::Option*> given;
  auto add_common = [&](CLI::App* s) {
    auto o = [&](CLI::Option* opt) { given.push_back(opt); return opt; };
    s->add_option("--job-file", job_file, "YAML job file with the same fields as these flags");
    s->add_option("-o,--output-file", out, "write here (atomically) instead of standard output");
    o(s->add_option("--name", cli.name, "job name (a DNS-1035 label for Kubernetes)"));
    o(s->add_option("--namespace", cli.ns, "Kubernetes namespace (default: default)"));
    o(s->add_option("--image", cli.image, "container image"));
    o(s->add_option("--image-pull-policy", cli.image_pull_policy, "Always, IfNotPresent or Never"));
    o(s->add_option("--nodes", cli.nodes, "nodes (pods, Slurm nodes)"));
    o(s->add_option("--nproc-per-node", cli.nproc_per_node, "processes per node (MPI slots per worker)"));
    o(s->add_option("--gpus-per-node", cli.gpus_per_node, "GPUs per node"));
    o(s->add_option("--gpu-resource", cli.gpu_resource, "GPU resource name (default: nvidia.com/gpu)"));
    o(s->add_option("--cpus", cli.cpus, "CPU request per node (a Kubernetes quantity: 4, 500m)"));
    o(s->add_option("--cpu-limit", cli.cpu_limit, "CPU limit per node (default: none)"));
    o(s->add_option("--memory", cli.memory, "memory request and limit per node (16Gi, 512Mi)"));
    o(s->add_option("--env", env, "environment variable K=V (repeatable)"));
    o(s->add_option("--queue", cli.queue, "Kueue LocalQueue (Slurm: partition)"));
    o(s->add_option("--priority-class", cli.priority_class, "Kueue WorkloadPriorityClass / MPIJob priority class"));
    o(s->add_option("--gang", gang, "gang scheduling through the runtime: none, coscheduling, volcano"));
    o(s->add_option("--scheduler-name", cli.scheduler_name, "schedulerName for the pods (e.g. volcano)"));
    o(s->add_option("--max-restarts", max_restarts, "restarts of the whole job (JobSet maxRestarts, MPIJob backoffLimit)"));
    o(s->add_option("--active-deadline", deadline, "seconds the job may run"));
    o(s->add_option("--ttl", ttl, "seconds to keep a finished job"));
    o(s->add_option("--ssh-mount-path", cli.ssh_mount_path, "MPIJob: where the ssh keys are mounted"));
    o(s->add_option("--runtime", cli.runtime, "ClusterTrainingRuntime name (default: kft-torch)"));
    o(s->add_option("--label", labels, "label K=V on the job and its pods (repeatable)"));
    o(s->add_option("--annotation", annotations, "annotation K=V on the job and its pods (repeatable)"));
    o(s->add_option("--launcher", cli.launcher, "sbatch: srun (with --mpi=pmix) or mpirun"));
    o(s->add_option("--time", cli.time_limit, "sbatch: time limit (Slurm syntax, e.g. 1:00:00)"));
    o(s->add_option("--output", cli.output, "sbatch: Slurm's --output file pattern"));
    o(s->add_option("--cpus-per-task", cli.cpus_per_task, "sbatch: CPUs per task"));
  };
  auto* trainjob = app.add_subcommand("trainjob", "Kubeflow Trainer v2.3 TrainJob running kftrun -- program");
  auto* runtime = app.add_subcommand("runtime", "a ClusterTrainingRuntime for kft TrainJobs");
  auto* mpijob = app.add_subcommand("mpijob", "MPI Operator v2beta1 MPIJob running mpirun program");
  auto* sbatch = app.add_subcommand("sbatch", "Slurm batch script running srun --mpi=pmix program (or mpirun)");
  for (auto* s : {trainjob, runtime, mpijob, sbatch}) {
    s->allow_extras(false);
    s->footer("The program and its arguments follow `--`; they are copied verbatim.");
  }
  // Everything after the first `--` is the program, untouched (CLI11 would read "[1]" as a list).
  int ours = argc;
  std::vector<std::string> program;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--") {
      ours = i;
      program.assign(argv + i + 1, argv + argc);
      break;
    }
  // CLI11 binds options to variables per subcommand: add them to the one chosen.
  for (int i = 1; i < ours; ++i) {
    const std::string a = argv[i];
    for (auto* s : {trainjob, runtime, mpijob, sbatch})
      if (a == s->get_name()) add_common(s);
    if (a == "trainjob" || a == "runtime" || a == "mpijob" || a == "sbatch") break;
  }
  try {
    app.parse(ours, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    job j;
    if (!job_file.empty()) load_job_file(job_file, j);
    for (auto* opt : given) {  // flags override the job file
      if (opt->count() == 0) continue;
      const std::string n = opt->get_name();
      if (n == "--name") j.name = cli.name;
      else if (n == "--namespace") j.ns = cli.ns;
      else if (n == "--image") j.image = cli.image;
      else if (n == "--image-pull-policy") j.image_pull_policy = cli.image_pull_policy;
      else if (n == "--nodes") j.nodes = cli.nodes;
      else if (n == "--nproc-per-node") j.nproc_per_node = cli.nproc_per_node;
      else if (n == "--gpus-per-node") j.gpus_per_node = cli.gpus_per_node;
      else if (n == "--gpu-resource") j.gpu_resource = cli.gpu_resource;
      else if (n == "--cpus") j.cpus = cli.cpus;
      else if (n == "--cpu-limit") j.cpu_limit = cli.cpu_limit;
      else if (n == "--memory") j.memory = cli.memory;
      else if (n == "--env") {
        j.env.clear();
        for (const auto& e : env) j.env.push_back(split_kv("--env", e));
      } else if (n == "--queue") j.queue = cli.queue;
      else if (n == "--priority-class") j.priority_class = cli.priority_class;
      else if (n == "--gang") j.gang_scheduling = parse_gang(gang);
      else if (n == "--scheduler-name") j.scheduler_name = cli.scheduler_name;
      else if (n == "--max-restarts") j.max_restarts = static_cast<int>(kft::detail::parse_integer("--max-restarts", max_restarts, -1000000, 1000000, ""));
      else if (n == "--active-deadline") j.active_deadline = kft::detail::parse_integer("--active-deadline", deadline, -1, 1LL << 40, "");
      else if (n == "--ttl") j.ttl = static_cast<int>(kft::detail::parse_integer("--ttl", ttl, -1000000, 1 << 30, ""));
      else if (n == "--ssh-mount-path") j.ssh_mount_path = cli.ssh_mount_path;
      else if (n == "--runtime") j.runtime = cli.runtime;
      else if (n == "--label") {
        for (const auto& l : labels) {
          auto [k, v] = split_kv("--label", l);
          j.labels[k] = v;
        }
      } else if (n == "--annotation") {
        for (const auto& l : annotations) {
          auto [k, v] = split_kv("--annotation", l);
          j.annotations[k] = v;
        }
      } else if (n == "--launcher") j.launcher = cli.launcher;
      else if (n == "--time") j.time_limit = cli.time_limit;
      else if (n == "--output") j.output = cli.output;
      else if (n == "--cpus-per-task") j.cpus_per_task = cli.cpus_per_task;
    }
    if (ours < argc) j.program = program;  // `--` given: overrides the job file's command
    using kft::manifest::target;
    std::string text;
    if (*trainjob) {
      kft::manifest::validate(j, target::trainjob);
      // These live in the ClusterTrainingRuntime, not in a TrainJob (Trainer v2.3 has no field
      // for them): say so instead of dropping them silently.
      std::string runtime_only;
      if (j.gang_scheduling != kft::manifest::gang::none) runtime_only += " --gang";
      if (!j.scheduler_name.empty()) runtime_only += " --scheduler-name";
      if (j.max_restarts) runtime_only += " --max-restarts";
      if (j.ttl) runtime_only += " --ttl";
      if (!j.image_pull_policy.empty()) runtime_only += " --image-pull-policy";
      if (!runtime_only.empty())
        std::cerr << "kft-manifest: note:" << runtime_only << " belong to the runtime `" << j.runtime
                  << "`: write it with `kft-manifest runtime` (the TrainJob cannot carry them)\n";
      text = manifest_tool::trainjob(j);
    } else if (*runtime) {
      kft::manifest::validate(j, target::runtime);
      text = manifest_tool::runtime(j);
    } else if (*mpijob) {
      kft::manifest::validate(j, target::mpijob);
      text = manifest_tool::mpijob(j);
    } else {
      kft::manifest::validate(j, target::sbatch);
      text = manifest_tool::sbatch(j);
    }
    write_out(text, out);
    return 0;
  } catch (const kft::config_error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const kft::error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
