// SPDX-License-Identifier: Apache-2.0
// The TCP store's wire codec in process (kft/rendezvous/detail/tcp_wire.hpp), against a
// reference decoder written here from the format's description.
//
// Input: byte 0 = n, the length of a script (0-31); the next n bytes are the script, one read
// per byte (u8, u32, i64 or str); the rest is the payload the reader owns. Each read is compared
// with the reference; once a read runs short, ok() must stay false and every later read return
// the empty value. Then the values read are written back with wire::writer and must read back
// identically; frame_length and same_token are checked on the side.
#include <cstring>
#include <string>
#include <variant>

#include <kft/rendezvous/detail/tcp_wire.hpp>

#include "fuzz_common.hpp"

namespace {

namespace wire = kft::rendezvous::wire;
using kft_fuzz::check;
using value = std::variant<std::uint8_t, std::uint32_t, std::int64_t, std::string>;

// Little-endian, from the description in tcp_wire.hpp; nullopt when too short.
struct reference {
  std::string_view data;
  std::size_t pos = 0;
  bool ok = true;

  template <class T>
  T integer() {
    if (!ok || data.size() - pos < sizeof(T)) {
      ok = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t{static_cast<unsigned char>(data[pos + i])} << (8 * i);
    pos += sizeof(T);
    return static_cast<T>(v);
  }
  std::string str() {
    const auto n = integer<std::uint32_t>();
    if (!ok || data.size() - pos < n) {
      ok = false;
      return {};
    }
    std::string s(data.substr(pos, n));
    pos += n;
    return s;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input = kft_fuzz::text(data, size);
  if (input.empty()) return 0;
  const std::size_t script_len = std::min<std::size_t>(static_cast<unsigned char>(input[0]) % 32, input.size() - 1);
  const std::string_view script = input.substr(1, script_len);
  const std::string_view payload = input.substr(1 + script_len);

  wire::reader r{std::string(payload)};
  reference ref{payload};
  std::vector<value> got;
  for (char c : script) {
    const bool was_ok = r.ok();
    switch (static_cast<unsigned char>(c) % 4) {
      case 0: {
        const auto v = r.u8();
        check(v == ref.integer<std::uint8_t>(), "u8 matches the reference");
        got.emplace_back(v);
        break;
      }
      case 1: {
        const auto v = r.u32();
        check(v == ref.integer<std::uint32_t>(), "u32 matches the reference");
        got.emplace_back(v);
        break;
      }
      case 2: {
        const auto v = r.i64();
        check(v == ref.integer<std::int64_t>(), "i64 matches the reference");
        got.emplace_back(v);
        break;
      }
      default: {
        auto v = r.str();
        check(v == ref.str(), "str matches the reference");
        check(v.size() <= payload.size(), "a string is never longer than the payload");
        got.emplace_back(std::move(v));
        break;
      }
    }
    check(r.ok() == ref.ok, "ok() agrees with the reference");
    check(was_ok || !r.ok(), "once short, a reader stays not ok");
    if (!r.ok()) {
      const auto& last = got.back();
      const bool empty = std::visit([](const auto& x) {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) return x.empty();
        else return x == 0;
      }, last);
      check(empty, "a short read returns the empty value");
    }
  }
  if (r.ok()) check(r.at_end() == (ref.pos == payload.size()), "at_end() agrees with the reference");

  // Write what was read, read it back.
  if (r.ok()) {
    wire::writer w;
    for (const auto& v : got)
      std::visit([&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::uint8_t>) w.u8(x);
        else if constexpr (std::is_same_v<T, std::uint32_t>) w.u32(x);
        else if constexpr (std::is_same_v<T, std::int64_t>) w.i64(x);
        else w.str(x);
      }, v);
    const std::string frame = w.done();
    check(frame.size() >= 4, "a frame has its length prefix");
    check(wire::frame_length(frame) == frame.size() - 4, "frame_length reads the writer's prefix");
    check(frame.substr(4) == payload.substr(0, ref.pos), "writing what was read gives the bytes read");
    wire::reader back{frame.substr(4)};
    for (const auto& v : got)
      std::visit([&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::uint8_t>) check(back.u8() == x, "u8 round trip");
        else if constexpr (std::is_same_v<T, std::uint32_t>) check(back.u32() == x, "u32 round trip");
        else if constexpr (std::is_same_v<T, std::int64_t>) check(back.i64() == x, "i64 round trip");
        else check(back.str() == x, "str round trip");
      }, v);
    check(back.ok() && back.at_end(), "the round trip consumes the frame exactly");
  }

  // The token comparison: equal exactly when the strings are, in both orders.
  const auto half = payload.size() / 2;
  const auto a = payload.substr(0, half), b = payload.substr(half);
  check(wire::same_token(a, b) == (a == b), "same_token(a, b) == (a == b)");
  check(wire::same_token(b, a) == (a == b), "same_token(b, a) == (a == b)");
  check(wire::same_token(a, a), "same_token(a, a)");
  return 0;
}
