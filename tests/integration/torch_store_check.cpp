// SPDX-License-Identifier: Apache-2.0
// torch_store_check HOST PORT: every operation of kft's torch TCPStore client against a real
// torch TCPStore server (hosted by torch_store_test.py, which checks the other side: what kft
// wrote, torch reads, and the reverse). Prints one line per check; exits 1 on the first failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kft/rendezvous/torch_store.hpp>

using namespace std::chrono_literals;
namespace rdzv = kft::rendezvous;

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: torch_store_check HOST PORT\n");
    return 2;
  }
  try {
    rdzv::torch_tcp_store::options o;
    o.host = argv[1];
    o.port = std::atoi(argv[2]);
    o.connect_timeout = 10s;
    o.io_timeout = 5s;
    rdzv::torch_tcp_store s(o);

    // torch wrote these before starting us.
    check(s.get("from_torch", 5s) == "hello from torch", "get a key torch set");
    check(s.try_get("from_torch") == std::optional<std::string>("hello from torch"), "try_get an existing key");
    check(!s.try_get("absent").has_value(), "try_get an absent key");
    check(s.add("torch_counter", 2) == 7, "add to torch's counter (5 + 2)");

    s.set("from_kft", std::string("bytes\0with nul", 14));
    s.set("kft_counter_base", "x");
    check(s.add("kft_counter", 3) == 3, "add creates a counter");
    check(s.add("kft_counter", -1) == 2, "add a negative delta");

    const auto swapped = s.compare_set("cas", std::nullopt, "first");
    check(swapped.swapped && swapped.current == std::optional<std::string>("first"), "compare_set on an absent key");
    const auto kept = s.compare_set("cas", "wrong", "second");
    check(!kept.swapped && kept.current == std::optional<std::string>("first"), "compare_set with a wrong expectation");
    const auto replaced = s.compare_set("cas", "first", "second");
    check(replaced.swapped && replaced.current == std::optional<std::string>("second"), "compare_set replaces");

    s.set("doomed", "1");
    check(s.erase("doomed"), "erase an existing key");
    check(!s.erase("doomed"), "erase it again");

    // A timed-out wait names the missing key, and the client still works afterwards (torch 1.13
    // cannot cancel a WAIT: the client reconnects).
    const std::vector<std::string> keys{"from_torch", "never"};
    bool named = false;
    try {
      s.wait(keys, 300ms);
    } catch (const kft::timeout_error& e) {
      named = std::string(e.what()).find("\"never\"") != std::string::npos &&
              std::string(e.what()).find("\"from_torch\"") == std::string::npos;
    }
    check(named, "a wait that times out names only the missing key");
    check(s.get("from_torch", 1s) == "hello from torch", "the client works after a timed-out wait");

    bool refused = false;
    try {
      (void)s.keys("");
    } catch (const kft::usage_error&) {
      refused = true;
    }
    check(refused, "keys() is refused (not in torch's protocol)");

    // Hand-shake with torch: it sets "torch_done" after reading ours; kft waits for it.
    s.set("kft_ready", "1");
    check(s.get("torch_done", 20s) == "1", "wait for a key torch sets later");
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
