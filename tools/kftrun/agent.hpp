// SPDX-License-Identifier: Apache-2.0
// kftrun: the node agent — meet the other agents, start the local workers, watch everyone,
// stop and restart as a unit.
//
// Store layout (under "kftrun/<run-id>/"):
//   r<a>/node/<n>        "<nproc> <host>"        agent n joined round a (fixed --nnodes N)
//   r<a>/worker_port     MASTER_PORT for the workers of round a (chosen by node 0)
//   r<a>/failure         first failure of round a: "key=value" lines (compare_set: first wins)
//   r<a>/done/<n>        node n's workers all exited 0 in round a
//   r<a>/alive/<n>       "<host> <pid>", bound to agent n's connection (set_owned): the store
//                        erases it when that connection closes, so a peer tells an agent whose
//                        process is gone (node lost) from one that is silent (hang)
//   r<a>/exit/<n>        node n has seen the round end (node 0 keeps the store up until all have)
//   hb/<n>               node n's heartbeat counter (all rounds)
// Elastic jobs (--nnodes MIN:MAX; n is the agent's --node-rank, its identity, and node 0 hosts
// the store), where node 0 forms each round from whoever asked to join:
//   e/current            the round node 0 is forming or running
//   e/r<a>/join/<n>      "<nproc> <host>"        agent n asks to be in round a
//   e/r<a>/members       "<n> <n> ..."           round a's nodes, in node-rank order (node 0 decides)
//   e/r<a>/failed        why round a could not form (fewer than MIN nodes within the timeout)
//   e/finished           the job's exit status, for agents still waiting to be taken in
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <map>
#include <set>
#include <optional>
#include <sstream>
#include <thread>

#include <kft/core/log.hpp>
#include <kft/core/timeout.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/tcp_store_relay.hpp>

#include "exit_codes.hpp"
#include "status.hpp"
#include "workers.hpp"

namespace kftrun {

using namespace std::chrono_literals;
namespace rdzv = kft::rendezvous;

struct options {
  int nproc_per_node = 1;
  int nnodes = 1;     // fixed size; with `elastic`, the most nodes a round takes (MAX)
  int min_nodes = 1;  // with `elastic`: the fewest a round starts with (MIN)
  bool elastic = false;  // --nnodes MIN:MAX: rounds re-form as agents join and leave
  // --store-relay: this node's workers reach the job's store through a relay this agent runs
  // (tcp_store_server with `upstream`: one connection per node to node 0's store, requests
  // combined on the way), not each by its own connection. On for every node but node 0 (whose
  // workers share the store's machine) when the job has several nodes.
  bool store_relay = false;
  std::chrono::milliseconds last_call = 2s;  // elastic: after MIN have joined, how long node 0 waits for more
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: any free port (single node only)
  int max_restarts = 0;
  std::chrono::milliseconds job_timeout = kft::default_job_timeout;  // --timeout: the workers' KFT_TIMEOUT
  std::chrono::milliseconds rdzv_timeout = 300s;
  std::string run_id = "none";
  std::optional<std::filesystem::path> log_dir;
  bool tee = false;
  std::chrono::milliseconds monitor_interval = 100ms;
  std::chrono::milliseconds heartbeat_timeout = 5s;
  std::chrono::milliseconds term_grace = 5s;
  // After a worker failed (or a node is gone): how long the other workers may still exit by
  // themselves, printing their own errors, before they are signalled (stop_workers).
  std::chrono::milliseconds exit_grace = 1s;
  // --on-failure continue: a failed worker is logged as lost and the others go on (they may
  // shrink their group); the job succeeds when every worker left exits 0. Across nodes an agent
  // whose workers were all lost reports "0" as done, and a peer agent that is gone is logged and
  // no longer waited for (lost_nodes_).
  bool keep_going = false;
  // --on-failure heal (implies keep_going): a lost worker is replaced by a new one with the same
  // rank and KFT_JOIN set, which joins the running group at a step boundary (at most
  // max_restarts replacements in the job).
  bool heal = false;
  std::string token;
  std::vector<std::string> program;  // argv
  std::vector<std::string> cpusets;  // per local rank (--bind); empty = no binding
};

/// Set by SIGINT/SIGTERM/SIGHUP handlers.
inline std::atomic<int> g_signal{0};
/// Set by the SIGUSR1 handler: print the job's live status (status.hpp).
inline std::atomic<bool> g_status{false};

/// A parsed failure record.
struct failure {
  std::map<std::string, std::string> fields;
  std::string get(const std::string& k) const {
    auto it = fields.find(k);
    return it == fields.end() ? "" : it->second;
  }
  int code() const {  // the failure's class (exit_codes.hpp)
    const auto c = get("code");
    return c.empty() ? exit_code::worker_failed : std::stoi(c);
  }
  static failure parse(const std::string& text) {
    failure f;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      auto eq = line.find('=');
      if (eq != std::string::npos) f.fields[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return f;
  }
  static std::string make(std::initializer_list<std::pair<std::string, std::string>> kv) {
    std::string s;
    for (const auto& [k, v] : kv) s += k + "=" + v + "\n";
    return s;
  }
};

inline std::string hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  ::gethostname(name, sizeof name);
  return name;
}

/// The class of a failure to reach the store: a deadline passed (it stopped answering, or never
/// came within the rendezvous timeout), or it is gone (its connection closed, refused, reset).
inline int store_failure_class(const kft::error& e) {
  if (dynamic_cast<const kft::timeout_error*>(&e) != nullptr) return exit_code::hang;
  if (dynamic_cast<const kft::transport_error*>(&e) != nullptr)
    return e.backend_code() == ETIMEDOUT ? exit_code::hang : exit_code::node_lost;
  return exit_code::worker_failed;
}

/// The class of a worker's end: it could not be started, was killed by SIGKILL (the OOM
/// killer, kill -9), or failed otherwise.
inline int worker_failure_class(const exit_info& e, bool could_not_start) {
  if (could_not_start) return exit_code::cannot_start;
  if (e.signal == SIGKILL) return exit_code::rank_lost;
  return exit_code::worker_failed;
}

/// A free TCP port on `host` (bound and released; the workers' rank 0 binds it soon after,
/// as with torchrun). `host` is resolved until `resolve_timeout` has passed (a lookup can fail
/// for a moment while the cluster's DNS reloads).
inline int free_port(const std::string& host, std::chrono::milliseconds resolve_timeout) {
  auto fd = rdzv::detail::listen_on(host, 0, rdzv::detail::clock::now() + resolve_timeout);
  return rdzv::detail::local_port(fd.get());
}

class agent {
 public:
  explicit agent(options opt) : opt_(std::move(opt)), host_(hostname()) {}


  /// Runs the job; returns kftrun's exit status.
  int run() {
    // Where the workers answer the live status (KFT_STATUS_NAME; status.hpp): abstract sockets
    // named after this agent, so nothing is left in the file system whatever ends it.
    status_name_ = "kftrun-" + std::to_string(::getpid()) + "-" + kft::random_token().substr(0, 8);
    std::unique_ptr<rdzv::tcp_store_server> server;
    if (opt_.node_rank == 0) {
      rdzv::tcp_store_server::options serve{opt_.master_addr, opt_.master_port, opt_.token,
                                            [who = who()](const std::string& line) { kft::log::warn(who, line); }};
      serve.resolve_timeout = opt_.rdzv_timeout;  // its own name may not be in DNS yet (a pod just started)
      server = std::make_unique<rdzv::tcp_store_server>(std::move(serve));
      opt_.master_port = server->port();
      log(kft::log::level::debug, "store listening on " + opt_.master_addr + ":" + std::to_string(opt_.master_port) +
                                      " (run id \"" + opt_.run_id + "\")");
    }
    rdzv::tcp_store::options so;
    so.host = opt_.master_addr;
    so.port = opt_.master_port;
    so.token = opt_.token;
    so.connect_timeout = opt_.rdzv_timeout;
    // A store that does not answer for a heartbeat timeout is lost, as a silent agent is: the
    // agents on the far side of a cut link end their part of the job as quickly as node 0 does.
    so.io_timeout = std::max<std::chrono::milliseconds>(opt_.heartbeat_timeout, 2s);
    so.name = "kftrun agent of node " + std::to_string(opt_.node_rank) + " on " + host_;
    so.cancelled = [] { return g_signal.load() != 0; };
    std::shared_ptr<rdzv::tcp_store> client;
    try {
      client = std::make_shared<rdzv::tcp_store>(so);
    } catch (const kft::usage_error&) {
      if (const int sig = g_signal.load()) return stopped_by(sig, "while connecting to the rendezvous store");
      throw;
    } catch (const kft::config_error&) {
      throw;  // the store refused the token: kftrun exits 2
    } catch (const kft::error& e) {  // not reached within --rdzv-timeout, or no answer (hang), or gone
      log(kft::log::level::error, kft_message(e));
      return store_failure_class(e);
    }
    client_ = client;
    std::unique_ptr<rdzv::tcp_store_server> relay;
    if (opt_.store_relay && opt_.node_rank != 0) {
      rdzv::tcp_store_server::options ro{"127.0.0.1", 0, opt_.token,
                                         [who = who()](const std::string& line) { kft::log::warn(who, line); }};
      ro.upstream = rdzv::relay_to(opt_.master_addr, opt_.master_port);
      ro.upstream.connect_timeout = opt_.rdzv_timeout;
      ro.upstream.name = "kftrun relay of node " + std::to_string(opt_.node_rank) + " on " + host_;
      try {
        relay = std::make_unique<rdzv::tcp_store_server>(std::move(ro));
      } catch (const kft::config_error&) {
        throw;
      } catch (const kft::error& e) {
        log(kft::log::level::error, kft_message(e));
        return store_failure_class(e);
      }
      relay_port_ = relay->port();
      log(kft::log::level::debug, "this node's workers reach the store through a relay on 127.0.0.1:" +
                                      std::to_string(relay_port_));
    }
    prefix_ = "kftrun/" + opt_.run_id + "/";
    store_ = std::make_shared<rdzv::prefix_store>(client, prefix_);

    int failures = 0;  // rounds that ended in a failure (a membership change is not one)
    for (int attempt = opt_.elastic ? first_elastic_round() : 0;; ++attempt) {
      membership m;
      const auto sent_before = client_->requests();
      const auto waits_before = waits_;
      auto outcome = opt_.elastic ? form_elastic(attempt, m) : form_static(attempt, m);
      if (!outcome && m.member)  // what the rendezvous cost this agent: the same for any number of nodes
        log(kft::log::level::debug, "round " + std::to_string(attempt) + " formed with " + std::to_string(m.ids.size()) +
                                        " node(s): " + std::to_string(client_->requests() - sent_before - (waits_ - waits_before)) +
                                        " store requests from this agent, besides " +
                                        std::to_string(waits_ - waits_before) + " wait(s)");
      if (!outcome) {
        if (!m.member) {  // elastic: the round is full without this node; the next one may take it
          if (ended_) {
            log(*ended_ == 0 ? kft::log::level::info : kft::log::level::warn,
                "the job ended (status " + std::to_string(*ended_) + ") before this node was taken in");
            return *ended_;
          }
          continue;
        }
        outcome = run_members(attempt, m);
      }
      if (outcome->success) {
        finish_round(attempt, -1, m);
        announce_end(attempt, 0);
        return 0;
      }
      if (outcome->interrupted) return stopped_by(g_signal.load(), outcome->message);
      const bool agent_signalled = g_signal.load() != 0;
      if (!agent_signalled && outcome->membership_change) {
        log(kft::log::level::warn,
            "re-forming the job (round " + std::to_string(attempt + 1) + "): " + outcome->message);
        continue;
      }
      if (!agent_signalled && failures < opt_.max_restarts && !outcome->fatal) {
        ++failures;
        log(kft::log::level::warn, "restarting all workers (restart " + std::to_string(failures) + " of " +
                                       std::to_string(opt_.max_restarts) + ") after: " + outcome->message);
        continue;
      }
      log(agent_signalled ? kft::log::level::warn : kft::log::level::error, outcome->message);
      finish_round(attempt, outcome->dead_node, m);
      const int code = agent_signalled ? 128 + g_signal.load() : outcome->code;
      announce_end(attempt, code);
      return code;
    }
  }

 private:
  struct round_outcome {
    bool success = false;
    bool interrupted = false;  // a signal ended the rendezvous (message: during what)
    bool fatal = false;  // no restart possible (e.g. the store is gone)
    bool membership_change = false;  // elastic: a node asked to join; the next round takes it
    int code = exit_code::worker_failed;  // the failure's class (exit_codes.hpp)
    int dead_node = -1;  // an agent that is gone or silent (not waited for at the end)
    std::string message;
  };

  // Who runs a round: node ids (their --node-rank) in node order, with their workers and hosts.
  struct membership {
    bool member = true;  // elastic: false when the round formed without this node
    std::vector<int> ids;
    std::vector<int> nprocs;
    std::vector<std::string> hosts;
    int index = 0;  // this agent's place in `ids` (its GROUP_RANK)
    int worker_port = 0;
    std::size_t position(int id) const {
      return static_cast<std::size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
    }
  };

  // SIGINT/SIGTERM/SIGHUP before any worker started: one line, 128 + the signal.
  int stopped_by(int sig, const std::string& during) const {
    log(kft::log::level::warn,
        std::string("received SIG") + ::sigabbrev_np(sig) + " " + during + ": stopped before starting any worker");
    return 128 + sig;
  }

  // Waits for `keys` in slices, so a signal ends the wait at once.
  enum class waited { ok, timed_out, signalled };
  waited wait_or_signal(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const auto until = clock::now() + timeout;
    while (true) {
      if (g_signal.load() != 0) return waited::signalled;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
      try {
        ++waits_;
        store_->wait(keys, std::clamp<std::chrono::milliseconds>(left, 0ms, 200ms));
        return waited::ok;
      } catch (const kft::timeout_error&) {
        if (left <= 200ms) return g_signal.load() != 0 ? waited::signalled : waited::timed_out;
      }
    }
  }

  // An error's message without kft's "kft: " prefix.
  static std::string kft_message(const std::exception& e) {
    std::string m = e.what();
    return m.rfind("kft: ", 0) == 0 ? m.substr(5) : m;
  }

  // "kftrun[node N]", the agent's name in its log lines.
  std::string who() const { return "kftrun[node " + std::to_string(opt_.node_rank) + "]"; }

  void log(kft::log::level l, const std::string& line) const { kft::log::write(l, who(), line); }

  std::string key(int attempt, const std::string& rest) const { return "r" + std::to_string(attempt) + "/" + rest; }

  // Tells the other agents, once: the first failure of a round wins.
  void report_failure(int attempt, const std::string& record) {
    try {
      store_->compare_set(key(attempt, "failure"), std::nullopt, record);
    } catch (const kft::error&) {
      // The store is gone; the other agents find out from that.
    }
  }

  // A fixed-size job's round: every node 0..nnodes-1 announces itself and waits for the others
  // (gang start). Returns the outcome when the round cannot start.
  std::optional<round_outcome> form_static(int attempt, membership& m) {
    round_outcome out;
    std::vector<int> nprocs(static_cast<std::size_t>(opt_.nnodes), 0);
    std::vector<std::string> hosts(static_cast<std::size_t>(opt_.nnodes));
    int worker_port = 0;
    try {
      set_alive(attempt);  // before the node key: a formed round's members all have one
      store_->set(key(attempt, "node/" + std::to_string(opt_.node_rank)), std::to_string(opt_.nproc_per_node) + " " + host_);
      std::vector<std::string> keys;
      for (int n = 0; n < opt_.nnodes; ++n) keys.push_back(key(attempt, "node/" + std::to_string(n)));
      const auto w = wait_or_signal(keys, opt_.rdzv_timeout);
      if (w == waited::signalled) {
        out.interrupted = true;
        out.message = "while waiting for the other nodes (" + missing_nodes(attempt) + ")";
        return out;
      }
      if (w == waited::timed_out) {
        out.fatal = true;
        out.code = exit_code::hang;
        out.message = "rendezvous timed out after " + kft::detail::describe_duration(opt_.rdzv_timeout) + ": " +
                      missing_nodes(attempt) + " (run id \"" + opt_.run_id + "\", store " + opt_.master_addr + ":" +
                      std::to_string(opt_.master_port) + ")";
        return out;
      }
      const auto records = store_->multi_get(keys, opt_.rdzv_timeout);  // one request, whatever --nnodes
      for (int n = 0; n < opt_.nnodes; ++n) {
        std::istringstream in(records[static_cast<std::size_t>(n)]);
        in >> nprocs[static_cast<std::size_t>(n)] >> hosts[static_cast<std::size_t>(n)];
      }
      if (opt_.node_rank == 0) store_->set(key(attempt, "worker_port"), std::to_string(free_port(opt_.master_addr, opt_.rdzv_timeout)));
      const auto wp = wait_or_signal({key(attempt, "worker_port")}, opt_.rdzv_timeout);
      if (wp == waited::signalled) {
        out.interrupted = true;
        out.message = "while waiting for node 0's port for the workers";
        return out;
      }
      worker_port = std::stoi(store_->get(key(attempt, "worker_port"), opt_.rdzv_timeout));
    } catch (const kft::error& e) {
      out.fatal = true;
      out.code = store_failure_class(e);
      out.message = std::string("rendezvous failed: ") + e.what();
      return out;
    }
    for (int n = 0; n < opt_.nnodes; ++n) m.ids.push_back(n);
    m.nprocs = std::move(nprocs);
    m.hosts = std::move(hosts);
    m.index = opt_.node_rank;
    m.worker_port = worker_port;
    return std::nullopt;
  }

  // ---- elastic rounds (--nnodes MIN:MAX) ----

  std::string ekey(int round, const std::string& rest) const { return "e/r" + std::to_string(round) + "/" + rest; }

  // The round a starting agent joins: node 0 opens round 0; a later agent joins the round node 0
  // is forming, or the next one when the current one has formed already (it is running).
  int first_elastic_round() {
    if (opt_.node_rank == 0) return 0;
    const auto cur = store_->try_get("e/current");
    if (!cur) return 0;
    const int r = std::stoi(*cur);
    return store_->try_get(ekey(r, "members")) ? r + 1 : r;
  }

  std::optional<int> job_finished() {
    try {
      if (auto f = store_->try_get("e/finished")) {
        store_->set("e/ack-end/" + std::to_string(opt_.node_rank), "1");
        return std::stoi(*f);
      }
    } catch (const kft::error&) {
    }
    return std::nullopt;
  }
  // Node 0, at the end of an elastic job: tells the agents still waiting to be taken in (those
  // that asked to join the next round), and keeps the store up until they have read it.
  void announce_end(int round, int code) {
    if (!opt_.elastic || opt_.node_rank != 0) return;
    try {
      store_->set("e/finished", std::to_string(code));
      await_acks("e/ack-end/", joined(round + 1));
    } catch (const kft::error&) {
    }
  }
  // Node 0 waits (at most a heartbeat timeout: a dead agent never answers) until each of `ids`
  // but itself has set prefix<id>.
  void await_acks(const std::string& prefix, const std::vector<int>& ids) {
    std::vector<std::string> keys;
    for (int id : ids)
      if (id != opt_.node_rank) keys.push_back(prefix + std::to_string(id));
    try {
      store_->wait(keys, opt_.heartbeat_timeout);
    } catch (const kft::error&) {
    }
  }

  // The node ids that asked to join round `round`, in order.
  std::vector<int> joined(int round) {
    std::vector<int> ids;
    for (const auto& k : store_->keys(ekey(round, "join/"))) ids.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  std::string joined_host(int round, int id) {
    std::istringstream v(store_->try_get(ekey(round, "join/" + std::to_string(id))).value_or("? ?"));
    std::string np, host;
    v >> np >> host;
    return host;
  }
  std::string describe_joined(int round, const std::vector<int>& ids) {
    std::string s;
    for (int n : ids) s += (s.empty() ? "" : ", ") + std::to_string(n) + " on " + joined_host(round, n);
    return s.empty() ? "none" : s;
  }

  // An elastic round: this agent asks to join; node 0 closes the round when MAX nodes have
  // joined, or `last_call` after MIN have; every joined agent reads the members. Returns the
  // outcome when the round cannot start; `m.member` false when it formed without this node.
  std::optional<round_outcome> form_elastic(int round, membership& m) {
    round_outcome out;
    try {
      if (opt_.node_rank == 0) store_->set("e/current", std::to_string(round));
      // The node rank is this agent's identity: a second agent with the same one is refused.
      const std::string me = std::to_string(opt_.nproc_per_node) + " " + host_ + " " + std::to_string(::getpid());
      const auto held = store_->compare_set(ekey(round, "join/" + std::to_string(opt_.node_rank)), std::nullopt, me)
                            .current.value_or(me);
      if (held != me) {
        std::istringstream h(held);
        std::string np, other_host, pid;
        h >> np >> other_host >> pid;
        throw kft::config_error("--node-rank", std::to_string(opt_.node_rank),
                                "node rank " + std::to_string(opt_.node_rank) + " is taken by the agent on " + other_host +
                                    " (pid " + pid + ") in this elastic job: every agent needs its own");
      }
      set_alive(round);  // (after the join: a refused duplicate must not take over the key)
      if (opt_.node_rank == 0) {
        const auto t0 = clock::now();
        std::optional<clock::time_point> enough;  // when MIN had joined
        while (true) {
          if (g_signal.load() != 0) {
            out.interrupted = true;
            out.message = "while forming round " + std::to_string(round) + " (joined: " + describe_joined(round, joined(round)) + ")";
            return out;
          }
          const auto ids = joined(round);
          const int n = static_cast<int>(ids.size());
          const auto now = clock::now();
          if (n >= opt_.min_nodes && !enough) enough = now;
          if (n >= opt_.nnodes || (enough && now - *enough >= opt_.last_call)) {
            std::vector<int> members(ids.begin(), ids.begin() + std::min(n, opt_.nnodes));
            if (std::find(members.begin(), members.end(), 0) == members.end()) members.insert(members.begin(), 0);
            std::string text;
            for (int id : members) text += (text.empty() ? "" : " ") + std::to_string(id);
            store_->set(key(round, "worker_port"), std::to_string(free_port(opt_.master_addr, opt_.rdzv_timeout)));
            store_->set(ekey(round, "members"), text);
            break;
          }
          if (now - t0 >= opt_.rdzv_timeout) {
            std::string never;
            for (int id = 0; id < opt_.nnodes; ++id)
              if (std::find(ids.begin(), ids.end(), id) == ids.end()) never += (never.empty() ? "" : ", ") + std::to_string(id);
            out.fatal = true;
            out.code = exit_code::hang;
            out.message = "rendezvous timed out after " + kft::detail::describe_duration(opt_.rdzv_timeout) + ": " +
                          std::to_string(n) + " of at least " + std::to_string(opt_.min_nodes) + " nodes joined round " +
                          std::to_string(round) + " (" + describe_joined(round, ids) + "); node rank(s) " + never +
                          " did not (run id \"" + opt_.run_id + "\", store " + opt_.master_addr + ":" +
                          std::to_string(opt_.master_port) + ")";
            store_->set(ekey(round, "failed"), out.message);
            await_acks(ekey(round, "ack/"), ids);  // every joined agent reads why before the store goes
            return out;
          }
          std::this_thread::sleep_for(50ms);
        }
      }
      // Every agent (node 0 too): the members, or why the round did not form. An agent that was
      // not taken in waits here until the next round forms, however long this one runs.
      std::string members;
      while (true) {
        if (g_signal.load() != 0) {
          out.interrupted = true;
          out.message = "while waiting to be taken into round " + std::to_string(round);
          return out;
        }
        if (auto f = store_->try_get(ekey(round, "failed"))) {
          store_->set(ekey(round, "ack/" + std::to_string(opt_.node_rank)), "1");
          out.fatal = true;
          out.code = exit_code::hang;  // (the only reason a round does not form: too few nodes in time)
          out.message = *f;
          return out;
        }
        if (auto v = store_->try_get(ekey(round, "members"))) {
          members = *v;
          break;
        }
        if ((ended_ = job_finished())) {
          m.member = false;
          return std::nullopt;
        }
        try {
          const std::string k[] = {ekey(round, "members")};
          ++waits_;
          store_->wait(k, 200ms);
        } catch (const kft::timeout_error&) {
        }
      }
      std::istringstream in(members);
      for (int id; in >> id;) m.ids.push_back(id);
      m.member = std::find(m.ids.begin(), m.ids.end(), opt_.node_rank) != m.ids.end();
      if (!m.member) return std::nullopt;
      m.index = static_cast<int>(m.position(opt_.node_rank));
      std::vector<std::string> join_keys;
      for (int id : m.ids) join_keys.push_back(ekey(round, "join/" + std::to_string(id)));
      const auto joins = store_->multi_get(join_keys, opt_.rdzv_timeout);  // one request, whatever the size
      for (const auto& record : joins) {
        std::istringstream j(record);
        int np = 0;
        std::string h;
        j >> np >> h;
        m.nprocs.push_back(np);
        m.hosts.push_back(h);
      }
      m.worker_port = std::stoi(store_->get(key(round, "worker_port"), opt_.rdzv_timeout));
    } catch (const kft::config_error&) {
      throw;  // (a node rank in use: kftrun exits 2)
    } catch (const kft::error& e) {
      out.fatal = true;
      out.code = store_failure_class(e);
      out.message = std::string("rendezvous failed: ") + e.what();
      return out;
    }
    std::string who;
    for (std::size_t i = 0; i < m.ids.size(); ++i)
      who += (i ? ", " : "") + std::to_string(m.ids[i]) + " on " + m.hosts[i];
    log(kft::log::level::info, "round " + std::to_string(round) + ": " + std::to_string(m.ids.size()) + " node(s) (" +
                                   who + "); this node is " + std::to_string(m.index) + " of them");
    return std::nullopt;
  }

  // Starts this node's workers for a formed round and watches them and the other nodes.
  round_outcome run_members(int attempt, const membership& m) {
    round_outcome out;
    const int nodes = static_cast<int>(m.ids.size());
    // 2. Start the local workers.
    int world = 0, first_rank = 0;
    for (int n = 0; n < nodes; ++n) {
      if (n == m.index) first_rank = world;
      world += m.nprocs[static_cast<std::size_t>(n)];
    }
    output_options oo;
    oo.to_console = !opt_.log_dir || opt_.tee;
    oo.dir = opt_.log_dir;
    worker_group group(opt_.program, oo);
    lost_.clear();
    const auto attempt_dir =
        opt_.log_dir ? *opt_.log_dir / opt_.run_id / ("attempt_" + std::to_string(attempt)) : std::filesystem::path();
    for (int l = 0; l < opt_.nproc_per_node; ++l)
      group.start({first_rank + l, l, worker_env(attempt, first_rank + l, l, world, m),
                   opt_.cpusets.empty() ? std::string() : opt_.cpusets[static_cast<std::size_t>(l)]},
                  attempt_dir);
    log(kft::log::level::debug, "round " + std::to_string(attempt) + ": started ranks " + std::to_string(first_rank) +
                                    "-" + std::to_string(first_rank + opt_.nproc_per_node - 1) + " of " +
                                    std::to_string(world) + ": " + opt_.program.front());

    // 3. Watch: local exits, the round's failure key, the other agents' heartbeats, signals.
    std::map<int, std::pair<std::int64_t, clock::time_point>> beats;  // node -> (last value, when it changed)
    // node -> its alive key was seen this round. A fixed-size round's members set theirs before
    // joining; an elastic member sets it just after, so it may not be there yet at the start.
    std::map<int, bool> seen_alive;
    if (!opt_.elastic)
      for (int n : m.ids) seen_alive[n] = true;
    std::map<int, clock::time_point> stopped_since;       // local rank -> when it was first seen stopped
    auto next_beat = clock::now();
    bool reported_done = false;
    while (true) {
      auto exits = group.poll_once(opt_.monitor_interval);
      // One poll can reap a killed rank together with a peer that saw it die and exited with
      // kft's error (waitpid returns the older child first): the killed one is the cause, and
      // the first failure reported is the one the job names.
      std::stable_partition(exits.begin(), exits.end(), [](const auto& e) { return e.signal != 0; });
      bool failed = false;
      for (const auto& e : exits) failed |= e.code != 0;
      // A worker that failed because a peer on a lost node vanished with it: the lost node is
      // the cause (its agent's connection closed before its workers died with it).
      if (failed && nodes > 1) {
        try {
          check_peers(attempt, m, beats, seen_alive, /*heartbeats=*/false);
        } catch (const kft::error&) {
          // The store is gone: the loop below finds out.
        }
      }
      for (const auto& e : exits) {
        if (e.code == 0) continue;
        const auto& why = group.start_error_of(e.rank);
        // (Across nodes a node may lose every worker while the job goes on on the others.)
        if (opt_.keep_going && why.empty() && (group.any_succeeded_or_running() || nodes > 1)) {
          lost_.push_back(e);
          // (Across nodes a node's last worker may be replaced: the others run elsewhere.)
          if (opt_.heal && replaced_ < opt_.max_restarts && (group.any_running() || nodes > 1)) {
            ++replaced_;
            auto env = worker_env(attempt, e.rank, e.local_rank, world, m);
            env.push_back("KFT_JOIN=" + std::to_string(replaced_));
            group.start({e.rank, e.local_rank, std::move(env),
                         opt_.cpusets.empty() ? std::string() : opt_.cpusets[static_cast<std::size_t>(e.local_rank)]},
                        attempt_dir);
            log(kft::log::level::warn,
                "rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.local_rank) + ") " + e.describe() +
                    "; the other workers go on and a replacement joins them at a step boundary (--on-failure heal, "
                    "replacement " + std::to_string(replaced_) + " of at most " + std::to_string(opt_.max_restarts) +
                    ")");
            continue;
          }
          log(kft::log::level::warn, "rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.local_rank) +
                                         ") " + e.describe() + "; the other workers go on (--on-failure continue)");
          continue;
        }
        // (--on-failure continue and no worker left: the first one lost is the cause.)
        const exit_info& cause = lost_.empty() ? e : lost_.front();
        report_failure(attempt, failure::make({{"rank", std::to_string(cause.rank)},
                                               {"local_rank", std::to_string(cause.local_rank)},
                                               {"node", std::to_string(opt_.node_rank)},
                                               {"host", host_},
                                               {"code", std::to_string(worker_failure_class(cause, !why.empty()))},
                                               {"what", why.empty() ? cause.describe() : why}}));
      }
      if (g_status.exchange(false)) {
        try {
          answer_status(group, m, true);
        } catch (const kft::error& e) {
          log(kft::log::level::warn, "the live status could not be gathered: " + kft_message(e));
        }
      }
      if (const int sig = g_signal.load()) {
        report_failure(attempt, failure::make({{"node", std::to_string(opt_.node_rank)},
                                               {"host", host_},
                                               {"code", std::to_string(exit_code::signalled(sig))},
                                               {"final", "1"},  // a stopped job is not restarted
                                               {"agent", std::string("received SIG") + ::sigabbrev_np(sig)}}));
        stop_workers(group);
        out.message = std::string("received SIG") + ::sigabbrev_np(sig) + ": stopped the local workers";
        return out;
      }
      try {
        if (auto f = store_->try_get(key(attempt, "failure"))) {
          const auto rec = failure::parse(*f);
          out.code = rec.code();
          if (rec.get("lost") == "1") out.dead_node = std::stoi(rec.get("node"));
          out.fatal = rec.get("final") == "1";
          out.membership_change = rec.get("membership") == "1";
          stop_workers(group, !out.membership_change && lets_workers_exit(out.code));
          out.message = out.membership_change ? "node " + rec.get("node") + " on " + rec.get("host") + " asked to join"
                                              : describe(rec);
          return out;
        }
        if (!reported_done && (opt_.keep_going ? group.all_exited() : group.all_succeeded())) {
          if (!lost_.empty()) {
            std::string ranks;
            for (const auto& l : lost_) {
              if (!ranks.empty()) ranks += ", ";
              ranks += std::to_string(l.rank);
            }
            log(kft::log::level::info, "the workers left finished; lost on the way: rank(s) " + ranks +
                                           (opt_.heal ? " (--on-failure heal: " + std::to_string(replaced_) +
                                                            " replacement(s) started)"
                                                      : std::string(" (--on-failure continue)")));
          }
          // "1": some worker here finished; "0": every one was lost (--on-failure continue across nodes).
          store_->set(key(attempt, "done/" + std::to_string(opt_.node_rank)), group.any_succeeded_or_running() ? "1" : "0");
          reported_done = true;
        }
        if (reported_done && all_done(attempt, m)) {
          stop_workers(group);  // whatever they left running (daemons) does not outlive the job
          if (!any_finished(attempt, m)) {  // every node lost every worker: the first one lost is the cause
            out.code = exit_code::rank_lost;
            out.fatal = true;
            out.message = "every worker of the job was lost (--on-failure continue)";
            return out;
          }
          out.success = true;
          return out;
        }
        const auto now = clock::now();
        if (now >= next_beat) {
          store_->add("hb/" + std::to_string(opt_.node_rank), 1);
          next_beat = now + std::min<std::chrono::milliseconds>(opt_.heartbeat_timeout / 5, 500ms);
          if (opt_.elastic && nodes < opt_.nnodes && !reported_done) {  // room for a node that asks to join
            const auto waiting = joined(attempt + 1);
            if (!waiting.empty())
              report_failure(attempt, failure::make({{"node", std::to_string(waiting.front())},
                                                     {"host", joined_host(attempt + 1, waiting.front())},
                                                     {"code", "0"},
                                                     {"membership", "1"},
                                                     {"agent", "asked to join"}}));
          }
          check_stopped_workers(attempt, group, stopped_since, now);
          check_peers(attempt, m, beats, seen_alive, /*heartbeats=*/true);
          // A live status asked for by another agent or `kftrun status`: answer with this node's.
          if (auto req = store_->try_get("status/req"); req && std::stoll(*req) > status_answered_)
            answer_status(group, m, false, std::stoll(*req));
        }
      } catch (const kft::error& e) {
        out.fatal = true;
        out.code = store_failure_class(e);
        stop_workers(group, lets_workers_exit(out.code));
        out.message = lost_store_message(e);
        return out;
      }
    }
  }

  // The live status (status.hpp). `asked_here` (SIGUSR1): a new request; this node's workers
  // answer, the other agents at their next heartbeat, and the job's status is printed on
  // standard output as one JSON line. Else: request `request` from elsewhere, answered into
  // the store.
  void answer_status(const worker_group& group, const membership& m, bool asked_here, std::int64_t request = 0) {
    const auto t0 = clock::now();
    const bool alone = m.ids.size() <= 1;
    if (asked_here && !alone) request = store_->add("status/req", 1);
    status_answered_ = std::max(status_answered_, request);
    auto mine = status::ask_workers(group.members(), status_name_, opt_.node_rank, host_, 500ms);
    if (!alone) store_->set("status/" + std::to_string(request) + "/" + std::to_string(opt_.node_rank), mine.dump());
    if (!asked_here) return;
    std::vector<std::pair<int, status::json>> answers{{opt_.node_rank, std::move(mine)}};
    std::vector<int> missing;
    for (int n : m.ids)
      if (n != opt_.node_rank && !lost_nodes_.count(n)) missing.push_back(n);
    // (the others answer at their next heartbeat: at most a fifth of --heartbeat-timeout, 500 ms)
    const auto until = clock::now() + std::min<std::chrono::milliseconds>(opt_.heartbeat_timeout / 5, 500ms) + 1500ms;
    while (!missing.empty() && clock::now() < until) {
      std::erase_if(missing, [&](int n) {
        auto v = store_->try_get("status/" + std::to_string(request) + "/" + std::to_string(n));
        if (!v) return false;
        answers.emplace_back(n, status::json::parse(*v, nullptr, false));
        return true;
      });
      if (!missing.empty()) std::this_thread::sleep_for(20ms);
    }
    const double took = std::chrono::duration<double>(clock::now() - t0).count();
    const auto line = status::merge(opt_.run_id, request, answers, missing, took).dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  }

  // r<a>/alive/<n>, bound to this agent's connection: if this process ends, the key goes with it.
  void set_alive(int attempt) {
    client_->set_owned(prefix_ + key(attempt, "alive/" + std::to_string(opt_.node_rank)),
                       host_ + " " + std::to_string(::getpid()));
  }

  static std::string lost_store_message(const kft::error& e) {
    return kft_message(e) + (store_failure_class(e) == exit_code::hang
                                 ? " (the node-0 agent, which hosts the store, stopped answering: stopped, or its "
                                   "host is unreachable)"
                                 : " (the node-0 agent, which hosts the store, has probably died)");
  }

  // A local worker stopped (state T: SIGSTOP, SIGTSTP) for longer than the heartbeat timeout
  // holds up the job as a silent agent would: the round fails as a hang.
  void check_stopped_workers(int attempt, const worker_group& group, std::map<int, clock::time_point>& since,
                             clock::time_point now) {
    std::map<int, clock::time_point> still;
    for (const auto& [rank, local_rank] : group.stopped_workers()) {
      const auto it = since.find(rank);
      const auto first = it == since.end() ? now : it->second;
      still[rank] = first;
      if (now - first > opt_.heartbeat_timeout)
        report_failure(attempt, failure::make({{"rank", std::to_string(rank)},
                                               {"local_rank", std::to_string(local_rank)},
                                               {"node", std::to_string(opt_.node_rank)},
                                               {"host", host_},
                                               {"code", std::to_string(exit_code::hang)},
                                               {"what", "stayed stopped (state T, e.g. SIGSTOP) for more than " +
                                                            kft::detail::describe_duration(opt_.heartbeat_timeout) +
                                                            " (--heartbeat-timeout)"}}));
    }
    since = std::move(still);
  }

  // The other agents of the round: one whose alive key vanished is gone (its process ended:
  // node lost); one whose heartbeat stopped for the heartbeat timeout while its key stays is
  // alive but silent (stopped, or cut off: hang). With `heartbeats` false, only the first.
  void check_peers(int attempt, const membership& m, std::map<int, std::pair<std::int64_t, clock::time_point>>& beats,
                   std::map<int, bool>& seen_alive, bool heartbeats) {
    const auto now = clock::now();
    const auto nodes_under = [&](const std::string& what) {  // the n of every r<a>/<what>/<n>
      std::vector<int> ids;
      for (const auto& k : store_->keys(key(attempt, what + "/"))) ids.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
      return ids;
    };
    const auto left = nodes_under("exit"), connected = nodes_under("alive");
    // Every agent's heartbeat counter, in two requests whatever the number of nodes (a listing,
    // then one multi_get); a node that has not beaten yet reads 0.
    std::map<int, std::int64_t> counters;
    if (heartbeats) {
      auto hb_keys = store_->keys("hb/");
      std::erase_if(hb_keys, [](const std::string& k) {
        return k.size() <= 3 || k.size() > 12 || !std::all_of(k.begin() + 3, k.end(), [](char c) { return c >= '0' && c <= '9'; });
      });
      if (!hb_keys.empty()) {
        const auto values = store_->multi_get(hb_keys, opt_.heartbeat_timeout);
        for (std::size_t i = 0; i < hb_keys.size(); ++i)
          counters[std::stoi(hb_keys[i].substr(3))] = std::strtoll(values[i].c_str(), nullptr, 10);
      }
    }
    const auto has = [](const std::vector<int>& ids, int n) { return std::find(ids.begin(), ids.end(), n) != ids.end(); };
    for (int n : m.ids) {
      const auto exited = [&] { return store_->try_get(key(attempt, "exit/" + std::to_string(n))).has_value(); };
      if (n == opt_.node_rank || has(left, n) || lost_nodes_.count(n)) continue;
      const bool alive = has(connected, n);
      bool& seen = seen_alive[n];
      seen |= alive;
      const auto& host = m.hosts[m.position(n)];
      // (An agent sets its exit key before it leaves: read again, it may have ended just now.)
      if (!alive && seen && !exited()) {
        if (opt_.keep_going) {  // its workers died with it; the others may go on without them
          lost_nodes_.insert(n);
          log(kft::log::level::warn, "the agent of node " + std::to_string(n) + " on " + host +
                                         " is gone (its connection to the store closed); the other nodes go on "
                                         "(--on-failure continue)");
          continue;
        }
        report_failure(attempt, failure::make({{"node", std::to_string(n)},
                                               {"host", host},
                                               {"code", std::to_string(exit_code::node_lost)},
                                               {"lost", "1"},
                                               {"agent", "is gone: its connection to the store closed (its process "
                                                         "ended: killed, or crashed)"}}));
        continue;
      }
      if (!heartbeats) continue;
      const auto counted = counters.find(n);
      const std::int64_t v = counted == counters.end() ? 0 : counted->second;
      auto [it, fresh] = beats.try_emplace(n, v, now);
      if (fresh || it->second.first != v) {
        it->second = {v, now};
      } else if (now - it->second.second > opt_.heartbeat_timeout) {
        const bool gone = !alive && !exited();
        report_failure(attempt,
                       failure::make({{"node", std::to_string(n)},
                                      {"host", host},
                                      {"code", std::to_string(gone ? exit_code::node_lost : exit_code::hang)},
                                      {"lost", "1"},
                                      {"agent", "stopped sending heartbeats for " +
                                                    kft::detail::describe_duration(opt_.heartbeat_timeout) +
                                                    (gone ? " and is not connected to the store (killed, or its host is gone)"
                                                          : " but is still connected to the store (stopped, e.g. SIGSTOP, "
                                                            "or its host is unreachable)")}}));
      }
    }
  }

  // Whether a failure of this class first gives the local workers --exit-grace to exit by
  // themselves: a worker ended (here or on another node) or a node is gone, which the other
  // workers find out for themselves and explain, often naming the rank at fault (a peer that
  // died, or called with other arguments). Signalled at once, they would die (SIGTERM's default)
  // before printing it. Not a hang (the workers wait on it until their own deadlines), a signal
  // to kftrun (it stops the job at once), nor a node that asks to join (the workers are well).
  static bool lets_workers_exit(int code) {
    return code == exit_code::worker_failed || code == exit_code::rank_lost || code == exit_code::node_lost;
  }

  // Stops the local workers: with `grace`, after --exit-grace in which they may exit by
  // themselves (worker_group::let_exit: it ends once all have, or those left are stopped, or
  // kftrun is signalled); then SIGTERM, and SIGKILL after --term-grace.
  void stop_workers(worker_group& group, bool grace = false) const {
    if (grace && opt_.exit_grace.count() > 0) {
      group.let_exit(clock::now() + opt_.exit_grace, [] { return g_signal.load() != 0; });
      if (!group.all_exited())
        log(kft::log::level::debug, "stopping the workers still running after --exit-grace " +
                                        kft::detail::describe_duration(opt_.exit_grace));
    }
    // With the flight recorder on (KFT_TRACE_DIR), the workers still running write their dumps
    // first: where each one is inside its calls, for kft-trace (docs/flight-recorder.md).
    if (const char* dir = std::getenv("KFT_TRACE_DIR"); dir && *dir && !group.all_exited()) {
      const int n = group.ask_for_dumps(dir, std::chrono::seconds(2));
      log(kft::log::level::info, "the workers still running wrote " + std::to_string(n) +
                                     " flight-recorder dump(s) to " + dir + " (kft-trace " + dir + " reads them)");
    }
    const int before = group.strays_ended();
    group.kill_all(opt_.term_grace);
    if (const int n = group.strays_ended() - before; n > 0)
      log(kft::log::level::warn, "ended " + std::to_string(n) + " process" + (n == 1 ? "" : "es") +
          " the workers left running (started with setsid(), outside the workers' process groups)");
  }

  bool all_done(int attempt, const membership& m) {
    for (int n : m.ids)
      if (!lost_nodes_.count(n) && !store_->try_get(key(attempt, "done/" + std::to_string(n)))) return false;
    return true;
  }
  // Some node's workers finished (a done key of "1"), not all were lost.
  bool any_finished(int attempt, const membership& m) {
    for (int n : m.ids)
      if (!lost_nodes_.count(n) && store_->try_get(key(attempt, "done/" + std::to_string(n))) == "1") return true;
    return false;
  }

  std::string missing_nodes(int attempt) {
    std::vector<std::string> joined_keys;
    try {
      joined_keys = store_->keys(key(attempt, "node/"));
    } catch (const kft::error&) {
    }
    std::vector<bool> joined(static_cast<std::size_t>(opt_.nnodes), false);
    std::string who_joined;
    for (const auto& k : joined_keys) {
      const int n = std::stoi(k.substr(k.rfind('/') + 1));
      if (n >= 0 && n < opt_.nnodes) joined[static_cast<std::size_t>(n)] = true;
      auto v = store_->try_get(k).value_or("");
      who_joined += (who_joined.empty() ? "" : ", ") + std::to_string(n) + " on " + v.substr(v.find(' ') + 1);
    }
    std::string missing;
    int count = 0;
    for (int n = 0; n < opt_.nnodes; ++n)
      if (!joined[static_cast<std::size_t>(n)]) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        ++count;
      }
    return "node rank" + std::string(count == 1 ? " " : "s ") + missing + " of " + std::to_string(opt_.nnodes) +
           (count == 1 ? " did" : " did") + " not join (joined: " + (who_joined.empty() ? "none" : who_joined) + ")";
  }

  static std::string describe(const failure& f) {
    if (!f.get("agent").empty())
      return "the agent of node " + f.get("node") + " on " + f.get("host") + " " + f.get("agent");
    return "rank " + f.get("rank") + " (local rank " + f.get("local_rank") + ", node " + f.get("node") + ") on " +
           f.get("host") + " " + f.get("what");
  }

  // After the round: say so, and on node 0 keep the store up until every other live agent
  // that joined has read the outcome (a dead agent, named by the failure, is not waited for).
  void finish_round(int attempt, int dead_node, const membership& m) {
    try {
      store_->set(key(attempt, "exit/" + std::to_string(opt_.node_rank)), "1");
      if (opt_.node_rank != 0) return;
      std::vector<std::string> keys;
      const auto joined_round = [&](int n) {
        return opt_.elastic ? std::find(m.ids.begin(), m.ids.end(), n) != m.ids.end()
                            : store_->try_get(key(attempt, "node/" + std::to_string(n))).has_value();
      };
      for (int n = 0; n < opt_.nnodes; ++n)
        if (n != dead_node && joined_round(n))  // joined this round
          keys.push_back(key(attempt, "exit/" + std::to_string(n)));
      store_->wait(keys, opt_.heartbeat_timeout);
    } catch (const kft::error&) {
      // Someone is gone without saying goodbye; nothing more to wait for.
    }
  }

  std::vector<std::string> worker_env(int attempt, int rank, int local_rank, int world, const membership& m) const {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    auto set = [&](const std::string& k, const std::string& v) { env[k] = v; };
    set("RANK", std::to_string(rank));
    set("LOCAL_RANK", std::to_string(local_rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_WORLD_SIZE", std::to_string(opt_.nproc_per_node));
    set("GROUP_RANK", std::to_string(m.index));
    set("GROUP_WORLD_SIZE", std::to_string(m.ids.size()));
    set("ROLE_NAME", "default");
    set("ROLE_RANK", std::to_string(rank));
    set("ROLE_WORLD_SIZE", std::to_string(world));
    set("MASTER_ADDR", opt_.master_addr);
    set("MASTER_PORT", std::to_string(m.worker_port));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
    set("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt_.max_restarts));
    set("TORCHELASTIC_RUN_ID", opt_.run_id);
    set("TORCHELASTIC_USE_AGENT_STORE", "False");
    if (!env.count("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
    set("KFT_LAUNCHER", "kftrun");
    set("KFT_RUN_ID", opt_.run_id);
    set("KFT_RESTART_COUNT", std::to_string(attempt));
    set("KFT_STORE_ADDR", opt_.master_addr);  // (also where the Gloo group picks its interface towards)
    set("KFT_STORE_PORT", std::to_string(opt_.master_port));
    if (relay_port_) set("KFT_STORE_RELAY_PORT", std::to_string(relay_port_));  // --store-relay: this node's relay
    set("KFT_STORE_PREFIX", "kftrun/" + opt_.run_id + "/r" + std::to_string(attempt) + "/user/");
    set("KFT_RDZV_TOKEN", opt_.token);
    set("KFT_STATUS_NAME", status_name_);
    const auto ms = opt_.job_timeout.count();
    set("KFT_TIMEOUT", ms % 1000 == 0 ? std::to_string(ms / 1000) + "s" : std::to_string(ms) + "ms");
    set("KFT_ON_FAILURE", opt_.heal ? "heal" : opt_.keep_going ? "continue" : "stop");  // whether a program may shrink and go on
    env.erase("KFT_JOIN");  // (only a replacement joins a running group: added to its own)
    if (!relay_port_) env.erase("KFT_STORE_RELAY_PORT");  // (an outer kftrun's: not this job's)
    std::vector<std::string> out;
    for (const auto& [k, v] : env) out.push_back(k + "=" + v);
    return out;
  }

  options opt_;
  std::string host_;
  std::vector<exit_info> lost_;  // --on-failure continue: this round's workers lost, in order
  int replaced_ = 0;             // --on-failure heal: replacements started in the job
  std::set<int> lost_nodes_;     // --on-failure continue across nodes: agents gone (not waited for)
  std::shared_ptr<rdzv::store> store_;
  std::shared_ptr<rdzv::tcp_store> client_;  // store_'s connection (for set_owned)
  int relay_port_ = 0;                        // --store-relay: the port of this node's relay (0: none)
  std::uint64_t waits_ = 0;  // the rendezvous' waits on the store (slices of wait_or_signal), counted apart
  std::string prefix_;
  std::string status_name_;              // the workers' status sockets' name (KFT_STATUS_NAME)
  std::int64_t status_answered_ = 0;     // the last status request this agent answered                       // store_'s prefix
  std::optional<int> ended_;  // elastic: the job's status, seen while waiting to be taken in
};

}  // namespace kftrun
