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
#include <cstdio>
#include <memory>
#include <optional>
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

/// @brief A generation's agreement was given up: survivors of a lost rank (a shrink) and the
/// ranks of a grow (members admitting joiners, and the joiners) met in the same generation, as
/// when a member dies while rank 0 admits a joiner. The decision is written as "void", every
/// rank that reads it learns the same thing, and the generation is skipped: a shrink goes on to
/// the next one by itself; a member that was growing gets this error (the trainer shrinks, as
/// after any lost rank) and a joiner waits to be admitted again.
class generation_void_error : public membership_error {
  using membership_error::membership_error;
};

/// @brief Why a rank takes part in an agreement; filed with its arrival (the decision is
/// "void" when a shrink meets a grow in one generation).
enum class intent : char { shrink = 's', grow = 'g', join = 'j' };

/// @brief Settings of the agreement.
struct shrink_options {
  /// How long a survivor waits for the others after its own arrival before it decides with
  /// those that came (only when fewer came than it expected: a rank it did not know was gone).
  std::chrono::milliseconds window{1000};
  /// The whole agreement's deadline (a store that does not answer).
  std::chrono::milliseconds timeout{30000};
};

/// @brief The membership a group's ranks agreed on. Members are named by their rank in the
/// group as it was first built (its *founding* ranks: a node's local ranks), in every generation,
/// so a rank that rejoins keeps its name.
struct membership {
  std::uint64_t generation = 0;  ///< 1 after the first change (a shrink or a join), 2 after the second, ...
  std::vector<int> members{};    ///< this generation's ranks, by founding rank, ascending
  int rank = 0;                  ///< this rank's place in `members`: its rank in the new group
  int old_size = 0;              ///< the previous generation's size
  std::vector<int> before{};     ///< the previous generation's members (empty: 0..old_size-1)
  int size() const noexcept { return static_cast<int>(members.size()); }
  /// @brief The previous generation's members that are not members now.
  std::vector<int> lost() const { return minus(previous(), members); }
  /// @brief The members that were not in the previous generation (ranks that joined).
  std::vector<int> joined() const { return minus(members, previous()); }
  /// @brief "0,1,3".
  std::string describe() const { return list(members); }
  /// @brief "2,5" (ascending ranks joined by commas; appends: GCC 12 at -O3 misreads
  /// ("" or ",") + string as overlapping copies).
  static std::string list(const std::vector<int>& ranks) {
    std::string s;
    for (int r : ranks) {
      if (!s.empty()) s += ',';
      s += std::to_string(r);
    }
    return s;
  }

 private:
  std::vector<int> previous() const {
    if (!before.empty()) return before;
    std::vector<int> all(static_cast<std::size_t>(std::max(old_size, 0)));
    for (int r = 0; r < old_size; ++r) all[static_cast<std::size_t>(r)] = r;
    return all;
  }
  static std::vector<int> minus(const std::vector<int>& a, const std::vector<int>& b) {
    std::vector<int> out;
    for (int r : a)
      if (std::find(b.begin(), b.end(), r) == b.end()) out.push_back(r);
    return out;
  }
};

namespace detail {
// A generation whose group could not be built (a member lost between the decision and the
// build): marked, so that the survivors' shrink skips it instead of reading its decision again.
inline void mark_failed(rendezvous::store& store, std::string_view scope, std::uint64_t generation) noexcept {
  try {
    store.set("shrink/" + std::string(scope) + "/g" + std::to_string(generation) + "/failed", "1");
  } catch (...) {  // (the store is gone: the shrink that follows fails on it, naming it)
  }
}
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

/// @brief Collective over the ranks of one generation: agrees, through `store`, on the members
/// of generation `generation` (>= 1) of the group called `scope`. `id`: this rank's founding
/// rank (below `id_limit`); `expected`: how many this rank expects to arrive (it decides with
/// those that came after `o.window` when fewer do). The steps are the file comment's.
/// `known_lost` (ids this rank knows are gone) is filed with its arrival, and with `before` (the
/// previous generation's size) every rank expects that size less the ids any arrival knows are
/// gone: a rank that saw nothing (a peer on another node died) decides as soon as the others
/// came, not after the window.
/// `why` is filed with the arrival: arrivals of a shrink and of a grow (or join) in one generation
/// make its decision "void" (generation_void_error); a shrink then agrees on the next
/// generation by itself (the membership returned says which).
/// @throws membership_error when this rank arrived after the decision that left it out
/// @throws generation_void_error for a grow or a join whose generation was given up
/// @throws timeout_error when the store does not answer within `o.timeout`
inline membership agree_on_members(rendezvous::store& store, std::string_view scope, std::uint64_t generation, int id,
                                   int id_limit, std::int64_t expected, const shrink_options& o = {},
                                   std::span<const int> known_lost = {}, int before = 0, intent why = intent::shrink) {
  using clk = std::chrono::steady_clock;
  const auto site = error_site::of("shrink");
  if (id_limit < 1 || id < 0 || id >= id_limit || generation < 1 || expected < 1)
    throw usage_error("agree_on_members: rank " + std::to_string(id) + " of " + std::to_string(id_limit) +
                          ", generation " + std::to_string(generation) + ", " + std::to_string(expected) +
                          " expected (ranks 0..size-1, generation >= 1, at least one expected)",
                      site);
  const auto deadline = clk::now() + o.timeout;
  std::string prefix, decision;
  std::optional<std::string> agreed;
  auto t0 = clk::now();
  // One generation's agreement per turn: a shrink that reads "void" takes the next generation.
  for (;; ++generation) {
    prefix = "shrink/" + std::string(scope) + "/g" + std::to_string(generation) + "/";
    decision = prefix + "members";
    t0 = clk::now();
    if (why == intent::shrink) {  // (given up already, or built by nobody: no arrival)
      if (auto d = store.try_get(decision); d && (*d == "void" || store.try_get(prefix + "failed"))) continue;
    }
    const auto ticket = store.add(prefix + "arrived", 1);
    std::string filed = std::string(1, static_cast<char>(why)) + std::to_string(id);
    if (!known_lost.empty()) filed += ":" + membership::list(std::vector<int>(known_lost.begin(), known_lost.end()));
    store.set(prefix + "arrival/" + std::to_string(ticket), filed);
    // What the arrivals so far said: their ids, and the ids they know are gone.
    std::vector<int> came, gone;
    std::int64_t read = 0;
    auto learn = [&](std::int64_t arrived) {
      for (; read < arrived; ++read) {
        auto v = store.try_get(prefix + "arrival/" + std::to_string(read + 1));
        if (!v) break;  // (filed right after its number: read next time)
        const auto colon = v->find(':');
        for (int r : detail::parse_members(v->substr(1, colon == std::string::npos ? colon : colon - 1), prefix + "arrival"))
          came.push_back(r);
        if (colon != std::string::npos)
          for (int r : detail::parse_members(v->substr(colon + 1), prefix + "arrival")) gone.push_back(r);
      }
      std::int64_t lost = 0;
      std::sort(gone.begin(), gone.end());
      gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
      for (int r : gone) lost += std::find(came.begin(), came.end(), r) == came.end();
      return std::min<std::int64_t>(expected, before - lost);
    };

    auto pause = std::chrono::microseconds(200);
    while (!(agreed = store.try_get(decision))) {
      const auto now = clk::now();
      const auto arrived = store.add(prefix + "arrived", 0);
      const std::int64_t wanted = before > 0 && arrived < expected ? learn(arrived) : expected;
      if (arrived >= wanted || now >= t0 + o.window) {
        // Decide with every rank that took a number so far (one that took it and has not filed
        // its rank yet is alive: it files it right after; wait for it briefly).
        std::vector<int> ranks;
        bool shrinking = false, growing = false;
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
          if (v->empty()) continue;
          const auto colon = v->find(':');
          const auto parsed = detail::parse_members(v->substr(1, colon == std::string::npos ? colon : colon - 1), key);
          if (parsed.size() != 1 || parsed[0] >= id_limit) continue;
          ranks.push_back(parsed[0]);
          ((*v)[0] == static_cast<char>(intent::shrink) ? shrinking : growing) = true;
        }
        std::sort(ranks.begin(), ranks.end());
        ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
        agreed = store.compare_set(decision, std::nullopt, shrinking && growing ? "void" : membership::list(ranks)).current;
        if (agreed) break;
      }
      if (now >= deadline)
        throw timeout_error("agreeing on the members of " + std::string(scope) + " (generation " +
                                std::to_string(generation) + "): no decision within " +
                                kft::detail::describe_duration(o.timeout) + " (" + std::to_string(arrived) + " of " +
                                std::to_string(expected) + " expected ranks arrived; store " + store.describe() + ")",
                            error_site::in({}, id, id_limit, "shrink", generation));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
    }
    if (*agreed != "void") break;
    if (why != intent::shrink)
      throw generation_void_error("rank " + std::to_string(id) + " of " + std::to_string(id_limit) + " in " +
                                      std::string(scope) + ": generation " + std::to_string(generation) +
                                      " was given up (ranks shrinking after a lost rank met ranks " +
                                      (why == intent::join ? "admitting this joiner" : "growing") + " in it)",
                                  error_site::in({}, id, id_limit, why == intent::join ? "join" : "grow", generation));
  }
  membership m;
  m.generation = generation;
  m.members = detail::parse_members(*agreed, decision);
  const auto me = std::find(m.members.begin(), m.members.end(), id);
  if (me == m.members.end())
    throw membership_error("rank " + std::to_string(id) + " of " + std::to_string(id_limit) + " in " +
                               std::string(scope) + " was left out of generation " + std::to_string(generation) +
                               ": the others agreed on ranks " + m.describe() + " before it arrived (" +
                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count()) +
                               " ms after its arrival; shrink_options::window is " +
                               kft::detail::describe_duration(o.window) +
                               " after the first one's); it must leave the job (or join it again as a new rank)",
                           error_site::in({}, id, id_limit, "shrink", generation));
  m.rank = static_cast<int>(me - m.members.begin());
  return m;
}

/// @brief Collective over the survivors: agrees, through `store`, on the survivors of a group of
/// `old_size` ranks called `scope`, for generation `generation` (>= 1). `known_lost`: the ranks
/// this rank knows are gone (what it expects not to arrive). Ranks are the group's own (0..old_size-1).
/// @throws membership_error when this rank arrived after the decision that left it out
/// @throws timeout_error when the store does not answer within `o.timeout`
inline membership agree_on_survivors(rendezvous::store& store, std::string_view scope, std::uint64_t generation,
                                     int old_rank, int old_size, std::span<const int> known_lost,
                                     const shrink_options& o = {}) {
  if (old_size < 1 || old_rank < 0 || old_rank >= old_size || generation < 1)
    throw usage_error("agree_on_survivors: rank " + std::to_string(old_rank) + " of " + std::to_string(old_size) +
                          ", generation " + std::to_string(generation) + " (ranks 0..size-1, generation >= 1)",
                      error_site::of("shrink"));
  std::int64_t lost = 0;
  for (int r : known_lost) lost += r >= 0 && r < old_size && r != old_rank;
  std::vector<int> gone;
  for (int r : known_lost)
    if (r >= 0 && r < old_size && r != old_rank) gone.push_back(r);
  membership m = agree_on_members(store, scope, generation, old_rank, old_size, old_size - lost, o, gone, old_size);
  m.old_size = old_size;
  return m;
}

// ---- growing back: a rank joins a running group (a restarted worker, a spare) ----
//
// Keys under `join/<scope>/` (the same store as the shrinks'):
//   tickets       a counter: each rank that asks to join takes the next number
//   ticket/<t>    the founding rank ticket t asks to join as
//   admit/<t>     "<generation> <expected> <tickets>": the group's answer, written by its rank 0
//                 when it admits ticket t at a step boundary; then the joiners and the members
//                 meet as that generation (agree_on_members) and build the larger group
//   closed        the group finished: a joiner still waiting leaves (join_closed_error)

/// @brief The group a rank asked to join has finished (no more steps to join at): not a
/// failure of the job; a program exits 0 on it.
class join_closed_error : public membership_error {
  using membership_error::membership_error;
};

namespace detail {
inline std::string join_prefix(std::string_view scope) { return "join/" + std::string(scope) + "/"; }
}  // namespace detail

/// @brief How many ranks have asked to join `scope` so far (a counter that only grows; the
/// members compare it with how many they admitted). One store call.
inline std::int64_t join_tickets(rendezvous::store& store, std::string_view scope) {
  return store.add(detail::join_prefix(scope) + "tickets", 0);
}

/// @brief Tells ranks still waiting to join `scope` that the group finished. Rank 0 calls it.
inline void close_joins(rendezvous::store& store, std::string_view scope) {
  store.set(detail::join_prefix(scope) + "closed", "1");
}

/// @brief What a joiner was admitted to.
struct admission {
  std::uint64_t generation = 0;  ///< the generation it meets the members as
  std::int64_t expected = 0;     ///< how many ranks that generation expects
  std::int64_t tickets = 0;      ///< tickets admitted up to and including this round
};

/// @brief The members' side, called by the group's rank 0 only: admits tickets
/// `admitted + 1 .. tickets` to generation `generation` of `expected` ranks.
inline void admit_joiners(rendezvous::store& store, std::string_view scope, std::int64_t admitted,
                          std::int64_t tickets, std::uint64_t generation, std::int64_t expected) {
  const std::string p = detail::join_prefix(scope);
  const std::string value =
      std::to_string(generation) + " " + std::to_string(expected) + " " + std::to_string(tickets);
  for (std::int64_t t = admitted + 1; t <= tickets; ++t) store.set(p + "admit/" + std::to_string(t), value);
}

/// @brief The joiner's side: asks to join `scope` as founding rank `id` (below `id_limit`) and
/// waits, up to `wait`, until the group admits it at a step boundary.
/// @throws join_closed_error when the group finished first; timeout_error after `wait`
inline admission request_to_join(rendezvous::store& store, std::string_view scope, int id, int id_limit,
                                 std::chrono::milliseconds wait, std::int64_t* ticket_out = nullptr);

/// @brief The joiner's side, again: waits, up to `wait`, until ticket `ticket` is admitted to a
/// generation after `after` (its admission to `after` was given up: generation_void_error;
/// the members admit it again at their next step boundary).
/// @throws join_closed_error when the group finished first; timeout_error after `wait`
inline admission await_admission(rendezvous::store& store, std::string_view scope, int id, int id_limit,
                                 std::int64_t ticket, std::uint64_t after, std::chrono::milliseconds wait) {
  using clk = std::chrono::steady_clock;
  const auto site = error_site::in({}, id, id_limit, "join");
  const std::string p = detail::join_prefix(scope);
  const std::string key = p + "admit/" + std::to_string(ticket);
  const auto t0 = clk::now();
  auto pause = std::chrono::microseconds(500);
  while (true) {
    if (auto v = store.try_get(key)) {
      admission a;
      unsigned long long g = 0;
      long long e = 0, t = 0;
      if (std::sscanf(v->c_str(), "%llu %lld %lld", &g, &e, &t) != 3 || g < 1 || e < 1 || t < ticket)
        throw membership_error("store key " + key + " holds '" + *v + "', not '<generation> <expected> <tickets>'", site);
      a.generation = g;
      a.expected = e;
      a.tickets = t;
      if (a.generation > after) return a;
    }
    if (store.try_get(p + "closed"))
      throw join_closed_error("rank " + std::to_string(id) + " asked to join " + std::string(scope) +
                                  " (ticket " + std::to_string(ticket) + "), but the group finished first: nothing is "
                                  "left to train",
                              site);
    if (clk::now() - t0 >= wait)
      throw timeout_error("rank " + std::to_string(id) + " asked to join " + std::string(scope) + " (ticket " +
                              std::to_string(ticket) + ") and was not admitted within " +
                              kft::detail::describe_duration(wait) +
                              " (the group admits joiners at a step boundary while it has lost ranks; store " +
                              store.describe() + ")",
                          site);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

inline admission request_to_join(rendezvous::store& store, std::string_view scope, int id, int id_limit,
                                 std::chrono::milliseconds wait, std::int64_t* ticket_out) {
  const auto site = error_site::in({}, id, id_limit, "join");
  if (id < 0 || id >= id_limit)
    throw usage_error("request_to_join: rank " + std::to_string(id) + " of " + std::to_string(id_limit), site);
  const std::string p = detail::join_prefix(scope);
  const auto ticket = store.add(p + "tickets", 1);
  store.set(p + "ticket/" + std::to_string(ticket), std::to_string(id));
  if (ticket_out) *ticket_out = ticket;
  return await_admission(store, scope, id, id_limit, ticket, 0, wait);
}

/// @brief The joiner's side from the ticket to the membership: asks to join, and meets the
/// members as the generation it is admitted to; a generation given up (a member lost while
/// rank 0 admitted it) is waited out, to the next admission. `wait` bounds the whole.
inline std::pair<admission, membership> join_members(rendezvous::store& store, std::string_view scope, int id,
                                                     int id_limit, std::chrono::milliseconds wait,
                                                     const shrink_options& o) {
  using clk = std::chrono::steady_clock;
  const auto until = clk::now() + wait;
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now()), std::chrono::milliseconds(1));
  };
  std::int64_t ticket = 0;
  admission a = request_to_join(store, scope, id, id_limit, wait, &ticket);
  while (true) {
    try {
      return {a, agree_on_members(store, scope, a.generation, id, id_limit, a.expected, o, {}, 0, intent::join)};
    } catch (const generation_void_error&) {
      a = await_admission(store, scope, id, id_limit, ticket, a.generation, left());
    }
  }
}

/// @brief A shrunk (or grown) shared-memory communicator and the membership it spans.
struct shrunk_shm {
  shm::communicator comm;
  membership members;
};

namespace detail {
// The founding ranks of a communicator's ranks (config::members; empty: its own ranks).
inline std::vector<int> founding_ranks(const shm::communicator& c) {
  const auto& m = c.configuration().members;
  if (!m.empty()) return m;
  std::vector<int> all(static_cast<std::size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) all[static_cast<std::size_t>(r)] = r;
  return all;
}
inline int founding_size(const shm::communicator& c) {
  return c.configuration().founding_size > 0 ? c.configuration().founding_size : c.size();
}
// The communicator of generation `m.generation` over `m.members`.
inline shm::communicator build_generation_once(std::shared_ptr<rendezvous::store> store, shm::config cfg,
                                               const membership& m, int founding) {
  cfg.generation = m.generation;
  cfg.members = m.members;
  cfg.founding_size = founding;
  // Messages keep naming ranks as the job numbers them ("rank 1 (job rank 3)").
  if (cfg.identity.world_rank < 0) cfg.identity.world_rank = m.members[static_cast<std::size_t>(m.rank)];
  if (cfg.identity.world_size < 0) cfg.identity.world_size = founding;
  return shm::communicator(std::move(store), m.rank, m.size(), std::move(cfg));
}
// A build that fails (a member lost before it was ready) marks its generation failed: the
// survivors' shrink then agrees on the next one.
inline shm::communicator build_generation(std::shared_ptr<rendezvous::store> store, shm::config cfg,
                                          const membership& m, int founding) {
  const std::string scope = "shm/" + cfg.name;
  try {
    return build_generation_once(store, std::move(cfg), m, founding);
  } catch (const error&) {
    mark_failed(*store, scope, m.generation);
    throw;
  }
}
}  // namespace detail

/// @brief The agreement scope of a shared-memory communicator's generations.
inline std::string shrink_scope(const shm::config& cfg) { return "shm/" + cfg.name; }

/// @brief Collective over the survivors of `failed` (a communicator whose call failed because a
/// rank died): agrees on the survivors through `store` (the store it was built with, or any
/// store all of them reach) and builds a communicator over them, generation + 1. `failed` is
/// left as it is (destroy or replace it). The membership names ranks by their founding rank.
inline shrunk_shm shrink(shm::communicator& failed, std::shared_ptr<rendezvous::store> store,
                         const shrink_options& o = {}) {
  if (!store) throw usage_error("shrink: no store", error_site::of("shrink"));
  const shm::config& cfg = failed.configuration();
  const auto ids = detail::founding_ranks(failed);
  const int founding = detail::founding_size(failed);
  const auto lost = failed.lost_ranks();
  std::int64_t gone = 0;
  for (int r : lost) gone += r >= 0 && r < failed.size() && r != failed.rank();
  std::vector<int> lost_ids;
  for (int r : lost)
    if (r >= 0 && r < failed.size() && r != failed.rank()) lost_ids.push_back(ids[static_cast<std::size_t>(r)]);
  membership m = agree_on_members(*store, shrink_scope(cfg), cfg.generation + 1, ids[static_cast<std::size_t>(failed.rank())],
                                  founding, failed.size() - gone, o, lost_ids, failed.size());
  m.old_size = failed.size();
  m.before = ids;
  auto comm = detail::build_generation(std::move(store), cfg, m, founding);
  return {std::move(comm), std::move(m)};
}

/// @brief Collective over `current`'s ranks, at a point where all of them are between calls (a
/// step boundary): admits the ranks that asked to join since `admitted` tickets (up to
/// `tickets`, which every rank passes equal: rank 0 read it, e.g. with join_tickets, and
/// broadcast it) and builds the larger communicator with them, generation + 1.
inline shrunk_shm grow(shm::communicator& current, std::shared_ptr<rendezvous::store> store, std::int64_t admitted,
                       std::int64_t tickets, const shrink_options& o = {}) {
  if (!store) throw usage_error("grow: no store", error_site::of("join"));
  if (tickets <= admitted)
    throw usage_error("grow: no ranks to admit (tickets " + std::to_string(admitted) + ".." + std::to_string(tickets) + ")",
                      error_site::of("join"));
  const shm::config& cfg = current.configuration();
  const auto ids = detail::founding_ranks(current);
  const int founding = detail::founding_size(current);
  const std::uint64_t generation = cfg.generation + 1;
  const std::int64_t expected = current.size() + (tickets - admitted);
  if (current.rank() == 0) admit_joiners(*store, shrink_scope(cfg), admitted, tickets, generation, expected);
  membership m = agree_on_members(*store, shrink_scope(cfg), generation, ids[static_cast<std::size_t>(current.rank())],
                                  founding, expected, o, {}, 0, intent::grow);
  m.old_size = current.size();
  m.before = ids;
  auto comm = detail::build_generation(std::move(store), cfg, m, founding);
  return {std::move(comm), std::move(m)};
}

/// @brief A rank joining a running group: asks through `store` to join the group `cfg` names
/// (its name, as the members built it) as founding rank `id` of `founding` ranks, waits up to
/// `wait` to be admitted at a step boundary, then meets the members and builds the larger
/// communicator with them. `tickets` receives how many join tickets the group has admitted.
/// @throws join_closed_error when the group finished first
inline shrunk_shm join(std::shared_ptr<rendezvous::store> store, shm::config cfg, int id, int founding,
                       std::chrono::milliseconds wait, const shrink_options& o = {}, std::int64_t* tickets = nullptr) {
  if (!store) throw usage_error("join: no store", error_site::of("join"));
  const std::string scope = shrink_scope(cfg);
  auto [a, m] = join_members(*store, scope, id, founding, wait, o);
  m.before = m.members;  // (unknown here: everyone else was there before)
  m.before.erase(std::find(m.before.begin(), m.before.end(), id));
  m.old_size = static_cast<int>(m.before.size());
  if (tickets) *tickets = a.tickets;
  auto comm = detail::build_generation(std::move(store), std::move(cfg), m, founding);
  return {std::move(comm), std::move(m)};
}

}  // namespace group
KFT_NAMESPACE_END
