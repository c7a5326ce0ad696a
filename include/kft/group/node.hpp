// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/node.hpp
/// @brief The communicator of this process's node, built from what discovery found, with the
/// environment's shared-memory settings and the job's timeout applied (the transport itself
/// reads no environment).
///
///     auto me = kft::discover();
///     auto store = kft::rendezvous::connect_store(me);
///     auto node = kft::group::node_communicator(store.client, me);   // the ranks on this host
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <kft/core/environment.hpp>
#include <kft/core/parse.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/shm/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief `base` with `KFT_SHM_TUNING` (a file of this machine's measured sizes and crossovers,
/// written by `bench/scripts/tune_shm.py`: `shm::parse_tuning`; its crossover rows go before base's),
/// then `KFT_SHM_STAGING_BYTES`, `KFT_SHM_SMALL_BYTES` and `KFT_SHM_STREAMING_BYTES` applied
/// (like NCCL_BUFFSIZE: buffers resized without recompiling; all ranks must see the same values,
/// which the segment header checks), `KFT_SHM_HUGE_PAGES` (`auto`, `1`, `0`: config::huge_pages),
/// `KFT_SHM_REGION_ALIGN` (bytes, 0 for the default: config::region_align_bytes),
/// `KFT_PROGRESS_AFFINITY` (`auto`: the progress thread
/// bound to the local rank's CPU, the default; `none`: left to the scheduler), and `KFT_TIMEOUT`
/// to `timeout` where base holds the default (`apply_timeout`: a timeout the program set stays).
/// @throws config_error naming a malformed or out-of-range variable, an unreadable tuning file,
/// or the line of the file at fault
inline shm::config shm_config(const environment& env, shm::config base = {}) {
  constexpr std::string_view ctx = "shm communicator";
  if (auto path = env.get("KFT_SHM_TUNING"); path && !path->empty()) {
    auto unreadable = [&](const std::string& why) {
      return config_error("KFT_SHM_TUNING", *path, "cannot be read: " + why + " (bench/scripts/tune_shm.py writes one)",
                          error_site::of("shm tuning"));
    };
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*path, ec)) throw unreadable(ec ? ec.message() : "not a regular file");
    std::ifstream in(*path, std::ios::binary);
    if (!in.is_open()) throw unreadable(std::strerror(errno));
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) throw unreadable(std::strerror(errno));
    const shm::tuning t = shm::parse_tuning(text.str(), *path);
    if (t.staging_bytes) base.staging_bytes = *t.staging_bytes;
    if (t.small_bytes) base.small_bytes = *t.small_bytes;
    if (t.streaming_bytes) base.streaming_bytes = *t.streaming_bytes;
    if (t.copy_streaming_bytes) base.copy_streaming_bytes = *t.copy_streaming_bytes;
    std::vector<shm::crossover> rows = t.crossovers;
    rows.insert(rows.end(), base.crossovers.begin(), base.crossovers.end());
    base.crossovers = shm::keep_table(std::move(rows));
  }
  if (auto v = env_int(env, "KFT_SHM_STAGING_BYTES", 4096, 1 << 30, ctx)) base.staging_bytes = static_cast<std::size_t>(*v);
  if (auto v = env_int(env, "KFT_SHM_SMALL_BYTES", 64, 1 << 26, ctx)) base.small_bytes = static_cast<std::size_t>(*v);
  if (auto v = env_int(env, "KFT_SHM_STREAMING_BYTES", 0, 1 << 30, ctx)) base.streaming_bytes = static_cast<std::size_t>(*v);
  if (auto v = env_int(env, "KFT_SHM_COPY_STREAMING_BYTES", 0, std::numeric_limits<int>::max(), ctx))
    base.copy_streaming_bytes = static_cast<std::size_t>(*v);
  if (auto v = env.get("KFT_SHM_HUGE_PAGES"); v && !v->empty()) {
    if (*v != "auto" && *v != "0" && *v != "1")
      throw config_error("KFT_SHM_HUGE_PAGES", *v,
                         "is not 'auto' (2 MiB pages when the zero-copy pool is 8 MiB or more), '1' (always) or "
                         "'0' (never)",
                         error_site::of(std::string(ctx)));
    base.huge_pages = *v == "auto" ? -1 : (*v == "1" ? 1 : 0);
  }
  if (auto v = env_int(env, "KFT_SHM_REGION_ALIGN", 0, 1 << 30, ctx)) base.region_align_bytes = static_cast<std::size_t>(*v);
  if (auto v = env.get("KFT_PROGRESS_AFFINITY"); v && !v->empty()) {
    if (*v != "auto" && *v != "none")
      throw config_error("KFT_PROGRESS_AFFINITY", *v,
                         "is not 'auto' (bind each local rank's progress thread to its own CPU) or 'none'",
                         error_site::of(std::string(ctx)));
    base.bind_progress_thread = *v == "auto";
  }
  apply_timeout(base.timeout, timeouts(env));
  return base;
}

/// @brief The communicator of this process's node: ranks on the same host (by the discovered
/// local view), meeting under "node/<hostname>/<node>/" in the job's store. The segment is
/// named after the job's run id (`KFT_RUN_ID` / `TORCHELASTIC_RUN_ID`) plus random bytes, and
/// `KFT_SHM_*` and `KFT_TIMEOUT` apply (`shm_config`).
/// @throws usage_error when the launcher did not say which ranks share this node
/// @brief The node's shared-memory settings: `cfg` with the environment's (`KFT_SHM_*`), the
/// segment named after the job, and the node's place in the job for messages.
inline shm::config node_config(const world_info& w, shm::config cfg, const environment& env = environment::process()) {
  cfg = shm_config(env, std::move(cfg));
  if (cfg.name == "kft") {  // name the segment after the job, as launchers know it
    if (auto id = env.get("KFT_RUN_ID").value_or(env.get("TORCHELASTIC_RUN_ID").value_or("")); !id.empty())
      cfg.name = "kft-" + id;
  }
  if (cfg.identity.world_size < 0 && w.local_size && w.world_size != *w.local_size) {
    cfg.identity.world_rank = w.rank;
    cfg.identity.world_size = w.world_size;
    cfg.identity.label = "node " + std::to_string(w.node_rank.value_or(0));
  }
  return cfg;
}

inline shm::communicator node_communicator(std::shared_ptr<rendezvous::store> store, const world_info& w,
                                           shm::config cfg = {}, const environment& env = environment::process()) {
  if (!w.local_rank || !w.local_size)
    throw usage_error("the local view is unknown (backend " + w.backend +
                          "): cannot tell which ranks share this node; launch with kftrun, mpirun or srun",
                      error_site::of("shm init"));
  cfg = node_config(w, std::move(cfg), env);
  auto scoped = std::make_shared<rendezvous::prefix_store>(std::move(store), "node/" + w.hostname + "/" +
                                                                                 std::to_string(w.node_rank.value_or(0)) + "/");
  return shm::communicator(std::move(scoped), *w.local_rank, *w.local_size, std::move(cfg));
}

}  // namespace group
KFT_NAMESPACE_END
