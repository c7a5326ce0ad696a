// SPDX-License-Identifier: Apache-2.0
// kft-info: prints what this rank discovered about the job and the host it runs on.
//
// Run it under any launcher (mpirun, srun, torchrun, kftrun, a Kubernetes pod) to see
// which discovery backend decided, what every other backend saw, and the host's cores,
// NUMA nodes, binding and GPUs. `--json` prints one line per rank for scripts.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kft/core/atomic_file.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/json.hpp>
#include <kft/kft.hpp>

#include <kft/rendezvous/connect.hpp>
#include <kft/topology/layout.hpp>

#include "../common/cli.hpp"

#if KFT_WITH_MPI
#include <kft/discovery/mpi.hpp>
#include <kft/topology/mpi.hpp>
#endif
#if KFT_WITH_HWLOC
#include <kft/topology/hwloc.hpp>
#endif
#if KFT_WITH_CUDA
#include <kft/topology/cuda.hpp>
#endif
#if KFT_WITH_NCCL
#include <kft/transport/nccl/nccl.hpp>
#endif
#if KFT_WITH_GLOO
#include <kft/group/gloo_group.hpp>
#endif

namespace {

nlohmann::json build_facts() {
  return {{"version", KFT_VERSION_STRING},
          {"abi_namespace", KFT_ABI_NAMESPACE_STRING},
          {"components", {{"mpi", bool(KFT_WITH_MPI)}, {"cuda", bool(KFT_WITH_CUDA)},
                          {"nccl", bool(KFT_WITH_NCCL)}, {"hwloc", bool(KFT_WITH_HWLOC)},
                          {"gloo", bool(KFT_WITH_GLOO)}}}};
}

// KFT_TIMEOUT and the defaults derived from it (docs/reliability.md).
nlohmann::json timeout_facts(const kft::environment& env) {
  try {
    const auto t = kft::timeouts(env);
    auto s = [](std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; };
    return {{"job_s", s(t.job)}, {"store_request_s", s(t.store_request)}, {"heartbeat_s", s(t.heartbeat)},
            {"report_grace_s", s(t.report_grace)}, {"teardown_s", s(t.teardown)},
            {"source", env.has("KFT_TIMEOUT") ? "KFT_TIMEOUT" : "default"}};
  } catch (const kft::error& e) {
    return {{"error", e.what()}};
  }
}

nlohmann::json host_facts() {
  nlohmann::json j;
#if KFT_WITH_HWLOC
  try {
    auto f = kft::topology::query_host();
    j["hwloc"] = {{"api_version", f.hwloc_api_version}, {"packages", f.packages}, {"numa_nodes", f.numa_nodes},
                  {"cores", f.cores}, {"pus", f.pus}, {"bound_cpuset", f.bound_cpuset},
                  {"bound_pus", f.bound_pus}, {"bound_numa_nodes", f.bound_numa_nodes}};
  } catch (const kft::error& e) {
    j["hwloc"] = {{"error", e.what()}};
  }
#else
  j["hwloc"] = {{"error", "kft built without hwloc (KFT_WITH_HWLOC=OFF)"}};
#endif
#if KFT_WITH_CUDA
  auto inv = kft::topology::query_cuda_devices();
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : inv.devices)
    devs.push_back({{"index", d.index}, {"name", d.name}, {"memory_bytes", d.memory_bytes},
                    {"compute_capability", std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)},
                    {"pci_bus_id", d.pci_bus_id}});
  j["cuda"] = {{"runtime_version", inv.runtime_version}, {"driver_version", inv.driver_version},
               {"status", inv.status}, {"devices", devs}};
  if (inv.devices.size() > 1) {
    try {
      const auto pm = kft::topology::query_peer_matrix();
      j["cuda"]["peer_access"] = pm.access;
      j["cuda"]["peer_performance_rank"] = pm.rank;
    } catch (const kft::error& e) {
      j["cuda"]["peer_access"] = {{"error", e.what()}};
    }
  }
#else
  j["cuda"] = {{"status", "kft built without CUDA (KFT_WITH_CUDA=OFF)"}, {"devices", nlohmann::json::array()}};
#endif
#if KFT_WITH_NCCL
  try {
    j["nccl"] = {{"version", kft::nccl::version()}};
  } catch (const kft::error& e) {
    j["nccl"] = {{"error", e.what()}};
  }
#endif
  return j;
}

// Which ranks share this node, by host identity: exchanged over MPI when MPI is up, through
// the job's store under kftrun or torchrun; otherwise only this rank's identity is known. The
// store exchange needs every rank to run kft-info, so it waits `store_timeout` at most (a
// kft-info started on rank 0 alone must not hang for the store's default minute).
nlohmann::json topology_facts(const kft::world_info& w, const kft::environment& env, [[maybe_unused]] bool use_mpi,
                              const std::string& mode, std::chrono::milliseconds store_timeout) {
  nlohmann::json j;
  try {
    const std::string host = kft::topology::host_id(env);
    j["host_id"] = host;
    std::optional<kft::topology::layout> lay;
    if (mode == "off") {
      j["error"] = "not exchanged (--topology=off)";
      return j;
    }
    if (w.world_size == 1) {
      lay.emplace(0, std::vector<std::string>{host});
      j["via"] = "single process";
    }
#if KFT_WITH_MPI
    if (!lay && use_mpi) {
      lay = kft::topology::exchange(MPI_COMM_WORLD, host);
      j["via"] = "MPI_Allgather";
    }
#endif
    // A launcher store: kftrun's, or the one torchrun's rendezvous implies.
    const bool has_store = env.has("KFT_STORE_ADDR") || (env.has("TORCHELASTIC_RUN_ID") && w.master_addr && w.master_port);
    if (!lay && has_store) {
      auto store = kft::rendezvous::connect_store(w, env, store_timeout);
      store.drain_timeout = store_timeout;
      j["via"] = kft::rendezvous::store_kind(env);
      lay = kft::topology::exchange(*store.client, w.rank, w.world_size, host, store_timeout);
    }
    if (!lay) {
      j["error"] = "ranks not grouped: run under MPI, kftrun or torchrun to exchange host identities";
      return j;
    }
    j["layout"] = lay->describe();
    j["nodes"] = lay->nodes();
    j["node"] = lay->node();
    j["local_rank"] = lay->local_rank();
    j["local_size"] = lay->local_size();
    j["uniform"] = lay->uniform();
    j["node_members"] = lay->local_members();
    j["rail"] = lay->rail(lay->local_rank());
  } catch (const kft::error& e) {
    j["error"] = e.what();
  }
  return j;
}

// The interface Gloo's connections would use between nodes (KFT_SOCKET_IFNAME, else the route
// towards the store's host), as the process group chooses it.
nlohmann::json gloo_facts(const kft::world_info& w, const kft::environment& env) {
#if KFT_WITH_GLOO
  try {
    const auto nic = kft::group::gloo_interface(w, env);
    return {{"interface", nic.name}, {"address", nic.address}, {"why", nic.why}};
  } catch (const kft::error& e) {
    return {{"error", e.what()}};
  }
#else
  (void)w;
  (void)env;
  return {{"error", "kft built without Gloo (KFT_WITH_GLOO=OFF)"}};
#endif
}

void print_text(const kft::discovery_report& r, const nlohmann::json& host, const nlohmann::json& build) {
  std::cout << kft::to_string(r.world);
  std::cout << "backends (precedence order):\n";
  for (const auto& o : r.outcomes) {
    std::string what;
    switch (o.status) {
      case kft::backend_outcome::state::not_applicable: what = "-"; break;
      case kft::backend_outcome::state::decided:
        what = "rank " + std::to_string(o.info->rank) + " of " + std::to_string(o.info->world_size);
        break;
      case kft::backend_outcome::state::failed: what = "error: " + o.error; break;
    }
    std::printf("  %-11s %-52s %s\n", o.backend.c_str(), o.source.c_str(), what.c_str());
  }
  std::fflush(stdout);
  const auto& t = host["topology"];
  if (t.contains("error")) {
    std::cout << "topology:     " << t["error"].get<std::string>() << "\n";
  } else {
    auto list = [](const nlohmann::json& a) {
      std::string s;
      for (const auto& v : a) s += (s.empty() ? "" : ",") + std::to_string(v.get<int>());
      return s;
    };
    std::cout << "topology:     " << t["layout"].get<std::string>() << " (via " << t["via"].get<std::string>()
              << "); this is node " << t["node"] << ", local rank " << t["local_rank"] << " of " << t["local_size"]
              << ", node ranks " << list(t["node_members"]) << ", rail " << list(t["rail"]) << "\n";
  }
  std::cout << "host id:      " << t.value("host_id", std::string("?")) << "\n";
  if (host["hwloc"].contains("error")) {
    std::cout << "host:         " << host["hwloc"]["error"].get<std::string>() << "\n";
  } else {
    const auto& h = host["hwloc"];
    std::cout << "host:         " << h["packages"] << " package(s), " << h["numa_nodes"] << " NUMA node(s), "
              << h["cores"] << " core(s), " << h["pus"] << " PU(s) (hwloc API " << h["api_version"].get<std::string>() << ")\n";
    std::cout << "bound to:     PUs " << h["bound_cpuset"].get<std::string>() << " (" << h["bound_pus"] << " PU(s), "
              << h["bound_numa_nodes"] << " NUMA node(s))\n";
  }
  const auto& c = host["cuda"];
  if (c["devices"].empty()) {
    std::cout << "cuda:         none (" << c["status"].get<std::string>() << ")\n";
  } else {
    for (const auto& d : c["devices"])
      std::cout << "cuda:         " << d["index"] << ": " << d["name"].get<std::string>() << ", "
                << d["memory_bytes"].get<std::size_t>() / (1u << 20) << " MiB, sm_" << d["compute_capability"].get<std::string>()
                << ", " << d["pci_bus_id"].get<std::string>() << "\n";
  }
  if (c.contains("peer_access") && c["peer_access"].is_array()) {
    std::cout << "peer access:  (1 = direct access; rows: from device, columns: to device)\n";
    for (const auto& row : c["peer_access"]) {
      std::string line;
      for (const auto& v : row) line += " " + std::to_string(v.get<int>());
      std::cout << "             " << line << "\n";
    }
  }
  const auto& g = host["gloo"];
  if (g.contains("error"))
    std::cout << "gloo:         " << g["error"].get<std::string>() << "\n";
  else
    std::cout << "gloo:         between nodes over " << g["interface"].get<std::string>() << " "
              << g["address"].get<std::string>() << " (" << g["why"].get<std::string>() << ")\n";
  if (host.contains("nccl"))
    std::cout << "nccl:         " << host["nccl"].value("version", host["nccl"].value("error", "")) << "\n";
  const auto& to = build["timeout"];
  if (to.contains("error")) {
    std::cout << "timeout:      " << to["error"].get<std::string>() << "\n";
  } else {
    auto d = [](const nlohmann::json& v) { return kft::detail::describe_duration(std::chrono::milliseconds(static_cast<long long>(v.get<double>() * 1000))); };
    std::cout << "timeout:      " << d(to["job_s"]) << " ("
              << (to["source"] == "default" ? "the default; set KFT_TIMEOUT or kftrun --timeout" : "KFT_TIMEOUT")
              << "): store requests " << d(to["store_request_s"]) << ", heartbeats " << d(to["heartbeat_s"])
              << ", failure reports " << d(to["report_grace_s"]) << ", teardown " << d(to["teardown_s"]) << "\n";
  }
  std::cout << "kft:          " << build["version"].get<std::string>() << " (" << build["abi_namespace"].get<std::string>() << ")\n";
}

// "%r" -> the rank, "%%" -> "%"; any other "%" is kept as it is.
std::string expand_rank(const std::string& pattern, int rank) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && (pattern[i + 1] == 'r' || pattern[i + 1] == '%')) {
      out += pattern[i + 1] == 'r' ? std::to_string(rank) : "%";
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft-info: what this rank discovered about the job and its host"};
  kft_tools::common_flags common;
  common.add_to(app, "kft-info");
  bool json = false, pretty = false;
  std::string mpi_mode = "auto", topology_mode = "auto";
  double topology_timeout = 5;
  app.add_flag("--json", json, "print one JSON object on one line (for scripts)");
  app.add_flag("--pretty", pretty, "with --json, indent the output");
  std::string output;
  app.add_option("--output,-o", output,
                 "write the JSON (implies --json) to this file instead of standard output, all or nothing; "
                 "%r becomes the rank (-o kft-info-%r.json): a launcher that relays output through a terminal "
                 "(mpirun) or in pieces (srun) may interleave long lines of several ranks")
      ->type_name("PATH");
  app.add_option("--mpi", mpi_mode,
                 "initialise MPI and ask MPI_COMM_WORLD: auto = when an MPI launcher's variables are present "
                 "and no torchrun/kftrun worker variables")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--topology", topology_mode,
                 "group ranks by host: auto = over MPI, or through the job's store under kftrun/torchrun (every "
                 "rank must then run kft-info); off = do not")
      ->check(CLI::IsMember({"auto", "off"}));
  app.add_option("--topology-timeout", topology_timeout,
                 "seconds to wait for the other ranks' host identities through the store")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  if (const auto status = kft_tools::parse(app, "kft-info", argc, argv)) return *status;
  try {
    common.apply();
  } catch (const kft::config_error& e) {
    kft::log::error("kft-info", kft_tools::message_of(e, "kft-info"));
    return kft_tools::usage_status;
  }

  const auto env = kft::environment::process();
#if KFT_WITH_MPI
  // A torchrun/kftrun worker inherits its agent's PMIx/PMI variables (srun --mpi=pmix torchrun
  // ...): initialising MPI there would make every worker claim the agent's MPI rank.
  const bool mpi_launched = (env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMIX_RANK") || env.has("PMI_SIZE")) &&
                            !env.has("TORCHELASTIC_RUN_ID");
  const bool use_mpi = mpi_mode == "on" || (mpi_mode == "auto" && mpi_launched);
  if (use_mpi) MPI_Init(&argc, &argv);
#else
  if (mpi_mode == "on") {
    kft::log::error("kft-info", "--mpi=\"on\": kft was built without MPI (KFT_WITH_MPI=OFF)");
    return kft_tools::usage_status;
  }
#endif

  const auto store_wait = std::chrono::milliseconds(static_cast<long long>(topology_timeout * 1000));
  int status = 0;
  try {
#if KFT_WITH_MPI
    auto report = use_mpi ? kft::discover_report(env, kft::discovery::mpi_precedence{}) : kft::discover_report(env);
#else
    auto report = kft::discover_report(env);
#endif
    auto host = host_facts();
    host["gloo"] = gloo_facts(report.world, env);
#if KFT_WITH_MPI
    host["topology"] = topology_facts(report.world, env, use_mpi, topology_mode, store_wait);
#else
    host["topology"] = topology_facts(report.world, env, false, topology_mode, store_wait);
#endif
    auto build = build_facts();
    build["timeout"] = timeout_facts(env);
    if (json || !output.empty()) {
      nlohmann::json j = report;
      j["host"] = host;
      j["kft"] = build;
      // One write() per rank: lines of several ranks sharing a pipe do not interleave (up to
      // PIPE_BUF = 4 KiB); a terminal (mpirun's relay) splits writes in 2 KiB pieces: --output.
      const std::string line = j.dump(pretty ? 2 : -1) + "\n";
      if (!output.empty()) {
        kft::write_file_atomically(expand_rank(output, report.world.rank), line, "kft-info --output");
      } else {
        std::fflush(stdout);
        for (std::size_t done = 0; done < line.size();) {
          const ssize_t n = ::write(STDOUT_FILENO, line.data() + done, line.size() - done);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0)
            throw kft::transport_error("writing to standard output failed", kft::error_site::of("kft-info"), errno);
          done += static_cast<std::size_t>(n);
        }
      }
    } else {
      print_text(report, host, build);
    }
  } catch (const kft::config_error& e) {
    kft::log::error("kft-info", kft_tools::message_of(e, "kft-info"));  // one write: ranks share the pipe
    status = kft_tools::usage_status;
  } catch (const kft::error& e) {
    kft::log::error("kft-info", kft_tools::message_of(e, "kft-info"));
    status = 1;
  }
#if KFT_WITH_MPI
  if (use_mpi) MPI_Finalize();
#endif
  return status;
}
