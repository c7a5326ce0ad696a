// SPDX-License-Identifier: Apache-2.0
// Starting the ranks of a single-node CUDA bench: p copies of this program, each told its rank,
// the rank count and a file-store directory through KFT_PERF_RANK / KFT_PERF_SIZE /
// KFT_PERF_STORE. Shared by cuda_ipc_perf and ddp_overlap_cuda (CUDA IPC needs its ranks to be
// distinct processes, so these benches cannot run ranks as threads).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace cuda_bench {

// This process's rank when it is one of launch()'s copies: {rank, size, store directory}.
struct rank_env {
  int rank = -1, size = 0;
  const char* store = nullptr;
  bool is_rank() const noexcept { return rank >= 0; }
};
inline rank_env this_rank() {
  rank_env e;
  const char* r = std::getenv("KFT_PERF_RANK");
  const char* s = std::getenv("KFT_PERF_SIZE");
  const char* d = std::getenv("KFT_PERF_STORE");
  if (r != nullptr && s != nullptr && d != nullptr) {
    e.rank = std::atoi(r);
    e.size = std::atoi(s);
    e.store = d;
  }
  return e;
}

// Starts p copies of this program (same arguments) as ranks, waits for every one and returns
// the last non-zero exit status (0 when all passed). `name` prefixes the temporary directory.
inline int launch(char** argv, int p, const char* name) {
  std::string tmpl = std::string("/tmp/kft_") + name + "_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* dir = ::mkdtemp(buf.data());
  if (dir == nullptr) {
    std::perror(name);
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("KFT_PERF_RANK", std::to_string(r).c_str(), 1);
      ::setenv("KFT_PERF_SIZE", std::to_string(p).c_str(), 1);
      ::setenv("KFT_PERF_STORE", dir, 1);
      ::execv("/proc/self/exe", argv);
      std::_Exit(127);
    }
    if (pid < 0) std::perror(name);
    else pids.push_back(pid);
  }
  int worst = static_cast<int>(pids.size()) == p ? 0 : 1;
  for (auto pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0) worst = rc;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return worst;
}

}  // namespace cuda_bench
