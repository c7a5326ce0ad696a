// SPDX-License-Identifier: Apache-2.0
// kft-trace: reads every rank's flight-recorder dump (KFT_TRACE_DIR, docs/flight-recorder.md)
// and names what went wrong: the first call where ranks diverge (a different collective, dtype,
// count or root), the call the job is stuck in with who is inside it and who never entered, and
// the chain of waits followed from rank to rank to the one at fault.
//
//   kft-trace /shared/trace            # a report for a person
//   kft-trace --json /shared/trace     # the same as one JSON object, for scripts
//
// Exit status: 0 after a report (whatever it found), 2 for bad input (no such directory, no
// dump in it, a file that is not a dump), naming the file and line at fault.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "../common/cli.hpp"
#include "analyze.hpp"

int main(int argc, char** argv) {
  constexpr const char* tool = "kft-trace";
  CLI::App app{"kft-trace: reads every rank's flight-recorder dump and names the rank and the call at fault"};
  kft_tools::common_flags common;
  common.add_to(app, tool);
  std::string dir;
  bool as_json = false;
  app.add_option("dir", dir, "the directory the ranks dumped to (their KFT_TRACE_DIR)")->required();
  app.add_flag("--json", as_json, "print the report as one JSON object");
  if (const auto status = kft_tools::parse(app, tool, argc, argv)) return *status;
  try {
    common.apply();
    const auto report = kft_trace::analyze(kft_trace::read_dir(dir));
    if (as_json) std::cout << report.dump(2) << "\n";
    else std::cout << kft_trace::describe(report, dir);
    return 0;
  } catch (const kft_trace::bad_input& e) {
    kft::log::error(tool, e.what());
    return kft_tools::usage_status;
  } catch (const std::exception& e) {
    kft::log::error(tool, kft_tools::message_of(e, tool));
    return kft_tools::usage_status;
  }
}
