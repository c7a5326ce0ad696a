// SPDX-License-Identifier: Apache-2.0
// kft-trace's reading of the flight recorder's dumps (kft/core/flight_recorder.hpp): every
// rank's `rank<R>.jsonl`, put side by side to name what went wrong and which rank did it.
//
// What it finds, group by group (a group's calls are numbered alike on every rank):
//   - the first divergent call: the same sequence number with a different collective, dtype,
//     count or root on some ranks (a skipped call, a mismatched size);
//   - the call the group is stuck in: the lowest sequence number some rank had not finished,
//     with who is inside it, who never entered it (and where that rank is instead), who
//     finished it, and who wrote no dump;
//   - the chain of waits: each dump says which ranks its failed call waited for (or which rank
//     failed it), so "rank 1 waited for rank 0, which waited for rank 2, which waited for
//     rank 3" is followed to its end: the rank at fault (stopped, dead, elsewhere).
// The culprits: the ranks of a divergent call's smaller side, else the chains' ends, else the
// ranks that never entered the stuck call or wrote no dump.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace kft_trace {

namespace fs = std::filesystem;
using nlohmann::json;

/// @brief Bad input: a file that is not a dump, a line that is not JSON. Names the file and line.
struct bad_input : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct call {
  std::string group;
  std::int64_t generation = 0;
  std::uint64_t seq = 0, seq_last = 0;  // identical calls in a row share an entry: seq..seq_last
  std::int64_t calls = 1;
  std::string op, dtype, algorithm, state;
  std::int64_t count = 0, root = -1;
  std::int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;
  bool timed = true;
  bool finished() const { return state == "completed"; }
};

struct group_place {
  std::string group;  // the group's id, the same on every rank
  std::string name;   // its description on this rank
  std::int64_t rank = -1, size = -1;
};

struct dump {
  std::string file;
  int rank = -1, world_size = -1;
  std::string host, why, error;
  std::int64_t pid = 0, now_ns = 0, unix_ms = 0;
  std::vector<int> waiting_for;  // whom the failed call waited for (or was failed by)
  std::vector<int> waiting_now;  // whom a call in flight waited for when the dump was taken
  std::vector<group_place> groups;
  std::vector<call> calls;
};

namespace detail {

template <class T>
T field(const json& j, const char* key, const std::string& where, bool required = true, T fallback = T{}) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw bad_input(where + ": no \"" + key + "\" field");
    return fallback;
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw bad_input(where + ": \"" + key + "\" is " + it->dump() + ", not the expected type");
  }
}

inline std::string join(const std::vector<int>& v, const char* sep = ", ") {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : sep) + std::to_string(x);
  return s;
}

}  // namespace detail

/// @brief Reads one dump. Throws `bad_input` naming `name` and the line at fault.
inline dump parse(std::istream& in, const std::string& name) {
  dump d;
  d.file = name;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const std::string where = name + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      throw bad_input(where + ": not JSON (" + std::string(e.what()) + ")");
    }
    if (!j.is_object()) throw bad_input(where + ": not a JSON object");
    if (n == 1) {
      if (!j.contains("kft_trace")) throw bad_input(where + ": not a kft flight-recorder dump (no \"kft_trace\" field)");
      if (detail::field<int>(j, "kft_trace", where) != 1)
        throw bad_input(where + ": format " + j["kft_trace"].dump() + " (this kft-trace reads format 1)");
      d.rank = detail::field<int>(j, "rank", where);
      d.world_size = detail::field<int>(j, "world_size", where);
      d.host = detail::field<std::string>(j, "host", where, false);
      d.pid = detail::field<std::int64_t>(j, "pid", where, false);
      d.why = detail::field<std::string>(j, "why", where);
      d.now_ns = detail::field<std::int64_t>(j, "now_ns", where);
      d.unix_ms = detail::field<std::int64_t>(j, "unix_ms", where, false);
      d.error = detail::field<std::string>(j, "error", where, false);
      d.waiting_for = detail::field<std::vector<int>>(j, "waiting_for", where, false);
      d.waiting_now = detail::field<std::vector<int>>(j, "waiting_now", where, false);
      continue;
    }
    if (!j.contains("op")) {  // a group's line
      group_place g;
      g.name = detail::field<std::string>(j, "group", where);
      g.group = detail::field<std::string>(j, "group_id", where, false, g.name);
      g.rank = detail::field<std::int64_t>(j, "group_rank", where);
      g.size = detail::field<std::int64_t>(j, "group_size", where);
      d.groups.push_back(std::move(g));
      continue;
    }
    call c;
    c.group = j.contains("group_id") ? detail::field<std::string>(j, "group_id", where)
                                     : detail::field<std::string>(j, "group", where);
    c.generation = detail::field<std::int64_t>(j, "generation", where);
    c.seq = detail::field<std::uint64_t>(j, "seq", where);
    c.seq_last = detail::field<std::uint64_t>(j, "seq_last", where, false, c.seq);
    c.calls = detail::field<std::int64_t>(j, "calls", where, false, 1);
    if (c.seq_last < c.seq) throw bad_input(where + ": \"seq_last\" is below \"seq\"");
    c.op = detail::field<std::string>(j, "op", where);
    c.dtype = detail::field<std::string>(j, "dtype", where);
    c.count = detail::field<std::int64_t>(j, "count", where);
    c.root = detail::field<std::int64_t>(j, "root", where);
    c.algorithm = detail::field<std::string>(j, "algorithm", where, false);
    c.state = detail::field<std::string>(j, "state", where);
    c.enqueue_ns = detail::field<std::int64_t>(j, "enqueue_ns", where, false);
    c.start_ns = detail::field<std::int64_t>(j, "start_ns", where, false);
    c.end_ns = detail::field<std::int64_t>(j, "end_ns", where, false);
    c.timed = detail::field<bool>(j, "timed", where, false, true);
    d.calls.push_back(std::move(c));
  }
  if (n == 0) throw bad_input(name + ": empty (a dump's first line describes the process)");
  return d;
}

/// @brief Every `rank<R>.jsonl` in `dir` (a dump being written, `.rank<R>.jsonl.<pid>`, is not
/// one). Throws `bad_input` for a missing directory, one with no dump, or two dumps of a rank.
inline std::vector<dump> read_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw bad_input(dir.string() + ": not a directory");
  std::vector<dump> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (!f.starts_with("rank") || !f.ends_with(".jsonl")) continue;
    std::ifstream in(e.path());
    if (!in) throw bad_input(e.path().string() + ": cannot be read");
    out.push_back(parse(in, e.path().string()));
  }
  if (out.empty())
    throw bad_input(dir.string() + ": no flight-recorder dumps (rank<R>.jsonl) in it; is it the job's KFT_TRACE_DIR?");
  std::sort(out.begin(), out.end(), [](const dump& a, const dump& b) { return a.rank < b.rank; });
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i].rank == out[i - 1].rank)
      throw bad_input(out[i].file + " and " + out[i - 1].file + " both say they are rank " + std::to_string(out[i].rank));
  return out;
}

/// @brief Puts the dumps side by side: the report kft-trace prints (as JSON with --json).
inline json analyze(const std::vector<dump>& dumps) {
  json report;
  std::map<int, const dump*> by_rank;
  int world = 0;
  std::int64_t newest_ms = 0;
  for (const auto& d : dumps) {
    by_rank[d.rank] = &d;
    world = std::max({world, d.world_size, d.rank + 1});
    newest_ms = std::max(newest_ms, d.unix_ms);
  }
  report["world_size"] = world;
  json listed = json::array();
  for (const auto& d : dumps)
    listed.push_back({{"rank", d.rank}, {"host", d.host}, {"pid", d.pid}, {"why", d.why}, {"file", d.file},
                      {"before_newest_s", static_cast<double>(newest_ms - d.unix_ms) / 1000.0},
                      {"error", d.error}, {"waiting_for", d.waiting_for}, {"waiting_now", d.waiting_now}});
  report["dumps"] = listed;
  std::vector<int> no_dump;
  for (int r = 0; r < world; ++r)
    if (!by_rank.count(r)) no_dump.push_back(r);
  report["no_dump"] = no_dump;

  // -- group by group: the first divergent call, the call the group is stuck in ------------------
  struct key_t {
    std::string group;
    std::int64_t generation;
    bool operator<(const key_t& o) const { return std::tie(group, generation) < std::tie(o.group, o.generation); }
  };
  std::map<key_t, std::map<int, std::vector<const call*>>> groups;  // (group, generation) -> rank -> calls
  for (const auto& d : dumps)
    for (const auto& c : d.calls) groups[{c.group, c.generation}][d.rank].push_back(&c);

  json culprits = json::array();
  std::set<int> named;
  auto name_culprit = [&](int rank, const std::string& why) {
    if (named.insert(rank).second) culprits.push_back({{"rank", rank}, {"why", why}});
  };
  auto describe_call = [](const call& c) {  // (the last call of a folded entry)
    std::string s = c.op + " #" + std::to_string(c.seq_last) + " (" + c.dtype + " x " + std::to_string(c.count);
    if (c.root >= 0) s += ", root " + std::to_string(c.root);
    return s + ")";
  };

  json group_reports = json::array();
  std::vector<std::pair<std::string, int>> divergent;  // (what, rank) for the culprits, in order
  std::set<int> not_entered_any, inside_any;
  for (const auto& [key, ranks] : groups) {
    json g{{"group", key.group}, {"generation", key.generation}};
    std::int64_t size = -1;
    std::string description;
    for (const auto& [r, calls] : ranks)
      for (const auto& p : by_rank[r]->groups)
        if (p.group == key.group) {
          size = std::max(size, p.size);
          if (description.empty()) description = p.name;
        }
    g["description"] = description;
    g["size"] = size;
    std::vector<int> members;
    for (const auto& [r, calls] : ranks) members.push_back(r);
    g["ranks"] = members;
    // A group of the whole job (as many ranks as the job): who should have written it and did not.
    std::vector<int> absent;
    if (size == world)
      for (int r : no_dump) absent.push_back(r);
    g["no_dump"] = absent;
    if (size > 0 && static_cast<std::int64_t>(members.size() + absent.size()) < size)
      g["no_dump_count"] = size - static_cast<std::int64_t>(members.size());

    // The first call numbered alike whose collective, dtype, count or root differ.
    // Entries cover seq..seq_last; shapes change only where some rank's entry starts, so the
    // ranks are compared at every entry's first number, each through its entry covering it.
    std::set<std::uint64_t> starts_at;
    for (const auto& [r, calls] : ranks)
      for (const call* c : calls) starts_at.insert(c->seq);
    auto covering = [](const std::vector<const call*>& calls, std::uint64_t seq) -> const call* {
      // (a ring's entries are in call order: the last one starting at or before seq)
      auto it = std::upper_bound(calls.begin(), calls.end(), seq, [](std::uint64_t v, const call* c) { return v < c->seq; });
      if (it == calls.begin()) return nullptr;
      const call* c = *(it - 1);
      return seq <= c->seq_last ? c : nullptr;
    };
    g["divergence"] = nullptr;
    for (const std::uint64_t seq : starts_at) {
      std::vector<std::pair<int, const call*>> at;
      for (const auto& [r, calls] : ranks)
        if (const call* c = covering(calls, seq)) at.push_back({r, c});
      std::map<std::tuple<std::string, std::string, std::int64_t, std::int64_t>, std::vector<int>> shapes;
      for (const auto& [r, c] : at) shapes[{c->op, c->dtype, c->count, c->root}].push_back(r);
      if (shapes.size() < 2) continue;
      json calls = json::array();
      std::size_t most = 0;
      for (const auto& [s, rs] : shapes) most = std::max(most, rs.size());
      bool tie = false;
      {
        int at_most = 0;
        for (const auto& [s, rs] : shapes) at_most += rs.size() == most;
        tie = at_most > 1;
      }
      std::string majority;
      for (const auto& [s, rs] : shapes) {
        const auto& [op, dt, count, root] = s;
        calls.push_back({{"op", op}, {"dtype", dt}, {"count", count}, {"root", root}, {"ranks", rs}});
        if (rs.size() == most && !tie) {
          call c;
          c.op = op, c.dtype = dt, c.count = count, c.root = root, c.seq = c.seq_last = seq;
          majority = "rank(s) " + detail::join(rs) + " called " + describe_call(c);
        }
      }
      g["divergence"] = {{"seq", seq}, {"calls", calls}};
      for (const auto& [s, rs] : shapes) {
        if (rs.size() == most && !tie) continue;
        const auto& [op, dt, count, root] = s;
        call c;
        c.op = op, c.dtype = dt, c.count = count, c.root = root, c.seq = c.seq_last = seq;
        for (int r : rs)
          divergent.push_back({"called " + describe_call(c) + (majority.empty() ? "" : " where " + majority) +
                                   " (group \"" + key.group + "\": the first call where the ranks differ)",
                               r});
      }
      break;
    }

    // The call the group is stuck in: the lowest-numbered call some rank had not finished.
    std::map<int, const call*> pending, last;
    for (const auto& [r, calls] : ranks) {
      last[r] = calls.back();
      for (const call* c : calls)
        if (!c->finished()) {
          pending[r] = c;
          break;
        }
    }
    g["stuck"] = nullptr;
    if (!pending.empty()) {
      const call* stuck = nullptr;
      for (const auto& [r, c] : pending)
        if (!stuck || c->seq_last < stuck->seq_last) stuck = c;
      json inside = json::array(), not_entered = json::array(), finished = json::array();
      for (const auto& [r, calls] : ranks) {
        const dump& d = *by_rank[r];
        const auto p = pending.find(r);
        if (p != pending.end() && p->second->seq_last == stuck->seq_last) {
          const call& c = *p->second;
          // How long it has been inside: from its start (one call), or from the last end the
          // recorder read (a folded entry keeps its first call's start).
          const bool folded = c.calls > 1 && c.end_ns > 0;
          const std::int64_t from = folded ? c.end_ns : c.start_ns;
          const std::int64_t to = !folded && c.end_ns ? c.end_ns : d.now_ns;
          inside.push_back({{"rank", r}, {"state", c.state}, {"op", c.op},
                            {"for_s", from ? static_cast<double>(to - from) / 1e9 : 0.0}});
          inside_any.insert(r);
        } else if (last[r]->seq_last < stuck->seq_last) {
          const call& c = *last[r];
          not_entered.push_back({{"rank", r}, {"last_seq", c.seq_last}, {"last_op", c.op}, {"last_state", c.state},
                                 {"last", describe_call(c)}});
          not_entered_any.insert(r);
        } else {
          finished.push_back(r);
        }
      }
      g["stuck"] = {{"seq", stuck->seq_last}, {"op", stuck->op}, {"dtype", stuck->dtype}, {"count", stuck->count},
                    {"call", describe_call(*stuck)}, {"inside", inside}, {"not_entered", not_entered},
                    {"finished", finished}};
    }
    group_reports.push_back(std::move(g));
  }
  report["groups"] = group_reports;

  // -- the chains of waits ---------------------------------------------------------------------
  // Each dump says whom its rank waited for: `waiting_now` (a call in flight when it dumped) or
  // `waiting_for` (the call that failed). From every rank no one waits for, the links are
  // followed breadth first (each rank once: a dense job stays linear) to their ends: a rank with
  // no dump, or one that waits for no one. One chain is reported per end: the first path found.
  auto links = [&](int r) -> std::vector<int> {
    const auto it = by_rank.find(r);
    if (it == by_rank.end()) return {};
    return it->second->waiting_now.empty() ? it->second->waiting_for : it->second->waiting_now;
  };
  std::set<int> waited_for;
  for (const auto& d : dumps)
    for (int w : links(d.rank)) waited_for.insert(w);
  std::vector<int> starts;
  for (const auto& d : dumps)
    if (!links(d.rank).empty() && !waited_for.count(d.rank)) starts.push_back(d.rank);
  if (starts.empty())  // (every rank that waits is waited for: a cycle; start from the lowest)
    for (const auto& d : dumps)
      if (!links(d.rank).empty()) {
        starts.push_back(d.rank);
        break;
      }
  std::map<int, int> parent;  // rank -> the rank that reached it first (-1: a start)
  std::vector<int> queue;
  for (int r : starts) {
    parent.emplace(r, -1);
    queue.push_back(r);
  }
  std::vector<int> ends;
  for (std::size_t i = 0; i < queue.size(); ++i) {
    const int at = queue[i];
    const auto next = links(at);
    if (next.empty()) {
      if (parent[at] != -1) ends.push_back(at);
      continue;
    }
    for (int w : next)
      if (parent.emplace(w, at).second) queue.push_back(w);
  }
  std::map<int, std::string> end_note;  // chain end -> what the rank before it said of it
  auto note_end = [&](int e, int before_rank) {
    const auto before = by_rank.find(before_rank);
    if (before != by_rank.end() && !end_note.count(e))
      end_note[e] = before->second->error.empty() ? "(a dump of a call in flight: " + before->second->why + ")"
                                                  : before->second->error;
  };
  for (int e : ends) note_end(e, parent[e]);
  // The chains shown: from each start, one walk to an end, preferring a rank with no dump, then
  // one that waits in turn (at most 16 chains; the ends above are complete either way).
  json chains = json::array();
  for (int st : starts) {
    if (chains.size() == 16) break;
    std::vector<int> path{st};
    std::set<int> on_path{st};
    for (;;) {
      int pick = -1, rank_of_pick = 3;
      for (int w : links(path.back())) {
        if (on_path.count(w)) continue;
        const int rank_of = !by_rank.count(w) ? 0 : !links(w).empty() ? 1 : 2;
        if (rank_of < rank_of_pick) pick = w, rank_of_pick = rank_of;
      }
      if (pick < 0) break;
      path.push_back(pick);
      on_path.insert(pick);
    }
    if (path.size() < 2) continue;
    if (links(path.back()).empty()) note_end(path.back(), path[path.size() - 2]);
    chains.push_back(path);
  }
  report["chains"] = chains;

  // -- the culprits ----------------------------------------------------------------------------
  for (const auto& [why, r] : divergent) name_culprit(r, why);
  if (culprits.empty()) {
    // A chain's end that wrote no dump or never entered the call is at fault; one inside the
    // call that names no one it waited for is named only when no chain ends better.
    std::vector<std::pair<int, std::string>> strong, weak;
    for (int r : ends) {
      const auto it = by_rank.find(r);
      if (it == by_rank.end())
        strong.push_back({r, "wrote no dump (stopped, killed, or hung outside kft's calls); the rank waiting for it said: " +
                                 end_note[r]});
      else if (not_entered_any.count(r))
        strong.push_back({r, "never entered the call the others wait in (its dump: \"" + it->second->why + "\")"});
      else
        weak.push_back({r, "the end of the chain of waits: its dump (\"" + it->second->why + "\") waits for no one" +
                               (it->second->error.empty() ? "" : "; its error: " + it->second->error)});
    }
    for (const auto& [r, why] : strong.empty() ? weak : strong) name_culprit(r, why);
    // A rank of the whole job that wrote no dump while the others are stuck is at fault too,
    // even when no one's wait points at it (two ranks of a host stopped: the others' waits may
    // all lead to one of them).
    if (!strong.empty())
      for (const auto& g : group_reports)
        if (!g["stuck"].is_null())
          for (int r : g["no_dump"].get<std::vector<int>>())
            name_culprit(r, "wrote no dump (stopped, killed, or hung outside kft's calls) while the others are inside " +
                                g["stuck"]["call"].get<std::string>());
  }
  if (culprits.empty()) {
    for (const auto& g : group_reports) {
      if (g["stuck"].is_null()) continue;
      for (const auto& n : g["stuck"]["not_entered"])
        name_culprit(n["rank"].get<int>(), "never entered " + g["stuck"]["call"].get<std::string>() +
                                               "; its last call was " + n["last"].get<std::string>() + ", " +
                                               n["last_state"].get<std::string>());
      for (int r : g["no_dump"].get<std::vector<int>>())
        name_culprit(r, "wrote no dump while the others are inside " + g["stuck"]["call"].get<std::string>());
    }
  }
  // A rank that crashed (a fatal signal's dump) is named whatever else was found.
  for (const auto& d : dumps)
    if (d.why.starts_with("SIG") && d.why != "SIGUSR1") name_culprit(d.rank, "crashed: " + d.why);
  report["culprits"] = culprits;
  return report;
}

/// @brief The report as text, for a person.
inline std::string describe(const json& r, const std::string& dir) {
  std::ostringstream o;
  const auto& dumps = r["dumps"];
  o << "kft-trace: " << dumps.size() << " dump(s) of a " << r["world_size"].get<int>() << "-rank job in " << dir;
  double spread = 0;
  for (const auto& d : dumps) spread = std::max(spread, d["before_newest_s"].get<double>());
  o << " (written within " << std::fixed;
  o.precision(1);
  o << spread << " s)";
  const auto no_dump = r["no_dump"].get<std::vector<int>>();
  if (!no_dump.empty()) o << "; no dump from rank(s) " << detail::join(no_dump);
  o << "\n";
  for (const auto& d : dumps)
    if (d["before_newest_s"].get<double>() > 600)
      o << "  note: rank " << d["rank"] << "'s dump is " << d["before_newest_s"].get<double>()
        << " s older than the newest: it may be from an earlier run\n";
  for (const auto& g : r["groups"]) {
    o << "group \"" << g["group"].get<std::string>() << "\" (generation " << g["generation"] << ")";
    if (const auto d = g["description"].get<std::string>(); !d.empty() && d != g["group"]) o << ": " << d;
    o << "\n";
    if (!g["divergence"].is_null()) {
      o << "  first divergent call: #" << g["divergence"]["seq"] << ":";
      for (const auto& c : g["divergence"]["calls"]) {
        o << " rank(s) " << detail::join(c["ranks"].get<std::vector<int>>()) << " " << c["op"].get<std::string>() << " "
          << c["dtype"].get<std::string>() << " x " << c["count"];
        if (c["root"].get<int>() >= 0) o << " root " << c["root"];
        o << ";";
      }
      o << "\n";
    }
    if (!g["stuck"].is_null()) {
      const auto& s = g["stuck"];
      o << "  stuck in " << s["call"].get<std::string>() << ":";
      std::vector<int> in;
      for (const auto& i : s["inside"]) in.push_back(i["rank"]);
      if (!in.empty()) o << " inside: rank(s) " << detail::join(in) << ";";
      for (const auto& n : s["not_entered"])
        o << " rank " << n["rank"] << " never entered it (last call " << n["last"].get<std::string>() << ", "
          << n["last_state"].get<std::string>() << ");";
      if (!s["finished"].empty()) o << " finished it: rank(s) " << detail::join(s["finished"].get<std::vector<int>>()) << ";";
      if (!g["no_dump"].empty()) o << " no dump: rank(s) " << detail::join(g["no_dump"].get<std::vector<int>>()) << ";";
      o << "\n";
    } else if (g["divergence"].is_null()) {
      o << "  every recorded call finished on every rank that wrote a dump\n";
    }
  }
  for (const auto& c : r["chains"]) o << "waits: rank " << detail::join(c.get<std::vector<int>>(), " -> rank ") << "\n";
  if (r["culprits"].empty()) {
    o << "no culprit found: no divergent call, no stuck call, no chain of waits\n";
  } else {
    for (const auto& c : r["culprits"]) {
      const int rank = c["rank"];
      std::string host;
      for (const auto& d : dumps)
        if (d["rank"] == rank) host = d["host"].get<std::string>();
      o << "culprit: rank " << rank << (host.empty() ? "" : " (" + host + ")") << ": " << c["why"].get<std::string>()
        << "\n";
    }
  }
  return o.str();
}

}  // namespace kft_trace
