// SPDX-License-Identifier: Apache-2.0
// `kftrun status`: a running job's live status from its store (status.hpp), for a job across
// nodes whose store address and KFT_RDZV_TOKEN you know (a job on one node: kill -USR1 its
// kftrun instead; it prints the same).
//
//   KFT_RDZV_TOKEN=... kftrun status --master-addr 10.0.0.1 --master-port 29500 --run-id job7
//
// Prints one JSON object: every rank's state, step, newest collective and its age. Exit status:
// 0 when every node answered, 1 when some did not (listed in "nodes_missing"), 2 for bad input
// (a flag, no token), 3 when the store could not be reached or refused the token.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/rendezvous/tcp_store.hpp>

#include "../common/cli.hpp"
#include "status.hpp"

namespace kftrun {

inline int status_command(int argc, const char* const* argv) {
  using namespace std::chrono_literals;
  CLI::App app{"kftrun status: every rank's step, newest collective and its age, from a running job's store"};
  kft_tools::common_flags common;
  common.add_to(app, "kftrun");
  std::string addr = "127.0.0.1", run_id = "none";
  int port = 29500;
  double wait_s = 5;
  app.add_option("--master-addr,--master_addr", addr, "where the job's store listens (node 0)")
      ->envname("PET_MASTER_ADDR")->capture_default_str();
  app.add_option("--master-port,--master_port", port, "the store's port")
      ->envname("PET_MASTER_PORT")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", run_id, "the job's id")->envname("PET_RUN_ID")->capture_default_str();
  app.add_option("--wait", wait_s, "seconds to wait for every node's answer")->check(CLI::Range(0.1, 600.0))->capture_default_str();
  if (const auto s = kft_tools::parse(app, "kftrun", argc, argv)) return *s;
  try {
    common.apply();
  } catch (const kft::config_error& e) {
    kft::log::error("kftrun", e.detail());
    return kft_tools::usage_status;
  }
  const char* token = std::getenv("KFT_RDZV_TOKEN");
  if (token == nullptr || *token == '\0') {
    kft::log::error("kftrun", "KFT_RDZV_TOKEN is not set: the job's store admits only clients with its token "
                              "(a job on one node makes its own: kill -USR1 <its kftrun> prints the status instead)");
    return kft_tools::usage_status;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    kft::rendezvous::tcp_store::options so;
    so.host = addr;
    so.port = port;
    so.token = token;
    so.connect_timeout = std::chrono::milliseconds(static_cast<long long>(wait_s * 1000));
    so.io_timeout = so.connect_timeout;
    so.name = "kftrun status";
    auto client = std::make_shared<kft::rendezvous::tcp_store>(so);
    kft::rendezvous::prefix_store store(client, "kftrun/" + run_id + "/");
    // The job's agents: each keeps a heartbeat counter, hb/<node>.
    std::vector<int> nodes;
    for (const auto& k : store.keys("hb/")) {
      const auto tail = k.substr(k.rfind('/') + 1);
      if (!tail.empty() && tail.find_first_not_of("0123456789") == std::string::npos) nodes.push_back(std::stoi(tail));
    }
    if (nodes.empty()) {
      kft::log::error("kftrun", "no agent of run \"" + run_id + "\" in the store at " + addr + ":" + std::to_string(port) +
                                    " (is --run-id the job's?)");
      return 1;
    }
    const std::int64_t request = store.add("status/req", 1);
    std::vector<std::pair<int, status::json>> answers;
    std::vector<int> missing = nodes;
    const auto until = t0 + std::chrono::milliseconds(static_cast<long long>(wait_s * 1000));
    while (!missing.empty() && std::chrono::steady_clock::now() < until) {
      std::erase_if(missing, [&](int n) {
        auto v = store.try_get("status/" + std::to_string(request) + "/" + std::to_string(n));
        if (!v) return false;
        answers.emplace_back(n, status::json::parse(*v, nullptr, false));
        return true;
      });
      if (!missing.empty()) std::this_thread::sleep_for(20ms);
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s\n", status::merge(run_id, request, answers, missing, took).dump().c_str());
    return missing.empty() ? 0 : 1;
  } catch (const kft::config_error& e) {
    kft::log::error("kftrun", kft_tools::message_of(e, "kftrun"));
    return 3;
  } catch (const kft::error& e) {
    kft::log::error("kftrun", "the job's store at " + addr + ":" + std::to_string(port) + " could not be asked: " +
                                  kft_tools::message_of(e, "kftrun"));
    return 3;
  }
}

}  // namespace kftrun
