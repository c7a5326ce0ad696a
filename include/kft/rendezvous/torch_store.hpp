// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/torch_store.hpp
/// @brief A client of PyTorch's `TCPStore` that speaks torch 1.13's wire protocol and torch
/// 2.x's (the validated one), so a kft program started by torchrun with static rendezvous uses
/// the store torchrun's agent already hosts at `MASTER_ADDR:MASTER_PORT` instead of fighting
/// over that port.
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
/// Wire format (both versions, little-endian): a request is one `u8` query type followed by its
/// fields; strings and byte vectors are `u64 length` + bytes. The numbering differs:
///
/// | query | 1.13 | 2.x | fields | reply |
/// | --- | --- | --- | --- | --- |
/// | VALIDATE | - | 0 | u32 0x3C85F7CE | none; must be a connection's first request |
/// | SET | 0 | 1 | key, value | none |
/// | COMPARE_SET | 1 | 2 | key, expected, desired | value afterwards |
/// | GET | 2 | 3 | key | value (absent key: dropped by 1.13 and 2.x classic; empty from 2.x libuv) |
/// | ADD | 3 | 4 | key, i64 delta | i64 new value |
/// | CHECK | 4 | 5 | u64 n, n keys | u8 0 = all present, 1 = not |
/// | WAIT | 5 | 6 | u64 n, n keys | u8 0, once all are present |
/// | GETNUMKEYS | 6 | 7 | - | i64 |
/// | DELETE_KEY | 8 | 8 | key | i64 keys deleted |
/// | CANCEL_WAIT | - | 12 | - | u8 1 (after the u8 0 of a WAIT that completed first) |
/// | PING | - | 13 | u32 nonce | the same u32 |
///
/// (1.13's 7 is WATCH_KEY; 2.x also has APPEND 9, MULTI_GET 10, MULTI_SET 11 and queues 14-16,
/// which kft does not use.) torch 2.x's servers (the libuv one, torchrun's default since 2.4,
/// and the older poll-based one) serve nothing on a connection whose first request is not
/// VALIDATE with that magic: the classic server drops the connection, the libuv server leaves
/// it unanswered. Both drop a connection that sends an unknown query type, as 1.13 does.
///
/// Which version: chosen per connection, by what the server answers. kft first sends 1.13's
/// GETNUMKEYS (what a 1.13 server has always seen from kft); a 1.13 server answers it with an
/// i64. A 2.x server drops the connection or stays silent (`options::probe_timeout`), and kft
/// then opens a new connection and sends VALIDATE + PING in one write; a 2.x server echoes the
/// nonce. Those 10 bytes cannot harm a 1.13 server that was only slow: it reads them as a SET
/// whose key length is at least 2^63 (the nonce's third byte has its top bit set) and drops
/// the connection at once, without blocking or storing anything; kft then asks 1.13's question
/// again with the full I/O timeout. A reconnect (after a lost connection) chooses again.
///
/// Keys get the `/` prefix torch's own `TCPStore` client adds, so torch and kft clients see the
/// same names. Neither version can list keys (`keys()` throws; `num_keys()` counts them). A
/// compare-and-set treats an empty `expected` as "absent" in both. A WAIT that times out is
/// cancelled with CANCEL_WAIT under 2.x (the connection stays); 1.13 cannot cancel one, so the
/// connection is closed and the next request opens a new one.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
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
/// The protocol a connection speaks.
enum class version : std::uint8_t { v1_13, v2 };

inline const char* name(version v) noexcept { return v == version::v2 ? "torch 2.x protocol" : "torch 1.13 protocol"; }

/// The queries kft sends, by meaning; `code()` gives each version's number.
enum class query : std::uint8_t { validate, set, compare_set, get, add, check, wait, num_keys, erase, cancel_wait, ping };

inline constexpr std::uint8_t no_code = 0xff;

/// The query type byte of `q` under `v` (`no_code` where that version lacks it).
constexpr std::uint8_t code(query q, version v) noexcept {
  constexpr std::array<std::uint8_t, 11> v1{no_code, 0, 1, 2, 3, 4, 5, 6, 8, no_code, no_code};
  constexpr std::array<std::uint8_t, 11> v2{0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13};
  return (v == version::v2 ? v2 : v1)[static_cast<std::size_t>(q)];
}
static_assert(code(query::num_keys, version::v1_13) == 6 && code(query::erase, version::v1_13) == 8);
static_assert(code(query::num_keys, version::v2) == 7 && code(query::erase, version::v2) == 8);

inline constexpr std::uint8_t ready = 0;          // CHECK: all keys present; WAIT: stop waiting
inline constexpr std::uint8_t wait_canceled = 1;  // 2.x: the answer to CANCEL_WAIT
inline constexpr std::uint32_t validation_magic = 0x3C85F7CE;
/// Largest value accepted in a reply (torch has no limit; kft's own store caps frames at 64 MiB).
inline constexpr std::uint64_t max_value = 64u << 20;

/// The PING nonce kft sends: bit 23 set, so that a 1.13 server reading VALIDATE + PING as a SET
/// sees a key length of at least 2^63 and refuses it at once (see the file comment).
inline std::uint32_t ping_nonce() noexcept {
  return 0x4b800000u | (static_cast<std::uint32_t>(::getpid()) & 0xffffu);
}
static_assert((0x4b800000u >> 16 & 0xffu) >= 0x80u);

/// Builds one request (or several, sent in one write).
class request {
 public:
  request(query q, version v) { add(q, v); }
  request& add(query q, version v) {
    buf_ += static_cast<char>(code(q, v));
    return *this;
  }
  request& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
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

inline std::uint64_t read_le(std::string_view b) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < b.size(); ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
  return v;
}
inline std::uint64_t read_u64(std::string_view eight) { return read_le(eight.substr(0, 8)); }
}  // namespace torch_wire

/// @brief A client of a torch `TCPStore` server (torch 1.13 or 2.x, chosen per connection).
/// Thread-safe (one request at a time).
class torch_tcp_store final : public store {
 public:
  struct options {
    std::string host;
    int port = 0;
    std::chrono::milliseconds connect_timeout = default_job_timeout;  ///< retry until then (`connect_store` applies KFT_TIMEOUT)
    std::chrono::milliseconds io_timeout = default_timeouts.store_request;  ///< a non-waiting request
    /// How long 1.13's GETNUMKEYS may go unanswered before torch 2.x's handshake is tried (a 2.x
    /// libuv server leaves it unanswered; capped by `io_timeout`).
    std::chrono::milliseconds probe_timeout = std::chrono::milliseconds(500);
    std::string role = "torchrun's agent store";  ///< shown in describe()
    /// The local address to connect from (numeric; empty = the kernel's choice).
    std::string source_address{};
  };

  /// @brief Connects (retrying with backoff until `connect_timeout`) and chooses the protocol by
  /// what the server answers (see the file comment).
  /// @throws timeout_error naming the address when it cannot connect in time
  /// @throws transport_error when the server answers like neither torch 1.13's nor 2.x's TCPStore
  explicit torch_tcp_store(options opt) : opt_(std::move(opt)) {
    std::lock_guard lock(mu_);
    connect_locked();
  }

  std::string address() const { return detail::endpoint(opt_.host, opt_.port); }
  /// @brief The protocol of the current (or last) connection.
  torch_wire::version protocol() const noexcept { return version_.load(); }
  std::string describe() const override {
    return "torch TCPStore " + address() + " (" + opt_.role + ", " + torch_wire::name(protocol()) + ")";
  }

  void set(std::string_view key, std::string_view value) override {
    std::lock_guard lock(mu_);
    const op o = on("set", key);
    send_request(req(query::set).bytes(wire_key(key)).bytes(value), o);
  }
  std::optional<std::string> try_get(std::string_view key) override {
    std::lock_guard lock(mu_);
    const op o = on("get", key);
    const std::string k = wire_key(key);
    if (!check_locked(k, o)) return std::nullopt;
    return get_present(k, o);
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    const std::string k(key);
    std::lock_guard lock(mu_);
    const op o = on("get", key);
    if (!wait_locked(std::span(&k, 1), timeout, o)) throw timed_out("get", std::span(&k, 1), timeout);
    return get_present(wire_key(key), o);
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::lock_guard lock(mu_);
    const op o = on("wait", keys);
    if (!wait_locked(keys, timeout, o)) throw timed_out("wait", keys, timeout);
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::lock_guard lock(mu_);
    // torch's servers drop the connection when the key holds something that is not an integer.
    const op o = on("add", key);
    return round_trip_i64(req(query::add).bytes(wire_key(key)).i64(delta), o);
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    std::lock_guard lock(mu_);
    const op o = on("compare_set", key);
    send_request(req(query::compare_set).bytes(wire_key(key)).bytes(expected.value_or("")).bytes(desired), o);
    cas_result out;
    out.current = read_value(deadline_io(), o);
    out.swapped = *out.current == desired;
    return out;
  }
  bool erase(std::string_view key) override {
    std::lock_guard lock(mu_);
    const op o = on("erase", key);
    return round_trip_i64(req(query::erase).bytes(wire_key(key)), o) == 1;
  }
  /// @brief How many keys the server holds (all of them, torch's and kft's; GETNUMKEYS).
  std::int64_t num_keys() {
    std::lock_guard lock(mu_);
    return round_trip_i64(req(query::num_keys), op{"num_keys", {}});
  }
  std::vector<std::string> keys(std::string_view) override {
    throw usage_error("listing keys is part of neither torch 1.13's nor torch 2.x's TCPStore protocol (" + describe() +
                          "; num_keys() counts them)",
                      error_site::of("store keys"));
  }

 private:
  using query = torch_wire::query;
  using version = torch_wire::version;

  /// What a request is for, for messages: the operation and its keys (without torch's "/").
  struct op {
    const char* name;
    std::string keys;  ///< e.g. `key "a"`; empty for GETNUMKEYS
  };
  static op on(const char* name, std::string_view key) {
    std::string k = "key \"";
    k.append(key);
    k += '"';
    return {name, std::move(k)};
  }
  static op on(const char* name, std::span<const std::string> keys) {
    return {name, (keys.size() == 1 ? "key " : "keys ") + detail::missing_list(keys)};
  }

  static std::string wire_key(std::string_view key) {
    std::string k;  // (built by append: GCC 12's -Wrestrict misfires on "/" + std::string at -O3)
    k.reserve(key.size() + 1);
    k.push_back('/');
    k.append(key);
    return k;
  }
  // Starts a request in the connection's protocol; after a lost connection or a timed-out 1.13
  // wait, connects (and chooses the protocol) again first.
  torch_wire::request req(query q) {
    if (!fd_) connect_locked();
    return torch_wire::request(q, version_.load());
  }
  detail::clock::time_point deadline_io() const { return detail::clock::now() + opt_.io_timeout; }

  std::string where(const op& o) const {
    return "torch TCPStore at " + address() + " (" + torch_wire::name(version_.load()) + ") during " + o.name +
           (o.keys.empty() ? std::string() : " (" + o.keys + ")");
  }

  [[noreturn]] void lost(const op& o, const std::string& why) {
    fd_.reset();
    throw transport_error("lost the " + where(o) + ": " + why, error_site::of(std::string("store ") + o.name));
  }

  // One attempt at a protocol on a fresh connection: the reply's bytes, or why there are none.
  struct probe_result {
    std::string reply;
    detail::recv_result::status status = detail::recv_result::status::ok;
    std::string why;
  };
  probe_result probe(const torch_wire::request& r, std::size_t reply_size, std::chrono::milliseconds wait) {
    using st = detail::recv_result::status;
    probe_result p;
    fd_ = detail::connect_with_retry(opt_.host, opt_.port, opt_.connect_timeout, {}, opt_.source_address);
    if (auto why = detail::send_all(fd_.get(), r.data(), detail::clock::now() + opt_.io_timeout); !why.empty()) {
      p.status = st::error;
      p.why = why;
      return p;
    }
    p.reply.assign(reply_size, '\0');
    const auto got = detail::recv_exact(fd_.get(), p.reply.data(), reply_size, detail::clock::now() + wait);
    p.status = got.what;
    if (got.what == st::timeout) p.why = "no answer within " + kft::detail::describe_duration(wait);
    if (got.what == st::closed) p.why = "the server closed the connection";
    if (got.what == st::error) p.why = detail::errno_text(got.err);
    return p;
  }

  // Connects and chooses the protocol (see the file comment). Leaves fd_ open on success.
  void connect_locked() {
    using st = detail::recv_result::status;
    const auto probe_wait = std::min(opt_.probe_timeout, opt_.io_timeout);
    const torch_wire::request v1_probe(query::num_keys, version::v1_13);
    auto first = probe(v1_probe, 8, probe_wait);
    if (first.status == st::ok) {
      version_ = version::v1_13;
      return;
    }
    const std::uint32_t nonce = torch_wire::ping_nonce();
    torch_wire::request hello(query::validate, version::v2);
    hello.u32(torch_wire::validation_magic).add(query::ping, version::v2).u32(nonce);
    auto second = probe(hello, 4, opt_.io_timeout);
    if (second.status == st::ok) {
      const auto echoed = static_cast<std::uint32_t>(torch_wire::read_le(second.reply));
      if (echoed == nonce) {
        version_ = version::v2;
        return;
      }
      second.why = "PING answered " + std::to_string(echoed) + " instead of " + std::to_string(nonce);
    } else if (first.status == st::timeout && second.status == st::closed) {
      // A 1.13 server that was slow to answer refuses the handshake at once: ask it again.
      auto third = probe(v1_probe, 8, opt_.io_timeout);
      if (third.status == st::ok) {
        version_ = version::v1_13;
        return;
      }
      first.why += "; asked again: " + third.why;
    }
    fd_.reset();
    throw transport_error(describe_address() + " answered like neither torch 1.13's TCPStore (GETNUMKEYS: " + first.why +
                              ") nor torch 2.x's (VALIDATE + PING: " + second.why +
                              "); kft speaks torch 1.13's wire protocol (Debian 12's python3-torch) and torch "
                              "2.x's validated one",
                          error_site::of("store connect"));
  }
  std::string describe_address() const { return "torch TCPStore " + address() + " (" + opt_.role + ")"; }

  void send_request(const torch_wire::request& r, const op& o) {
    if (auto why = detail::send_all(fd_.get(), r.data(), deadline_io()); !why.empty()) lost(o, why);
  }

  // Reads `count` bytes; `quiet_timeout` = return an empty string at the deadline instead of
  // throwing (a WAIT that may legitimately run out).
  std::string read_exact(std::size_t count, detail::clock::time_point deadline, const op& o, bool quiet_timeout = false) {
    std::string buf(count, '\0');
    using st = detail::recv_result::status;
    const auto r = detail::recv_exact(fd_.get(), buf.data(), count, deadline);
    if (r.what == st::timeout) {
      if (quiet_timeout && r.got == 0) return {};
      lost(o, "no reply in time");
    }
    if (r.what == st::closed)
      lost(o, std::string("the store closed the connection (torch's server does that on a request it cannot serve, "
                          "e.g. add on a key that holds no integer") +
                  (version_.load() == version::v2 ? ", or, from 2.x's libuv server, a key over 8 KiB or a value over 8 MiB"
                                                  : "") +
                  "; or its host process ended)");
    if (r.what == st::error) lost(o, detail::errno_text(r.err));
    return buf;
  }

  std::int64_t round_trip_i64(const torch_wire::request& r, const op& o) {
    send_request(r, o);
    return static_cast<std::int64_t>(torch_wire::read_u64(read_exact(8, deadline_io(), o)));
  }

  std::string read_value(detail::clock::time_point deadline, const op& o) {
    const auto n = torch_wire::read_u64(read_exact(8, deadline, o));
    if (n > torch_wire::max_value) lost(o, "a reply of " + std::to_string(n) + " bytes (over 64 MiB)");
    return read_exact(static_cast<std::size_t>(n), deadline, o);
  }

  bool check_locked(const std::string& wire, const op& o) {
    send_request(req(query::check).u64(1).bytes(wire), o);
    return read_exact(1, deadline_io(), o)[0] == static_cast<char>(torch_wire::ready);
  }

  // GET of a key known to exist.
  std::string get_present(const std::string& wire, const op& o) {
    send_request(req(query::get).bytes(wire), o);
    return read_value(deadline_io(), o);
  }

  // WAIT for all keys; false at the deadline. 2.x cancels the WAIT and keeps the connection;
  // 1.13 cannot, and would still answer that WAIT later, out of step with the next request, so
  // the connection is closed.
  bool wait_locked(std::span<const std::string> keys, std::chrono::milliseconds timeout, const op& o) {
    torch_wire::request r = req(query::wait);
    r.u64(keys.size());
    for (const auto& k : keys) r.bytes(wire_key(k));
    send_request(r, o);
    auto reply = read_exact(1, detail::clock::now() + timeout, o, true);
    if (reply.empty()) {
      if (version_.load() == version::v1_13) {
        fd_.reset();
        return false;
      }
      send_request(req(query::cancel_wait), o);
      reply = read_exact(1, deadline_io(), o);
      if (reply[0] == static_cast<char>(torch_wire::wait_canceled)) return false;
      // The keys arrived before the server saw the cancel: the WAIT's answer, then the cancel's.
      if (reply[0] != static_cast<char>(torch_wire::ready) ||
          read_exact(1, deadline_io(), o)[0] != static_cast<char>(torch_wire::wait_canceled))
        lost(o, "unexpected reply to CANCEL_WAIT");
      return true;
    }
    if (reply[0] != static_cast<char>(torch_wire::ready)) lost(o, "unexpected reply to WAIT");
    return true;
  }

  // The keys still missing, for the message (1.13: asked on a fresh connection).
  timeout_error timed_out(const std::string& name, std::span<const std::string> keys, std::chrono::milliseconds timeout) {
    std::vector<std::string> missing;
    try {
      for (const auto& k : keys)
        if (!check_locked(wire_key(k), on("wait", k))) missing.push_back(k);
    } catch (const error&) {
      missing.assign(keys.begin(), keys.end());
    }
    if (missing.empty()) missing.assign(keys.begin(), keys.end());  // arrived just now: name them all
    return detail::wait_timeout(name, missing, timeout, describe());
  }

  options opt_;
  std::mutex mu_;
  detail::unique_fd fd_;
  std::atomic<version> version_{version::v1_13};
};

}  // namespace rendezvous
KFT_NAMESPACE_END
