// kftrun: the node agent — meet the other agents, start the local workers, watch everyone,
// stop and restart as a unit.
//
// Store layout (under "kftrun/<run-id>/"):
//   r<a>/node/<n>        "<nproc> <host>"        agent n joined round a
//   r<a>/worker_port     MASTER_PORT for the workers of round a (chosen by node 0)
//   r<a>/failure         first failure of round a: "key=value" lines (compare_set: first wins)
//   r<a>/done/<n>        node n's workers all exited 0 in round a
//   r<a>/exit/<n>        node n has seen the round end (node 0 keeps the store up until all have)
//   hb/<n>               node n's heartbeat counter (all rounds)
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <sstream>

#include <kft/core/timeout.hpp>
#include <kft/core/token.hpp>
#include <kft/rendezvous/tcp_store.hpp>

#include "workers.hpp"

namespace kftrun {

using namespace std::chrono_literals;
namespace rdzv = kft::rendezvous;

struct options {
  int nproc_per_node = 1;
  int nnodes = 1;
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
  std::string token;
  std::vector<std::string> program;  // argv
  std::vector<std::string> cpusets;  // per local rank (--bind); empty = no binding
};

/// Set by SIGINT/SIGTERM/SIGHUP handlers.
inline std::atomic<int> g_signal{0};

/// A parsed failure record.
struct failure {
  std::map<std::string, std::string> fields;
  std::string get(const std::string& k) const {
    auto it = fields.find(k);
    return it == fields.end() ? "" : it->second;
  }
  int code() const {
    const auto c = get("code");
    return c.empty() ? 1 : std::stoi(c);
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

/// A free TCP port on `host` (bound and released; the workers' rank 0 binds it soon after,
/// as with torchrun).
inline int free_port(const std::string& host) {
  auto fd = rdzv::detail::listen_on(host, 0);
  return rdzv::detail::local_port(fd.get());
}

class agent {
 public:
  explicit agent(options opt) : opt_(std::move(opt)), host_(hostname()) {}

  /// Runs the job; returns kftrun's exit status.
  int run() {
    std::unique_ptr<rdzv::tcp_store_server> server;
    if (opt_.node_rank == 0) {
      server = std::make_unique<rdzv::tcp_store_server>(
          rdzv::tcp_store_server::options{opt_.master_addr, opt_.master_port, opt_.token,
                                          [](const std::string& line) { std::fprintf(stderr, "kftrun: %s\n", line.c_str()); }});
      opt_.master_port = server->port();
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
    }
    store_ = std::make_shared<rdzv::prefix_store>(client, "kftrun/" + opt_.run_id + "/");

    for (int attempt = 0;; ++attempt) {
      const auto outcome = run_round(attempt);
      if (outcome.success) {
        finish_round(attempt, -1);
        return 0;
      }
      if (outcome.interrupted) return stopped_by(g_signal.load(), outcome.message);
      const bool agent_signalled = g_signal.load() != 0;
      if (!agent_signalled && attempt < opt_.max_restarts && !outcome.fatal) {
        log("restarting all workers (restart " + std::to_string(attempt + 1) + " of " + std::to_string(opt_.max_restarts) +
            ") after: " + outcome.message);
        continue;
      }
      log(outcome.message);
      finish_round(attempt, outcome.dead_node);
      return agent_signalled ? 128 + g_signal.load() : outcome.code;
    }
  }

 private:
  struct round_outcome {
    bool success = false;
    bool interrupted = false;  // a signal ended the rendezvous (message: during what)
    bool fatal = false;  // no restart possible (e.g. the store is gone)
    int code = 1;
    int dead_node = -1;  // an agent that stopped heartbeating
    std::string message;
  };

  // SIGINT/SIGTERM/SIGHUP before any worker started: one line, 128 + the signal.
  int stopped_by(int sig, const std::string& during) const {
    log(std::string("received SIG") + ::sigabbrev_np(sig) + " " + during + ": stopped before starting any worker");
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
        store_->wait(keys, std::clamp<std::chrono::milliseconds>(left, 0ms, 200ms));
        return waited::ok;
      } catch (const kft::timeout_error&) {
        if (left <= 200ms) return g_signal.load() != 0 ? waited::signalled : waited::timed_out;
      }
    }
  }

  void log(const std::string& line) const {
    std::fprintf(stderr, "kftrun[node %d]: %s\n", opt_.node_rank, line.c_str());
    std::fflush(stderr);
  }

  std::string key(int attempt, const std::string& rest) const { return "r" + std::to_string(attempt) + "/" + rest; }

  // Tells the other agents, once: the first failure of a round wins.
  void report_failure(int attempt, const std::string& record) {
    try {
      store_->compare_set(key(attempt, "failure"), std::nullopt, record);
    } catch (const kft::error&) {
      // The store is gone; the other agents find out from that.
    }
  }

  round_outcome run_round(int attempt) {
    round_outcome out;
    // 1. Join: every agent announces itself and waits for the others (gang start).
    std::vector<int> nprocs(static_cast<std::size_t>(opt_.nnodes), 0);
    std::vector<std::string> hosts(static_cast<std::size_t>(opt_.nnodes));
    int worker_port = 0;
    try {
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
        out.message = "rendezvous timed out after " + kft::detail::describe_duration(opt_.rdzv_timeout) + ": " +
                      missing_nodes(attempt) + " (run id \"" + opt_.run_id + "\", store " + opt_.master_addr + ":" +
                      std::to_string(opt_.master_port) + ")";
        return out;
      }
      for (int n = 0; n < opt_.nnodes; ++n) {
        std::istringstream in(*store_->try_get(keys[static_cast<std::size_t>(n)]));
        in >> nprocs[static_cast<std::size_t>(n)] >> hosts[static_cast<std::size_t>(n)];
      }
      if (opt_.node_rank == 0) store_->set(key(attempt, "worker_port"), std::to_string(free_port(opt_.master_addr)));
      const auto wp = wait_or_signal({key(attempt, "worker_port")}, opt_.rdzv_timeout);
      if (wp == waited::signalled) {
        out.interrupted = true;
        out.message = "while waiting for node 0's port for the workers";
        return out;
      }
      worker_port = std::stoi(store_->get(key(attempt, "worker_port"), opt_.rdzv_timeout));
    } catch (const kft::error& e) {
      out.fatal = true;
      out.message = std::string("rendezvous failed: ") + e.what();
      return out;
    }

    // 2. Start the local workers.
    int world = 0, first_rank = 0;
    for (int n = 0; n < opt_.nnodes; ++n) {
      if (n == opt_.node_rank) first_rank = world;
      world += nprocs[static_cast<std::size_t>(n)];
    }
    output_options oo;
    oo.to_console = !opt_.log_dir || opt_.tee;
    oo.dir = opt_.log_dir;
    worker_group group(opt_.program, oo);
    const auto attempt_dir =
        opt_.log_dir ? *opt_.log_dir / opt_.run_id / ("attempt_" + std::to_string(attempt)) : std::filesystem::path();
    for (int l = 0; l < opt_.nproc_per_node; ++l)
      group.start({first_rank + l, l, worker_env(attempt, first_rank + l, l, world, worker_port),
                   opt_.cpusets.empty() ? std::string() : opt_.cpusets[static_cast<std::size_t>(l)]},
                  attempt_dir);

    // 3. Watch: local exits, the round's failure key, the other agents' heartbeats, signals.
    std::map<int, std::pair<std::int64_t, clock::time_point>> beats;  // node -> (last value, when it changed)
    auto next_beat = clock::now();
    bool reported_done = false;
    while (true) {
      for (const auto& e : group.poll_once(opt_.monitor_interval)) {
        if (e.code == 0) continue;
        const auto& why = group.start_error_of(e.rank);
        report_failure(attempt, failure::make({{"rank", std::to_string(e.rank)},
                                               {"local_rank", std::to_string(e.local_rank)},
                                               {"node", std::to_string(opt_.node_rank)},
                                               {"host", host_},
                                               {"code", std::to_string(e.code)},
                                               {"what", why.empty() ? e.describe() : why}}));
      }
      if (const int sig = g_signal.load()) {
        report_failure(attempt, failure::make({{"node", std::to_string(opt_.node_rank)},
                                               {"host", host_},
                                               {"code", std::to_string(128 + sig)},
                                               {"final", "1"},  // a stopped job is not restarted
                                               {"agent", std::string("received SIG") + ::sigabbrev_np(sig)}}));
        stop_workers(group);
        out.message = std::string("received SIG") + ::sigabbrev_np(sig) + ": stopped the local workers";
        return out;
      }
      try {
        if (auto f = store_->try_get(key(attempt, "failure"))) {
          stop_workers(group);
          const auto rec = failure::parse(*f);
          out.code = rec.code();
          if (rec.get("agent").find("heartbeat") != std::string::npos) out.dead_node = std::stoi(rec.get("node"));
          out.fatal = rec.get("final") == "1";
          out.message = describe(rec);
          return out;
        }
        if (!reported_done && group.all_succeeded()) {
          store_->set(key(attempt, "done/" + std::to_string(opt_.node_rank)), "1");
          reported_done = true;
        }
        if (reported_done && all_done(attempt)) {
          stop_workers(group);  // whatever they left running (daemons) does not outlive the job
          out.success = true;
          return out;
        }
        const auto now = clock::now();
        if (now >= next_beat) {
          store_->add("hb/" + std::to_string(opt_.node_rank), 1);
          next_beat = now + std::min<std::chrono::milliseconds>(opt_.heartbeat_timeout / 5, 500ms);
          for (int n = 0; n < opt_.nnodes; ++n) {
            if (n == opt_.node_rank || store_->try_get(key(attempt, "exit/" + std::to_string(n)))) continue;
            const auto v = store_->add("hb/" + std::to_string(n), 0);
            auto [it, fresh] = beats.try_emplace(n, v, now);
            if (fresh || it->second.first != v) {
              it->second = {v, now};
            } else if (now - it->second.second > opt_.heartbeat_timeout) {
              report_failure(attempt,
                             failure::make({{"node", std::to_string(n)},
                                            {"host", hosts[static_cast<std::size_t>(n)]},
                                            {"code", "1"},
                                            {"agent", "stopped sending heartbeats for " +
                                                          kft::detail::describe_duration(opt_.heartbeat_timeout) +
                                                          " (killed, or its host is gone)"}}));
            }
          }
        }
      } catch (const kft::error& e) {
        stop_workers(group);
        out.fatal = true;
        out.message = std::string(e.what()) + " (the node-0 agent, which hosts the store, has probably died)";
        return out;
      }
    }
  }

  void stop_workers(worker_group& group) const {
    const int before = group.strays_ended();
    group.kill_all(opt_.term_grace);
    if (const int n = group.strays_ended() - before; n > 0)
      log("ended " + std::to_string(n) + " process" + (n == 1 ? "" : "es") +
          " the workers left running (started with setsid(), outside the workers' process groups)");
  }

  bool all_done(int attempt) {
    for (int n = 0; n < opt_.nnodes; ++n)
      if (!store_->try_get(key(attempt, "done/" + std::to_string(n)))) return false;
    return true;
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
  void finish_round(int attempt, int dead_node) {
    try {
      store_->set(key(attempt, "exit/" + std::to_string(opt_.node_rank)), "1");
      if (opt_.node_rank != 0) return;
      std::vector<std::string> keys;
      for (int n = 0; n < opt_.nnodes; ++n)
        if (n != dead_node && store_->try_get(key(attempt, "node/" + std::to_string(n))))  // joined this round
          keys.push_back(key(attempt, "exit/" + std::to_string(n)));
      store_->wait(keys, opt_.heartbeat_timeout);
    } catch (const kft::error&) {
      // Someone is gone without saying goodbye; nothing more to wait for.
    }
  }

  std::vector<std::string> worker_env(int attempt, int rank, int local_rank, int world, int worker_port) const {
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
    set("GROUP_RANK", std::to_string(opt_.node_rank));
    set("GROUP_WORLD_SIZE", std::to_string(opt_.nnodes));
    set("ROLE_NAME", "default");
    set("ROLE_RANK", std::to_string(rank));
    set("ROLE_WORLD_SIZE", std::to_string(world));
    set("MASTER_ADDR", opt_.master_addr);
    set("MASTER_PORT", std::to_string(worker_port));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
    set("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt_.max_restarts));
    set("TORCHELASTIC_RUN_ID", opt_.run_id);
    set("TORCHELASTIC_USE_AGENT_STORE", "False");
    if (!env.count("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
    set("KFT_LAUNCHER", "kftrun");
    set("KFT_RUN_ID", opt_.run_id);
    set("KFT_RESTART_COUNT", std::to_string(attempt));
    set("KFT_STORE_ADDR", opt_.master_addr);
    set("KFT_STORE_PORT", std::to_string(opt_.master_port));
    set("KFT_STORE_PREFIX", "kftrun/" + opt_.run_id + "/r" + std::to_string(attempt) + "/user/");
    set("KFT_RDZV_TOKEN", opt_.token);
    const auto ms = opt_.job_timeout.count();
    set("KFT_TIMEOUT", ms % 1000 == 0 ? std::to_string(ms / 1000) + "s" : std::to_string(ms) + "ms");
    std::vector<std::string> out;
    for (const auto& [k, v] : env) out.push_back(k + "=" + v);
    return out;
  }

  options opt_;
  std::string host_;
  std::shared_ptr<rdzv::store> store_;
};

}  // namespace kftrun
