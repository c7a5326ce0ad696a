// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/failure.hpp
/// @brief What a Gloo communicator's ranks tell each other through the store when a call fails
/// or a rank aborts, and what a failing rank learns from it.
///
/// The records, one key each in the communicator's store scope:
///  - `kft/fail/<member>`: "<op> #<seq>: <what Gloo said>", written by a rank whose call failed;
///  - `kft/abort`: "<member> <reason>", written by a rank that called `abort(reason)`.
///
/// A failing rank writes its record, then reads the others' for up to `config::report_grace`
/// (`compare_notes`): a rank with no record by then stopped, died, was cut off, or is not in
/// this call, and the error names it with its host; an abort record names the aborting rank
/// and its reason instead.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/failure.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <kft/core/deadline.hpp>
#include <kft/core/error.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo::detail {

using namespace std::chrono_literals;

/// @brief The key of member `r`'s failure record.
inline std::string failure_key(int r) { return "kft/fail/" + std::to_string(r); }
/// @brief The key of the abort record (the first rank to abort writes it; later ones overwrite).
inline constexpr std::string_view abort_key = "kft/abort";

/// @brief What the other ranks recorded about a failure.
struct findings {
  std::string text;     // "; the rank that recorded no failure within 2 s ...: rank 2 (host c)"
  std::string aborted;  // "rank 3 (host b) aborted the communicator: reason" when a rank aborted
  std::vector<int> silent;  // the members that recorded nothing within the grace (none when one aborted)
  int aborter = -1;         // the member that aborted the communicator, -1 when none
};

/// @brief Records this rank's failure of `op` #`seq` (`what`) and reads the others' records
/// until every member has one, a rank aborted, or `grace` has passed. Bounded: the store is
/// asked on a thread of its own, so a host cut off from the store does not hold this rank
/// past `grace` + 1 s.
/// @param world_of the job rank of each member; @param host_of the host of each member
inline findings compare_notes(std::shared_ptr<rendezvous::store> store, int me, int n, std::string op,
                              std::uint64_t seq, std::string what, std::chrono::milliseconds grace,
                              std::vector<int> world_of, std::vector<std::string> host_of) {
  auto done = std::make_shared<std::promise<findings>>();
  auto fut = done->get_future();
  std::thread([st = std::move(store), me, n, seq, note_of_mine = std::move(what), grace, done, op_name = std::move(op),
               worlds = std::move(world_of), hosts = std::move(host_of)] {
    findings f;
    try {
      st->set(failure_key(me), op_name + " #" + std::to_string(seq) + ": " + note_of_mine);
      std::vector<std::string> notes(static_cast<std::size_t>(n));
      const auto d = deadline::after(grace);
      // Two requests a look, whatever n: which records exist (one listing), then the new ones.
      const std::string fail_prefix = failure_key(0).substr(0, failure_key(0).size() - 1);
      for (int missing = n;;) {
        const auto present = st->keys("kft/");
        const bool aborted = std::binary_search(present.begin(), present.end(), std::string(abort_key));
        std::vector<std::string> fresh;
        std::vector<int> whose;
        for (const auto& k : present) {
          if (!k.starts_with(fail_prefix)) continue;
          const auto tail = k.substr(fail_prefix.size());
          if (tail.empty() || tail.size() > 9 || !std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; }))
            continue;
          const int r = std::stoi(tail);
          if (r < 0 || r >= n || !notes[static_cast<std::size_t>(r)].empty()) continue;
          fresh.push_back(k);
          whose.push_back(r);
        }
        if (!fresh.empty()) {
          const auto got = st->multi_get(fresh, 1s);
          for (std::size_t i = 0; i < got.size(); ++i) {
            notes[static_cast<std::size_t>(whose[i])] = got[i].empty() ? std::string("?") : got[i];
            --missing;
          }
        }
        if (missing == 0 || d.passed() || aborted) break;
        std::this_thread::sleep_for(20ms);
      }
      auto name_of = [&](int r) {
        std::string s = "rank " + std::to_string(worlds[static_cast<std::size_t>(r)]);
        if (!hosts[static_cast<std::size_t>(r)].empty()) s += " (" + hosts[static_cast<std::size_t>(r)] + ")";
        return s;
      };
      int aborter = -1;
      if (auto a = st->try_get(abort_key)) {
        const auto sp = a->find(' ');
        aborter = std::stoi(a->substr(0, sp));
        if (aborter >= 0 && aborter < n) f.aborter = aborter;
        f.aborted = (aborter >= 0 && aborter < n ? name_of(aborter) : "rank ?") + " aborted the communicator: " +
                    (sp == std::string::npos ? "" : a->substr(sp + 1));
        return done->set_value(std::move(f));
      }
      std::string silent, failed;
      int silent_n = 0, failed_n = 0;
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        const auto& note = notes[static_cast<std::size_t>(r)];
        if (note.empty()) {
          silent += (silent_n++ ? ", " : "") + name_of(r);
          f.silent.push_back(r);
        }
        else if (failed_n++ < 3) failed += std::string(failed.empty() ? "" : "; ") + name_of(r) + " failed too at " + note;
      }
      if (silent_n)
        f.text += "; " + std::string(silent_n == 1 ? "the rank that" : "the ranks that") +
                  " recorded no failure within " + kft::detail::describe_duration(grace) +
                  " (stopped, dead, cut off, or not in this call): " + silent;
      else if (n > 1)
        f.text += "; every other rank failed too";
      if (failed_n) f.text += "; " + failed + (failed_n > 3 ? "; ..." : "");
    } catch (const std::exception& e) {
      f.text = "; (the store could not be reached to compare notes with the other ranks: " + std::string(e.what()) + ")";
    }
    done->set_value(std::move(f));
  }).detach();
  if (fut.wait_for(grace + 1s) == std::future_status::ready) return fut.get();
  findings late;
  late.text = "; (the store did not answer within " + kft::detail::describe_duration(grace + 1s) +
              " to compare notes with the other ranks)";
  return late;
}

/// @brief Gloo's message without the source location it starts with
/// ("[./gloo/transport/tcp/pair.cc:598] ").
inline std::string tidy(std::string what) {
  if (what.starts_with("[")) {
    const auto close = what.find("] ");
    if (close != std::string::npos && what.find(".cc:") < close) what.erase(0, close + 2);
  }
  return what;
}

}  // namespace gloo::detail
KFT_NAMESPACE_END
