// SPDX-License-Identifier: Apache-2.0
// kftrun's exit statuses: a fixed set of failure classes, so that a rule keyed on the exit code
// (Kubernetes' podFailurePolicy, a script) can tell a preemption from a worker that failed, or
// bad input from a worker that exited 2. The worker's own status stays in kftrun's ERROR line.
// kft-manifest includes this header for the failure rules it writes, so the two cannot drift
// apart; docs/launching.md ("Failure semantics") and docs/kubernetes.md ("Failure rules") list
// the same classes.
#pragma once

#include <array>
#include <string_view>

namespace kftrun::exit_code {

/// Every worker exited 0.
inline constexpr int success = 0;
/// A worker exited non-zero or was killed by a signal other than SIGKILL (SIGSEGV, SIGABRT,
/// ...), and no restart is left; also kftrun's own failures that fit no other class (the
/// store's port is taken, fork failed).
inline constexpr int worker_failed = 1;
/// kftrun refused its input: a flag or its environment form, the job's shape, a node rank
/// already taken, no KFT_RDZV_TOKEN for a multi-node job, a token the store refused.
inline constexpr int usage = 2;
/// A local worker was killed by SIGKILL (the OOM killer, kill -9).
inline constexpr int rank_lost = 3;
/// Another node's agent is gone (its connection to the store closed: the process ended), or
/// node 0's store went away (connection closed, refused or reset).
inline constexpr int node_lost = 4;
/// A deadline passed: an agent stopped answering but is still connected (SIGSTOP, a cut
/// link), the store stopped answering, a local worker stayed stopped (state T) longer than
/// --heartbeat-timeout, or the nodes did not all join within --rdzv-timeout.
inline constexpr int hang = 5;
/// The program could not be executed.
inline constexpr int cannot_start = 127;
/// kftrun received signal n and stopped the job: 128 + n (143 for SIGTERM, i.e. a preemption
/// or an eviction; 130 SIGINT; 129 SIGHUP). The other agents, told of it, exit with the same.
inline constexpr int signalled_base = 128;
inline constexpr int signalled(int sig) { return signalled_base + sig; }
/// SIGTERM: what Kubernetes sends a pod it preempts, evicts or deletes.
inline constexpr int preempted = signalled_base + 15;

/// One class: its status and its name (as docs and kft-manifest's rules call it).
struct exit_class {
  int status;
  std::string_view name;
};

/// The classes kftrun exits with (signalled: the three signals it handles).
inline constexpr std::array<exit_class, 10> all = {{{success, "success"},
                                                    {worker_failed, "worker_failed"},
                                                    {usage, "usage"},
                                                    {rank_lost, "rank_lost"},
                                                    {node_lost, "node_lost"},
                                                    {hang, "hang"},
                                                    {cannot_start, "cannot_start"},
                                                    {signalled_base + 1, "signalled_SIGHUP"},
                                                    {signalled_base + 2, "signalled_SIGINT"},
                                                    {preempted, "signalled_SIGTERM"}}};

}  // namespace kftrun::exit_code
