// SPDX-License-Identifier: Apache-2.0
/// @file kft/group/shrink.hpp
/// @brief Going on without a lost rank: the survivors of a group agree, through the job's
/// store, on one new membership, and build a smaller group over it without restarting any
/// process (what NCCL 2.27's `ncclCommShrink` and PyTorch's `shrink_group` do for NCCL, and
/// torchft's quorum for replica groups).
///
///     try {
///       comm.allreduce(grads, kft::ops::sum);
///     } catch (const kft::remote_error& e) {          // "rank 2 (pid 4242) died during ..."
///       auto next = kft::group::shrink(comm, job.store());
///       comm = std::move(next.comm);                 // 3 ranks now; next.members says who
///     }
///
/// **The agreement** (`agree_on_survivors`), generation g of a group named n, keys under
/// `shrink/<n>/g<g>/`:
///  1. each survivor takes an arrival number (`add`) and files its old rank under it;
///  2. it waits until as many have arrived as it expects (the group's size less the ranks it
///     knows are gone), or until `window` has passed since its own arrival (a rank it did not
///     know was gone never comes), or until the decision exists;
///  3. the first survivor to decide writes the membership, every survivor that arrived so far,
///     with a compare-and-set on an absent key: exactly one decision is ever written, and every
///     survivor reads that one;
///  4. a survivor not in it (it arrived after the decision) gets a `membership_error` naming
///     the membership and the window: one job goes on, never two.
/// The store is the arbiter: survivors that disagree about who is gone (a cut link between two
/// of them) still read one decision. The decision is a list of the old ranks; the new rank of a
/// survivor is its place in it, so the old order is kept.
///
/// **Detection** is the transport's: the shared-memory communicator looks at its peers'
/// processes while it waits (every 100 ms) and fails the call with a `remote_error` naming the
/// rank that died; `lost_ranks()` lists the ranks whose processes are gone. A group whose
/// store is gone (rank 0 hosted it: a job started by hand) cannot agree: the agreement fails
/// with the store's error, and the job falls back to a restart.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/core/parse.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/shm/communicator.hpp>

KFT_NAMESPACE_BEGIN
namespace group {

/// @brief A survivor was left out of the membership the others agreed on, or the agreement
/// could not be reached.
class membership_error : public error {
  using error::error;
};

/// @brief Settings of the agreement.
struct shrink_options {
  /// How long a survivor waits for the others after its own arrival before it decides with
  /// those that came (only when fewer came than it expected: a rank it did not know was gone).
  std::chrono::milliseconds window{1000};
  /// The whole agreement's deadline (a store that does not answer).
  std::chrono::milliseconds timeout{30000};
};

/// @brief The membership the survivors agreed on.
struct membership {
  std::uint64_t generation = 0;  ///< 1 after the first shrink, 2 after the second, ...
  std::vector<int> members;      ///< the survivors' ranks in the old group, ascending
  int rank = 0;                  ///< this rank's place in `members`: its rank in the new group
  int old_size = 0;              ///< the old group's size
  int size() const noexcept { return static_cast<int>(members.size()); }
  /// @brief The old group's ranks that are not members.
  std::vector<int> lost() const {
    std::vector<int> out;
    for (int r = 0; r < old_size; ++r)
      if (!std::binary_search(members.begin(), members.end(), r)) out.push_back(r);
    return out;
  }
  /// @brief "0,1,3".
  std::string describe() const {
    std::string s;
    for (int r : members) {
      if (!s.empty()) s += ",";
      s += std::to_string(r);
    }
    return s;
  }
};

namespace detail {
inline std::vector<int> parse_members(const std::string& text, const std::string& key) {
  std::vector<int> out;
  if (text.empty()) return out;
  try {
    for (auto piece : kft::detail::split(text, ','))
      out.push_back(static_cast<int>(kft::detail::parse_integer("rank", piece, 0, 1 << 30, key)));
  } catch (const config_error&) {
    throw membership_error("store key " + key + " holds '" + text + "', not a list of ranks", error_site::of("shrink"));
  }
  return out;
}
}  // namespace detail

/// @brief Collective over the survivors: agrees, through `store`, on the survivors of a group of
/// `old_size` ranks called `scope`, for generation `generation` (>= 1). `known_lost`: the ranks
/// this rank knows are gone (what it expects not to arrive).
/// @throws membership_error when this rank arrived after the decision that left it out
/// @throws timeout_error when the store does not answer within `o.timeout`
inline membership agree_on_survivors(rendezvous::store& store, std::string_view scope, std::uint64_t generation,
                                     int old_rank, int old_size, std::span<const int> known_lost,
                                     const shrink_options& o = {}) {
  using clk = std::chrono::steady_clock;
  const auto site = error_site::of("shrink");
  if (old_size < 1 || old_rank < 0 || old_rank >= old_size || generation < 1)
    throw usage_error("agree_on_survivors: rank " + std::to_string(old_rank) + " of " + std::to_string(old_size) +
                          ", generation " + std::to_string(generation) + " (ranks 0..size-1, generation >= 1)",
                      site);
  const std::string prefix = "shrink/" + std::string(scope) + "/g" + std::to_string(generation) + "/";
  const std::string decision = prefix + "members";
  const auto t0 = clk::now();
  const auto deadline = t0 + o.timeout;
  const auto ticket = store.add(prefix + "arrived", 1);
  store.set(prefix + "arrival/" + std::to_string(ticket), std::to_string(old_rank));
  std::int64_t lost = 0;
  for (int r : known_lost) lost += r >= 0 && r < old_size && r != old_rank;
  const std::int64_t expected = old_size - lost;

  std::optional<std::string> agreed;
  auto pause = std::chrono::microseconds(200);
  while (!(agreed = store.try_get(decision))) {
    const auto now = clk::now();
    const auto arrived = store.add(prefix + "arrived", 0);
    if (arrived >= expected || now >= t0 + o.window) {
      // Decide with every survivor that took a number so far (one that took it and has not
      // filed its rank yet is alive: it files it right after; wait for it briefly).
      std::vector<int> ranks;
      for (std::int64_t k = 1; k <= arrived; ++k) {
        const std::string key = prefix + "arrival/" + std::to_string(k);
        auto v = store.try_get(key);
        if (!v) {
          try {
            v = store.get(key, std::chrono::milliseconds(200));
          } catch (const timeout_error&) {
            continue;  // it died between its number and its rank: not a member
          }
        }
        const auto parsed = detail::parse_members(*v, key);
        if (parsed.size() == 1 && parsed[0] < old_size) ranks.push_back(parsed[0]);
      }
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      std::string text;
      for (int r : ranks) {  // (appends: GCC 12 at -O3 misreads ("" or ",") + string as overlapping copies)
        if (!text.empty()) text += ',';
        text += std::to_string(r);
      }
      agreed = store.compare_set(decision, std::nullopt, text).current;
      if (agreed) break;
    }
    if (now >= deadline)
      throw timeout_error("agreeing on the survivors of " + std::string(scope) + " (generation " +
                              std::to_string(generation) + "): no decision within " +
                              kft::detail::describe_duration(o.timeout) + " (" + std::to_string(arrived) + " of " +
                              std::to_string(expected) + " expected survivors arrived; store " + store.describe() + ")",
                          error_site::in({}, old_rank, old_size, "shrink", generation));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  membership m;
  m.generation = generation;
  m.old_size = old_size;
  m.members = detail::parse_members(*agreed, decision);
  const auto me = std::find(m.members.begin(), m.members.end(), old_rank);
  if (me == m.members.end())
    throw membership_error("rank " + std::to_string(old_rank) + " of " + std::to_string(old_size) + " in " +
                               std::string(scope) + " was left out of generation " + std::to_string(generation) +
                               ": the survivors agreed on ranks " + m.describe() + " before it arrived (" +
                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count()) +
                               " ms after its arrival; shrink_options::window is " +
                               kft::detail::describe_duration(o.window) +
                               " after the first survivor's); it must leave the job (or join it again as a new rank)",
                           error_site::in({}, old_rank, old_size, "shrink", generation));
  m.rank = static_cast<int>(me - m.members.begin());
  return m;
}

/// @brief A shrunk shared-memory communicator and the membership it spans.
struct shrunk_shm {
  shm::communicator comm;
  membership members;
};

/// @brief Collective over the survivors of `failed` (a communicator whose call failed because a
/// rank died): agrees on the survivors through `store` (the store it was built with, or any
/// store all of them reach) and builds a communicator over them, generation + 1. `failed` is
/// left as it is (destroy or replace it).
inline shrunk_shm shrink(shm::communicator& failed, std::shared_ptr<rendezvous::store> store,
                         const shrink_options& o = {}) {
  if (!store) throw usage_error("shrink: no store", error_site::of("shrink"));
  shm::config cfg = failed.configuration();
  const std::uint64_t generation = cfg.generation + 1;
  const auto lost = failed.lost_ranks();
  membership m = agree_on_survivors(*store, "shm/" + cfg.name, generation, failed.rank(), failed.size(), lost, o);
  cfg.generation = generation;
  // Messages keep naming ranks as the job numbers them ("rank 1 (job rank 3)").
  if (cfg.identity.world_rank < 0) cfg.identity.world_rank = failed.rank();
  if (cfg.identity.world_size < 0) cfg.identity.world_size = failed.size();
  return {shm::communicator(std::move(store), m.rank, m.size(), std::move(cfg)), std::move(m)};
}

}  // namespace group
KFT_NAMESPACE_END
