// SPDX-License-Identifier: Apache-2.0
// kftrun's command line: flags (and their PET_* / KFT_* environment forms) -> the agent's
// options. Separate from main() so tests/fuzz/kftrun_args.cpp can drive it with any argv.
#pragma once

#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/core/parse.hpp>
#include <kft/core/timeout.hpp>
#include <kft/kft.hpp>
#if KFT_WITH_CUDA
#include <kft/topology/cuda.hpp>
#endif
#if KFT_WITH_HWLOC
#include <kft/topology/hwloc.hpp>
#endif

#include "../common/cli.hpp"
#include "agent.hpp"

namespace kftrun {

// CLI11's refusals (kft_tools::parse) and kftrun's own exit with the same usage class.
static_assert(exit_code::usage == kft_tools::usage_status);

// --bind: one CPU list per local rank, planned with hwloc before any worker starts.
inline std::vector<std::string> plan_bindings(const std::string& bind, [[maybe_unused]] int nproc) {
  if (bind.empty() || bind == "none") return {};
#if KFT_WITH_HWLOC
  const auto policy = kft::topology::bind_policy_from_env(kft::environment({{"KFT_BIND", bind}}, "localhost"));
  std::vector<std::string> out;
  for (int l = 0; l < nproc; ++l) {
    std::string bus;
    if (policy == kft::topology::bind_policy::gpu) {
#if KFT_WITH_CUDA
      const auto inv = kft::topology::query_cuda_devices();
      if (inv.devices.empty()) throw kft::config_error("--bind", bind, "needs a visible GPU (" + inv.status + ")");
      bus = inv.devices[static_cast<std::size_t>(l) % inv.devices.size()].pci_bus_id;
#else
      throw kft::config_error("--bind", bind, "needs kft built with CUDA (KFT_WITH_CUDA=ON)");
#endif
    }
    const auto b = kft::topology::plan_binding(l, nproc, policy, bus);
    kft::log::info("kftrun", "local rank " + std::to_string(l) + ": " +
                                 (b.cpuset.empty() ? "not bound: " : "PUs " + b.cpuset + ", ") + b.reason);
    out.push_back(b.cpuset);
  }
  return out;
#else
  throw kft::config_error("--bind", bind, "needs kft built with hwloc (KFT_WITH_HWLOC=ON)");
#endif
}

// --nproc-per-node: a number, or auto (GPUs if any, else CPU cores), gpu, cpu.
inline int resolve_nproc(const std::string& value) {
  auto gpus = []() -> int {
#if KFT_WITH_CUDA
    return static_cast<int>(kft::topology::query_cuda_devices().devices.size());
#else
    return 0;
#endif
  };
  auto cpus = [] { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); };
  if (value == "auto") return gpus() > 0 ? gpus() : cpus();
  if (value == "cpu") return cpus();
  if (value == "gpu") {
    const int n = gpus();
    if (n == 0) throw kft::config_error("--nproc-per-node", value, "asks for one process per GPU, but no CUDA device is visible");
    return n;
  }
  try {
    return static_cast<int>(kft::detail::parse_integer("--nproc-per-node", value, 1, 1 << 16, ""));
  } catch (const kft::config_error&) {
    throw kft::config_error("--nproc-per-node", value, "is not a positive integer, auto, cpu or gpu");
  }
}

// --nnodes: N (fixed), or MIN:MAX (elastic; "N:N" is an elastic job of exactly N nodes, whose
// lost nodes may be replaced by new agents).
inline void parse_nnodes(const std::string& value, options& o) {
  auto number = [&](const std::string& part) {
    try {
      return static_cast<int>(kft::detail::parse_integer("--nnodes", part, 1, 1 << 20, ""));
    } catch (const kft::config_error&) {
      throw kft::config_error("--nnodes", value, "is not a number of nodes N or a range MIN:MAX (each 1 to 1048576)");
    }
  };
  const auto colon = value.find(':');
  if (colon == std::string::npos) {
    o.nnodes = o.min_nodes = number(value);
    o.elastic = false;
    return;
  }
  o.min_nodes = number(value.substr(0, colon));
  o.nnodes = number(value.substr(colon + 1));
  o.elastic = true;
  if (o.min_nodes > o.nnodes)
    throw kft::config_error("--nnodes", value, "has MIN above MAX");
}

/// The options to run with, or the exit status when kftrun must not start: 0 after --help or
/// --version, 2 for bad input (the message, naming the flag and its value, is printed).
inline std::variant<options, int> parse_command_line(int argc, const char* const* argv) {
  CLI::App app{"kftrun: start a program on every node of a job, torchrun's way (docs/launching.md)"};
  kft_tools::common_flags common;
  common.add_to(app, "kftrun");
  kftrun::options o;
  std::string nproc = "1";
  double monitor = 0.1, grace = 5, exit_grace = 1;
  std::optional<double> rdzv_timeout, heartbeat;
  std::string timeout_text;
  bool standalone = false;
  std::optional<int> port;
  std::string log_dir;
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "workers on this node: N, auto, cpu or gpu")
      ->envname("PET_NPROC_PER_NODE")->capture_default_str();
  std::string bind;
  app.add_option("--bind", bind,
                 "bind each worker's CPUs: none, core (an even share of the cores, spread over NUMA nodes), "
                 "numa (its NUMA node), gpu (the cores nearest GPU local-rank %% GPUs)")
      ->envname("KFT_BIND");
  std::string nnodes = "1";
  app.add_option("--nnodes", nnodes,
                 "nodes (agents) in the job: N, or MIN:MAX for an elastic job whose rounds re-form as agents join "
                 "and leave (each agent's --node-rank is then its identity; node 0 hosts the store)")
      ->envname("PET_NNODES")->capture_default_str();
  std::optional<double> last_call;
  app.add_option("--rdzv-last-call", last_call,
                 "elastic jobs: seconds node 0 waits for more nodes once MIN have joined a round [default: 2]")
      ->envname("KFT_RDZV_LAST_CALL")->check(CLI::Range(0.0, 3600.0));
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's index, 0..nnodes-1")->envname("PET_NODE_RANK")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr, "address of node 0, where the store listens")
      ->envname("PET_MASTER_ADDR")->capture_default_str();
  app.add_option("--master-port,--master_port", port, "store port on node 0 (default: 29500; any free port on one node)")
      ->envname("PET_MASTER_PORT")->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts,--max_restarts", o.max_restarts, "restart every worker group this many times at most")
      ->envname("PET_MAX_RESTARTS")->check(CLI::Range(0, std::numeric_limits<int>::max()))->capture_default_str();
  app.add_option("--timeout", timeout_text,
                 "the job's one timeout (seconds, or 90s, 2m, 1500ms): every wait's default derives from it "
                 "(docs/reliability.md); passed to the workers as KFT_TIMEOUT [default: 300]")
      ->envname("KFT_TIMEOUT");
  app.add_option("--rdzv-timeout,--rdzv_timeout", rdzv_timeout, "seconds to wait for every node to join [default: --timeout]")
      ->envname("PET_RDZV_TIMEOUT")->check(CLI::Range(0.001, 30.0 * 24 * 3600));
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", o.run_id, "job id shared by all agents")
      ->envname("PET_RUN_ID")->capture_default_str();
  app.add_option("--log-dir,--log_dir", log_dir, "write each rank's stdout/stderr under this directory")
      ->envname("PET_LOG_DIR");
  app.add_flag("--tee", o.tee, "with --log-dir, also relay output to the console")->envname("PET_TEE");
  app.add_option("--monitor-interval,--monitor_interval", monitor, "seconds between checks of the workers")
      ->envname("PET_MONITOR_INTERVAL")->check(CLI::Range(0.01, 60.0))->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat,
                 "seconds without a heartbeat before an agent counts as dead [default: --timeout / 60, 2 to 30 s]")
      ->envname("KFT_HEARTBEAT_TIMEOUT")->check(CLI::Range(0.5, 3600.0));
  app.add_option("--term-grace", grace, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->envname("KFT_TERM_GRACE")->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  app.add_option("--exit-grace", exit_grace,
                 "after a worker fails, seconds the others may still exit by themselves (and print their errors) "
                 "before they are stopped; 0: stop them at once")
      ->envname("KFT_EXIT_GRACE")->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  std::string on_failure = "stop";
  app.add_option("--on-failure", on_failure,
                 "when a worker fails: stop (stop every worker; restart them all while --max-restarts allows) or "
                 "continue (the others go on: a program that shrinks its group, kft/group/shrink.hpp, finishes "
                 "without the lost ranks; the job succeeds when every worker left exits 0) or heal (as continue, and "
                 "a replacement with the lost one's rank and KFT_JOIN set joins the running group at a step "
                 "boundary; at most --max-restarts replacements)")
      ->envname("KFT_ON_FAILURE")->check(CLI::IsMember({"stop", "continue", "heal"}))->capture_default_str();
  std::string store_relay = "auto";
  app.add_option("--store-relay", store_relay,
                 "on: this node's workers reach the job's store through a relay this agent runs (one connection per "
                 "node to the store, requests combined); off: each worker connects to node 0's store; auto: on for "
                 "nodes other than node 0 when the job has several")
      ->envname("KFT_STORE_RELAY")->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  app.add_flag("--standalone", standalone, "single node, any free port (the default when --nnodes is 1)");
  app.add_option("program", o.program, "the program and its arguments (after --)")->required();
  app.positionals_at_end();
  app.footer("While the job runs, kill -USR1 <this kftrun's pid> prints every rank's step and newest collective as JSON; "
             "across nodes, kftrun status --help (docs/launching.md).");
  if (const auto status = kft_tools::parse(app, "kftrun", argc, argv)) return *status;

  try {
    common.apply();  // KFT_LOG_LEVEL, before --bind's lines
    o.nproc_per_node = resolve_nproc(nproc);
    parse_nnodes(nnodes, o);
    if (o.node_rank >= o.nnodes && !o.elastic)  // (elastic: an identity, any number; node 0 hosts the store)
      throw kft::config_error("--node-rank", std::to_string(o.node_rank), "is not below --nnodes=" + nnodes);
    if (last_call) {
      if (!o.elastic) throw kft::config_error("--rdzv-last-call", std::to_string(*last_call), "applies to elastic jobs (--nnodes MIN:MAX)");
      o.last_call = std::chrono::milliseconds(static_cast<long long>(*last_call * 1000));
    }
    if (standalone && o.nnodes != 1)
      throw kft::config_error("--standalone", "", "means a single node, but --nnodes=" + std::to_string(o.nnodes));
    o.master_port = port ? *port : (o.nnodes == 1 ? 0 : 29500);
    o.store_relay = store_relay == "on" || (store_relay == "auto" && (o.nnodes > 1 || o.elastic));
    const auto derived = kft::derived_timeouts::from(
        timeout_text.empty() ? kft::default_job_timeout : kft::detail::parse_duration("--timeout", timeout_text));
    o.job_timeout = derived.job;
    o.rdzv_timeout = rdzv_timeout ? std::chrono::milliseconds(static_cast<long long>(*rdzv_timeout * 1000)) : derived.job;
    o.monitor_interval = std::chrono::milliseconds(static_cast<long long>(monitor * 1000));
    o.heartbeat_timeout = heartbeat ? std::chrono::milliseconds(static_cast<long long>(*heartbeat * 1000)) : derived.heartbeat;
    o.term_grace = std::chrono::milliseconds(static_cast<long long>(grace * 1000));
    o.exit_grace = std::chrono::milliseconds(static_cast<long long>(exit_grace * 1000));
    o.keep_going = on_failure == "continue" || on_failure == "heal";
    o.heal = on_failure == "heal";
    if (o.heal && o.max_restarts < 1)
      throw kft::config_error("--max-restarts", std::to_string(o.max_restarts),
                              "is how many replacements --on-failure heal may start: give it 1 or more");
    if (o.keep_going && o.elastic)
      throw kft::config_error("--on-failure", on_failure,
                              "keeps the survivors of a fixed-size job (--nnodes=" + nnodes +
                                  " is elastic: a lost worker re-forms the round)");
    if (!log_dir.empty()) o.log_dir = log_dir;
    o.cpusets = plan_bindings(bind, o.nproc_per_node);
    if (const char* t = std::getenv("KFT_RDZV_TOKEN"); t != nullptr && *t != '\0') {
      o.token = t;
    } else if (o.nnodes == 1) {
      o.token = kft::random_token();
    } else {
      throw kft::config_error("KFT_RDZV_TOKEN", "",
                              "is not set: with --nnodes > 1 every agent must present the same secret to the store; "
                              "set KFT_RDZV_TOKEN to one random value on all nodes (kft-manifest does)");
    }
  } catch (const kft::config_error& e) {
    kft::log::error("kftrun", e.detail());  // names the flag or variable and its value
    return exit_code::usage;
  }
  return o;
}

}  // namespace kftrun
