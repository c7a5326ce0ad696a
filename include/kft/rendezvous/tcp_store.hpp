// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/tcp_store.hpp
/// @brief The TCP store: one server (in kftrun's node-0 agent, or in rank 0; its own header,
/// tcp_store_server.hpp), any number of clients on any host (this header).
///
/// Security: the server binds to the address it is given (the rendezvous address, not
/// 0.0.0.0 unless asked), and every connection must first present the job's token (128
/// random bits made by the launcher, or `KFT_RDZV_TOKEN`); a wrong token is refused, logged
/// by the server and reported to the client.
///
/// Waits are timed on both sides: the server answers a `get`/`wait` with "timeout" when the
/// client's deadline passes, so every request gets exactly one reply; the client also gives
/// up if the server goes silent, and reports the store as lost.
///
/// Wire format (little-endian): a frame is `u32 length` + payload; a payload is `u8 op` (or
/// `u8 status` in replies) followed by fields, strings as `u32 length` + bytes (every request in
/// detail/tcp_wire.hpp). `wait`, `multi_get` and `multi_set` are one request each, whatever the
/// number of keys.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kft/core/timeout.hpp>
#include <kft/rendezvous/detail/socket.hpp>
#include <kft/rendezvous/detail/tcp_wire.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/rendezvous/tcp_store_server.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

/// @brief A client of a tcp_store_server. Thread-safe (one request at a time).
class tcp_store final : public store {
 public:
  struct options {
    std::string host;
    int port = 0;
    std::string token;
    std::chrono::milliseconds connect_timeout = default_job_timeout;  ///< retry until then (`connect_store` applies KFT_TIMEOUT)
    std::chrono::milliseconds io_timeout = default_timeouts.store_request;  ///< a non-waiting request
    std::string name;  ///< shown in the server's log when refused, e.g. "node 1 agent"
    /// Checked while connecting (every 250 ms at most): true gives up (usage_error), e.g. when
    /// the launcher got SIGTERM.
    std::function<bool()> cancelled;
    /// The local address to connect from (numeric; empty = the kernel's choice), e.g. one of
    /// several interfaces, or 127.x.y.z to spread many clients of one host over source addresses.
    std::string source_address{};
  };

  /// @brief Connects (retrying with backoff) and authenticates.
  /// @throws timeout_error naming the address when it cannot connect in time
  /// @throws config_error when the server refuses the token
  explicit tcp_store(options opt) : opt_(std::move(opt)) {
    const auto deadline = detail::clock::now() + opt_.connect_timeout;
    const auto hello = wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str(opt_.token).str(opt_.name).done();
    std::optional<wire::reader> reply;
    for (auto pause = std::chrono::milliseconds(20); !reply;) {
      fd_ = detail::connect_until(opt_.host, opt_.port, deadline, opt_.connect_timeout, opt_.cancelled, opt_.source_address);
      try {
        reply = request(hello, opt_.io_timeout, "hello");
      } catch (const transport_error&) {
        // A store flooded by connections that never say hello sheds some of them, possibly
        // this one before its hello was read: connect again, with backoff, until the deadline.
        if (detail::clock::now() + pause >= deadline || (opt_.cancelled && opt_.cancelled())) throw;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(1000));
      }
    }
    auto& r = *reply;
    if (static_cast<wire::status>(r.u8()) != wire::status::ok) {
      fd_.reset();
      throw config_error("KFT_RDZV_TOKEN", "(hidden)",
                         "was refused by the rendezvous store at " + address() +
                             ": this process's token is not the job's (every agent and rank must share one)",
                         error_site::of("store connect"));
    }
  }

  std::string address() const { return detail::endpoint(opt_.host, opt_.port); }
  std::string describe() const override { return "tcp store " + address(); }

  void set(std::string_view key, std::string_view value) override {
    expect_ok(call(wire::writer().u8(op(wire::op::set)).str(key).str(value), "set"), "set");
  }
  std::optional<std::string> try_get(std::string_view key) override {
    auto r = call(wire::writer().u8(op(wire::op::get)).str(key).u32(0), "get");
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) return std::nullopt;
    check(s, r, "get");
    return r.str();
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    auto r = call(wire::writer().u8(op(wire::op::get)).str(key).u32(ms(timeout)), "get", timeout);
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) {
      const std::string k(key);
      throw detail::wait_timeout("get", std::span(&k, 1), timeout, describe());
    }
    check(s, r, "get");
    return r.str();
  }
  /// One request, whatever the number of keys.
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    batch_fits(keys.size(), "wait");
    wire::writer w;
    w.u8(op(wire::op::wait)).u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    auto r = call(w.u32(ms(timeout)), "wait", timeout);
    check_wait(r, "wait", timeout, keys.size());
  }
  /// One request, whatever the number of keys (at most wire::max_batch, and 64 MiB of values).
  std::vector<std::string> multi_get(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    batch_fits(keys.size(), "multi_get");
    wire::writer w;
    w.u8(op(wire::op::multi_get)).u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    auto r = call(w.u32(ms(timeout)), "multi_get", timeout);
    check_wait(r, "multi_get", timeout, keys.size());
    const auto n = r.u32();
    if (n != keys.size()) {
      std::lock_guard lock(mu_);
      lost("multi_get", "a reply of " + std::to_string(n) + " values for " + std::to_string(keys.size()) + " keys", EPROTO);
    }
    std::vector<std::string> values(n);
    for (auto& v : values) v = r.str();
    check(r.ok() ? wire::status::ok : wire::status::error, r, "multi_get");
    return values;
  }
  /// One request, applied by the server as one step (no other client sees part of it).
  void multi_set(std::span<const key_value> items) override {
    batch_fits(items.size(), "multi_set");
    wire::writer w;
    w.u8(op(wire::op::multi_set)).u32(static_cast<std::uint32_t>(items.size()));
    for (const auto& [key, value] : items) w.str(key).str(value);
    auto r = call(std::move(w), "multi_set");
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::error) throw usage_error(r.str() + " on " + describe(), error_site::of("store multi_set"));
    check(s, r, "multi_set");
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    auto r = call(wire::writer().u8(op(wire::op::add)).str(key).i64(delta), "add");
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::error) throw usage_error(r.str(), error_site::of("store add"));
    check(s, r, "add");
    return r.i64();
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    auto r = call(wire::writer().u8(op(wire::op::cas)).str(key).u8(expected ? 1 : 0).str(expected.value_or("")).str(desired),
                  "compare_set");
    check(static_cast<wire::status>(r.u8()), r, "compare_set");
    cas_result out;
    out.swapped = r.u8() != 0;
    const bool has = r.u8() != 0;
    auto cur = r.str();
    if (has) out.current = std::move(cur);
    return out;
  }
  bool erase(std::string_view key) override {
    auto r = call(wire::writer().u8(op(wire::op::erase)).str(key), "erase");
    check(static_cast<wire::status>(r.u8()), r, "erase");
    return r.u8() != 0;
  }
  std::vector<std::string> keys(std::string_view prefix) override {
    auto r = call(wire::writer().u8(op(wire::op::keys)).str(prefix), "keys");
    check(static_cast<wire::status>(r.u8()), r, "keys");
    std::vector<std::string> out(r.u32());
    for (auto& k : out) k = r.str();
    return out;
  }
  /// @brief Sets `key` bound to this connection: the server erases it when this connection
  /// closes (the process ended, was killed, or gave up on the store), unless a later write from
  /// any connection (set, compare_set, add, erase, or another set_owned) took the key over. A
  /// peer can so tell a process that is gone (its key vanished) from one that is alive but
  /// silent (a stopped process, a cut link: the key stays until the connection is torn down).
  void set_owned(std::string_view key, std::string_view value) {
    expect_ok(call(wire::writer().u8(op(wire::op::set_owned)).str(key).str(value), "set"), "set");
  }
  /// @brief A round trip; throws when the store is gone.
  void ping() { expect_ok(call(wire::writer().u8(op(wire::op::ping)), "ping"), "ping"); }
  /// @brief Requests this client has sent (one per call: a `multi_get` of 1,000 keys is one).
  /// What a program counts its own round trips with; the server counts everyone's.
  std::uint64_t requests() const noexcept { return sent_.load(std::memory_order_relaxed); }

 private:
  static std::uint8_t op(wire::op o) { return static_cast<std::uint8_t>(o); }
  static std::uint32_t ms(std::chrono::milliseconds d) {
    return static_cast<std::uint32_t>(std::clamp<long long>(d.count(), 0, 0x7fffffff));
  }

  // One request, one reply. `wait_time` is how long the server may legitimately hold it.
  wire::reader call(wire::writer w, const char* what, std::chrono::milliseconds wait_time = std::chrono::milliseconds(0)) {
    auto frame = w.done();
    if (frame.size() - 4 > wire::max_frame)
      throw usage_error(std::string("a ") + what + " request of " + std::to_string(frame.size() - 4) + " bytes, over a frame's " +
                            std::to_string(wire::max_frame >> 20) + " MiB (" + describe() + "): send it in parts",
                        error_site::of(std::string("store ") + what));
    sent_.fetch_add(1, std::memory_order_relaxed);
    return request(frame, wait_time + opt_.io_timeout, what);
  }

  void batch_fits(std::size_t n, const char* what) const {
    if (n > wire::max_batch)
      throw usage_error(std::string("a ") + what + " on " + std::to_string(n) + " keys, over the " + std::to_string(wire::max_batch) +
                            " one request may hold (" + describe() + "): send it in parts",
                        error_site::of(std::string("store ") + what));
  }

  // The status of a wait or multi_get's reply: timeout names the keys still missing, error is
  // the server's refusal (the request was over its limits).
  void check_wait(wire::reader& r, const char* what, std::chrono::milliseconds timeout, std::size_t asked) {
    const auto s = static_cast<wire::status>(r.u8());
    if (s == wire::status::timeout) {
      std::vector<std::string> missing(std::min<std::size_t>(r.u32(), asked));
      for (auto& k : missing) k = r.str();
      throw detail::wait_timeout(what, missing, timeout, describe());
    }
    if (s == wire::status::error) throw usage_error(r.str() + " on " + describe(), error_site::of(std::string("store ") + what));
    check(s, r, what);
  }

  wire::reader request(const std::string& frame, std::chrono::milliseconds timeout, const char* what) {
    std::lock_guard lock(mu_);
    if (!fd_) lost(what, "an earlier request failed", lost_code_);
    const auto deadline = detail::clock::now() + timeout;
    if (auto why = detail::send_all(fd_.get(), frame, deadline); !why.empty()) {
      const int err = errno;
      lost(what, why, detail::clock::now() >= deadline ? ETIMEDOUT : err);
    }
    using st = detail::recv_result::status;
    auto check_read = [&](const detail::recv_result& r) {
      if (r.what == st::timeout) lost(what, "no reply within " + kft::detail::describe_duration(timeout), ETIMEDOUT);
      if (r.what == st::closed) lost(what, "the store closed the connection (did its host process end?)", ECONNRESET);
      if (r.what == st::error) lost(what, detail::errno_text(r.err), r.err);
    };
    // The first read takes what has come, a small reply's header and body together; the rest of
    // a large one is read exactly. (One request at a time: nothing follows the reply.)
    std::string buf(512, '\0');
    const auto first = detail::recv_at_least(fd_.get(), buf.data(), 4, buf.size(), deadline);
    check_read(first);
    const auto n = wire::frame_length(buf);
    if (n == 0 || n > wire::max_frame || first.got > 4u + n) lost(what, "malformed reply", EPROTO);
    if (first.got < 4u + n) {
      buf.resize(4u + n);
      check_read(detail::recv_exact(fd_.get(), buf.data() + first.got, 4u + n - first.got, deadline));
    }
    buf.resize(4u + n);
    buf.erase(0, 4);
    return wire::reader(std::move(buf));
  }

  // The error's backend code tells a silent store (ETIMEDOUT: stopped, or cut off) from one
  // that is gone (ECONNRESET, ECONNREFUSED, ...: its process ended).
  [[noreturn]] void lost(const char* what, const std::string& why, int code) {
    fd_.reset();
    lost_code_ = code;
    throw transport_error("lost the rendezvous store at " + address() + ": " + why,
                          error_site::of(std::string("store ") + what), code);
  }
  void check(wire::status s, const wire::reader& r, const char* what) {
    if (s != wire::status::ok || !r.ok()) {
      std::lock_guard lock(mu_);
      lost(what, "unexpected reply", EPROTO);
    }
  }
  void expect_ok(wire::reader r, const char* what) { check(static_cast<wire::status>(r.u8()), r, what); }

  options opt_;
  std::mutex mu_;
  std::atomic<std::uint64_t> sent_{0};
  detail::unique_fd fd_;
  int lost_code_ = 0;  // why the connection was dropped (lost()'s code)
};

}  // namespace rendezvous
KFT_NAMESPACE_END
