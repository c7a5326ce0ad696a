// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/timeline.hpp
/// @brief A per-rank timeline of a DDP run, written as Chrome-trace JSON (chrome://tracing,
/// Perfetto): when each gradient became ready, when each bucket was queued, when its
/// communication ran, and the compute spans the program reports.
///
///     kft::ddp::timeline tl = kft::ddp::timeline::from(env, rank);   // KFT_TIMELINE=dir, else off
///     kft::ddp::reducer r(pg, params, {.timeline = &tl});
///     { auto s = tl.span("backward"); ... }                          // a compute span
///     // on destruction: dir/timeline-rank<r>.json (written atomically)
///
/// Recording is a push into a preallocated vector (no I/O while training); an off timeline
/// costs one branch. `bench/ddp/plot_timeline.py` turns the traces of all ranks into a Gantt chart.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/atomic_file.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

class timeline {
 public:
  /// @brief One event: a span (`end_ns > 0`) or an instant, on a track.
  struct event {
    std::string name;
    const char* track = "compute";  ///< "compute", "ready", "queue", "comm"
    std::int64_t begin_ns = 0, end_ns = 0;
  };

  timeline() = default;  ///< off
  /// @brief Records for `rank` and writes to `dir` at destruction (or `write()`).
  timeline(std::string dir, int rank, std::size_t reserve = 1u << 16) : dir_(std::move(dir)), rank_(rank) {
    events_.reserve(reserve);
  }
  /// @brief On when `KFT_TIMELINE` names a directory; it is created if missing (its parent
  /// must exist), so a run learns at its start, not at its end, that it cannot write there.
  /// @throws config_error naming `KFT_TIMELINE` when the directory cannot be made or written
  static timeline from(const environment& env, int rank) {
    auto d = env.get("KFT_TIMELINE");
    if (!d || d->empty()) return {};
    usable_directory("KFT_TIMELINE", *d);
    return timeline(*d, rank);
  }
  /// @brief Makes sure `dir` is a directory this process can write in (creating it if its
  /// parent exists); `variable` names the setting in the error.
  static void usable_directory(const std::string& variable, const std::string& dir) {
    const auto fail = [&](const std::string& why) {
      throw config_error(variable, dir, why + " (a timeline trace is written there as timeline-rank<r>.json)",
                         error_site::of("ddp timeline"));
    };
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT) fail("cannot be inspected: " + std::string(std::strerror(errno)));
      if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)  // another rank may make it first
        fail("does not exist and cannot be created: " + std::string(std::strerror(errno)));
      if (::stat(dir.c_str(), &st) != 0) fail("cannot be inspected: " + std::string(std::strerror(errno)));
    }
    if (!S_ISDIR(st.st_mode)) fail("is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) fail("is not writable: " + std::string(std::strerror(errno)));
  }
  timeline(timeline&&) noexcept = default;
  timeline& operator=(timeline&&) noexcept = default;
  ~timeline() {
    try {
      write();
    } catch (...) {  // a destructor reports nothing: write() explicitly to see errors
    }
  }

  bool on() const noexcept { return !dir_.empty() && recording_; }
  /// @brief Pauses (false) or resumes recording; writing still happens at destruction.
  void record(bool yes) noexcept { recording_ = yes; }
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void instant(std::string name, const char* track, std::int64_t at = 0) {
    if (on()) events_.push_back({std::move(name), track, at ? at : now_ns(), 0});
  }
  void add(std::string name, const char* track, std::int64_t begin, std::int64_t end) {
    if (on() && end >= begin) events_.push_back({std::move(name), track, begin, end});
  }

  /// @brief A compute span from now to the scope's end.
  class [[nodiscard]] scope {
   public:
    scope(timeline* t, std::string name) : t_(t), name_(std::move(name)), begin_(t && t->on() ? now_ns() : 0) {}
    scope(scope&& o) noexcept : t_(std::exchange(o.t_, nullptr)), name_(std::move(o.name_)), begin_(o.begin_) {}
    scope(const scope&) = delete;
    ~scope() {
      if (t_ && t_->on()) t_->add(std::move(name_), "compute", begin_, now_ns());
    }

   private:
    timeline* t_;
    std::string name_;
    std::int64_t begin_;
  };
  scope span(std::string name) { return scope(this, std::move(name)); }

  const std::vector<event>& events() const noexcept { return events_; }

  /// @brief Writes `dir/timeline-rank<r>.json` (temp file + rename: never a torn file).
  /// @throws transport_error naming the file when it cannot be written
  void write() {
    if (dir_.empty() || written_ == events_.size()) return;
    const std::string path = dir_ + "/timeline-rank" + std::to_string(rank_) + ".json";
    std::int64_t t0 = events_.empty() ? 0 : events_.front().begin_ns;
    for (const auto& e : events_) t0 = std::min(t0, e.begin_ns);
    std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":" + std::to_string(rank_) +
                      ",\"t0_ns\":" + std::to_string(t0) + "},\"traceEvents\":[\n";
    char num[64];
    auto us = [&](std::int64_t ns) {  // microseconds, three decimals
      std::snprintf(num, sizeof num, "%.3f", static_cast<double>(ns) / 1e3);
      return std::string(num);
    };
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const auto& e = events_[i];
      const std::string track = e.track, pid = std::to_string(rank_);
      out += (i ? ",\n" : "");
      out += "{\"name\":\"" + escaped(e.name) + "\",\"cat\":\"" + track + "\",\"pid\":" + pid + ",\"tid\":\"" +
             track + "\",";
      if (e.end_ns > 0) out += "\"ph\":\"X\",\"ts\":" + us(e.begin_ns - t0) + ",\"dur\":" + us(e.end_ns - e.begin_ns) + "}";
      else out += "\"ph\":\"i\",\"s\":\"t\",\"ts\":" + us(e.begin_ns - t0) + "}";
    }
    out += "\n]}\n";
    write_file_atomically(path, out, "ddp timeline");
    written_ = events_.size();
  }

 private:
  static std::string escaped(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out;
  }
  std::string dir_;
  int rank_ = 0;
  std::vector<event> events_;
  std::size_t written_ = 0;
  bool recording_ = true;
};

}  // namespace ddp
KFT_NAMESPACE_END
