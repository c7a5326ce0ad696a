// SPDX-License-Identifier: Apache-2.0
// The hex codec (kft/core/hex.hpp) and the FNV-1a hash (kft/core/hash.hpp): round trips, bad
// input named in the error, and values pinned from the copies they replaced (the token file's
// name, the DDP bucket fingerprint), which must never change.
#define BOOST_TEST_MODULE kft_hex_hash
#include <boost/test/unit_test.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/hash.hpp>
#include <kft/core/hex.hpp>
#include <kft/core/token.hpp>
#include <kft/ddp/buckets.hpp>
#include <kft/rendezvous/detail/token_file.hpp>

namespace {

// The message of the error that from_hex throws for `text` as the hex of `n` bytes.
template <class E = kft::transport_error>
std::string refusal(std::string_view text, std::size_t n) {
  std::vector<unsigned char> out(n);
  try {
    kft::detail::from_hex<E>(text, out.data(), n, "the test's value", kft::error_site::of("hex test"));
  } catch (const E& e) {
    return e.what();
  }
  BOOST_FAIL("no error for \"" << text << "\"");
  return {};
}

}  // namespace

BOOST_AUTO_TEST_CASE(hex_encodes_lowercase_in_memory_order) {
  const unsigned char bytes[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xff};
  BOOST_TEST(kft::detail::to_hex(bytes, sizeof bytes) == "00017f80abff");
  BOOST_TEST(kft::detail::to_hex(std::string_view("kft")) == "6b6674");
  BOOST_TEST(kft::detail::to_hex(std::string_view()) == "");
  BOOST_TEST(kft::detail::to_hex(nullptr, 0) == "");
}

BOOST_AUTO_TEST_CASE(hex_round_trips_every_byte) {
  std::array<unsigned char, 256> all{};
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<unsigned char>(i);
  const std::string text = kft::detail::to_hex(all.data(), all.size());
  BOOST_TEST(text.size() == 512u);
  BOOST_TEST(text.find_first_not_of("0123456789abcdef") == std::string::npos);
  std::array<unsigned char, 256> back{};
  BOOST_TEST(kft::detail::read_hex(text, back.data(), back.size()).empty());
  BOOST_TEST(back == all);
  std::array<unsigned char, 256> thrown{};
  kft::detail::from_hex(text, thrown.data(), thrown.size(), "all bytes", kft::error_site::of("hex test"));
  BOOST_TEST(thrown == all);
  BOOST_TEST(kft::detail::read_hex("", nullptr, 0).empty());  // zero bytes: the empty text
  for (char c = '0'; c <= '9'; ++c) BOOST_TEST(kft::detail::hex_value(c) == c - '0');
  for (char c = 'a'; c <= 'f'; ++c) BOOST_TEST(kft::detail::hex_value(c) == c - 'a' + 10);
  for (char c : {'A', 'F', 'g', ' ', '\0', '/', ':'}) BOOST_TEST(kft::detail::hex_value(c) == -1);
}

BOOST_AUTO_TEST_CASE(hex_reports_bad_input) {
  unsigned char two[2] = {};
  BOOST_TEST(kft::detail::read_hex("abc", two, 2) == "3 characters, want 4");
  BOOST_TEST(kft::detail::read_hex("12x4", two, 2) == "character 2 is 'x'");
  BOOST_TEST(kft::detail::read_hex("1x34", two, 2) == "character 1 is 'x'");
  BOOST_TEST(kft::detail::read_hex("ABCD", two, 2) == "character 0 is 'A'");  // lowercase only

  // The thrown error names what it was, the text and why; the site comes through.
  const std::string short_one = refusal("abc", 2);
  BOOST_TEST(short_one.find("hex test") != std::string::npos, short_one);
  BOOST_TEST(short_one.find("the test's value \"abc\" is not the lowercase hex of 2 bytes (3 characters, want 4)") !=
                 std::string::npos,
             short_one);
  const std::string bad_digit = refusal("12x4", 2);
  BOOST_TEST(bad_digit.find("\"12x4\"") != std::string::npos, bad_digit);
  BOOST_TEST(bad_digit.find("character 2 is 'x'") != std::string::npos, bad_digit);
  // Control bytes are shown escaped, and long text is cut saying how long it was.
  const std::string control = refusal(std::string_view("1\n", 2), 1);
  BOOST_TEST(control.find("\"1\\n\"") != std::string::npos, control);
  BOOST_TEST(control.find('\n') == std::string::npos, control);
  const std::string long_one = refusal(std::string(300, 'z'), 4);
  BOOST_TEST(long_one.find("(300 bytes)") != std::string::npos, long_one);
  BOOST_TEST(long_one.size() < 300u, long_one);
  // The caller picks the error class.
  BOOST_TEST(refusal<kft::usage_error>("zz", 1).find("character 0 is 'z'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(random_tokens_are_hex) {
  const std::string t = kft::random_token();
  BOOST_TEST(t.size() == 32u);
  unsigned char bytes[16];
  BOOST_TEST(kft::detail::read_hex(t, bytes, sizeof bytes).empty());
  BOOST_TEST(kft::random_token() != t);
}

// Computed with 64-bit FNV-1a from kft's basis (1469598103934665603) before hash.hpp existed.
BOOST_AUTO_TEST_CASE(fnv1a_values_are_pinned) {
  static_assert(kft::detail::fnv1a("") == kft::detail::fnv1a_basis);
  static_assert(kft::detail::fnv1a("hello") == 0x005a0d15131ec7a1ull);
  static_assert(kft::detail::fnv1a(std::string_view("\x01\x23", 2)) == 0x9a658c00c5459dbfull);
  static_assert(kft::detail::fnv1a_u64(0) == 0x47fe0d7eaf8e51e3ull);
  static_assert(kft::detail::fnv1a_u64(0x0123456789abcdefull) == 0xe1b1f298cfb61863ull);
  static_assert(kft::detail::fnv1a_u64(2, kft::detail::fnv1a_u64(1)) == 0x162a8345ecfd7fc0ull);
  BOOST_TEST(kft::detail::fnv1a("kft") == 0x14a304512a87a60aull);
  // An integer's hash is the hash of its bytes, least significant first.
  BOOST_TEST(kft::detail::fnv1a_u64(0x0123456789abcdefull) ==
             kft::detail::fnv1a(std::string_view("\xef\xcd\xab\x89\x67\x45\x23\x01", 8)));
  // Continuing from a value is hashing the concatenation.
  BOOST_TEST(kft::detail::fnv1a("lo", kft::detail::fnv1a("hel")) == kft::detail::fnv1a("hello"));
}

// The file rank 0 hands the store token through: ranks of one job, and of jobs across
// versions, must agree on its name.
BOOST_AUTO_TEST_CASE(token_file_names_are_pinned) {
  if constexpr (std::endian::native == std::endian::little) {  // the hash's bytes in memory order
    BOOST_TEST(kft::rendezvous::detail::token_file_name("") == "rdzv-83039d73b00f6514.token");
    BOOST_TEST(kft::rendezvous::detail::token_file_name("a") == "rdzv-0699cd73d48abd44.token");
    BOOST_TEST(kft::rendezvous::detail::token_file_name("run-7/127.0.0.1:29500/0") == "rdzv-377c152ef134c778.token");
  }
}

// The DDP reducer puts the fingerprint in its collectives' tags.
BOOST_AUTO_TEST_CASE(bucket_fingerprints_are_pinned) {
  const std::vector<kft::ddp::parameter> params = {
      {1000, kft::dtype::f32, "a"}, {7, kft::dtype::bf16, "b"}, {4099, kft::dtype::f64, "c"}};
  const kft::ddp::bucket_assignment buckets = {{2, 1}, {0}};
  BOOST_TEST(kft::ddp::fingerprint(params, buckets) == 0xb8383d19u);
  BOOST_TEST(kft::ddp::fingerprint({}, {}) == 0xe8705c9du);
}
