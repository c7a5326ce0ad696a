/// @file kft/rendezvous/connect.hpp
/// @brief Reaching the job's store from a rank, however the job was launched.
#pragma once

#include <memory>

#include <kft/core/environment.hpp>
#include <kft/core/parse.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/rendezvous/tcp_store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief A connection to the job's store; on rank 0 without a launcher it also owns the server.
///
/// Where it owns the server, destruction first closes this process's own connection, then
/// waits (up to `drain_timeout`) for every other rank to disconnect, so that a rank 0 that
/// finishes first does not take the store away from ranks still using it.
struct store_handle {
  std::shared_ptr<store> client;
  std::unique_ptr<tcp_store_server> server;  ///< set only where this process hosts the store
  std::chrono::milliseconds drain_timeout = std::chrono::seconds(60);

  store_handle() = default;
  store_handle(store_handle&&) noexcept = default;
  store_handle& operator=(store_handle&&) noexcept = default;
  ~store_handle() {
    client.reset();
    if (server) server->drain(drain_timeout);
  }
};

/// @brief Connects to the job's store.
///
/// - Under kftrun: `KFT_STORE_ADDR`, `KFT_STORE_PORT` and `KFT_RDZV_TOKEN` name the store the
///   launcher hosts, and `KFT_STORE_PREFIX` scopes this restart round's keys.
/// - Otherwise (mpirun, srun, a pod): rank 0 hosts the store at the rendezvous address
///   (`w.master_addr`/`w.master_port`, or `KFT_STORE_ADDR`/`KFT_STORE_PORT`), and every rank
///   connects with `KFT_RDZV_TOKEN`, which must then be set identically on all ranks.
///   (With MPI, `mpi_bootstrap()` needs no address or token.)
/// @throws config_error naming what is missing
inline store_handle connect_store(const world_info& w, const environment& env = environment::process(),
                                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  constexpr std::string_view ctx = "rendezvous store";
  const auto token = env.get("KFT_RDZV_TOKEN");
  if (!token || token->empty())
    throw config_error("KFT_RDZV_TOKEN", token.value_or(""),
                       "is not set: the job's store needs a shared token (kftrun sets it; otherwise set the "
                       "same secret on every rank)",
                       error_site::of("store connect"));
  store_handle h;
  std::string host;
  int port = 0;
  if (auto addr = env.get("KFT_STORE_ADDR")) {
    host = *addr;
    port = env_int_required(env, "KFT_STORE_PORT", 1, 65535, ctx);
  } else {
    if (!w.master_addr || !w.master_port)
      throw config_error("KFT_STORE_ADDR", "",
                         "is not set and the launcher gave no rendezvous address (MASTER_ADDR/MASTER_PORT): "
                         "cannot tell where rank 0's store is",
                         error_site::of("store connect"));
    host = *w.master_addr;
    port = *w.master_port;
    if (w.rank == 0) h.server = std::make_unique<tcp_store_server>(tcp_store_server::options{host, port, *token, {}});
  }
  tcp_store::options o;
  o.host = host;
  o.port = port;
  o.token = *token;
  o.connect_timeout = timeout;
  o.name = "rank " + std::to_string(w.rank);
  h.client = std::make_shared<tcp_store>(std::move(o));
  // kftrun scopes each restart round's keys, so a restarted job never sees stale values.
  if (auto prefix = env.get("KFT_STORE_PREFIX"); prefix && !prefix->empty())
    h.client = std::make_shared<prefix_store>(h.client, *prefix);
  return h;
}

}  // namespace rendezvous
KFT_NAMESPACE_END
