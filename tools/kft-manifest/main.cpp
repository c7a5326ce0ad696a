// SPDX-License-Identifier: Apache-2.0
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
// Bad input is refused before anything is written, naming the option (for a job file: the file,
// the field and its line), with exit status 2.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <kft/core/atomic_file.hpp>
#include <kft/core/error.hpp>
#include <kft/core/parse.hpp>
#include <kft/manifest/job.hpp>

#include "../common/cli.hpp"
#include "emit.hpp"

namespace {

using kft::manifest::job;
using kft::manifest::detail::shown;

[[noreturn]] void bad(const std::string& option, const std::string& value, const std::string& why) {
  kft::manifest::detail::bad(option, value, why);  // echoes at most the value's first 80 bytes
}

std::pair<std::string, std::string> split_kv(const std::string& option, const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0) bad(option, s, "is not KEY=VALUE");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

kft::manifest::gang parse_gang(const std::string& option, const std::string& s) {
  if (s.empty() || s == "none") return kft::manifest::gang::none;
  if (s == "coscheduling") return kft::manifest::gang::coscheduling;
  if (s == "volcano") return kft::manifest::gang::volcano;
  bad(option, s, "is not none, coscheduling or volcano");
}

// "line 4, column 8": yaml-cpp counts from 0, people from 1.
std::string line_of(const YAML::Mark& m) {
  return "line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1);
}

// yaml-cpp 0.7 (Debian 12's) never returns from LoadAll on some malformed streams: a token that
// cannot start a node where one is expected (a `,` at the top level: `, name: x`) makes the
// parser report an empty document without consuming the token, again and again, allocating a
// node each time until memory runs out (jbeder/yaml-cpp#1040; fixed upstream after 0.8 by #1319).
// This pass walks the documents' events first and stops at an empty document reported where the
// previous one was (no progress); each document consumes at least one byte otherwise, so the
// document count is bounded by the text's length too. Returns the mark of the stuck token.
std::optional<YAML::Mark> stuck_parser_at(const std::string& text) {
  class events final : public YAML::EventHandler {
   public:
    bool only_null = true;
    YAML::Mark mark;
    void OnDocumentStart(const YAML::Mark& m) override {
      only_null = true;
      mark = m;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark& m, YAML::anchor_t) override { mark = m; }
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override { only_null = false; }
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {
      only_null = false;
    }
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
      only_null = false;
    }
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
      only_null = false;
    }
    void OnMapEnd() override {}
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  events e;
  std::optional<int> last_empty_at;
  for (std::size_t docs = 0; parser.HandleNextDocument(e); ++docs) {
    if (e.only_null) {
      if (last_empty_at == e.mark.pos || docs > text.size() + 1) return e.mark;
      last_empty_at = e.mark.pos;
    } else {
      last_empty_at.reset();
    }
  }
  return std::nullopt;
}

// A list or a mapping in flow style ("[1, {a: b}]"), up to about `budget` bytes.
void flow(const YAML::Node& n, std::string& out, std::size_t budget) {
  if (out.size() > budget) return;
  if (n.IsScalar()) {
    out.append(n.Scalar(), 0, budget + 1 - out.size());
    return;
  }
  if (!n.IsSequence() && !n.IsMap()) {
    out += "~";
    return;
  }
  out += n.IsSequence() ? "[" : "{";
  bool first = true;
  for (const auto& it : n) {
    if (out.size() > budget) break;
    if (!first) out += ", ";
    first = false;
    if (n.IsSequence()) {
      flow(it, out, budget);
    } else {
      flow(it.first, out, budget);
      out += ": ";
      flow(it.second, out, budget);
    }
  }
  out += n.IsSequence() ? "]" : "}";
}

// A node as a message shows it: a scalar's text (`shown` shortens it), a list or a mapping in
// flow style, at most 80 bytes of it.
std::string text_of(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (!n.IsSequence() && !n.IsMap()) return "";
  std::string out;
  flow(n, out, 80);
  if (out.size() <= 80) return out;
  std::size_t keep = 76;
  while (keep > 0 && (static_cast<unsigned char>(out[keep]) & 0xC0) == 0x80) --keep;
  return out.substr(0, keep) + " ...";
}

std::string kind_of(const YAML::Node& n) {
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  if (n.IsNull()) return "empty (null)";
  return "a single value";
}

// The job file: keys are the flags' long names. Unknown keys are errors (a typo must not be
// silently dropped), and so are keys given twice, nulls and values of the wrong YAML type: each
// names the file, the field (`env.FOO`, `command[1]`) and its line.
class job_file_reader {
 public:
  job_file_reader(const std::string& path, job& j, kft::manifest::origins& from) : path_(path), j_(j), from_(from) {}

  void read() {
    std::error_code ec;
    if (std::filesystem::is_directory(path_, ec)) bad_file("is a directory");
    {
      std::ifstream f(path_, std::ios::binary);
      if (!f) bad_file(std::string("cannot be read: ") + std::strerror(errno));
      // Bounded: a job file is a few KB; /dev/zero or a mistaken multi-GB file must not fill memory.
      constexpr std::size_t limit = std::size_t{16} << 20;
      std::string chunk(1u << 16, '\0');
      while (f && text_.size() <= limit) {
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        text_.append(chunk.data(), static_cast<std::size_t>(f.gcount()));
      }
      if (f.bad()) bad_file(std::string("cannot be read: ") + std::strerror(errno));
      if (text_.size() > limit) bad_file("is larger than 16 MiB: not a job file");
    }
    std::vector<YAML::Node> docs;
    try {
      if (const auto at = stuck_parser_at(text_)) {
        const auto pos = static_cast<std::size_t>(std::max(at->pos, 0));
        const std::string token = pos < text_.size() ? text_.substr(pos, 1) : std::string("end of file");
        bad_file("is not valid YAML: " + line_of(*at) + ": unexpected '" + shown(token, 8) + "' where a value should start");
      }
      docs = YAML::LoadAll(text_);
    } catch (const YAML::Exception& e) {
      bad_file("is not valid YAML: " + line_of(e.mark) + ": " + e.msg);
    }
    // Empty documents (a stray `---`) say nothing; a second one with content would be dropped.
    docs.erase(std::remove_if(docs.begin(), docs.end(), [](const YAML::Node& d) { return d.IsNull(); }), docs.end());
    if (docs.empty()) bad_file("is empty: it must be a mapping of option names to values");
    if (docs.size() > 1)
      bad("--job-file", path_,
          "holds " + std::to_string(docs.size()) + " YAML documents (the second at " + line_of(docs[1].Mark()) +
              "): a job file is one mapping of option names to values");
    const YAML::Node& doc = docs[0];
    if (!doc.IsMap())
      bad("--job-file", path_,
          "must be a mapping of option names to values, not " + kind_of(doc) + " (" + line_of(doc.Mark()) + ")");
    try {
      fields(doc);
    } catch (const YAML::Exception& e) {  // every conversion is checked first; this is the backstop
      bad_file("cannot be read: " + line_of(e.mark) + ": " + e.msg);
    }
  }

 private:
  // The path as typed, unless absurdly long (values from the file are cut at 80 bytes).
  std::string file() const { return shown(path_, 1024); }
  [[noreturn]] void bad_file(const std::string& why) const {
    throw kft::config_error("--job-file", file(), why, kft::error_site::of("kft-manifest"));
  }
  // "--job-file job.yaml, line 4, column 8: env.FOO"
  std::string place(const YAML::Mark& m, const std::string& field) const {
    return "--job-file " + file() + ", " + line_of(m) + ": " + field;
  }
  std::string at(const YAML::Node& n, const std::string& field) const { return place(n.Mark(), field); }

  [[noreturn]] void bad_at(const YAML::Node& n, const std::string& field, const std::string& value,
                           const std::string& why) const {
    bad(at(n, field), value, why);
  }

  // Where an empty list entry (a `-` and nothing) is: yaml-cpp marks it where the next token
  // starts, so step back over blank and comment lines to the `-`. A written `~` or `null` is
  // marked where it is.
  YAML::Mark empty_entry(YAML::Mark m) const {
    if (m.pos < 0 || static_cast<std::size_t>(m.pos) > text_.size()) return m;
    const std::string_view rest = std::string_view(text_).substr(static_cast<std::size_t>(m.pos));
    for (const char* word : {"~", "null", "Null", "NULL"})
      if (rest.rfind(word, 0) == 0) return m;
    const std::size_t npos = std::string::npos;
    std::size_t eol = m.pos == 0 ? npos : text_.rfind('\n', static_cast<std::size_t>(m.pos) - 1);  // ends the line above
    for (int line = m.line - 1; eol != npos && line >= 0; --line) {
      const std::size_t nl = eol == 0 ? npos : text_.rfind('\n', eol - 1);
      const std::size_t bol = nl == npos ? 0 : nl + 1;
      const std::string_view l = std::string_view(text_).substr(bol, eol - bol);
      const std::size_t first = l.find_first_not_of(" \t\r");
      if (first != npos && l[first] != '#') {
        m.line = line;
        m.column = static_cast<int>(first);
        m.pos = static_cast<int>(bol + first);
        return m;
      }
      eol = nl;
    }
    return m;
  }

  // A single value (text or a number), not a list, a mapping or null. An empty value's mark is
  // where the next token starts: `key`, the node it belongs to, says where it is instead.
  std::string scalar(const YAML::Node& n, const std::string& field, const YAML::Node& key) const {
    if (n.IsNull()) bad_at(key, field, "", empty_value);
    if (!n.IsScalar()) bad_at(n, field, text_of(n), "is " + kind_of(n) + "; it must be a single value");
    return n.Scalar();
  }

  long long integer(const YAML::Node& n, const std::string& field, const YAML::Node& key, long long lo,
                    long long hi) const {
    const std::string s = scalar(n, field, key);
    long long v = 0;
    if (!YAML::convert<long long>::decode(n, v)) bad_at(n, field, s, "is not an integer");
    if (v < lo || v > hi)
      bad_at(n, field, s, "is out of range (" + std::to_string(lo) + " to " + std::to_string(hi) + ")");
    return v;
  }
  int integer(const YAML::Node& n, const std::string& field, const YAML::Node& key) const {
    return static_cast<int>(integer(n, field, key, INT_MIN, INT_MAX));
  }

  // A mapping's key: a name, not a list, a mapping or null.
  std::string key(const YAML::Node& k, const std::string& field, const std::string& what) const {
    if (!k.IsScalar()) bad_at(k, field, text_of(k), "is " + kind_of(k) + ", not " + what);
    return k.Scalar();
  }

  // Each key once: `seen` holds the keys so far and their lines.
  void once(std::map<std::string, YAML::Mark>& seen, const std::string& k, const YAML::Node& key_node,
            const YAML::Node& value, const std::string& field) const {
    const auto [it, fresh] = seen.emplace(k, key_node.Mark());
    if (!fresh) bad_at(key_node, field, text_of(value), "is given twice (first at " + line_of(it->second) + ")");
  }

  // env/label/annotation: a mapping of names to single values, entries remembered by name.
  template <class Put>
  void pairs(const YAML::Node& v, const std::string& field, const YAML::Node& field_key, const std::string& option,
             Put put) {
    if (!v.IsMap())
      bad_at(v.IsNull() ? field_key : v, field, text_of(v),
             "is " + kind_of(v) + "; it must be a mapping of names to values");
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : v) {
      const std::string k = key(kv.first, field + " key", "a name");
      const std::string entry = field + "." + shown(k);
      once(seen, k, kv.first, kv.second, entry);
      put(k, scalar(kv.second, entry, kv.first));
      from_[option + " " + k] = at(kv.first, entry);
    }
  }

  void fields(const YAML::Node& doc) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& item : doc) {
      const std::string key =
          this->key(item.first, "key", "an option name (the flags' long names, e.g. nproc-per-node)");
      const YAML::Node& v = item.second;
      const std::string field = shown(key);
      once(seen, key, item.first, v, field);
      const YAML::Node& key_node = item.first;
      auto str = [&] { return scalar(v, field, key_node); };
      auto integer = [&] { return this->integer(v, field, key_node); };
      auto integer_in = [&](long long lo, long long hi) { return this->integer(v, field, key_node, lo, hi); };
      job& j = j_;
      if (key == "name") j.name = str();
      else if (key == "namespace") j.ns = str();
      else if (key == "image") j.image = str();
      else if (key == "image-pull-policy") j.image_pull_policy = str();
      else if (key == "nodes") j.nodes = integer();
      else if (key == "nproc-per-node") j.nproc_per_node = integer();
      else if (key == "gpus-per-node") j.gpus_per_node = integer();
      else if (key == "gpu-resource") j.gpu_resource = str();
      else if (key == "cpus") j.cpus = str();
      else if (key == "cpu-limit") j.cpu_limit = str();
      else if (key == "memory") j.memory = str();
      else if (key == "env")
        pairs(v, field, key_node, "--env", [&](const std::string& k, const std::string& val) { j.env.emplace_back(k, val); });
      else if (key == "queue") j.queue = str();
      else if (key == "priority-class") j.priority_class = str();
      else if (key == "gang") j.gang_scheduling = parse_gang(at(v, field), str());
      else if (key == "scheduler-name") j.scheduler_name = str();
      // the same ranges as the flags
      else if (key == "max-restarts") j.max_restarts = static_cast<int>(integer_in(-1000000, 1000000));
      else if (key == "active-deadline") j.active_deadline = integer_in(-1, 1LL << 40);
      else if (key == "ttl") j.ttl = static_cast<int>(integer_in(-1000000, 1 << 30));
      else if (key == "ssh-mount-path") j.ssh_mount_path = str();
      else if (key == "runtime") j.runtime = str();
      else if (key == "label")
        pairs(v, field, key_node, "--label", [&](const std::string& k, const std::string& val) { j.labels[k] = val; });
      else if (key == "annotation")
        pairs(v, field, key_node, "--annotation", [&](const std::string& k, const std::string& val) { j.annotations[k] = val; });
      else if (key == "launcher") j.launcher = str();
      else if (key == "time") j.time_limit = str();
      else if (key == "output") j.output = str();
      else if (key == "cpus-per-task") j.cpus_per_task = integer();
      else if (key == "command") {
        if (!v.IsSequence())
          bad_at(v.IsNull() ? key_node : v, field, text_of(v),
                 "is " + kind_of(v) + "; it must be a list: the program and its arguments");
        j.program.clear();
        for (std::size_t i = 0; i < v.size(); ++i) {
          const std::string entry = field + "[" + std::to_string(i) + "]";
          if (v[i].IsNull()) bad(place(empty_entry(v[i].Mark()), entry), "", empty_value);
          j.program.push_back(scalar(v[i], entry, v[i]));
        }
      } else {
        bad_at(key_node, field, text_of(v),
               "is not a known field (they are the flags' long names, e.g. nproc-per-node)");
      }
      if (key != "env" && key != "label" && key != "annotation")
        from_["--" + key] = at(v.IsNull() ? key_node : v, field);  // for validate's messages
    }
  }

  static constexpr const char* empty_value = "is empty (null): give a value, or \"\" for an empty one";

  const std::string& path_;
  std::string text_;  // the file, for empty_entry
  job& j_;
  kft::manifest::origins& from_;
};

// Writes all or nothing: a temporary file next to the target, renamed into place.
void write_out(const std::string& text, const std::string& path) {
  if (path.empty() || path == "-") {
    std::cout << text << std::flush;
    if (!std::cout) throw kft::transport_error("writing to standard output failed", kft::error_site::of("kft-manifest"));
    return;
  }
  try {
    kft::write_file_atomically(path, text, "kft-manifest -o");
  } catch (const kft::transport_error& e) {
    bad("-o", path, std::string("cannot be written: ") + std::strerror(e.backend_code()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft-manifest: one job description -> Kubeflow TrainJob / ClusterTrainingRuntime / MPIJob / Slurm sbatch"};
  app.require_subcommand(1);
  kft_tools::common_flags common;
  common.add_to(app, "kft-manifest");
  // One set of options, shared by every subcommand.
  job cli;
  std::string job_file, out, gang, ttl, max_restarts, deadline;
  std::vector<std::string> env, labels, annotations;
  std::vector<CLI::Option*> given;
  bool no_failure_rules = false;
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
    s->add_flag("--no-failure-rules", no_failure_rules,
                "runtime, mpijob: leave out the failure rules keyed on kftrun's exit classes (docs/kubernetes.md)");
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
  if (const auto status = kft_tools::parse(app, "kft-manifest", ours, argv)) return *status;

  try {
    common.apply();
    job j;
    kft::manifest::origins from;  // the fields the job file set, named by their place in it
    if (!job_file.empty()) job_file_reader(job_file, j, from).read();
    for (auto* opt : given) {  // flags override the job file
      if (opt->count() == 0) continue;
      const std::string n = opt->get_name();
      from.erase(n);
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
        for (auto it = from.begin(); it != from.end();)  // the file's env is replaced, not merged
          it = it->first.rfind("--env ", 0) == 0 ? from.erase(it) : std::next(it);
        for (const auto& e : env) j.env.push_back(split_kv("--env", e));
      } else if (n == "--queue") j.queue = cli.queue;
      else if (n == "--priority-class") j.priority_class = cli.priority_class;
      else if (n == "--gang") j.gang_scheduling = parse_gang("--gang", gang);
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
          from.erase("--label " + k);
        }
      } else if (n == "--annotation") {
        for (const auto& l : annotations) {
          auto [k, v] = split_kv("--annotation", l);
          j.annotations[k] = v;
          from.erase("--annotation " + k);
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
      kft::manifest::validate(j, target::trainjob, from);
      // These live in the ClusterTrainingRuntime, not in a TrainJob (Trainer v2.3 has no field
      // for them): say so instead of dropping them silently.
      std::string runtime_only;
      if (j.gang_scheduling != kft::manifest::gang::none) runtime_only += " --gang";
      if (!j.scheduler_name.empty()) runtime_only += " --scheduler-name";
      if (j.max_restarts) runtime_only += " --max-restarts";
      if (j.ttl) runtime_only += " --ttl";
      if (!j.image_pull_policy.empty()) runtime_only += " --image-pull-policy";
      if (!runtime_only.empty())
        kft::log::warn("kft-manifest", runtime_only.substr(1) + " belong to the runtime `" + j.runtime +
                                           "`: write it with `kft-manifest runtime` (the TrainJob cannot carry them)");
      text = manifest_tool::trainjob(j);
    } else if (*runtime) {
      kft::manifest::validate(j, target::runtime, from);
      text = manifest_tool::runtime(j, !no_failure_rules);
    } else if (*mpijob) {
      kft::manifest::validate(j, target::mpijob, from);
      text = manifest_tool::mpijob(j, !no_failure_rules);
    } else {
      kft::manifest::validate(j, target::sbatch, from);
      text = manifest_tool::sbatch(j);
    }
    write_out(text, out);
    return 0;
  } catch (const kft::config_error& e) {
    kft::log::error("kft-manifest", kft_tools::message_of(e, "kft-manifest"));
    return kft_tools::usage_status;
  } catch (const kft::error& e) {
    kft::log::error("kft-manifest", kft_tools::message_of(e, "kft-manifest"));
    return 1;
  } catch (const std::exception& e) {  // not expected: still one line, never an abort
    kft::log::error("kft-manifest", e.what());
    return 1;
  }
}
