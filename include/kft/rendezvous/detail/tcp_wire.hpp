// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/detail/tcp_wire.hpp
/// @brief The TCP store's wire format (internal): little-endian frames of `u32 length` +
/// payload; a payload is `u8 op` (or `u8 status` in replies) followed by fields, strings as
/// `u32 length` + bytes. Limits: 64 MiB per frame, 4 KiB before the hello is accepted, 1 Mi keys
/// in one request.
///
/// Requests after the hello (fields in order; every reply starts with `u8 status`):
///
/// | op | fields | ok reply |
/// | --- | --- | --- |
/// | set, set_owned | key, value | - |
/// | get | key, u32 timeout ms | value |
/// | wait | u32 n, n keys, u32 timeout ms | - |
/// | add | key, i64 delta | i64 value |
/// | cas | key, u8 has expected, expected, desired | u8 swapped, u8 present, value |
/// | erase | key | u8 existed |
/// | ping | - | - |
/// | keys | prefix | u32 n, n keys |
/// | multi_set | u32 n, n x (key, value) | - |
/// | multi_get | u32 n, n keys, u32 timeout ms | u32 n, n values |
///
/// | tagged | u32 tag, one request above (from its op) | `tagged` u32 tag, that request's reply |
///
/// `tagged` lets one connection have many requests in flight (a node's relay,
/// tcp_store_relay.hpp, speaks for its ranks over one connection): the server handles the inner
/// request at once, and a get or wait that must wait does not stop the connection; its reply
/// comes when it is ready, carrying the tag (replies to tagged requests may come in any order;
/// a `set_owned` through a tagged request is owned by the connection). At most
/// `max_tagged_pending` of a connection's tagged requests may wait at once.
///
/// A get, wait or multi_get that runs out of time is answered `timeout` + u32 n + the n keys
/// still missing; a request the server refuses (add on a non-integer, a batch over the limits) is
/// answered `error` + a message. `multi_set` is applied as one step: no other request sees part
/// of it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

namespace wire {

// set_owned: a set whose key the server erases when the connection that set it closes (see
// tcp_store::set_owned).
enum class op : std::uint8_t {
  hello = 1, set, get, wait, add, cas, erase, ping, keys, set_owned, multi_set, multi_get, tagged
};
enum class status : std::uint8_t { ok = 0, denied = 1, timeout = 2, error = 3, tagged = 4 };

/// Largest frame accepted after authentication, and before it.
inline constexpr std::uint32_t max_frame = 64u << 20;
inline constexpr std::uint32_t max_hello_frame = 4096;
/// Most keys in one wait, multi_get or multi_set (a 64 MiB frame of empty keys would otherwise
/// become 16 Mi strings in the server: 8x the frame).
inline constexpr std::uint32_t max_batch = 1u << 20;
/// Most tagged requests of one connection waiting at once.
inline constexpr std::uint32_t max_tagged_pending = 1u << 16;

/// Builds one frame.
class writer {
 public:
  writer() : buf_(4, '\0') {}
  writer& u8(std::uint8_t v) {
    buf_ += static_cast<char>(v);
    return *this;
  }
  writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  writer& i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_ += static_cast<char>((u >> (8 * i)) & 0xff);
    return *this;
  }
  writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_ += s;
    return *this;
  }
  /// Bytes as they are (a whole inner payload, after a tag).
  writer& raw(std::string_view s) {
    buf_ += s;
    return *this;
  }
  /// The frame, length prefix filled in.
  std::string done() {
    const auto n = static_cast<std::uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

/// Reads the fields of one payload (which it owns); `ok()` turns false on a short or
/// malformed payload.
class reader {
 public:
  explicit reader(std::string data) : data_(std::move(data)) {}
  std::uint8_t u8() { return need(1) ? static_cast<std::uint8_t>(data_[pos_++]) : 0; }
  std::uint32_t u32() {
    if (!need(4)) return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(data_[pos_++])) << (8 * i);
    return v;
  }
  std::int64_t i64() {
    if (!need(8)) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data_[pos_++])) << (8 * i);
    return static_cast<std::int64_t>(v);
  }
  std::string str() {
    const auto n = u32();
    if (!need(n)) return {};
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  /// Everything not read yet (a tagged request's inner payload).
  std::string rest() {
    std::string s = data_.substr(pos_);
    pos_ = data_.size();
    return s;
  }
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return pos_ == data_.size(); }
  /// The whole payload, read or not.
  const std::string& data() const noexcept { return data_; }

 private:
  bool need(std::size_t n) {
    if (!ok_ || data_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  std::string data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

inline std::uint32_t frame_length(std::string_view four) {
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(four[static_cast<std::size_t>(i)])) << (8 * i);
  return n;
}

/// Token comparison that does not stop at the first differing byte.
inline bool same_token(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace wire

}  // namespace rendezvous
KFT_NAMESPACE_END
