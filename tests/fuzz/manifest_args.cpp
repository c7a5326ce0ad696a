// SPDX-License-Identifier: Apache-2.0
// kft-manifest's command line: the input is one argument per line, given after "kft-manifest"
// to the tool itself (tools/kft-manifest/main.cpp compiled into this target, its main()
// renamed), so every flag's conversion, kft::manifest::validate and the writers run.
//
// Expected, as the tool documents: exit status 0 (written) or 2 (bad input naming the flag).
// Status 1, an exception escaping main(), a crash or undefined behaviour is a finding. The
// output goes nowhere: `-o`/`--output-file` and `--job-file` (with their values) are taken out
// of the input before the tool sees it, so a run writes no file and reads none (job files have
// their own target, manifest_job).
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

// A flag that names a file (or a short-flag cluster that could hold -o).
bool names_a_file(std::string_view a) {
  for (std::string_view f : {"--output-file", "--job-file"})
    if (a == f || (a.size() > f.size() && a.substr(0, f.size() + 1) == std::string(f) + "=")) return true;
  return a.size() >= 2 && a[0] == '-' && a[1] != '-' && a.find('o') != std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"kft-manifest"};
  const auto lines = kft_fuzz::lines(kft_fuzz::text(data, size));
  for (std::size_t i = 0; i < lines.size() && args.size() <= 64; ++i) {
    if (names_a_file(lines[i])) {
      if (lines[i].find('=') == std::string_view::npos && (lines[i] == "--output-file" || lines[i] == "--job-file" ||
                                                           lines[i] == "-o"))
        ++i;  // and its value
      continue;
    }
    args.emplace_back(lines[i]);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int rc = -1;
  const std::string err = kft_fuzz::quietly([&] {
    kft_fuzz::expect_no_throw("kft-manifest's main()",
                              [&] { rc = kft_manifest_tool_main(static_cast<int>(args.size()), argv.data()); });
  });
  if (rc != 0 && rc != 2)
    kft_fuzz::fail("kft-manifest exited " + std::to_string(rc) + " (only 0 and 2 are documented): " + err);
  return 0;
}
