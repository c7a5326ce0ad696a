// SPDX-License-Identifier: Apache-2.0
// Every discovery backend against fixed environments: the good cases, each malformed case,
// the precedence between backends and the traps from docs/discovery.md.
#define BOOST_TEST_MODULE kft_discovery
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <kft/discovery/json.hpp>
#include <kft/kft.hpp>

namespace {

using vars = kft::environment::map_type;

kft::environment env(vars v, std::string host = "host-a") { return kft::environment(std::move(v), std::move(host)); }

bool has_note(const kft::world_info& w, const std::string& fragment) {
  for (const auto& n : w.notes)
    if (n.find(fragment) != std::string::npos) return true;
  return false;
}

// Asserts that discovery fails with a config_error naming `variable` and containing `fragment`.
void expect_config_error(const kft::environment& e, const std::string& variable, const std::string& fragment = "") {
  try {
    auto w = kft::discover(e);
    BOOST_ERROR("expected a config_error about " << variable << ", got rank " << w.rank << " of " << w.world_size
                                                  << " from " << w.backend);
  } catch (const kft::config_error& err) {
    BOOST_TEST_INFO("message: " << err.what());
    BOOST_TEST(err.variable() == variable);
    BOOST_TEST(std::string(err.what()).find(fragment) != std::string::npos);
    BOOST_TEST(std::string(err.what()).rfind("kft: discover", 0) == 0);
  }
}

const vars torchrun_worker{{"RANK", "5"},          {"WORLD_SIZE", "8"},   {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"},
                           {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
                           {"TORCHELASTIC_RUN_ID", "job42"}};

vars with(vars base, const vars& extra) {
  for (const auto& [k, v] : extra) base.insert_or_assign(k, v);
  return base;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(single_process)

BOOST_AUTO_TEST_CASE(empty_environment_is_rank_0_of_1) {
  auto w = kft::discover(env({}));
  BOOST_TEST(w.backend == "single");
  BOOST_TEST(w.rank == 0);
  BOOST_TEST(w.world_size == 1);
  BOOST_TEST(*w.local_size == 1);
  BOOST_TEST(*w.node_count == 1);
  BOOST_TEST(w.hostname == "host-a");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(torchrun)

BOOST_AUTO_TEST_CASE(full_worker_environment) {
  auto w = kft::discover(env(torchrun_worker));
  BOOST_TEST(w.backend == "torchrun");
  BOOST_TEST(w.rank == 5);
  BOOST_TEST(w.world_size == 8);
  BOOST_TEST(*w.local_rank == 1);
  BOOST_TEST(*w.local_size == 4);
  BOOST_TEST(*w.node_rank == 1);
  BOOST_TEST(*w.node_count == 2);
  BOOST_TEST(*w.master_addr == "10.0.0.1");
  BOOST_TEST(*w.master_port == 29500);
}

BOOST_AUTO_TEST_CASE(plain_env_contract_without_marker) {
  auto w = kft::discover(env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  BOOST_TEST(w.backend == "torchrun");
  BOOST_TEST(w.rank == 1);
  BOOST_TEST(!w.local_rank.has_value());
  BOOST_TEST(has_note(w, "LOCAL_RANK not set"));
}

BOOST_AUTO_TEST_CASE(stray_rank_alone_is_not_a_launcher) {
  auto w = kft::discover(env({{"RANK", "3"}}));
  BOOST_TEST(w.backend == "single");
}

BOOST_AUTO_TEST_CASE(malformed) {
  expect_config_error(env(with(torchrun_worker, {{"RANK", "abc"}})), "RANK", "not an integer");
  expect_config_error(env(with(torchrun_worker, {{"RANK", "-2"}})), "RANK", "negative");
  expect_config_error(env(with(torchrun_worker, {{"RANK", "8"}})), "RANK", "WORLD_SIZE=8");
  expect_config_error(env(with(torchrun_worker, {{"WORLD_SIZE", "0"}})), "WORLD_SIZE", "minimum 1");
  expect_config_error(env(with(torchrun_worker, {{"WORLD_SIZE", "4294967296"}})), "WORLD_SIZE", "");
  expect_config_error(env(with(torchrun_worker, {{"LOCAL_RANK", "4"}})), "LOCAL_RANK", "LOCAL_WORLD_SIZE=4");
  expect_config_error(env(with(torchrun_worker, {{"LOCAL_WORLD_SIZE", "9"}})), "LOCAL_WORLD_SIZE", "exceeds WORLD_SIZE");
  expect_config_error(env(with(torchrun_worker, {{"GROUP_RANK", "2"}})), "GROUP_RANK", "GROUP_WORLD_SIZE=2");
  expect_config_error(env(with(torchrun_worker, {{"MASTER_PORT", "70000"}})), "MASTER_PORT", "maximum 65535");
  expect_config_error(env({{"TORCHELASTIC_RUN_ID", "x"}, {"WORLD_SIZE", "2"}}), "RANK", "not set");
  expect_config_error(env({{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"LOCAL_WORLD_SIZE", "3"}, {"GROUP_WORLD_SIZE", "2"}}),
                      "GROUP_WORLD_SIZE", "one node");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(mpi_environment)

const vars ompi_one_node{{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "3"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                         {"OMPI_COMM_WORLD_NODE_RANK", "2"},  {"OMPI_MCA_orte_num_nodes", "1"}};

BOOST_AUTO_TEST_CASE(open_mpi_single_node_ignores_node_rank_trap) {
  auto w = kft::discover(env(ompi_one_node));
  BOOST_TEST(w.backend == "mpi");
  BOOST_TEST(w.rank == 2);
  BOOST_TEST(w.world_size == 3);
  BOOST_TEST(*w.local_rank == 2);
  BOOST_TEST(*w.node_rank == 0);  // not OMPI_COMM_WORLD_NODE_RANK=2
  BOOST_TEST(*w.node_count == 1);
}

BOOST_AUTO_TEST_CASE(open_mpi_two_nodes_has_no_node_index) {
  auto w = kft::discover(env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                              {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"OMPI_MCA_orte_num_nodes", "2"}}));
  BOOST_TEST(*w.node_count == 2);
  BOOST_TEST(!w.node_rank.has_value());
  BOOST_TEST(has_note(w, "node index unknown"));
}

BOOST_AUTO_TEST_CASE(open_mpi_malformed) {
  expect_config_error(env(with(ompi_one_node, {{"OMPI_COMM_WORLD_RANK", "3"}})), "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE=3");
  expect_config_error(env({{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE", "not set");
  expect_config_error(env(with(ompi_one_node, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "x"}})), "OMPI_COMM_WORLD_LOCAL_SIZE");
  expect_config_error(env(with(ompi_one_node, {{"OMPI_MCA_orte_num_nodes", "2"}})), "OMPI_MCA_orte_num_nodes",
                      "one node");
}

BOOST_AUTO_TEST_CASE(pmi) {
  auto w = kft::discover(env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  BOOST_TEST(w.backend == "mpi");
  BOOST_TEST(w.source.find("PMI") != std::string::npos);
  BOOST_TEST(w.rank == 1);
  BOOST_TEST(!w.local_rank.has_value());
  expect_config_error(env({{"PMI_RANK", "1"}}), "PMI_SIZE", "not set");
  expect_config_error(env({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}}), "PMI_RANK");
  // Never PMIX_RANK alone: it comes without a size.
  BOOST_TEST(kft::discover(env({{"PMIX_RANK", "3"}})).backend == "single");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(slurm)

const vars srun_step{{"SLURM_PROCID", "3"},         {"SLURM_NTASKS", "4"},
                     {"SLURM_LOCALID", "1"},        {"SLURM_NODEID", "1"},
                     {"SLURM_JOB_NUM_NODES", "2"},  {"SLURM_STEP_NODELIST", "n[1-2]"},
                     {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_ID", "12"}};

BOOST_AUTO_TEST_CASE(step_environment) {
  auto w = kft::discover(env(srun_step));
  BOOST_TEST(w.backend == "slurm");
  BOOST_TEST(w.rank == 3);
  BOOST_TEST(w.world_size == 4);
  BOOST_TEST(*w.local_rank == 1);
  BOOST_TEST(*w.local_size == 2);
  BOOST_TEST(*w.node_rank == 1);
  BOOST_TEST(*w.node_count == 2);
  BOOST_TEST(*w.node_name == "n2");
  BOOST_TEST(*w.master_addr == "n1");
}

// A plain srun step (no MPI) meets through rank 0's store: every task derives the same port
// from the job and step ids; MASTER_ADDR/MASTER_PORT from the batch script win.
BOOST_AUTO_TEST_CASE(the_rendezvous_comes_from_the_step_or_the_batch_script) {
  auto w = kft::discover(env(srun_step));
  BOOST_TEST(*w.master_port == 29500 + (12 * 16 + 0) % 2000);
  BOOST_TEST(*kft::discover(env(with(srun_step, {{"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"},
                                                 {"SLURM_LOCALID", "0"}}))).master_port == *w.master_port);
  BOOST_TEST(*kft::discover(env(with(srun_step, {{"SLURM_STEP_ID", "1"}}))).master_port != *w.master_port);
  auto set = kft::discover(env(with(srun_step, {{"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "41000"}})));
  BOOST_TEST(*set.master_addr == "10.0.0.7");
  BOOST_TEST(*set.master_port == 41000);
  BOOST_CHECK_THROW(kft::discover(env(with(srun_step, {{"MASTER_PORT", "http"}}))), kft::config_error);
}

BOOST_AUTO_TEST_CASE(uneven_tasks_per_node) {
  auto w = kft::discover(env(with(srun_step, {{"SLURM_NTASKS", "7"}, {"SLURM_PROCID", "6"},
                                              {"SLURM_NODEID", "2"}, {"SLURM_LOCALID", "0"},
                                              {"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_STEP_NODELIST", "gpu[07-08],cpu1"},
                                              {"SLURM_TASKS_PER_NODE", "3(x2),1"}})));
  BOOST_TEST(*w.local_size == 1);
  BOOST_TEST(*w.node_name == "cpu1");
  BOOST_TEST(*w.master_addr == "gpu07");
}

BOOST_AUTO_TEST_CASE(step_variables_win_over_job_variables) {
  // A step using 2 of the job's 3 nodes.
  auto w = kft::discover(env(with(srun_step, {{"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_NTASKS", "6"},
                                              {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"SLURM_STEP_NUM_NODES", "2"},
                                              {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}})));
  BOOST_TEST(w.world_size == 4);
  BOOST_TEST(*w.node_count == 2);
}

BOOST_AUTO_TEST_CASE(batch_shell_values_are_not_trusted) {
  // Inside sbatch (no step) every child inherits SLURM_PROCID=0: that is no rank.
  vars batch{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "12"}};
  BOOST_TEST(kft::discover(env(batch)).backend == "single");
  // ... and mpirun's ranks started from that shell are decided by Open MPI, with no conflict.
  auto w = kft::discover(env(with(batch, {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}})));
  BOOST_TEST(w.backend == "mpi");
  BOOST_TEST(w.rank == 2);
  BOOST_TEST(!has_note(w, "slurm"));
}

BOOST_AUTO_TEST_CASE(malformed) {
  expect_config_error(env(with(srun_step, {{"SLURM_STEP_NODELIST", "n[1-"}})), "SLURM_STEP_NODELIST", "unmatched");
  expect_config_error(env(with(srun_step, {{"SLURM_TASKS_PER_NODE", "2,1"}})), "SLURM_TASKS_PER_NODE",
                      "adds up to 3");
  expect_config_error(env(with(srun_step, {{"SLURM_TASKS_PER_NODE", "2(y2)"}})), "SLURM_TASKS_PER_NODE");
  expect_config_error(env(with(srun_step, {{"SLURM_NODEID", "2"}})), "SLURM_NODEID");
  expect_config_error(env(with(srun_step, {{"SLURM_JOB_NUM_NODES", "3"}})), "SLURM_JOB_NUM_NODES",
                      "names 2 node(s)");
  expect_config_error(env(with(srun_step, {{"SLURM_PROCID", "4"}})), "SLURM_PROCID", "SLURM_NTASKS=4");
  expect_config_error(env(with(srun_step, {{"SLURM_LOCALID", "2"}})), "SLURM_LOCALID");
}

// Found by tests/fuzz/discovery_env: without a node count, a node list or tasks per node, the
// node and local indices were taken unchecked (node 8 of a 7-task step).
BOOST_AUTO_TEST_CASE(indices_are_checked_against_the_step_size_when_nothing_else_bounds_them) {
  const vars bare{{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_ID", "0"}};
  auto w = kft::discover(env(with(bare, {{"SLURM_NODEID", "1"}, {"SLURM_LOCALID", "0"}})));
  BOOST_TEST(*w.node_rank == 1);
  BOOST_TEST(*w.local_rank == 0);
  expect_config_error(env(with(bare, {{"SLURM_NODEID", "2"}})), "SLURM_NODEID", "SLURM_STEP_NUM_TASKS=2");
  expect_config_error(env(with(bare, {{"SLURM_LOCALID", "5"}})), "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS=2");
}

// A step runs at least one task on each of its nodes: a 0 in the list is no local size.
BOOST_AUTO_TEST_CASE(a_node_without_tasks_is_refused) {
  expect_config_error(env(with(srun_step, {{"SLURM_TASKS_PER_NODE", "0,4"}, {"SLURM_NODEID", "0"},
                                           {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}})),
                      "SLURM_TASKS_PER_NODE", "no task");
}

BOOST_AUTO_TEST_CASE(torchrun_under_srun_disagrees_and_torchrun_wins) {
  // torchrun started by srun: its workers carry the agent's SLURM_PROCID.
  vars one_task_step{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}, {"SLURM_LOCALID", "0"},
                     {"SLURM_NODEID", "0"}, {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_TASKS_PER_NODE", "1"}};
  auto w = kft::discover(env(with(one_task_step, {{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"TORCHELASTIC_RUN_ID", "r"},
                                                  {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"}})));
  BOOST_TEST(w.backend == "torchrun");
  BOOST_TEST(w.rank == 2);
  BOOST_TEST(has_note(w, "slurm"));
  BOOST_TEST(has_note(w, "says rank 0 of 1"));
  BOOST_TEST(has_note(w, "takes precedence"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kubeflow)

const vars trainjob_pod{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "1"},
                        {"PET_MASTER_ADDR", "mnist-node-0-0.mnist"}, {"PET_MASTER_PORT", "29500"},
                        {"JOB_COMPLETION_INDEX", "1"}};

BOOST_AUTO_TEST_CASE(one_process_per_pod) {
  auto w = kft::discover(env(trainjob_pod, "mnist-node-0-1"));
  BOOST_TEST(w.backend == "kubeflow");
  BOOST_TEST(w.rank == 1);
  BOOST_TEST(w.world_size == 2);
  BOOST_TEST(*w.node_rank == 1);
  BOOST_TEST(*w.master_addr == "mnist-node-0-0.mnist");
  BOOST_TEST(*w.master_port == 29500);
}

BOOST_AUTO_TEST_CASE(several_processes_need_a_launcher) {
  expect_config_error(env(with(trainjob_pod, {{"PET_NPROC_PER_NODE", "4"}})), "PET_NPROC_PER_NODE", "kftrun");
  expect_config_error(env(with(trainjob_pod, {{"PET_NPROC_PER_NODE", "auto"}})), "PET_NPROC_PER_NODE", "kftrun");
}

BOOST_AUTO_TEST_CASE(under_kftrun_the_per_process_ranks_decide) {
  auto w = kft::discover(env(with(with(trainjob_pod, {{"PET_NPROC_PER_NODE", "2"}}),
                                  {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                   {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "j"}})));
  BOOST_TEST(w.backend == "torchrun");
  BOOST_TEST(w.rank == 3);
  BOOST_TEST(has_note(w, "ignored kubeflow"));
}

BOOST_AUTO_TEST_CASE(malformed) {
  expect_config_error(env(with(trainjob_pod, {{"PET_NODE_RANK", "2"}})), "PET_NODE_RANK", "PET_NNODES=2");
  expect_config_error(env(with(trainjob_pod, {{"PET_NNODES", "0"}})), "PET_NNODES");
  expect_config_error(env(with(trainjob_pod, {{"PET_NNODES", "1:4"}})), "PET_NNODES", "not an integer");
  expect_config_error(env(with(trainjob_pod, {{"PET_MASTER_PORT", "port"}})), "PET_MASTER_PORT");
  expect_config_error(env({{"PET_NODE_RANK", "0"}}), "PET_NNODES", "not set");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kubernetes)

BOOST_AUTO_TEST_CASE(indexed_job_in_a_jobset) {
  auto w = kft::discover(env({{"JOB_COMPLETION_INDEX", "1"}, {"KFT_NNODES", "3"}}, "train-node-0-1"));
  BOOST_TEST(w.backend == "kubernetes");
  BOOST_TEST(w.rank == 1);
  BOOST_TEST(w.world_size == 3);
  BOOST_TEST(*w.master_addr == "train-node-0-0.train");
}

BOOST_AUTO_TEST_CASE(jobset_pod_with_explicit_subdomain) {
  auto w = kft::discover(env({{"JOB_COMPLETION_INDEX", "0"}, {"KFT_NNODES", "2"}, {"KFT_SUBDOMAIN", "svc"}},
                             "big-job-workers-1-0"));
  BOOST_TEST(*w.master_addr == "big-job-workers-0-0.svc");
  auto parts = kft::discovery::kubernetes_env::parse_pod_hostname("big-job-workers-1-0");
  BOOST_TEST(*parts.index == 0);
  BOOST_TEST(*parts.job_prefix == "big-job-workers");  // <jobset>-<rjob>, without the job index
}

BOOST_AUTO_TEST_CASE(mpijob_worker_counts_the_hostfile) {
  char path[] = "/tmp/kft-hostfile-XXXXXX";
  const int fd = ::mkstemp(path);
  BOOST_REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << "pi-worker-0.pi.default.svc slots=1\npi-worker-1.pi.default.svc slots=1\n";
  auto w = kft::discover(env({{"K_MPI_JOB_ROLE", "worker"}, {"KFT_MPI_HOSTFILE", path}}, "pi-worker-1"));
  std::remove(path);
  BOOST_TEST(w.backend == "kubernetes");
  BOOST_TEST(w.rank == 1);
  BOOST_TEST(w.world_size == 2);
}

BOOST_AUTO_TEST_CASE(malformed) {
  expect_config_error(env({{"JOB_COMPLETION_INDEX", "1"}, {"KFT_MPI_HOSTFILE", "/nonexistent/kft"}}), "KFT_NNODES",
                      "number of pods is unknown");
  expect_config_error(env({{"JOB_COMPLETION_INDEX", "3"}, {"KFT_NNODES", "3"}}), "JOB_COMPLETION_INDEX");
  expect_config_error(env({{"JOB_COMPLETION_INDEX", "x"}, {"KFT_NNODES", "3"}}), "JOB_COMPLETION_INDEX");
  expect_config_error(env({{"K_MPI_JOB_ROLE", "launcher"}}), "K_MPI_JOB_ROLE", "not a rank");
  expect_config_error(env({{"K_MPI_JOB_ROLE", "boss"}}), "K_MPI_JOB_ROLE");
  expect_config_error(env({{"JOB_COMPLETION_INDEX", "0"}, {"KFT_NNODES", "2"}, {"KFT_NPROC_PER_NODE", "2"}}),
                      "KFT_NPROC_PER_NODE", "kftrun");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(precedence_and_forcing)

BOOST_AUTO_TEST_CASE(forced_backend_wins) {
  auto w = kft::discover(env(with(torchrun_worker, {{"KFT_DISCOVERY", "single"}})));
  BOOST_TEST(w.backend == "single");
  BOOST_TEST(has_note(w, "forced by KFT_DISCOVERY=single"));
  BOOST_TEST(has_note(w, "torchrun"));  // the overridden source is still reported
}

BOOST_AUTO_TEST_CASE(forcing_errors) {
  expect_config_error(env(with(torchrun_worker, {{"KFT_DISCOVERY", "pbs"}})), "KFT_DISCOVERY",
                      "torchrun|mpi|slurm|kubeflow|kubernetes|single");
  expect_config_error(env(with(torchrun_worker, {{"KFT_DISCOVERY", "slurm"}})), "KFT_DISCOVERY",
                      "none of its variables");
}

BOOST_AUTO_TEST_CASE(malformed_lower_backend_does_not_break_the_decision) {
  auto w = kft::discover(env(with(torchrun_worker, {{"SLURM_PROCID", "x"}, {"SLURM_STEP_ID", "0"}})));
  BOOST_TEST(w.rank == 5);
  BOOST_TEST(has_note(w, "ignored slurm"));
}

BOOST_AUTO_TEST_CASE(gaps_filled_from_an_agreeing_backend) {
  // srun --mpi=pmi2: PMI has no local view, the Slurm step has one and agrees on the rank.
  auto w = kft::discover(env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},
                              {"SLURM_STEP_ID", "1"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                              {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}));
  BOOST_TEST(w.backend == "mpi");
  BOOST_TEST(*w.local_rank == 1);
  BOOST_TEST(*w.local_size == 2);
  BOOST_TEST(*w.node_rank == 1);
  BOOST_TEST(has_note(w, "completed from slurm"));
}

// Found by tests/fuzz/discovery_env: torchrun's LOCAL_RANK=1 alone was completed with the pod's
// "local rank 0 of 1" into local rank 1 of 1. A pair is completed only when the other backend
// agrees with what the decider knows, and only into rank < size.
BOOST_AUTO_TEST_CASE(gaps_are_not_filled_into_an_impossible_local_view) {
  auto w = kft::discover(env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"PET_NNODES", "2"},
                              {"PET_NODE_RANK", "1"}}));
  BOOST_TEST(w.backend == "torchrun");
  BOOST_TEST(*w.local_rank == 1);
  BOOST_TEST(!w.local_size);  // still unknown: the pod's 0 of 1 contradicts LOCAL_RANK=1
  BOOST_TEST(*w.node_rank == 1);  // the node view agrees and is completed
  BOOST_TEST(*w.node_count == 2);
  // A local size that does not hold the decider's local rank is not taken either.
  auto s = kft::discover(env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"SLURM_PROCID", "3"},
                              {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "1"}, {"SLURM_NODEID", "1"},
                              {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "3,1"}}));
  BOOST_TEST(s.backend == "mpi");
  BOOST_TEST(*s.local_rank == 1);
  BOOST_TEST(!s.local_size);
}

BOOST_AUTO_TEST_CASE(report_lists_every_backend_in_order) {
  auto r = kft::discover_report(env(torchrun_worker));
  BOOST_TEST(r.outcomes.size() == 7u);
  BOOST_TEST(r.outcomes.front().backend == "torchrun");
  BOOST_TEST(r.outcomes.back().backend == "single");
  BOOST_TEST((r.outcomes.front().status == kft::backend_outcome::state::decided));
}

BOOST_AUTO_TEST_CASE(json_form_uses_null_for_unknown) {
  auto w = kft::discover(env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}));
  nlohmann::json j = w;
  BOOST_TEST(j["rank"] == 0);
  BOOST_TEST(j["world_size"] == 2);
  BOOST_TEST(j["local_rank"].is_null());
  BOOST_TEST(j["backend"] == "mpi");
  const std::string text = kft::to_string(w);
  BOOST_TEST(text.find("rank:         0 of 2") != std::string::npos);
  BOOST_TEST(text.find("local rank:   ? of ?") != std::string::npos);
}

// Found by tests/fuzz/discovery_env: a value that is not UTF-8 (echoed in a note, a hostname)
// made kft-info --json's dump() throw nlohmann's type_error 316. Such bytes become U+FFFD.
BOOST_AUTO_TEST_CASE(json_form_always_dumps) {
  auto r = kft::discover_report(env(with(torchrun_worker, {{"MASTER_ADDR", "10.0.0.\xd7" "1"}, {"SLURM_PROCID", "\xff"},
                                                           {"SLURM_STEP_ID", "0"}}),
                                    "host-\xc3"));
  nlohmann::json j = r;
  std::string text;
  BOOST_REQUIRE_NO_THROW(text = j.dump());
  const std::string bad = "\xef\xbf\xbd";  // U+FFFD
  BOOST_TEST(j["world"]["master_addr"] == "10.0.0." + bad + "1");
  BOOST_TEST(j["world"]["hostname"] == "host-" + bad);
  BOOST_TEST(text.find("ignored slurm") != std::string::npos);
  // Valid UTF-8 passes unchanged; each byte of an invalid sequence is replaced.
  const std::string good = "n\xc5\x93ud-\xce\xb1-\xf0\x9f\x9a\x80";  // nœud-α-🚀
  BOOST_TEST(kft::detail::valid_utf8(good) == good);
  BOOST_TEST(kft::detail::valid_utf8("\xc0\xaf") == bad + bad);           // overlong '/'
  BOOST_TEST(kft::detail::valid_utf8("\xed\xa0\x80") == bad + bad + bad);  // a surrogate
  BOOST_TEST(kft::detail::valid_utf8("a\xe2\x82") == "a" + bad + bad);     // cut short
  BOOST_TEST(kft::detail::valid_utf8("\xf4\x90\x80\x80") == bad + bad + bad + bad);  // above U+10FFFF
}

BOOST_AUTO_TEST_CASE(process_environment_snapshot_reads_real_variables) {
  ::setenv("KFT_TEST_PROBE", "42", 1);
  auto e = kft::environment::process();
  BOOST_TEST(*e.get("KFT_TEST_PROBE") == "42");
  BOOST_TEST(!e.hostname().empty());
}

BOOST_AUTO_TEST_SUITE_END()
