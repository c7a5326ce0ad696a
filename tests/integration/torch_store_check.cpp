// SPDX-License-Identifier: Apache-2.0
// torch_store_check HOST PORT [1.13|2 [server-goes-away]]: every operation of kft's torch TCPStore
// client against a torch TCPStore server (hosted by torch_store_test.py: the real torch 1.13, or
// torch2_store_server.py speaking torch 2.x's protocol; the script checks the other side: what
// kft wrote, torch reads, and the reverse). The third argument is the protocol the client must
// have chosen; with "server-goes-away" the last check is a wait during which the server ends.
// Prints one line per check; exits 1 on the first error, or after the checks when one failed.
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
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5 || (argc >= 4 && std::string(argv[3]) != "1.13" && std::string(argv[3]) != "2") ||
      (argc == 5 && std::string(argv[4]) != "server-goes-away")) {
    std::fprintf(stderr, "usage: torch_store_check HOST PORT [1.13|2 [server-goes-away]]\n");
    return 2;
  }
  const std::string expect = argc >= 4 ? argv[3] : "";
  const bool goes_away = argc == 5;
  try {
    rdzv::torch_tcp_store::options o;
    o.host = argv[1];
    o.port = std::atoi(argv[2]);
    o.connect_timeout = 10s;
    o.io_timeout = 5s;
    rdzv::torch_tcp_store s(o);
    const bool v2 = s.protocol() == rdzv::torch_wire::version::v2;
    const std::string proto = rdzv::torch_wire::name(s.protocol());
    std::printf("info chose the %s\n", proto.c_str());
    if (!expect.empty()) check(v2 == (expect == "2"), "the client chose the protocol the server speaks");
    check(has(s.describe(), proto), "describe() names the protocol");

    // torch wrote these before starting us.
    check(s.num_keys() == 2, "num_keys counts torch's two keys");
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

    // A timed-out wait names the missing key, and the client still works afterwards (2.x cancels
    // the WAIT on the same connection; torch 1.13 cannot: the client reconnects).
    const std::vector<std::string> keys{"from_torch", "never"};
    bool named = false;
    try {
      s.wait(keys, 300ms);
    } catch (const kft::timeout_error& e) {
      named = has(e.what(), "\"never\"") && !has(e.what(), "\"from_torch\"") && has(e.what(), proto);
    }
    check(named, "a wait that times out names only the missing key and the protocol");
    check(s.get("from_torch", 1s) == "hello from torch", "the client works after a timed-out wait");

    bool missing = false;
    try {
      (void)s.get("missing", 200ms);
    } catch (const kft::timeout_error& e) {
      missing = has(e.what(), "\"missing\"");
    }
    check(missing, "get of a missing key times out naming it");
    check(s.add("torch_counter", 0) == 7, "the client works after that");
    check(s.num_keys() == 6, "num_keys counts torch's and kft's keys");

    bool refused = false;
    try {
      (void)s.keys("");
    } catch (const kft::usage_error&) {
      refused = true;
    }
    check(refused, "keys() is refused (in neither protocol)");

    // Hand-shake with torch: it sets "torch_done" after reading ours; kft waits for it.
    s.set("kft_ready", "1");
    check(s.get("torch_done", 20s) == "1", "wait for a key torch sets later");

    if (goes_away) {
      // The script stops the server now: the wait must end with a transport error naming the
      // address, the operation, the key and the protocol, well before its 20 s.
      std::string what;
      try {
        s.wait(std::vector<std::string>{"never_set"}, 20s);
      } catch (const kft::transport_error& e) {
        what = e.what();
      } catch (const kft::error& e) {
        what = std::string("(not a transport_error) ") + e.what();
      }
      std::printf("info %s\n", what.c_str());
      check(has(what, s.address()) && has(what, "wait") && has(what, "\"never_set\"") && has(what, proto) &&
                !has(what, "not a transport_error"),
            "a server that goes away during a wait: a transport error naming address, operation, key, protocol");
    }
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
