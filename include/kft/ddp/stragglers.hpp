// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/stragglers.hpp
/// @brief Naming a slow rank (a straggler): the arithmetic the trainer runs on every rank's
/// own work per step, apart from the trainer so it can be tested on synthetic numbers.
///
/// In synchronous data parallelism every rank's wall-clock step is the same (the fast ones wait
/// for the slow one inside the gradient reduction), so a step's wall time cannot say who is
/// slow. What differs is each rank's own work: the time of a step it does not spend blocked in
/// a collective (its data, forward, backward and optimizer). The trainer sums that per rank
/// over a window of `every` steps, the ranks allgather the sums (one small collective per
/// window: every rank gets the same bytes and so reaches the same verdicts), and this detector
/// compares each rank's mean work per step with the median of the other ranks':
///
///  - a rank is named when it is at least `threshold` above that median in `sustain`
///    consecutive windows (a single hiccup names nobody);
///  - a named rank recovers when it is below `threshold` / 2 for `sustain` consecutive windows
///    (the hysteresis keeps a rank slowed by about the threshold from being named again and
///    again);
///  - each rank is named once when it starts straggling and once when it recovers;
///  - a rank that did no step in a window (it has joined, its data ran out) is neither judged
///    nor counted in the median; with fewer than two such ranks nothing is judged;
///  - the first `warmup` windows after reset() (a new membership) are not judged.
///
///     kft::ddp::straggler_detector d({.every = 10, .threshold = 0.10, .sustain = 2, .warmup = 1});
///     d.reset(ranks);
///     for (auto& e : d.window(step, sums, steps)) ...   // sums[r], steps[r]: rank r's window
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief What the trainer watches for a slow rank (trainer_options::stragglers).
struct straggler_options {
  /// Steps per window: every `every` steps the ranks exchange their work sums (one allgather
  /// of two f64 per rank). 0: off (no exchange, nobody named).
  std::uint64_t every = 10;
  /// How far above the median of the other ranks a rank's work per step must be to count as
  /// slow in a window (0.10: 10%; docs/ddp.md has the noise it was measured against).
  double threshold = 0.10;
  /// Consecutive slow windows before a rank is named (and fast ones before it recovers).
  int sustain = 2;
  /// Windows not judged after a new membership (the start, a shrink, a join): the first steps
  /// fault in pages and fill caches, and a joiner's first window includes taking the state.
  int warmup = 1;
};

/// @brief A rank named as a straggler, or recovered (the same on every rank).
struct straggler_event {
  std::uint64_t step = 0;    ///< the step whose window decided it
  int rank = 0;              ///< in the group of that step
  int ranks = 0;             ///< the group's size then
  std::string host;          ///< the rank's host name ("" : not known)
  double seconds = 0.0;      ///< its work per step in that window
  double median = 0.0;       ///< the median of the other ranks' work per step
  double excess = 0.0;       ///< seconds / median - 1 (0.2: 20% slower)
  bool recovered = false;    ///< false: it started straggling; true: it is back within the threshold
};

/// @brief The detection (file comment): fed one window of every rank's work at a time.
class straggler_detector {
 public:
  straggler_detector() = default;
  explicit straggler_detector(straggler_options o) : o_(o) { check(o_); }

  /// @throws usage_error on a threshold that is not positive and finite, or sustain < 1
  static void check(const straggler_options& o) {
    if (!(o.threshold > 0.0 && o.threshold < 1e6))
      throw usage_error("trainer: stragglers.threshold = " + std::to_string(o.threshold) +
                        " (a fraction above the median, > 0: 0.10 is 10%)");
    if (o.sustain < 1)
      throw usage_error("trainer: stragglers.sustain = " + std::to_string(o.sustain) + " (windows in a row, >= 1)");
    if (o.warmup < 0)
      throw usage_error("trainer: stragglers.warmup = " + std::to_string(o.warmup) + " (windows, >= 0)");
  }

  const straggler_options& options() const noexcept { return o_; }
  bool on() const noexcept { return o_.every != 0; }

  /// @brief A new membership of `ranks` ranks (the start, a shrink, a join): every window
  /// and verdict is forgotten, the hosts too.
  void reset(int ranks) {
    const auto n = static_cast<std::size_t>(ranks < 0 ? 0 : ranks);
    slow_.assign(n, 0);
    fast_.assign(n, 0);
    named_.assign(n, 0);
    hosts_.assign(n, std::string());
    excess_.assign(n, std::numeric_limits<double>::quiet_NaN());
    windows_ = 0;
  }
  void set_host(int rank, std::string host) {
    if (rank >= 0 && static_cast<std::size_t>(rank) < hosts_.size()) hosts_[static_cast<std::size_t>(rank)] = std::move(host);
  }
  bool hosts_known() const noexcept {
    return std::any_of(hosts_.begin(), hosts_.end(), [](const std::string& h) { return !h.empty(); });
  }
  /// @brief Whether rank `r` stands named now.
  bool straggling(int r) const noexcept {
    return r >= 0 && static_cast<std::size_t>(r) < named_.size() && named_[static_cast<std::size_t>(r)];
  }
  /// @brief The last window's verdict per rank: its work per step / the others' median - 1
  /// (NaN: not judged), and the windows seen since reset() (how a bench sees the noise).
  std::span<const double> last_excess() const noexcept { return excess_; }
  std::uint64_t windows() const noexcept { return windows_; }

  /// @brief One window ending at `step`: `seconds[r]` is rank r's work over it, `steps[r]` the
  /// steps it did. Returns who started straggling or recovered, by rank.
  /// @throws usage_error when the spans' sizes are not the reset()'s ranks
  std::vector<straggler_event> window(std::uint64_t step, std::span<const double> seconds, std::span<const double> steps) {
    const std::size_t n = named_.size();
    if (seconds.size() != n || steps.size() != n)
      throw usage_error("straggler_detector::window: " + std::to_string(seconds.size()) + " sums and " +
                        std::to_string(steps.size()) + " step counts for " + std::to_string(n) + " ranks (reset first)");
    ++windows_;
    std::fill(excess_.begin(), excess_.end(), std::numeric_limits<double>::quiet_NaN());
    per_step_.clear();
    for (std::size_t r = 0; r < n; ++r)
      if (steps[r] > 0 && seconds[r] >= 0) per_step_.push_back(seconds[r] / steps[r]);
    std::vector<straggler_event> out;
    if (per_step_.size() < 2) return out;
    std::sort(per_step_.begin(), per_step_.end());
    for (std::size_t r = 0; r < n; ++r) {
      if (!(steps[r] > 0 && seconds[r] >= 0)) {  // no work here: no verdict either way
        slow_[r] = fast_[r] = 0;
        continue;
      }
      const double mine = seconds[r] / steps[r], med = median_without(mine);
      if (!(med > 0)) continue;
      const double excess = mine / med - 1.0;
      excess_[r] = excess;
      if (windows_ <= static_cast<std::uint64_t>(o_.warmup)) continue;  // (seen, not judged)
      const bool slow = excess >= o_.threshold, fast = excess < o_.threshold / 2;
      slow_[r] = slow ? slow_[r] + 1 : 0;
      fast_[r] = fast ? fast_[r] + 1 : 0;
      const bool name = !named_[r] && slow_[r] >= o_.sustain, recover = named_[r] && fast_[r] >= o_.sustain;
      if (!name && !recover) continue;
      named_[r] = name;
      slow_[r] = fast_[r] = 0;
      out.push_back({step, static_cast<int>(r), static_cast<int>(n), hosts_[r], mine, med, excess, recover});
    }
    return out;
  }

  /// @brief The median of the sorted values of every judged rank but one whose value is
  /// `mine` (removing any one copy of equal values leaves the same list).
  double median_without(double mine) const {
    const std::size_t m = per_step_.size() - 1;  // the others
    const auto at = static_cast<std::size_t>(std::lower_bound(per_step_.begin(), per_step_.end(), mine) - per_step_.begin());
    auto kth = [&](std::size_t k) { return per_step_[k < at ? k : k + 1]; };
    return m % 2 ? kth(m / 2) : (kth(m / 2 - 1) + kth(m / 2)) / 2;
  }

  /// @brief This machine's host name ("" : none).
  static std::string this_host() {
    char h[256] = {};
    if (::gethostname(h, sizeof h - 1) != 0) return {};
    return h;
  }

 private:
  straggler_options o_{};
  std::vector<int> slow_, fast_;  // consecutive slow (fast) windows per rank
  std::vector<std::uint8_t> named_;
  std::vector<std::string> hosts_;
  std::vector<double> per_step_;  // the judged ranks' work per step, sorted
  std::vector<double> excess_;    // the last window's, per rank
  std::uint64_t windows_ = 0;
};

}  // namespace ddp
KFT_NAMESPACE_END
