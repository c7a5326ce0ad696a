// SPDX-License-Identifier: Apache-2.0
// The reduction kernel against a plain scalar loop written here: every dtype and op, counts that
// cover the unrolled vector body, single vectors and the scalar tail, in place and out of place,
// and the 16-bit formats exhaustively (every bit pattern widened and rounded back, every pattern
// added to a set of others), since their vector paths convert with integer tricks of their own.
#define BOOST_TEST_MODULE kft_kernels
#include <boost/test/unit_test.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <kft/kernels/reduce.hpp>

namespace {

using kft::dtype;
using kft::op_kind;

template <class T>
T scalar_apply(op_kind op, T a, T b) {
  switch (op) {
    case op_kind::sum:
    case op_kind::avg: return static_cast<T>(a + b);
    case op_kind::prod: return static_cast<T>(a * b);
    case op_kind::min: return b < a ? b : a;
    case op_kind::max: return a < b ? b : a;
  }
  return a;
}

// dst[i] = ((s0 op s1) op s2) ..., then / divisor for avg: the documented order.
template <class T>
std::vector<T> reference(const std::vector<std::vector<T>>& in, op_kind op, int divisor) {
  std::vector<T> out(in[0]);
  for (std::size_t k = 1; k < in.size(); ++k)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = scalar_apply(op, out[i], in[k][i]);
  if (op == op_kind::avg)
    for (auto& v : out) v = static_cast<T>(v / static_cast<T>(divisor));
  return out;
}

// The same for a 16-bit format, through its scalar conversions.
template <class H>
std::vector<std::uint16_t> reference16(const std::vector<std::vector<std::uint16_t>>& in, op_kind op, int divisor) {
  std::vector<std::uint16_t> out(in[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    float a = H::to_float(in[0][i]);
    for (std::size_t k = 1; k < in.size(); ++k) a = scalar_apply(op, a, H::to_float(in[k][i]));
    if (op == op_kind::avg) a /= static_cast<float>(divisor);
    out[i] = H::from_float(a);
  }
  return out;
}

template <class T>
std::vector<T> run(std::vector<std::vector<T>> in, dtype t, op_kind op, int divisor, bool in_place) {
  std::vector<const void*> srcs;
  for (auto& v : in) srcs.push_back(v.data());
  std::vector<T> out(in[0].size(), T{});
  void* dst = in_place ? static_cast<void*>(in[1 % in.size()].data()) : static_cast<void*>(out.data());
  kft::kernels::reduce(dst, srcs.data(), static_cast<int>(in.size()), in[0].size(), t, op, divisor);
  return in_place ? in[1 % in.size()] : out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
T value(std::mt19937& g) {
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::uniform_real_distribution<double>(-4, 4)(g));
  else return static_cast<T>(std::uniform_int_distribution<int>(-50, 50)(g));
}

// n inputs of `count` random values; integer products stay in range (values in -2..2).
template <class T>
std::vector<std::vector<T>> random_inputs(std::mt19937& g, int n, std::size_t count, op_kind op) {
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(count));
  for (auto& v : in)
    for (auto& x : v) {
      x = value<T>(g);
      if constexpr (!std::is_floating_point_v<T>)
        if (op == op_kind::prod) x = static_cast<T>(x % 3);
    }
  return in;
}

const op_kind all_ops[] = {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg};
const std::size_t counts[] = {0, 1, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 1023, 4099};

template <class T>
void native_case(dtype t) {
  std::mt19937 g(7);
  for (int n : {1, 2, 3, 5})
    for (op_kind op : all_ops)
      for (std::size_t count : counts)
        for (bool in_place : {false, true}) {
          if (in_place && n == 1) continue;
          const auto in = random_inputs<T>(g, n, count, op);
          const auto got = run(in, t, op, n, in_place);
          const auto want = reference(in, op, n);
          BOOST_TEST_CONTEXT(kft::name(t) << " n=" << n << " op=" << static_cast<int>(op) << " count=" << count
                                          << (in_place ? " in place" : "")) {
            BOOST_TEST(same_bits(got, want));
          }
        }
}

template <class H>
void sixteen_bit_case(dtype t) {
  // Every bit pattern, widened and rounded back (n = 1, avg by 1: exactly one conversion each way).
  std::vector<std::uint16_t> all(65536 + 13);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  BOOST_TEST(same_bits(run<std::uint16_t>({all}, t, op_kind::avg, 1, false), reference16<H>({all}, op_kind::avg, 1)));
  // Every pattern plus each of a set of others (edges and random), for every op.
  std::mt19937 g(11);
  std::vector<std::uint16_t> others = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00,
                                       0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7f80, 0xff80, 0x3f80, 0x0080};
  for (int j = 0; j < 24; ++j) others.push_back(static_cast<std::uint16_t>(g()));
  for (op_kind op : all_ops)
    for (std::uint16_t b : others) {
      std::vector<std::uint16_t> rhs(all.size(), b);
      BOOST_TEST_CONTEXT(kft::name(t) << " op=" << static_cast<int>(op) << " b=" << b) {
        BOOST_TEST(same_bits(run<std::uint16_t>({all, rhs}, t, op, 2, false), reference16<H>({all, rhs}, op, 2)));
      }
    }
  // Several inputs, odd counts, in place, values of the size gradients have.
  for (int n : {2, 3, 5})
    for (std::size_t count : counts)
      for (op_kind op : all_ops) {
        std::vector<std::vector<std::uint16_t>> in(static_cast<std::size_t>(n), std::vector<std::uint16_t>(count));
        for (auto& v : in)
          for (auto& x : v) x = H::from_float(std::uniform_real_distribution<float>(-1e-3f, 1e-3f)(g));
        BOOST_TEST_CONTEXT(kft::name(t) << " n=" << n << " op=" << static_cast<int>(op) << " count=" << count) {
          BOOST_TEST(same_bits(run(in, t, op, n, true), reference16<H>(in, op, n)));
        }
      }
}

// reduce_copy: both destinations get the reference's bits, for every alignment of the second
// (streaming stores start at its first 16-byte boundary; misaligned elements never stream),
// with the first cached or streamed too (it streams where it is aligned as the second is: here,
// the first sits at the same shift from a 16-byte boundary, or one byte further).
template <class T>
void reduce_copy_case(dtype t) {
  std::mt19937 g(5);
  const auto at = [](std::vector<unsigned char>& raw, std::size_t shift) {
    return raw.data() + (16 - (reinterpret_cast<std::uintptr_t>(raw.data()) & 15)) + shift;
  };
  for (int n : {1, 2, 3})
    for (op_kind op : all_ops)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{129}, std::size_t{4099}})
        for (std::size_t shift = 0; shift < 16; ++shift)
          for (int mode : {0, 1, 2, 3}) {  // cached; second streamed; both (same shift); both (shifts differ)
            const bool stream = mode > 0, first_too = mode > 1;
            auto in = random_inputs<T>(g, n, count, op);
            std::vector<const void*> srcs;
            for (auto& v : in) srcs.push_back(v.data());
            std::vector<unsigned char> raw1(count * sizeof(T) + 48, 0xee), raw2(count * sizeof(T) + 48, 0xee);
            auto* first = at(raw1, shift + (mode == 3 ? 1 : 0));
            auto* second = at(raw2, shift);
            kft::kernels::reduce_copy(first, second, stream, srcs.data(), n, count, t, op, n, first_too);
            kft::kernels::stream_fence();
            std::vector<T> a(count), b(count);
            if (count) std::memcpy(a.data(), first, count * sizeof(T));
            if (count) std::memcpy(b.data(), second, count * sizeof(T));
            const auto want = reference(in, op, n);
            BOOST_TEST_CONTEXT(kft::name(t) << " n=" << n << " op=" << static_cast<int>(op) << " count=" << count
                                            << " shift=" << shift << " mode=" << mode) {
              BOOST_TEST(same_bits(a, want));
              BOOST_TEST(same_bits(b, want));
              for (auto* d : {first, second}) {  // nothing written outside either
                BOOST_TEST(d[count * sizeof(T)] == 0xee);
                BOOST_TEST(d[-1] == 0xee);
              }
            }
          }
}

// reduce_all: every destination gets the reference's bits, for 1-5 destinations, every shared
// alignment (streaming starts at the first 16-byte boundary), and destinations whose alignments
// differ (then nothing streams); nothing is written outside any destination.
template <class T>
void reduce_all_case(dtype t) {
  std::mt19937 g(9);
  for (int n : {1, 3, 4})
    for (op_kind op : all_ops)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{129}, std::size_t{4099}})
        for (int ndst : {1, 2, 5})
          for (std::size_t shift : {std::size_t{0}, std::size_t{3}, std::size_t{8}, std::size_t{15}})
            for (int mode : {0, 1, 2}) {  // cached; streamed; streamed asked, alignments differ
              auto in = random_inputs<T>(g, n, count, op);
              std::vector<const void*> srcs;
              for (auto& v : in) srcs.push_back(v.data());
              std::vector<std::vector<unsigned char>> raw(static_cast<std::size_t>(ndst),
                                                          std::vector<unsigned char>(count * sizeof(T) + 48, 0xee));
              std::vector<void*> dsts;
              for (int j = 0; j < ndst; ++j) {
                auto& r = raw[static_cast<std::size_t>(j)];
                const std::size_t sh = shift + (mode == 2 && j == ndst - 1 ? 1 : 0);
                dsts.push_back(r.data() + (16 - (reinterpret_cast<std::uintptr_t>(r.data()) & 15)) + sh);
              }
              kft::kernels::reduce_all(dsts.data(), ndst, mode > 0, srcs.data(), n, count, t, op, n);
              kft::kernels::stream_fence();
              const auto want = reference(in, op, n);
              BOOST_TEST_CONTEXT(kft::name(t) << " n=" << n << " op=" << static_cast<int>(op) << " count=" << count
                                              << " ndst=" << ndst << " shift=" << shift << " mode=" << mode) {
                for (void* d : dsts) {
                  std::vector<T> got(count);
                  if (count) std::memcpy(got.data(), d, count * sizeof(T));
                  BOOST_TEST(same_bits(got, want));
                  auto* b = static_cast<unsigned char*>(d);
                  BOOST_TEST(b[count * sizeof(T)] == 0xee);
                  BOOST_TEST(b[-1] == 0xee);
                }
              }
            }
}

// Two inputs of 1001 values in the 16-bit format F: i / 4, and `constant` throughout.
template <class F>
std::array<std::vector<std::uint16_t>, 2> inputs16(float constant) {
  std::array<std::vector<std::uint16_t>, 2> in{std::vector<std::uint16_t>(1001), std::vector<std::uint16_t>(1001)};
  for (std::size_t i = 0; i < in[0].size(); ++i) {
    in[0][i] = F::from_float(static_cast<float>(i) * 0.25f);
    in[1][i] = F::from_float(constant);
  }
  return in;
}

}  // namespace

BOOST_AUTO_TEST_CASE(reduce_all_writes_every_destination) {
  reduce_all_case<float>(dtype::f32);
  reduce_all_case<double>(dtype::f64);
  reduce_all_case<std::int32_t>(dtype::i32);
  reduce_all_case<std::int64_t>(dtype::i64);
  reduce_all_case<std::uint8_t>(dtype::u8);
  // 16-bit formats reduce into the first, then copy: the same bits everywhere.
  const auto [x, y] = inputs16<kft::bfloat16>(-0.75f);
  const void* srcs[] = {x.data(), y.data()};
  std::vector<std::uint16_t> a(x.size()), b(x.size()), c(x.size());
  void* dsts[] = {a.data(), b.data(), c.data()};
  kft::kernels::reduce_all(dsts, 3, true, srcs, 2, x.size(), dtype::bf16, op_kind::avg, 2);
  kft::kernels::stream_fence();
  BOOST_TEST(same_bits(a, reference16<kft::bfloat16>({x, y}, op_kind::avg, 2)));
  BOOST_TEST(same_bits(b, a));
  BOOST_TEST(same_bits(c, a));
}

BOOST_AUTO_TEST_CASE(reduce_copy_writes_both_destinations) {
  reduce_copy_case<float>(dtype::f32);
  reduce_copy_case<double>(dtype::f64);
  reduce_copy_case<std::int32_t>(dtype::i32);
  reduce_copy_case<std::int64_t>(dtype::i64);
  reduce_copy_case<std::uint8_t>(dtype::u8);
  // 16-bit formats take the reduce-then-copy path: the same values in both.
  const auto [x, y] = inputs16<kft::half>(1.5f);
  const void* srcs[] = {x.data(), y.data()};
  std::vector<std::uint16_t> a(x.size()), b(x.size());
  kft::kernels::reduce_copy(a.data(), b.data(), true, srcs, 2, x.size(), dtype::f16, op_kind::sum, 2);
  kft::kernels::stream_fence();
  BOOST_TEST(same_bits(a, reference16<kft::half>({x, y}, op_kind::sum, 2)));
  BOOST_TEST(same_bits(b, a));
}

// The scalar conversions against the compiler's own binary16 (an independent implementation):
// every half widened, and floats across the whole half range (normal, subnormal, ties, overflow)
// rounded. NaNs only have to stay NaNs.
BOOST_AUTO_TEST_CASE(half_conversions_match_the_compiler) {
#if defined(__FLT16_MAX__)
  for (std::uint32_t h = 0; h < 65536; ++h) {
    _Float16 c;
    const auto bits = static_cast<std::uint16_t>(h);
    std::memcpy(&c, &bits, 2);
    const float mine = kft::half::to_float(bits), theirs = static_cast<float>(c);
    if (std::isnan(theirs)) BOOST_TEST(std::isnan(mine));
    else BOOST_TEST(std::bit_cast<std::uint32_t>(mine) == std::bit_cast<std::uint32_t>(theirs), "half " << h);
  }
  std::size_t checked = 0;
  for (std::uint64_t x = 0; x < (1ull << 32); x += 4093) {  // every 4093rd float: all exponents, both signs
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(x));
    const _Float16 c = static_cast<_Float16>(f);
    std::uint16_t theirs;
    std::memcpy(&theirs, &c, 2);
    const std::uint16_t mine = kft::half::from_float(f);
    if (std::isnan(f)) BOOST_TEST(((mine & 0x7c00u) == 0x7c00u && (mine & 0x3ffu) != 0));
    else if (mine != theirs) BOOST_TEST(mine == theirs, "float bits " << x);
    ++checked;
  }
  BOOST_TEST(checked > 1000000u);
#else
  BOOST_TEST_MESSAGE("skipped: this compiler has no _Float16 to compare with");
#endif
}

BOOST_AUTO_TEST_CASE(f32) { native_case<float>(dtype::f32); }
BOOST_AUTO_TEST_CASE(f64) { native_case<double>(dtype::f64); }
BOOST_AUTO_TEST_CASE(i32) { native_case<std::int32_t>(dtype::i32); }
BOOST_AUTO_TEST_CASE(i64) { native_case<std::int64_t>(dtype::i64); }
BOOST_AUTO_TEST_CASE(u8) { native_case<std::uint8_t>(dtype::u8); }
BOOST_AUTO_TEST_CASE(f16) { sixteen_bit_case<kft::half>(dtype::f16); }
BOOST_AUTO_TEST_CASE(bf16) { sixteen_bit_case<kft::bfloat16>(dtype::bf16); }

