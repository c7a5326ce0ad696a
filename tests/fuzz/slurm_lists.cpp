// SPDX-License-Identifier: Apache-2.0
// Slurm's compressed lists: the whole input is given to expand_hostlist (`node[01-04,7],gpu-[1-2]`)
// and to expand_tasks_per_node (`2(x3),1`).
//
// Expected: a config_error naming the variable and the list, or a result inside the caps
// (at most max_hostlist_entries entries and max_hostlist_bytes characters, no empty host name,
// task counts in [0, 2^24]). The caps are what keep a typo such as `n[0-999999999]` from eating
// memory and time: libFuzzer's -rss_limit_mb and -timeout enforce them from outside.
#include <algorithm>
#include <string>

#include <kft/discovery/slurm_lists.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using kft_fuzz::check;
  const std::string_view list = kft_fuzz::text(data, size);
  namespace slurm = kft::slurm;

  std::vector<std::string> hosts;
  const bool hosts_ok = kft_fuzz::expect_only<kft::config_error>(
      "expand_hostlist", [&] { hosts = slurm::expand_hostlist(list, "SLURM_STEP_NODELIST"); });
  if (hosts_ok) {
    check(!hosts.empty(), "a host list that parses names at least one host");
    check(hosts.size() <= slurm::max_hostlist_entries, "host count within max_hostlist_entries");
    std::size_t bytes = 0;
    for (const auto& h : hosts) {
      check(!h.empty(), "no empty host name");
      bytes += h.size();
    }
    check(bytes <= slurm::max_hostlist_bytes, "host names within max_hostlist_bytes");
    // A list without brackets is its names, unchanged.
    if (list.find_first_of("[]") == std::string_view::npos)
      check(hosts.size() == static_cast<std::size_t>(std::count(list.begin(), list.end(), ',')) + 1,
            "a list without brackets has one host per comma-separated name");
  }

  std::vector<int> tasks;
  const bool tasks_ok = kft_fuzz::expect_only<kft::config_error>(
      "expand_tasks_per_node", [&] { tasks = slurm::expand_tasks_per_node(list, "SLURM_STEP_TASKS_PER_NODE"); });
  if (tasks_ok) {
    check(!tasks.empty(), "a task list that parses has at least one node");
    check(tasks.size() <= slurm::max_hostlist_entries, "node count within max_hostlist_entries");
    for (int t : tasks) check(t >= 0 && t <= (1 << 24), "task count in [0, 2^24]");
  }
  return 0;
}
