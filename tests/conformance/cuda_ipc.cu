// SPDX-License-Identifier: Apache-2.0
// Conformance of the CUDA IPC communicator (kft/transport/cuda_ipc/communicator.cuh, device
// buffers). Its ranks must be distinct processes (CUDA does not open an IPC handle in the
// process that made it), so this program is two things:
//  - run plainly, the Boost.Test runner: one suite per rank count (cuda_ipc_p1 .. cuda_ipc_p4;
//    KFT_CONFORMANCE_CUDA_IPC_RANKS="2 3" picks some), whose first case starts that many copies
//    of this program as ranks (rank r on GPU r % GPUs: with one GPU they share it). Each case
//    goes to every rank through a pipe; each runs it and answers with its outcome, and the
//    runner checks them like every other factory's (registry.hpp). One case alone:
//      test_conformance_cuda_ipc --run_test=cuda_ipc_p3/allreduce/two_shot_bf16_avg_n4099_in_place
//  - started as a rank (KFT_CONFORMANCE_RANK set by the runner): makes the communicator
//    through a file store, says "ready", then runs the cases it is sent until its pipe closes.
// Without a CUDA device it exits 77 (CTest: skipped) saying why.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <kft/rendezvous/file_store.hpp>
#include <kft/transport/cuda_ipc/communicator.cuh>

#include "device_memory.hpp"
#include "registry.hpp"

extern char** environ;

using namespace std::chrono_literals;
namespace conf = kft_test::conformance;

namespace {

// ---- a rank -------------------------------------------------------------------------------------

using conf::device_memory;

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

bool write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// A case on the wire: "coll algo dtype op count in_place root".
std::string encode(const conf::spec& s) {
  return std::to_string(static_cast<int>(s.coll)) + " " + std::to_string(static_cast<int>(s.algorithm)) + " " +
         std::to_string(static_cast<int>(s.type)) + " " + std::to_string(static_cast<int>(s.op)) + " " +
         std::to_string(s.count) + " " + (s.in_place ? "1" : "0") + " " + std::to_string(s.root) + "\n";
}
conf::spec decode(const std::string& line) {
  std::istringstream in(line);
  int c = 0, a = 0, t = 0, op = 0, ip = 0;
  conf::spec s;
  if (!(in >> c >> a >> t >> op >> s.count >> ip >> s.root)) throw std::runtime_error("bad case line: " + line);
  s.coll = static_cast<kft::collective>(c);
  s.algorithm = static_cast<kft::algo>(a);
  s.type = static_cast<kft::dtype>(t);
  s.op = static_cast<kft::op_kind>(op);
  s.in_place = ip != 0;
  return s;
}

int serve(int rank, int size, const char* dir, int from_runner, int to_runner) {
  ::signal(SIGPIPE, SIG_IGN);  // a runner gone: the write fails and the rank ends
  FILE* in = ::fdopen(from_runner, "r");
  if (in == nullptr) return 1;
  try {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) throw std::runtime_error("no CUDA device");
    const int device = rank % devices;
    if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
    kft::rendezvous::file_store store(dir);
    kft::cuda_ipc::config cfg;
    cfg.name = "conformance";
    cfg.timeout = 60s;
    cfg.staging_bytes = 256u << 10;  // the 1 Mi element cases take several chunks
    cfg.one_shot_bytes = 16u << 10;  // auto: n1023 f32 one-shot, n4099 f32 two-shot
    kft::cuda_ipc::communicator comm(store, rank, size, device, cfg);
    if (!write_all(to_runner, "ready\n")) return 1;
    char buf[256];
    while (std::fgets(buf, sizeof buf, in) != nullptr) {
      conf::outcome o;
      try {
        o = conf::run_case(comm, decode(buf), device_memory{});
      } catch (const std::exception& e) {
        o.wrong = 1;
        o.first = std::string("threw: ") + e.what();
      }
      if (!write_all(to_runner, std::to_string(o.wrong) + " " + std::to_string(o.output_hash) + " " + one_line(o.first) + "\n"))
        return 1;
    }
  } catch (const std::exception& e) {
    write_all(to_runner, "error rank " + std::to_string(rank) + ": " + one_line(e.what()) + "\n");
    return 1;
  }
  return 0;
}

// ---- the runner ---------------------------------------------------------------------------------

// p ranks started as processes, fed one case at a time.
class ranks {
 public:
  explicit ranks(int p) {
    char tmpl[] = "/tmp/kft_conformance_cuda_ipc_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    dir_ = tmpl;
    try {
      for (int r = 0; r < p; ++r) start(r, p);
    } catch (const std::exception& e) {
      failure_ = e.what();  // the ranks started so far leave with the destructor
    }
    for (int r = 0; r < p && failure_.empty(); ++r) {
      std::string line;
      if (!read_line(static_cast<std::size_t>(r), 120s, line) || line != "ready")
        failure_ = "rank " + std::to_string(r) + " did not start: " + line;
    }
  }
  ranks(const ranks&) = delete;
  ranks& operator=(const ranks&) = delete;
  ~ranks() {
    for (auto& k : kids_) ::close(k.to);  // end of cases: each rank leaves (its communicator meets once more)
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (auto& k : kids_) {
      int status = 0;
      while (k.pid > 0 && ::waitpid(k.pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          ::kill(k.pid, SIGKILL);
          ::waitpid(k.pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
      ::close(k.from);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::vector<conf::outcome> run(const conf::spec& s) {
    std::vector<conf::outcome> out(kids_.size());
    if (failure_.empty()) {
      const std::string request = encode(s);
      for (std::size_t r = 0; r < kids_.size() && failure_.empty(); ++r)
        if (!write_all(kids_[r].to, request)) failure_ = "rank " + std::to_string(r) + " is gone (its pipe is closed)";
      for (std::size_t r = 0; r < kids_.size() && failure_.empty(); ++r) {
        std::string line;
        if (!read_line(r, 180s, line)) {
          failure_ = "rank " + std::to_string(r) + ": " + line;
          break;
        }
        std::istringstream in(line);
        if (!(in >> out[r].wrong >> out[r].output_hash)) {
          failure_ = "rank " + std::to_string(r) + " answered '" + line + "'";
          break;
        }
        std::getline(in >> std::ws, out[r].first);
      }
    }
    if (!failure_.empty())  // every later case reports it too: the ranks are not usable
      for (auto& o : out) {
        o.wrong = 1;
        o.first = failure_;
      }
    return out;
  }

 private:
  struct kid {
    pid_t pid = -1;
    int to = -1, from = -1;  // the runner's ends of the rank's pipes
    std::string pending;     // what was read past the last full line
  };
  std::vector<kid> kids_;
  std::string dir_, failure_;

  void start(int r, int p) {
    int down[2], up[2];  // runner -> rank, rank -> runner
    if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    // The environment before fork: the child only execs.
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "KFT_CONFORMANCE_", 16) != 0) env.emplace_back(*e);
    env.push_back("KFT_CONFORMANCE_RANK=" + std::to_string(r));
    env.push_back("KFT_CONFORMANCE_SIZE=" + std::to_string(p));
    env.push_back("KFT_CONFORMANCE_STORE=" + dir_);
    env.push_back("KFT_CONFORMANCE_FDS=" + std::to_string(down[0]) + " " + std::to_string(up[1]));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::fcntl(down[0], F_SETFD, 0);  // the rank's two ends survive exec; nothing else does
      ::fcntl(up[1], F_SETFD, 0);
      ::execve(self, argv, envp.data());
      ::_exit(127);
    }
    ::close(down[0]);
    ::close(up[1]);
    kids_.push_back({pid, down[1], up[0], {}});
  }

  // The rank's next line into `line`; false with why there is none in `line` (the rank ended,
  // or said nothing in time).
  bool read_line(std::size_t r, std::chrono::seconds limit, std::string& line) {
    auto& k = kids_[r];
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      if (const auto nl = k.pending.find('\n'); nl != std::string::npos) {
        line = k.pending.substr(0, nl);
        k.pending.erase(0, nl + 1);
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        line = "no answer within " + std::to_string(limit.count()) + " s";
        return false;
      }
      pollfd pfd{k.from, POLLIN, 0};
      const int n = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
      if (n < 0 && errno != EINTR) {
        line = std::string("poll: ") + std::strerror(errno);
        return false;
      }
      if (n <= 0) continue;
      char buf[4096];
      const ssize_t got = ::read(k.from, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        int status = 0;
        ::waitpid(k.pid, &status, 0);
        k.pid = -1;
        line = WIFSIGNALED(status) ? "the rank was killed by signal " + std::to_string(WTERMSIG(status))
                                   : "the rank exited with status " + std::to_string(WEXITSTATUS(status));
        if (!k.pending.empty()) line += " after '" + k.pending + "'";
        return false;
      }
      k.pending.append(buf, static_cast<std::size_t>(got));
    }
  }
};

// One pool of ranks at a time (the GPU's memory): the suite of the next rank count replaces it.
struct pool {
  int p = 0;
  std::unique_ptr<ranks> live;
};
pool g_pool;

std::vector<int> rank_counts() {
  const char* v = std::getenv("KFT_CONFORMANCE_CUDA_IPC_RANKS");
  std::istringstream in(v != nullptr ? v : "1 2 3 4");
  std::vector<int> out;
  for (int p; in >> p;)
    if (p >= 1 && p <= kft::cuda_ipc::max_ranks) out.push_back(p);
  return out;
}

}  // namespace

bool init_unit_test() {
  for (int p : rank_counts())
    conf::register_suite("cuda_ipc", p, conf::cases(p, [](kft::collective c) {
                           if (c == kft::collective::allreduce)
                             return std::vector{kft::algo::automatic, kft::algo::one_shot, kft::algo::two_shot};
                           return std::vector{kft::algo::automatic};
                         }),
                         [p](const conf::spec& s) {
                           if (g_pool.p != p || !g_pool.live) {
                             g_pool.live.reset();
                             g_pool.p = p;
                             g_pool.live = std::make_unique<ranks>(p);
                           }
                           return g_pool.live->run(s);
                         });
  return true;
}

int main(int argc, char* argv[]) {
  if (const char* r = std::getenv("KFT_CONFORMANCE_RANK"); r != nullptr) {
    const char* size = std::getenv("KFT_CONFORMANCE_SIZE");
    const char* dir = std::getenv("KFT_CONFORMANCE_STORE");
    const char* fds = std::getenv("KFT_CONFORMANCE_FDS");
    int from = -1, to = -1;
    if (size == nullptr || dir == nullptr || fds == nullptr || std::sscanf(fds, "%d %d", &from, &to) != 2) {
      std::fprintf(stderr, "a conformance rank needs KFT_CONFORMANCE_SIZE, _STORE and _FDS (the runner sets them)\n");
      return 2;
    }
    return serve(std::atoi(r), std::atoi(size), dir, from, to);
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return 77;
  }
  const int rc = boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
  g_pool.live.reset();  // the ranks leave before the program does
  return rc;
}
