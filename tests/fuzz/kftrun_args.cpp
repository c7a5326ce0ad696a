// SPDX-License-Identifier: Apache-2.0
// kftrun's command line: the input is one argument per line, given after "kftrun" to the
// parser kftrun's main() uses (tools/kftrun/cli.hpp: every flag, its PET_*/KFT_* form, the
// checks that follow). The agent is never started.
//
// Expected, as kftrun documents: options to run with, or exit status 0 (--help, --version) or
// 2 (bad input, a message naming the flag). Any exception escaping the parser, a crash or
// undefined behaviour is a finding; so are options that break the agent's assumptions (checked
// below: a node rank outside the job, no program, a zero or negative wait, a port out of range).
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "fuzz_common.hpp"
#include "tools/kftrun/cli.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"kftrun"};
  for (auto line : kft_fuzz::lines(kft_fuzz::text(data, size))) {
    if (args.size() > 64) break;
    args.emplace_back(line);
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  std::variant<kftrun::options, int> parsed = 1;
  const std::string err = kft_fuzz::quietly([&] {
    kft_fuzz::expect_no_throw("kftrun's parse_command_line()", [&] {
      parsed = kftrun::parse_command_line(static_cast<int>(args.size()), argv.data());
    });
  });

  if (const int* status = std::get_if<int>(&parsed)) {
    kft_fuzz::check(*status == 0 || *status == 2, "kftrun's parser returned status " + std::to_string(*status) +
                                                      " (only 0 and 2 are documented): " + err);
    kft_fuzz::check(*status == 0 || !err.empty(), "a refused command line printed no message");
    return 0;
  }
  const auto& o = std::get<kftrun::options>(parsed);
  using std::chrono::milliseconds;
  kft_fuzz::check(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, "node rank " +
                  std::to_string(o.node_rank) + " outside --nnodes " + std::to_string(o.nnodes));
  kft_fuzz::check(o.nproc_per_node >= 1 && o.nproc_per_node <= (1 << 16), "nproc " + std::to_string(o.nproc_per_node));
  kft_fuzz::check(o.master_port >= 0 && o.master_port <= 65535 && (o.nnodes == 1 || o.master_port > 0),
                  "master port " + std::to_string(o.master_port));
  kft_fuzz::check(!o.program.empty(), "no program to start");
  kft_fuzz::check(o.max_restarts >= 0, "negative --max-restarts");
  for (auto [name, d] : {std::pair{"job timeout", o.job_timeout}, std::pair{"rendezvous timeout", o.rdzv_timeout},
                         std::pair{"monitor interval", o.monitor_interval},
                         std::pair{"heartbeat timeout", o.heartbeat_timeout}})
    kft_fuzz::check(d > milliseconds(0) && d <= milliseconds(31LL * 24 * 3600 * 1000),
                    std::string(name) + " of " + std::to_string(d.count()) + " ms");
  kft_fuzz::check(o.term_grace >= milliseconds(0), "negative --term-grace");
  kft_fuzz::check(o.exit_grace >= milliseconds(0), "negative --exit-grace");
  kft_fuzz::check(!o.token.empty(), "no store token");
  return 0;
}
