// SPDX-License-Identifier: Apache-2.0
/// @file kft/discovery/discover.hpp
/// @brief `kft::discover()`: turn the launcher's environment into a world_info.
///
/// Backends are tried in a fixed precedence (docs/discovery.md explains why this order):
///
///   1. torchrun / kftrun  (`TORCHELASTIC_RUN_ID`, or `RANK` + `WORLD_SIZE`)
///   2. MPI                (`MPI_COMM_WORLD` when the MPI component is used, then
///                          `OMPI_COMM_WORLD_*`, then `PMI_RANK`/`PMI_SIZE`)
///   3. Slurm              (`SLURM_*`, only inside a job step)
///   4. Kubeflow Trainer   (`PET_*`, one process per pod)
///   5. Kubernetes         (`JOB_COMPLETION_INDEX`, JobSet hostname, `K_MPI_JOB_ROLE`)
///   6. single process     (rank 0 of 1)
///
/// The first backend that applies decides. `KFT_DISCOVERY=<name>` forces one. Every
/// backend is still evaluated, so disagreements (torchrun's `RANK=2` under an inherited
/// `SLURM_PROCID=0`) are reported as notes, and gaps in the decider's view (e.g. PMI has no
/// local rank) are filled from a lower backend that agrees on rank and world size.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <kft/core/timeout.hpp>
#include <kft/discovery/backend.hpp>
#include <kft/discovery/kubeflow.hpp>
#include <kft/discovery/kubernetes.hpp>
#include <kft/discovery/mpi_env.hpp>
#include <kft/discovery/single.hpp>
#include <kft/discovery/slurm.hpp>
#include <kft/discovery/torchrun.hpp>

KFT_NAMESPACE_BEGIN

/// @brief An ordered list of backends; the first that applies decides.
template <discovery_backend... Backends>
struct precedence {};

/// @brief The precedence used by `kft::discover()` without the MPI component.
using default_precedence =
    precedence<discovery::torchrun_env, discovery::ompi_env, discovery::pmi_env, discovery::slurm_env,
               discovery::kubeflow_env, discovery::kubernetes_env, discovery::single_process>;

/// @brief What one backend made of the environment.
struct backend_outcome {
  enum class state { not_applicable, decided, failed };
  std::string backend;  ///< e.g. "mpi"
  std::string source;   ///< e.g. "Open MPI environment (OMPI_COMM_WORLD_*)"
  state status = state::not_applicable;
  std::optional<world_info> info;  ///< when decided
  std::string error;               ///< when failed: the config_error's message
};

/// @brief The decision plus what every backend saw (kft-info prints this).
struct discovery_report {
  world_info world;
  std::vector<backend_outcome> outcomes;  ///< in precedence order
  std::optional<std::string> forced;      ///< the value of KFT_DISCOVERY, if set
};

namespace detail {

template <class B>
void run_backend(const environment& env, std::vector<backend_outcome>& out,
                 std::vector<std::exception_ptr>& errors) {
  backend_outcome o;
  o.backend = std::string(B::name);
  o.source = std::string(B::source);
  std::exception_ptr err;
  try {
    o.info = B::detect(env);
    if (o.info) o.status = backend_outcome::state::decided;
  } catch (const config_error& e) {
    o.status = backend_outcome::state::failed;
    o.error = e.what();
    err = std::current_exception();
  }
  out.push_back(std::move(o));
  errors.push_back(err);
}

inline std::string describe(const world_info& w) {
  return "rank " + std::to_string(w.rank) + " of " + std::to_string(w.world_size);
}

// Fill the decider's unknown fields from `other` when both agree on who this process is: each
// pair (local rank and size, node rank and count) only when `other` agrees with every part the
// decider knows and the completed pair is consistent (rank < size). A launcher that says
// LOCAL_RANK=1 alone is not completed by a pod's "local rank 0 of 1".
inline void fill_gaps(world_info& w, const world_info& other) {
  bool filled = false;
  auto agree = [](const std::optional<int>& a, const std::optional<int>& b) { return !a || !b || *a == *b; };
  auto fill_pair = [&](std::optional<int>& rank, std::optional<int>& size, const std::optional<int>& their_rank,
                       const std::optional<int>& their_size) {
    if (!agree(rank, their_rank) || !agree(size, their_size)) return;
    const auto r = rank ? rank : their_rank;
    const auto n = size ? size : their_size;
    if (r && n && *r >= *n) return;
    if (r != rank || n != size) filled = true;
    rank = r;
    size = n;
  };
  fill_pair(w.local_rank, w.local_size, other.local_rank, other.local_size);
  fill_pair(w.node_rank, w.node_count, other.node_rank, other.node_count);
  if (!w.node_name && other.node_name) w.node_name = other.node_name;
  if (filled) w.notes.push_back("local/node view completed from " + other.backend + " (" + other.source + ")");
}

}  // namespace detail

/// @brief Runs every backend of `P` over `env` and decides.
/// @throws config_error when the deciding backend's variables are malformed, or when
///   KFT_DISCOVERY names an unknown backend or one that does not apply.
template <discovery_backend... Bs>
discovery_report discover_report(const environment& env, precedence<Bs...>) {
  discovery_report report;
  report.forced = env.get("KFT_DISCOVERY");
  if (report.forced) {
    const bool known = ((*report.forced == Bs::name) || ...);
    if (!known) {
      std::string names;
      auto add = [&](std::string_view n) {
        if (("|" + names + "|").find("|" + std::string(n) + "|") == std::string::npos)
          names += (names.empty() ? "" : "|") + std::string(n);
      };
      (add(Bs::name), ...);
      throw config_error("KFT_DISCOVERY", *report.forced, "is not a discovery backend; expected one of " + names);
    }
  }
  std::vector<std::exception_ptr> errors;
  (detail::run_backend<Bs>(env, report.outcomes, errors), ...);

  std::size_t chosen = report.outcomes.size();
  for (std::size_t i = 0; i < report.outcomes.size(); ++i) {
    const auto& o = report.outcomes[i];
    if (report.forced && o.backend != *report.forced) continue;
    if (o.status != backend_outcome::state::not_applicable) {
      chosen = i;
      break;
    }
  }
  if (chosen == report.outcomes.size())
    throw config_error("KFT_DISCOVERY", *report.forced,
                       "forces the \"" + *report.forced + "\" backend, but none of its variables are set");
  if (report.outcomes[chosen].status == backend_outcome::state::failed) std::rethrow_exception(errors[chosen]);

  world_info w = *report.outcomes[chosen].info;
  if (report.forced) w.notes.push_back("forced by KFT_DISCOVERY=" + *report.forced);
  for (std::size_t i = 0; i < report.outcomes.size(); ++i) {
    const auto& o = report.outcomes[i];
    if (i == chosen || o.backend == "single") continue;
    if (o.status == backend_outcome::state::failed) {
      w.notes.push_back("ignored " + o.backend + ": " + o.error);
    } else if (o.status == backend_outcome::state::decided) {
      const auto& other = *o.info;
      if (other.rank != w.rank || other.world_size != w.world_size)
        w.notes.push_back(o.backend + " (" + o.source + ") says " + detail::describe(other) + ", " +
                          w.backend + " says " + detail::describe(w) + ": " + w.backend +
                          (i > chosen ? " takes precedence" : " was forced"));
      else if (i > chosen)
        detail::fill_gaps(w, other);
    }
  }
  report.world = std::move(w);
  return report;
}

/// @brief `discover_report` with the default precedence.
inline discovery_report discover_report(const environment& env = environment::process()) {
  return discover_report(env, default_precedence{});
}

/// @brief This process's place in the job, from the environment.
/// @throws config_error naming the variable and value when the environment is malformed
/// (KFT_TIMEOUT included: every program meets it here, before the group makers apply it).
template <class P = default_precedence>
world_info discover(const environment& env = environment::process(), P p = {}) {
  (void)job_timeout(env);
  return discover_report(env, p).world;
}

KFT_NAMESPACE_END
