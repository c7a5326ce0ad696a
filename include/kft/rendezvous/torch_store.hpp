// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/torch_store.hpp
/// @brief A client of PyTorch's `TCPStore` (torch 1.13's wire protocol), so a kft program
/// started by torchrun with static rendezvous uses the store torchrun's agent already hosts
/// at `MASTER_ADDR:MASTER_PORT` instead of fighting over that port.
///
/// torchrun's static rendezvous (`--nnodes N --master_addr A --master_port P`, no
/// `--rdzv_backend`) tells workers `TORCHELASTIC_USE_AGENT_STORE=True`: the node-0 agent's
/// `TCPStore` listens on `MASTER_PORT`, and torch's own workers reach it as clients under the
/// prefix `/worker/attempt_<TORCHELASTIC_RESTART_COUNT>`. `connect_store()` does the same
/// (with a `kft/` prefix below it).
///
/// Trust model: torch's store has no authentication. Anyone who can reach the port can read
/// and write every key, exactly as for a PyTorch job started the same way; kft adds no token
/// there (it has none to check against). Bind torchrun's `--master_addr` to an interface only
/// the job's hosts reach, or use kftrun (token-checked store) on shared networks.
///
/// Wire format (little-endian, as torch 1.13's `TCPStore.cpp` defines it): a request is one
/// `u8` query type followed by its fields; strings and byte vectors are `u64 length` + bytes.
///
/// | query | type | fields | reply |
/// | --- | --- | --- | --- |
/// | SET | 0 | key, value | none |
/// | COMPARE_SET | 1 | key, expected, desired | value afterwards |
/// | GET | 2 | key | value (the server drops the connection for an absent key) |
/// | ADD | 3 | key, i64 delta | i64 new value |
/// | CHECK | 4 | u64 n, n keys | u8 0 = all present, 1 = not |
/// | WAIT | 5 | u64 n, n keys | u8 0, once all are present |
/// | GETNUMKEYS | 6 | - | i64 |
/// | DELETE_KEY | 8 | key | i64 keys deleted |
///
/// Keys get the `/` prefix torch's own `TCPStore` client adds, so torch and kft clients see the
/// same names. torch 1.13's server cannot cancel a WAIT, so a wait that times out closes the
/// connection (the next request opens a new one). It cannot list keys (`keys()` throws), and
/// its compare-and-set treats an empty `expected` as "absent".
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <kft/core/timeout.hpp>
#include <kft/rendezvous/detail/socket.hpp>
#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

namespace torch_wire {
enum class query : std::uint8_t {
  set = 0,
  compare_set = 1,
  get = 2,
  add = 3,
  check = 4,
  wait = 5,
  num_keys = 6,
  erase = 8
};
inline constexpr std::uint8_t ready = 0;  // CHECK: all keys present; WAIT: stop waiting
/// Largest value accepted in a reply (torch has no limit; kft's own store caps frames at 64 MiB).
inline constexpr std::uint64_t max_value = 64u << 20;

/// Builds one request.
class request {
 public:
  explicit request(query q) { buf_ += static_cast<char>(q); }
  request& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  request& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  request& bytes(std::string_view s) {
    u64(s.size());
    buf_ += s;
    return *this;
  }
  const std::string& data() const noexcept { return buf_; }

 private:
  std::string buf_;
};

inline std::uint64_t read_u64(std::string_view eight) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(eight[static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}
}  // namespace torch_wire

/// @brief A client of a torch `TCPStore` server. Thread-safe (one request at a time).
class torch_tcp_store final : public store {
 public:
  struct options {
    std::string host;
    int port = 0;
    std::chrono::milliseconds connect_timeout = default_job_timeout;  ///< retry until then (`connect_store` applies KFT_TIMEOUT)
    std::chrono::milliseconds io_timeout = default_timeouts.store_request;  ///< a non-waiting request
    std::string role = "torchrun's agent store";  ///< shown in describe()
  };

  /// @brief Connects (retrying with backoff until `connect_timeout`) and checks that the
  /// server answers torch 1.13's protocol (one GETNUMKEYS round trip).
  /// @throws timeout_error naming the address when it cannot connect in time
  /// @throws transport_error when the server does not answer like a torch 1.13 TCPStore
  explicit torch_tcp_store(options opt) : opt_(std::move(opt)) {
    std::lock_guard lock(mu_);
    connect_locked();
    try {
      (void)round_trip_i64(torch_wire::request(torch_wire::query::num_keys), "connect");
    } catch (const transport_error& e) {
      throw transport_error(describe() + " did not answer like torch 1.13's TCPStore (" + e.detail() +
                                "); kft speaks the wire protocol of torch 1.13 (Debian 12's python3-torch)",
                            error_site::of("store connect"));
    }
  }

  std::string address() const { return detail::endpoint(opt_.host, opt_.port); }
  std::string describe() const override { return "torch TCPStore " + address() + " (" + opt_.role + ")"; }

  void set(std::string_view key, std::string_view value) override {
    std::lock_guard lock(mu_);
    send_request(torch_wire::request(torch_wire::query::set).bytes(wire_key(key)).bytes(value), "set");
  }
  std::optional<std::string> try_get(std::string_view key) override {
    std::lock_guard lock(mu_);
    const std::string k = wire_key(key);
    send_request(torch_wire::request(torch_wire::query::check).u64(1).bytes(k), "get");
    if (read_exact(1, deadline_io(), "get")[0] != static_cast<char>(torch_wire::ready)) return std::nullopt;
    return get_present(k, "get");
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    const std::string k(key);
    std::lock_guard lock(mu_);
    if (!wait_locked(std::span(&k, 1), timeout, "get")) throw timed_out("get", std::span(&k, 1), timeout);
    return get_present(wire_key(key), "get");
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::lock_guard lock(mu_);
    if (!wait_locked(keys, timeout, "wait")) throw timed_out("wait", keys, timeout);
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::lock_guard lock(mu_);
    // torch's server drops the connection when the key holds something that is not an integer.
    return round_trip_i64(torch_wire::request(torch_wire::query::add).bytes(wire_key(key)).i64(delta), "add");
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    std::lock_guard lock(mu_);
    send_request(torch_wire::request(torch_wire::query::compare_set)
                     .bytes(wire_key(key))
                     .bytes(expected.value_or(""))
                     .bytes(desired),
                 "compare_set");
    cas_result out;
    out.current = read_value(deadline_io(), "compare_set");
    out.swapped = *out.current == desired;
    return out;
  }
  bool erase(std::string_view key) override {
    std::lock_guard lock(mu_);
    return round_trip_i64(torch_wire::request(torch_wire::query::erase).bytes(wire_key(key)), "erase") == 1;
  }
  std::vector<std::string> keys(std::string_view) override {
    throw usage_error("listing keys is not part of torch's TCPStore protocol (" + describe() + ")",
                      error_site::of("store keys"));
  }

 private:
  static std::string wire_key(std::string_view key) {
    std::string k;  // (built by append: GCC 12's -Wrestrict misfires on "/" + std::string at -O3)
    k.reserve(key.size() + 1);
    k.push_back('/');
    k.append(key);
    return k;
  }
  detail::clock::time_point deadline_io() const { return detail::clock::now() + opt_.io_timeout; }

  void connect_locked() { fd_ = detail::connect_with_retry(opt_.host, opt_.port, opt_.connect_timeout); }

  [[noreturn]] void lost(const char* what, const std::string& why) {
    fd_.reset();
    throw transport_error("lost the torch store at " + address() + ": " + why, error_site::of(std::string("store ") + what));
  }

  void send_request(const torch_wire::request& r, const char* what) {
    if (!fd_) connect_locked();  // after a timed-out wait, which leaves the old connection unusable
    if (auto why = detail::send_all(fd_.get(), r.data(), deadline_io()); !why.empty()) lost(what, why);
  }

  // Reads `count` bytes; `quiet_timeout` = return an empty string at the deadline instead of
  // throwing (a WAIT that may legitimately run out).
  std::string read_exact(std::size_t count, detail::clock::time_point deadline, const char* what,
                         bool quiet_timeout = false) {
    std::string buf(count, '\0');
    using st = detail::recv_result::status;
    const auto r = detail::recv_exact(fd_.get(), buf.data(), count, deadline);
    if (r.what == st::timeout) {
      if (quiet_timeout && r.got == 0) return {};
      lost(what, "no reply in time");
    }
    if (r.what == st::closed)
      lost(what, "the store closed the connection (torch's server does that on a request it cannot serve, "
                 "e.g. add on a key that holds no integer; or its host process ended)");
    if (r.what == st::error) lost(what, detail::errno_text(r.err));
    return buf;
  }

  std::int64_t round_trip_i64(const torch_wire::request& r, const char* what) {
    send_request(r, what);
    return static_cast<std::int64_t>(torch_wire::read_u64(read_exact(8, deadline_io(), what)));
  }

  std::string read_value(detail::clock::time_point deadline, const char* what) {
    const auto n = torch_wire::read_u64(read_exact(8, deadline, what));
    if (n > torch_wire::max_value) lost(what, "a reply of " + std::to_string(n) + " bytes (over 64 MiB)");
    return read_exact(static_cast<std::size_t>(n), deadline, what);
  }

  // GET of a key known to exist.
  std::string get_present(const std::string& wire, const char* what) {
    send_request(torch_wire::request(torch_wire::query::get).bytes(wire), what);
    return read_value(deadline_io(), what);
  }

  // WAIT for all keys; false at the deadline (the connection is then closed: torch 1.13
  // would still answer that WAIT later, out of step with the next request).
  bool wait_locked(std::span<const std::string> keys, std::chrono::milliseconds timeout, const char* what) {
    torch_wire::request r(torch_wire::query::wait);
    r.u64(keys.size());
    for (const auto& k : keys) r.bytes(wire_key(k));
    send_request(r, what);
    const auto reply = read_exact(1, detail::clock::now() + timeout, what, true);
    if (reply.empty()) {
      fd_.reset();
      return false;
    }
    if (reply[0] != static_cast<char>(torch_wire::ready)) lost(what, "unexpected reply to WAIT");
    return true;
  }

  // The keys still missing, for the message (asked on a fresh connection).
  timeout_error timed_out(const std::string& op, std::span<const std::string> keys, std::chrono::milliseconds timeout) {
    std::vector<std::string> missing;
    try {
      for (const auto& k : keys) {
        send_request(torch_wire::request(torch_wire::query::check).u64(1).bytes(wire_key(k)), "wait");
        if (read_exact(1, deadline_io(), "wait")[0] != static_cast<char>(torch_wire::ready)) missing.push_back(k);
      }
    } catch (const error&) {
      missing.assign(keys.begin(), keys.end());
    }
    if (missing.empty()) missing.assign(keys.begin(), keys.end());  // arrived just now: name them all
    return detail::wait_timeout(op, missing, timeout, describe());
  }

  options opt_;
  std::mutex mu_;
  detail::unique_fd fd_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
