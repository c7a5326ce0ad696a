// SPDX-License-Identifier: Apache-2.0
// kftrun: start a kft (or torch-style) program on every node, torchrun's way, for C++ binaries.
//
//   kftrun --nproc-per-node 4 -- ./train --epochs 3
//   kftrun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --nproc-per-node 8 -- ./train
//   kill -USR1 <kftrun's pid>      # the job's live status: every rank's step and newest collective
//   kftrun status --master-addr 10.0.0.1 --run-id job7     # the same from the store, across nodes
//
// Every flag also reads its PET_* environment form (PET_NNODES, PET_NPROC_PER_NODE, ...), so a
// Kubeflow TrainJob pod running the stock torch runtime can run `kftrun -- program` unchanged.
// See docs/launching.md for the environment each worker gets and the failure semantics; the exit
// statuses are the failure classes of exit_codes.hpp.
#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <variant>

#include "cli.hpp"
#include "status_command.hpp"

namespace {

void on_signal(int sig) {
  int expected = 0;
  kftrun::g_signal.compare_exchange_strong(expected, sig);
}

void on_status_signal(int) { kftrun::g_status.store(true); }

}  // namespace

int main(int argc, char** argv) {
  // `kftrun status ...`: a running job's live status from its store (status_command.hpp).
  if (argc > 1 && std::string_view(argv[1]) == "status") return kftrun::status_command(argc - 1, argv + 1);
  auto parsed = kftrun::parse_command_line(argc, argv);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  auto o = std::get<kftrun::options>(std::move(parsed));
  const int node = o.node_rank;

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_status_signal;  // kill -USR1: print the job's live status (status.hpp)
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned grandchildren come back to us to be reaped

  try {
    return kftrun::agent(std::move(o)).run();
  } catch (const kft::config_error& e) {
    kft::log::error("kftrun[node " + std::to_string(node) + "]", kft_tools::message_of(e, "kftrun"));
    return kftrun::exit_code::usage;
  } catch (const kft::error& e) {  // e.g. the store's port is taken, fork failed
    kft::log::error("kftrun[node " + std::to_string(node) + "]", kft_tools::message_of(e, "kftrun"));
    return dynamic_cast<const kft::timeout_error*>(&e) != nullptr ? kftrun::exit_code::hang
                                                                  : kftrun::exit_code::worker_failed;
  }
}
