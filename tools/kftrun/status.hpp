// SPDX-License-Identifier: Apache-2.0
// kftrun's live status (issue 47 item 6): every rank's step, newest collective and its age, as
// JSON, on request: `kill -USR1 <kftrun>` (the agent prints the job's status on its standard
// output, one line) or `kftrun status` against the job's store (across nodes).
//
// Each agent asks its own workers: a kft program started by kftrun (KFT_STATUS_NAME set) answers
// on the abstract Unix socket @<name>/rank<R> with one JSON line (kft/core/live_status.hpp). All of a
// node's workers are asked at once and read with poll(), so a node of 256 ranks answers in
// tens of milliseconds; a stopped worker cannot answer and is shown as stopped. Across nodes, a
// request is a counter in the store ("status/req"): every agent looks at it with its heartbeat
// and answers under status/<n>/<node>; the asker gathers the answers.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kft/core/live_status.hpp>

#include "workers.hpp"

namespace kftrun::status {

using json = nlohmann::json;
using clock = std::chrono::steady_clock;

/// Seconds since the newest call started (still inside it) or ended (idle since): the "age".
inline double age_of(const json& call, std::int64_t now_ns) {
  const std::int64_t end = call.value("end_ns", std::int64_t{0}), start = call.value("start_ns", std::int64_t{0});
  const std::int64_t since = end > 0 ? end : start;
  return since > 0 && now_ns > since ? static_cast<double>(now_ns - since) / 1e9 : 0.0;
}

/// Asks each live worker of `workers` for its status over its socket (`name`), all at once,
/// until every one has answered or `wait` has passed. One JSON object per worker, by rank:
/// the worker's answer plus node, host and the age of its newest call, or what kftrun knows
/// (state "stopped", "exited", or "no answer": not a kft program, or too busy).
inline json ask_workers(const std::vector<worker_group::worker_view>& workers, const std::string& name, int node,
                        const std::string& host, std::chrono::milliseconds wait) {
  struct asking {
    const worker_group::worker_view* w = nullptr;
    int fd = -1;
    std::string got;
    bool done = false;
  };
  std::vector<asking> a;
  for (const auto& w : workers) {
    asking x;
    x.w = &w;
    if (!w.exited && w.state != 'T' && w.state != 't') {
      sockaddr_un addr{};
      if (const socklen_t len = kft::trace::abstract_address(kft::trace::status_socket(name, w.rank), addr)) {
        x.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (x.fd >= 0 && ::connect(x.fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 &&
            errno != EINPROGRESS && errno != EAGAIN) {
          ::close(x.fd);
          x.fd = -1;
        }
      }
    }
    x.done = x.fd < 0;
    a.push_back(std::move(x));
  }
  const auto until = clock::now() + wait;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<asking*> of;
    for (auto& x : a)
      if (!x.done) {
        fds.push_back({x.fd, POLLIN, 0});
        of.push_back(&x);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
    if (fds.empty() || left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        of[i]->got.append(buf, static_cast<std::size_t>(n));
        if (of[i]->got.find('\n') == std::string::npos) continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        continue;
      }
      of[i]->done = true;
    }
  }
  json out = json::array();
  for (auto& x : a) {
    if (x.fd >= 0) ::close(x.fd);
    json r;
    const auto nl = x.got.find('\n');
    if (nl != std::string::npos) {
      try {
        r = json::parse(x.got.substr(0, nl));
      } catch (const json::exception&) {
        r = json::object();
      }
    }
    if (r.is_object() && r.contains("rank")) {
      r["state"] = "running";
      const std::int64_t now = r.value("now_ns", std::int64_t{0});
      double age = -1;
      for (auto& c : r["calls"]) {
        c["age_s"] = age_of(c, now);
        age = age < 0 ? c["age_s"].get<double>() : std::min(age, c["age_s"].get<double>());
      }
      r["age_s"] = age;  // (the newest call of any group: how long this rank has been at it)
    } else {
      r = json{{"rank", x.w->rank}, {"pid", x.w->pid}, {"step", -1}, {"calls", json::array()}};
      r["state"] = x.w->exited                                ? "exited"
                   : x.w->state == 'T' || x.w->state == 't' ? "stopped"
                                                              : "no answer";
    }
    r["node"] = node;
    r["local_rank"] = x.w->local_rank;
    if (!r.contains("host")) r["host"] = host;
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const json& p, const json& q) { return p["rank"] < q["rank"]; });
  return out;
}

/// The job's status from every node's answer (`answers`: node -> its array), as one object.
inline json merge(const std::string& run_id, std::int64_t request, const std::vector<std::pair<int, json>>& answers,
                  const std::vector<int>& missing, double took_s) {
  json ranks = json::array();
  for (const auto& [node, a] : answers)
    for (const auto& r : a) ranks.push_back(r);
  std::sort(ranks.begin(), ranks.end(), [](const json& p, const json& q) { return p["rank"] < q["rank"]; });
  return json{{"kftrun_status", 1}, {"run_id", run_id}, {"request", request}, {"took_s", took_s},
              {"ranks", ranks}, {"nodes_missing", missing}};
}

}  // namespace kftrun::status
