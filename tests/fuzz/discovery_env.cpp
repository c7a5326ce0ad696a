// SPDX-License-Identifier: Apache-2.0
// Discovery from a fuzzed environment: every environment-only backend's detect(env), then
// kft::discover_report(env) over the default precedence, its text and its JSON form.
//
// Input: lines `NAME=value` (a line without '=' sets NAME to the empty string; lines starting
// with '#' are comments), `@host=<name>` for the hostname, and an optional line `@hostfile`
// after which the rest of the input is the MPI Operator hostfile (KFT_MPI_HOSTFILE then points
// at it; without the section it points at a file that does not exist, so the real
// /etc/mpi/hostfile is never read).
//
// Expected: a config_error (the documented failure), or a world_info that is self-consistent
// (rank < world size, local rank < local size <= world size, node rank < node count, ...).
// Anything else thrown, a crash, undefined behaviour or a huge allocation is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include <nlohmann/json.hpp>

#include <kft/discovery/discover.hpp>
#include <kft/discovery/json.hpp>

#include "fuzz_common.hpp"

namespace {

using kft_fuzz::check;

int hostfile_fd = -1;

void check_world(const kft::world_info& w, const std::string& who) {
  const std::string at = who + " (" + w.backend + ")";
  check(w.world_size >= 1, at + ": world size >= 1");
  check(w.rank >= 0 && w.rank < w.world_size, at + ": 0 <= rank < world size");
  if (w.local_size) check(*w.local_size >= 1 && *w.local_size <= w.world_size, at + ": 1 <= local size <= world size");
  if (w.local_rank) {
    check(*w.local_rank >= 0 && *w.local_rank < w.world_size, at + ": 0 <= local rank < world size");
    if (w.local_size) check(*w.local_rank < *w.local_size, at + ": local rank < local size");
  }
  if (w.node_count) check(*w.node_count >= 1 && *w.node_count <= w.world_size, at + ": 1 <= node count <= world size");
  if (w.node_rank) {
    check(*w.node_rank >= 0 && *w.node_rank < w.world_size, at + ": 0 <= node rank < world size");
    if (w.node_count) check(*w.node_rank < *w.node_count, at + ": node rank < node count");
  }
  if (w.master_port) check(*w.master_port >= 1 && *w.master_port <= 65535, at + ": 1 <= master port <= 65535");
  check(!w.backend.empty() && !w.source.empty(), at + ": backend and source named");
}

template <class B>
void run_backend(const kft::environment& env) {
  std::optional<kft::world_info> w;
  if (!kft_fuzz::expect_only<kft::config_error>(B::name.data(), [&] { w = B::detect(env); })) return;
  if (!w) return;
  check(w->backend == B::name, std::string(B::name) + ": world_info names its backend");
  check_world(*w, std::string(B::name) + "::detect");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hostfile_fd = ::memfd_create("kft-fuzz-hostfile", MFD_CLOEXEC);
  if (hostfile_fd < 0) kft_fuzz::fail("memfd_create failed");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input = kft_fuzz::text(data, size);
  kft::environment::map_type vars;
  std::string host = "localhost";
  std::optional<std::string_view> hostfile;
  std::size_t offset = 0;
  for (auto line : kft_fuzz::lines(input)) {
    offset += line.size() + 1;
    if (line == "@hostfile") {
      hostfile = input.substr(std::min(offset, input.size()));
      break;
    }
    if (line.starts_with("@host=")) {
      host = std::string(line.substr(6));
      continue;
    }
    if (line.empty() || line.front() == '#') continue;
    const auto eq = line.find('=');
    vars.insert_or_assign(std::string(line.substr(0, eq)),
                          eq == std::string_view::npos ? std::string() : std::string(line.substr(eq + 1)));
  }
  if (hostfile) {
    if (::ftruncate(hostfile_fd, 0) != 0 ||
        ::pwrite(hostfile_fd, hostfile->data(), hostfile->size(), 0) != static_cast<ssize_t>(hostfile->size()))
      kft_fuzz::fail("writing the hostfile failed");
    vars.insert_or_assign("KFT_MPI_HOSTFILE", "/proc/self/fd/" + std::to_string(hostfile_fd));
  } else {
    vars.insert_or_assign("KFT_MPI_HOSTFILE", "/nonexistent/kft-fuzz/hostfile");
  }
  const kft::environment env(std::move(vars), std::move(host));

  namespace d = kft::discovery;
  run_backend<d::torchrun_env>(env);
  run_backend<d::ompi_env>(env);
  run_backend<d::pmi_env>(env);
  run_backend<d::slurm_env>(env);
  run_backend<d::kubeflow_env>(env);
  run_backend<d::kubernetes_env>(env);
  run_backend<d::single_process>(env);

  kft::discovery_report report;
  if (!kft_fuzz::expect_only<kft::config_error>("discover_report", [&] { report = kft::discover_report(env); }))
    return 0;
  check(report.outcomes.size() == 7, "the report lists every backend");
  check_world(report.world, "discover_report");
  kft_fuzz::expect_no_throw("to_string/json", [&] {
    (void)kft::to_string(report.world);
    const nlohmann::json j = report;
    (void)j.dump();  // kft-info --json prints exactly this
  });
  return 0;
}
