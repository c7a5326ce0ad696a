// SPDX-License-Identifier: Apache-2.0
// kft-manifest's job files: the input is a YAML job file, given to the tool itself
// (tools/kft-manifest/main.cpp compiled into this target, its main() renamed) as
// `kft-manifest <trainjob|runtime|mpijob|sbatch> --job-file <input> -o -`, so the whole path runs:
// the job-file reader, kft::manifest::validate (include/kft/manifest/job.hpp) and the writers.
//
// Expected, as the tool documents: exit status 0 (written) or 2 (a kft::config_error naming the
// field). Status 1 means some other exception reached main() (yaml-cpp's own, such as a key that
// is a list; std::out_of_range; a kft error that is not a config_error); an exception escaping
// main(), a crash or undefined behaviour is a finding too. The command line is the stable
// interface: the reader inside the tool can be refactored without touching this target.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <kft/core/atomic_file.hpp>
#include <kft/core/error.hpp>
#include <kft/core/parse.hpp>
#include <kft/manifest/job.hpp>

#include "fuzz_common.hpp"

// Every header the tool includes is already in, so the rename touches only its main().
#define main kft_manifest_tool_main
#include "tools/kft-manifest/main.cpp"
#undef main

namespace {

int job_fd = -1;

int run_tool(const std::vector<std::string>& args, std::string& err) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = -1;
  err = kft_fuzz::quietly([&] {
    kft_fuzz::expect_no_throw("kft-manifest's main()",
                              [&] { rc = kft_manifest_tool_main(static_cast<int>(copy.size()), argv.data()); });
  });
  return rc;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  job_fd = ::memfd_create("kft-fuzz-job.yaml", MFD_CLOEXEC);
  if (job_fd < 0) kft_fuzz::fail("memfd_create failed");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (::ftruncate(job_fd, 0) != 0 || ::pwrite(job_fd, data, size, 0) != static_cast<ssize_t>(size))
    kft_fuzz::fail("writing the job file failed");
  const std::string path = "/proc/self/fd/" + std::to_string(job_fd);
  for (const char* sub : {"trainjob", "runtime", "mpijob", "sbatch"}) {
    std::string err;
    const int rc = run_tool({"kft-manifest", sub, "--job-file", path, "-o", "-"}, err);
    if (rc != 0 && rc != 2)
      kft_fuzz::fail("kft-manifest " + std::string(sub) + " --job-file exited " + std::to_string(rc) +
                     " (only 0 and 2 are documented): " + err);
  }
  return 0;
}
