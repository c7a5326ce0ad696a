// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/connect.hpp
/// @brief Reaching the job's store from a rank, however the job was launched.
#pragma once

#include <unistd.h>

#include <memory>
#include <utility>

#include <kft/core/environment.hpp>
#include <kft/core/parse.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/rendezvous/detail/token_file.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/torch_store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief A connection to the job's store; on rank 0 without a launcher-hosted store it also
/// owns the server.
///
/// Where it owns the server, destruction first closes this process's own connection, then
/// waits (up to `drain_timeout`) for every other rank to disconnect, so that a rank 0 that
/// finishes first does not take the store away from ranks still using it.
struct store_handle {
  std::shared_ptr<store> client;
  std::unique_ptr<tcp_store_server> server;  ///< set only where this process hosts the store
  std::chrono::milliseconds drain_timeout = default_job_timeout;  ///< `connect_store` sets the job's (KFT_TIMEOUT)
  std::string token_file;  ///< the single-host token handover file this process wrote, if any

  store_handle() = default;
  store_handle(store_handle&& o) noexcept
      : client(std::move(o.client)), server(std::move(o.server)), drain_timeout(o.drain_timeout),
        token_file(std::exchange(o.token_file, {})) {}
  store_handle& operator=(store_handle&& o) noexcept {
    if (this != &o) {
      release();
      client = std::move(o.client);
      server = std::move(o.server);
      drain_timeout = o.drain_timeout;
      token_file = std::exchange(o.token_file, {});
    }
    return *this;
  }
  ~store_handle() { release(); }

 private:
  void release() noexcept {
    if (!token_file.empty()) ::unlink(token_file.c_str());
    token_file.clear();
    client.reset();
    if (server) server->drain(drain_timeout);
    server.reset();
  }
};

/// @brief Which store `connect_store` uses for a world and environment, in words (kft-info).
inline std::string store_kind(const environment& env) {
  if (env.has("KFT_STORE_ADDR") && env.has("KFT_STORE_RELAY_PORT"))
    return "kft store hosted by the launcher (KFT_STORE_ADDR), through this node's relay (KFT_STORE_RELAY_PORT)";
  if (env.has("KFT_STORE_ADDR")) return "kft store hosted by the launcher (KFT_STORE_ADDR)";
  if (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True") return "torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True)";
  return "kft store hosted by rank 0 at MASTER_ADDR:MASTER_PORT";
}

/// @brief Connects to the job's store.
///
/// - Under kftrun: `KFT_STORE_ADDR`, `KFT_STORE_PORT` and `KFT_RDZV_TOKEN` name the store the
///   launcher hosts, and `KFT_STORE_PREFIX` scopes this restart round's keys. With
///   `KFT_STORE_RELAY_PORT` (kftrun --store-relay, on the nodes of a job with several) the rank
///   connects to its node's relay on 127.0.0.1 at that port instead, which speaks for the node's
///   ranks to that store over one connection.
/// - Under torchrun's static rendezvous (`TORCHELASTIC_USE_AGENT_STORE=True`): torchrun's own
///   `TCPStore` at `MASTER_ADDR:MASTER_PORT` (`torch_store.hpp`; no token: torch's store has
///   none), keys under `/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/kft/`.
/// - Otherwise (torchrun's c10d rendezvous and `--standalone`, mpirun, srun, a pod): rank 0
///   hosts a kft store at the rendezvous address (`w.master_addr`/`w.master_port`, or
///   `KFT_STORE_ADDR`/`KFT_STORE_PORT`) and every rank presents `KFT_RDZV_TOKEN`. When it is
///   unset and every rank is on this host (`w.node_count == 1`), rank 0 makes a random token
///   and hands it over through a file only this user can read (`detail/token_file.hpp`); a
///   job on several hosts must set one secret on every rank. (With MPI, `mpi_bootstrap()`
///   needs no address or token.)
/// - A single process with no launcher (world size 1, no rendezvous address): an in-process
///   `memory_store`; nothing to meet.
///
/// The job's timeout (`KFT_TIMEOUT` in `env`, else 5 minutes) applies: reaching the store within
/// `timeout` (0: the job's), each request that is not a wait (`tcp_store::options::io_timeout`)
/// and, where this rank hosts the store, `store_handle::drain_timeout`.
/// @throws config_error naming what is missing or malformed
inline store_handle connect_store(const world_info& w, const environment& env = environment::process(),
                                  std::chrono::milliseconds timeout = {}) {
  constexpr std::string_view ctx = "rendezvous store";
  const derived_timeouts job = timeouts(env);
  if (timeout.count() <= 0) timeout = job.job;
  store_handle h;
  h.drain_timeout = job.job;
  if (!env.has("KFT_STORE_ADDR") && env.get("TORCHELASTIC_USE_AGENT_STORE") == "True") {
    if (!w.master_addr || !w.master_port)
      throw config_error("TORCHELASTIC_USE_AGENT_STORE", "True",
                         "but MASTER_ADDR/MASTER_PORT are not both set: cannot tell where torchrun's store is",
                         error_site::of("store connect"));
    const int attempt = env_int_required(env, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, ctx);
    torch_tcp_store::options o;
    o.host = *w.master_addr;
    o.port = *w.master_port;
    o.connect_timeout = timeout;
    o.io_timeout = job.store_request;
    h.client = std::make_shared<prefix_store>(std::make_shared<torch_tcp_store>(std::move(o)),
                                              "/worker/attempt_" + std::to_string(attempt) + "/kft/");
    return h;
  }

  if (w.world_size == 1 && !env.has("KFT_STORE_ADDR") && (!w.master_addr || !w.master_port)) {
    h.client = std::make_shared<memory_store>();
    return h;
  }

  std::string host;
  int port = 0;
  const bool launcher_store = env.has("KFT_STORE_ADDR");
  if (launcher_store) {
    host = *env.get("KFT_STORE_ADDR");
    port = env_int_required(env, "KFT_STORE_PORT", 1, 65535, ctx);
    if (env.has("KFT_STORE_RELAY_PORT")) {  // this node's relay to that store (kftrun --store-relay)
      host = "127.0.0.1";
      port = env_int_required(env, "KFT_STORE_RELAY_PORT", 1, 65535, ctx);
    }
  } else {
    if (!w.master_addr || !w.master_port)
      throw config_error("KFT_STORE_ADDR", "",
                         "is not set and the launcher gave no rendezvous address (MASTER_ADDR/MASTER_PORT): "
                         "cannot tell where rank 0's store is",
                         error_site::of("store connect"));
    host = *w.master_addr;
    port = *w.master_port;
  }

  std::string token = env.get("KFT_RDZV_TOKEN").value_or("");
  if (token.empty()) {
    const bool one_host = w.world_size == 1 || w.node_count == 1;
    if (launcher_store || !one_host)
      throw config_error("KFT_RDZV_TOKEN", "",
                         launcher_store ? "is not set, but the launcher's store needs its token (kftrun sets it)"
                                        : "is not set: a job on several hosts needs one secret shared by every rank "
                                          "(e.g. KFT_RDZV_TOKEN=$(openssl rand -hex 16) exported to every rank; "
                                          "kftrun and kft-manifest do it for you; see docs/launching.md)",
                         error_site::of("store connect"));
    // One host: rank 0 makes a token and hands it to the others through a private file.
    std::string key = detail::endpoint(host, port);
    for (const char* v : {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "PMIX_NAMESPACE", "SLURM_JOB_ID",
                          "SLURM_STEP_ID"})
      key += std::string("|") + v + "=" + env.get(v).value_or("");
    const std::string path = detail::private_dir(env) + "/" + detail::token_file_name(key);
    if (w.rank == 0) {
      token = detail::publish_token(path);
      h.token_file = path;
    } else {
      token = detail::read_token(path, timeout);
    }
  }
  if (!launcher_store && w.rank == 0)
    h.server = std::make_unique<tcp_store_server>(tcp_store_server::options{host, port, token, {}});
  tcp_store::options o;
  o.host = host;
  o.port = port;
  o.token = token;
  o.connect_timeout = timeout;
  o.io_timeout = job.store_request;
  o.name = "rank " + std::to_string(w.rank);
  h.client = std::make_shared<tcp_store>(std::move(o));
  // kftrun scopes each restart round's keys, so a restarted job never sees stale values.
  if (auto prefix = env.get("KFT_STORE_PREFIX"); prefix && !prefix->empty())
    h.client = std::make_shared<prefix_store>(h.client, *prefix);
  return h;
}

}  // namespace rendezvous
KFT_NAMESPACE_END
