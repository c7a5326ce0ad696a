// SPDX-License-Identifier: Apache-2.0
// kftrun: the local worker group — start, watch, stop, and relay output.
//
// Every worker is its own process group (so a signal reaches whatever it started), dies with
// the agent (PR_SET_PDEATHSIG), and the agent is a child subreaper (so grandchildren come back
// to it and are reaped). Output goes through pipes and is relayed a whole line at a time,
// prefixed with the rank, and/or written to per-rank log files.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kft/core/error.hpp>

namespace kftrun {

using clock = std::chrono::steady_clock;

/// How a worker ended.
struct exit_info {
  int rank = -1;
  int local_rank = -1;
  int code = 0;    ///< exit status, or 128 + signal
  int signal = 0;  ///< the signal that killed it, 0 if it exited
  std::string describe() const {
    if (signal != 0) {
      const char* name = ::sigabbrev_np(signal);
      return "was killed by signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : "");
    }
    return "exited with status " + std::to_string(code);
  }
};

/// What one worker needs to start.
struct worker_spec {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> env;  ///< "NAME=value", complete
  std::string cpuset;            ///< PUs to bind to ("0-3,8"), empty = inherit
};

/// "0-3,8" -> a cpu_set_t. @throws usage_error on anything else
inline cpu_set_t parse_cpu_list(const std::string& list) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::size_t i = 0;
  auto number = [&]() {
    std::size_t start = i;
    while (i < list.size() && list[i] >= '0' && list[i] <= '9') ++i;
    if (start == i || i - start > 5) throw kft::usage_error("bad CPU list \"" + list + "\"", kft::error_site::of("kftrun"));
    return std::stoi(list.substr(start, i - start));
  };
  while (i < list.size()) {
    const int a = number();
    int b = a;
    if (i < list.size() && list[i] == '-') {
      ++i;
      b = number();
    }
    for (int c = a; c <= b && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
    if (i < list.size() && list[i] != ',') throw kft::usage_error("bad CPU list \"" + list + "\"", kft::error_site::of("kftrun"));
    if (i < list.size()) ++i;
  }
  return set;
}

/// Where output goes.
struct output_options {
  bool to_console = true;                      ///< relay with a "[rank]: " prefix
  std::optional<std::filesystem::path> dir;    ///< per-rank stdout.log / stderr.log here
};

/// Resolves a program name like execvp would, before fork (exec in the child must not search).
inline std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= p.size()) {
    auto end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return name;  // exec will fail with ENOENT and we report it
}

class worker_group {
 public:
  worker_group(std::vector<std::string> argv, output_options out) : argv_(std::move(argv)), out_(std::move(out)) {
    program_ = resolve_program(argv_.at(0));
  }
  ~worker_group() { kill_all(std::chrono::milliseconds(0)); }
  worker_group(const worker_group&) = delete;
  worker_group& operator=(const worker_group&) = delete;

  /// Starts one worker. Exec failures come back as an exit with status 127 and a message.
  void start(const worker_spec& spec, const std::filesystem::path& attempt_dir) {
    worker w;
    w.rank = spec.rank;
    w.local_rank = spec.local_rank;
    int out_pipe[2], err_pipe[2], exec_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0)
      throw kft::transport_error(std::string("pipe2: ") + std::strerror(errno), kft::error_site::of("kftrun start"), errno);
    if (out_.dir) {
      const auto d = attempt_dir / std::to_string(spec.rank);
      std::filesystem::create_directories(d);
      w.log_out.open(d / "stdout.log", std::ios::app);
      w.log_err.open(d / "stderr.log", std::ios::app);
    }
    // Everything the child touches is prepared here: between fork and exec only
    // async-signal-safe calls are allowed (the node-0 agent has a store thread).
    std::vector<char*> argv, envp;
    for (auto& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env = spec.env;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const bool bind = !spec.cpuset.empty();
    const cpu_set_t cpus = bind ? parse_cpu_list(spec.cpuset) : cpu_set_t{};

    const pid_t pid = ::fork();
    if (pid < 0) throw kft::transport_error(std::string("fork: ") + std::strerror(errno), kft::error_site::of("kftrun start"), errno);
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);  // the agent died before prctl took effect
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      if (bind && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
        const int e = errno;
        (void)!::write(exec_pipe[1], &e, sizeof e);
        ::_exit(127);
      }
      ::execve(program_.c_str(), argv.data(), envp.data());
      const int e = errno;
      (void)!::write(exec_pipe[1], &e, sizeof e);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also from the parent, so kill(-pid) works at once
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    ::close(exec_pipe[1]);
    int exec_errno = 0;
    ssize_t n;
    while ((n = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    ::close(exec_pipe[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno))
      w.start_error = "could not start \"" + argv_[0] + "\": " + std::strerror(exec_errno);
    w.pid = pid;
    w.out_fd = out_pipe[0];
    w.err_fd = err_pipe[0];
    ::fcntl(w.out_fd, F_SETFL, O_NONBLOCK);
    ::fcntl(w.err_fd, F_SETFL, O_NONBLOCK);
    workers_.push_back(std::move(w));
  }

  /// Relays output for up to `wait`, then reaps whatever exited. Returns new exits.
  std::vector<exit_info> poll_once(std::chrono::milliseconds wait) {
    pump(wait);
    return reap();
  }

  bool all_exited() const {
    for (const auto& w : workers_)
      if (!w.exited) return false;
    return true;
  }
  bool all_succeeded() const {
    for (const auto& w : workers_)
      if (!w.exited || w.result.code != 0) return false;
    return true;
  }
  /// True while some worker runs or has exited 0 (--on-failure continue: someone goes on).
  bool any_succeeded_or_running() const {
    for (const auto& w : workers_)
      if (!w.exited || w.result.code == 0) return true;
    return false;
  }
  /// True while some worker runs.
  bool any_running() const {
    for (const auto& w : workers_)
      if (!w.exited) return true;
    return false;
  }
  bool empty() const { return workers_.empty(); }
  const std::string& start_error_of(int rank) const {
    static const std::string none;
    for (const auto& w : workers_)
      if (w.rank == rank) return w.start_error;
    return none;
  }

  /// Leaves the workers alone until `until`, relaying their output and reaping them: after a
  /// failure, the others are often about to fail too, and their errors (a peer that died, a
  /// peer that called with other arguments) name the rank at fault. Ends early once every
  /// worker has exited, once those left are all stopped (SIGSTOP, a debugger: they cannot exit
  /// by themselves), or when `cancelled()` says so (kftrun was signalled).
  template <class Cancelled>
  void let_exit(clock::time_point until, Cancelled cancelled) {
    while (!cancelled()) {
      const bool running =
          std::any_of(workers_.begin(), workers_.end(), [](const worker& w) { return !w.exited && !is_stopped(w.pid); });
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
      if (!running || left <= std::chrono::milliseconds(0)) break;
      poll_once(std::min(left, std::chrono::milliseconds(20)));
    }
  }

  /// Asks every live worker that is not stopped for its flight recorder's dump (SIGUSR1: kft's
  /// handler writes `<dir>/rank<R>.jsonl` and the worker goes on; docs/flight-recorder.md), and
  /// waits until each has written it, one has exited, or `wait` has passed. For a job being
  /// stopped with KFT_TRACE_DIR set: the ranks still inside their calls say where they are, so
  /// kft-trace can follow the chain of waits, not only the rank that failed first. Returns how
  /// many wrote.
  int ask_for_dumps(const std::string& dir, std::chrono::milliseconds wait) {
    namespace fs = std::filesystem;
    struct asked {
      const worker* w;
      fs::path file;
      fs::file_time_type before;
    };
    std::vector<asked> waiting;
    for (const auto& w : workers_) {
      if (w.exited || is_stopped(w.pid)) continue;
      const fs::path f = fs::path(dir) / ("rank" + std::to_string(w.rank) + ".jsonl");
      std::error_code ec;
      const auto before = fs::last_write_time(f, ec);
      waiting.push_back({&w, f, ec ? fs::file_time_type::min() : before});
      ::kill(w.pid, SIGUSR1);
    }
    int wrote = 0;
    const auto until = clock::now() + wait;
    while (!waiting.empty() && clock::now() < until) {
      poll_once(std::chrono::milliseconds(10));
      std::erase_if(waiting, [&](const asked& a) {
        std::error_code ec;
        const auto t = fs::last_write_time(a.file, ec);
        if (!ec && t != a.before) {
          ++wrote;
          return true;
        }
        return a.w->exited;
      });
    }
    return wrote;
  }

  /// SIGTERM (and SIGCONT) to every live worker's process group, SIGKILL after `grace`; reaps everyone and
  /// drains their output. Leaves an empty group.
  void kill_all(std::chrono::milliseconds grace) {
    // A stopped worker (SIGSTOP, a debugger's stop) could not act on SIGTERM before the grace
    // ran out: it is killed at once.
    for (auto& w : workers_)
      if (!w.exited && is_stopped(w.pid)) ::kill(-w.pid, SIGKILL);
    signal_all(SIGTERM);
    signal_all(SIGCONT);  // the rest of a stopped process group gets its SIGTERM now
    const auto deadline = clock::now() + grace;
    while (!all_exited() && clock::now() < deadline) poll_once(std::chrono::milliseconds(20));
    if (!all_exited()) signal_all(SIGKILL);
    while (!all_exited()) poll_once(std::chrono::milliseconds(20));
    end_strays(deadline);
    for (auto& w : workers_) {
      finish_output(w);
      for (int* fd : {&w.out_fd, &w.err_fd})
        if (*fd >= 0) {
          ::close(*fd);
          *fd = -1;
        }
    }
    workers_.clear();
  }

  /// Processes the workers left behind (daemons that left the workers' process groups with
  /// setsid() and were handed to kftrun, the child subreaper) that were ended, so far.
  int strays_ended() const noexcept { return strays_ended_; }

  /// Live workers in state T (stopped by a signal: SIGSTOP, SIGTSTP), as (rank, local rank).
  /// Not those stopped by a tracer (state t: a debugger at a breakpoint).
  std::vector<std::pair<int, int>> stopped_workers() const {
    std::vector<std::pair<int, int>> out;
    for (const auto& w : workers_)
      if (!w.exited && state_of(w.pid) == 'T') out.emplace_back(w.rank, w.local_rank);
    return out;
  }

  /// A worker as the live status sees it.
  struct worker_view {
    int rank = 0, local_rank = 0;
    pid_t pid = -1;
    bool exited = false;
    char state = 0;  // /proc's state letter (T: stopped), 0 when unknown or exited
  };
  std::vector<worker_view> members() const {
    std::vector<worker_view> out;
    for (const auto& w : workers_) out.push_back({w.rank, w.local_rank, w.pid, w.exited, w.exited ? '\0' : state_of(w.pid)});
    return out;
  }

  /// Sends `sig` to every live worker's process group.
  void signal_all(int sig) {
    for (auto& w : workers_)
      if (!w.exited) ::kill(-w.pid, sig);
  }

 private:
  struct stream_state {
    std::string partial;
  };
  struct worker {
    int rank = 0, local_rank = 0;
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1;
    stream_state out_state, err_state;
    std::ofstream log_out, log_err;
    bool exited = false;
    exit_info result;
    std::string start_error;
  };

  // The state letter of /proc/<pid>/stat (R, S, D, T stopped, t stopped by a tracer, Z, ...);
  // 0 when it cannot be read.
  static char state_of(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(f, text);
    const auto close = text.rfind(')');
    return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '\0';
  }
  static bool is_stopped(pid_t pid) {
    const char s = state_of(pid);
    return s == 'T' || s == 't';
  }

  // kftrun's children that are not workers: whatever the workers started and left behind
  // (as subreaper, kftrun inherits them when their parents exit).
  static std::vector<pid_t> adopted_children() {
    std::vector<pid_t> found;
    const pid_t self = ::getpid();
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const auto name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream f(entry.path() / "stat");
      std::string text;
      if (!std::getline(f, text)) continue;
      const auto close = text.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(text.substr(close + 1));
      char state = 0;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == self && state != 'Z') found.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return found;
  }

  // Ends the strays: SIGTERM (and SIGCONT) to each and its process group, SIGKILL when
  // `deadline` has passed, until none is left (a daemon may still be double-forking).
  void end_strays(clock::time_point deadline) {
    std::vector<pid_t> seen;
    for (int round = 0; round < 10000; ++round) {
      const auto strays = adopted_children();
      if (strays.empty()) {
        reap();
        if (adopted_children().empty()) break;
        continue;
      }
      const bool hard = clock::now() >= deadline;
      for (pid_t pid : strays) {
        if (std::find(seen.begin(), seen.end(), pid) == seen.end()) {
          seen.push_back(pid);
          ++strays_ended_;
        }
        const int sig = hard ? SIGKILL : SIGTERM;
        ::kill(pid, sig);
        ::kill(-pid, sig);  // a setsid() daemon leads its own group: whatever it started too
        if (!hard) ::kill(pid, SIGCONT);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      reap();
    }
  }

  void pump(std::chrono::milliseconds wait) {
    std::vector<pollfd> fds;
    std::vector<std::pair<worker*, bool>> owners;  // bool: is stderr
    for (auto& w : workers_) {
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        owners.emplace_back(&w, false);
      }
      if (w.err_fd >= 0) {
        fds.push_back({w.err_fd, POLLIN, 0});
        owners.emplace_back(&w, true);
      }
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(wait);
      return;
    }
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    if (rc <= 0) return;
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*owners[i].first, owners[i].second);
  }

  void drain(worker& w, bool is_err) {
    int& fd = is_err ? w.err_fd : w.out_fd;
    char buf[65536];
    while (fd >= 0) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        emit(w, is_err, std::string_view(buf, static_cast<std::size_t>(n)), false);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      emit(w, is_err, {}, true);  // EOF: flush a last line without newline
      ::close(fd);
      fd = -1;
    }
  }

  void emit(worker& w, bool is_err, std::string_view data, bool eof) {
    auto& st = is_err ? w.err_state : w.out_state;
    auto& log = is_err ? w.log_err : w.log_out;
    if (log.is_open() && !data.empty()) {
      log.write(data.data(), static_cast<std::streamsize>(data.size()));
      log.flush();
    }
    if (!out_.to_console) return;
    st.partial.append(data);
    FILE* sink = is_err ? stderr : stdout;
    const std::string prefix = "[" + std::to_string(w.rank) + "]: ";
    // A line ends at '\n', or at '\r' (progress bars redraw one line: each redraw is relayed
    // with the prefix), or after max_line bytes without either: kftrun holds at most one
    // piece per stream, however the worker writes.
    // Written piece by piece into stdio's buffer (no string per line); flushed once below.
    auto put = [&](std::string_view piece, bool newline) {
      std::fwrite(prefix.data(), 1, prefix.size(), sink);
      std::fwrite(piece.data(), 1, piece.size(), sink);
      if (newline) std::fputc('\n', sink);
    };
    const std::string_view all(st.partial);
    std::size_t start = 0;
    while (start < all.size()) {
      const auto end = all.find_first_of("\r\n", start);
      if (end == std::string_view::npos) {
        if (all.size() - start < max_line) break;
        put(all.substr(start, max_line), true);
        start += max_line;
        continue;
      }
      put(all.substr(start, end - start + 1), false);
      start = end + 1;
    }
    st.partial.erase(0, start);
    if (eof && !st.partial.empty()) {
      const std::string line = prefix + st.partial + "\n";
      std::fwrite(line.data(), 1, line.size(), sink);
      st.partial.clear();
    }
    std::fflush(sink);
  }

  void finish_output(worker& w) {
    if (w.out_fd >= 0) drain(w, false);
    if (w.err_fd >= 0) drain(w, true);
  }

  std::vector<exit_info> reap() {
    std::vector<exit_info> done;
    while (true) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& w : workers_) {
        if (w.pid != pid || w.exited) continue;
        w.exited = true;
        w.result.rank = w.rank;
        w.result.local_rank = w.local_rank;
        if (WIFSIGNALED(status)) {
          w.result.signal = WTERMSIG(status);
          w.result.code = 128 + w.result.signal;
        } else {
          w.result.code = WEXITSTATUS(status);
        }
        ::kill(-w.pid, SIGKILL);  // whatever it left behind in its process group
        finish_output(w);
        done.push_back(w.result);
      }
      // Other pids: grandchildren handed to us as subreaper; reaping them is all we owe.
    }
    return done;
  }

  static constexpr std::size_t max_line = 64 * 1024;

  std::vector<std::string> argv_;
  std::string program_;
  int strays_ended_ = 0;
  output_options out_;
  std::vector<worker> workers_;
};

}  // namespace kftrun
