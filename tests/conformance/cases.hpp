// SPDX-License-Identifier: Apache-2.0
// The conformance suite: every communicator that claims kft's contract (transport/concepts.hpp)
// runs the same named cases, one per collective x algorithm x dtype x op x count x in/out of
// place (x root for broadcast), checked element by element against tests/common/reference.hpp,
// and every rank's output of allreduce, broadcast and allgather must be bit-identical across
// ranks (replicas never drift). A new transport gets these tests by adding a factory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>

#include "../common/reference.hpp"

namespace kft_test::conformance {

struct spec {
  kft::collective coll = kft::collective::allreduce;
  kft::algo algorithm = kft::algo::automatic;
  kft::dtype type = kft::dtype::f32;
  kft::op_kind op = kft::op_kind::sum;
  std::size_t count = 0;
  bool in_place = false;
  int root = 0;

  // "two_shot_bf16_avg_n4099_in_place" (the suite names the collective and rank count).
  std::string name() const {
    std::string s = std::string(kft::name(algorithm)) + "_" + std::string(kft::name(type));
    if (coll == kft::collective::allreduce || coll == kft::collective::reduce_scatter) s += "_" + std::string(kft::name(op));
    if (coll == kft::collective::broadcast) s += "_root" + std::to_string(root);
    return s + "_n" + std::to_string(count) + (in_place ? "_in_place" : "_out_of_place");
  }
};

inline const std::vector<kft::dtype>& all_dtypes() {
  static const std::vector<kft::dtype> v{kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16,
                                         kft::dtype::i32, kft::dtype::i64, kft::dtype::u8};
  return v;
}
inline const std::vector<kft::op_kind>& all_ops() {
  static const std::vector<kft::op_kind> v{kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min,
                                           kft::op_kind::max, kft::op_kind::avg};
  return v;
}

// The sweep for p ranks. `algorithms(c)` lists what the communicator runs for collective c.
// Counts {0, 1, 7, 1023, 4099} for every dtype and op; 1 Mi + 3 for one dtype of each kind
// (f32, bf16, i64) with sum and avg, so the suite stays quick.
inline std::vector<spec> cases(int p, const std::function<std::vector<kft::algo>(kft::collective)>& algorithms) {
  const std::vector<std::size_t> counts{0, 1, 7, 1023, 4099, (1u << 20) + 3};
  auto big_ok = [](kft::dtype t, kft::op_kind op) {
    return (t == kft::dtype::f32 || t == kft::dtype::bf16 || t == kft::dtype::i64) &&
           (op == kft::op_kind::sum || op == kft::op_kind::avg);
  };
  std::vector<spec> out;
  for (auto c : {kft::collective::allreduce, kft::collective::reduce_scatter, kft::collective::broadcast,
                 kft::collective::allgather}) {
    const bool reduces = c == kft::collective::allreduce || c == kft::collective::reduce_scatter;
    std::vector<int> roots{0};
    if (c == kft::collective::broadcast && p > 1) roots.push_back(p - 1);
    for (auto a : algorithms(c))
      for (auto t : all_dtypes())
        for (auto op : reduces ? all_ops() : std::vector<kft::op_kind>{kft::op_kind::sum})
          for (auto n : counts) {
            if (n > 5000 && !big_ok(t, op)) continue;
            for (int root : roots)
              for (bool ip : {false, true}) out.push_back({c, a, t, op, n, ip, root});
          }
  }
  out.push_back({kft::collective::barrier, kft::algo::automatic, kft::dtype::u8, kft::op_kind::sum, 0, false, 0});
  return out;
}

// What one rank saw in one case.
struct outcome {
  std::size_t wrong = 0;         // elements that differ from the reference (and changed inputs)
  std::uint64_t output_hash = 0;  // of the output every rank should share (0: none to share)
  std::string first;             // the first wrong element, for the message
};

// Host buffers; a device backend passes its own upload/download.
struct host_memory {
  void* alloc(std::size_t bytes) {
    blocks.emplace_back(std::max<std::size_t>(bytes, 1));
    return blocks.back().data();
  }
  void upload(void* dst, const void* src, std::size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
  std::vector<std::vector<unsigned char>> blocks;
};

// Runs case `s` on rank `me` of `p` through `comm` (any kft::communicator). `Memory` places the
// buffers (host_memory, or a device's); `roundings` widens the tolerance of floating-point
// averages for a backend that rounds more than once (reference.hpp).
template <class Comm, class Memory = host_memory>
outcome run_case(Comm& comm, const spec& s, Memory mem = {}, int roundings = 1) {
  const int me = comm.rank(), p = comm.size();
  const std::size_t es = kft::size_of(s.type), n = s.count, P = static_cast<std::size_t>(p),
                    R = static_cast<std::size_t>(me);
  const kft::options o{.algorithm = s.algorithm};
  outcome res;
  auto note = [&](std::size_t i, double got, double want) {
    if (res.wrong++ == 0)
      res.first = "rank " + std::to_string(me) + ": element " + std::to_string(i) + " is " + std::to_string(got) +
                  ", want " + std::to_string(want);
  };
  auto fill = [&](std::vector<unsigned char>& h, std::size_t elems, int rank_of_value, std::size_t offset) {
    for (std::size_t i = 0; i < elems; ++i) put(s.type, h.data(), i, input(rank_of_value, offset + i, s.op, s.type));
  };
  switch (s.coll) {
    case kft::collective::barrier: comm.barrier(o); return res;
    case kft::collective::allreduce:
    case kft::collective::broadcast: {
      std::vector<unsigned char> in(n * es + 1), outh(n * es + 1, 0xff);
      fill(in, n, me, 0);  // broadcast: only the root's is read
      void* din = mem.alloc(n * es);
      void* dout = s.in_place ? din : mem.alloc(n * es);
      mem.upload(din, in.data(), n * es);
      if (!s.in_place) mem.upload(dout, outh.data(), n * es);
      if (s.coll == kft::collective::allreduce) comm.allreduce(din, dout, n, s.type, s.op, o);
      else comm.broadcast(din, dout, n, s.type, s.root, o);
      mem.download(outh.data(), dout, n * es);
      for (std::size_t i = 0; i < n; ++i) {
        const double got = get(s.type, outh.data(), i);
        const double want = s.coll == kft::collective::allreduce ? expected(p, i, s.op, s.type)
                                                                 : input(s.root, i, s.op, s.type);
        if (!close_enough(got, want, s.type, s.coll == kft::collective::allreduce ? s.op : kft::op_kind::sum, roundings))
          note(i, got, want);
      }
      if (!s.in_place && (s.coll == kft::collective::allreduce || me == s.root)) {
        std::vector<unsigned char> back(n * es + 1);
        mem.download(back.data(), din, n * es);
        if (std::memcmp(back.data(), in.data(), n * es) != 0) note(n, -1, -1);  // the input changed
      }
      res.output_hash = bits_hash(outh.data(), n * es) | 1;
      return res;
    }
    case kft::collective::reduce_scatter: {
      std::vector<unsigned char> in(n * P * es + 1), outh(n * es + 1, 0xff);
      fill(in, n * P, me, 0);
      void* din = mem.alloc(n * P * es);
      mem.upload(din, in.data(), n * P * es);
      void* dout = s.in_place ? static_cast<unsigned char*>(din) + R * n * es : mem.alloc(n * es);
      if (!s.in_place) mem.upload(dout, outh.data(), n * es);
      comm.reduce_scatter(din, dout, n, s.type, s.op, o);
      mem.download(outh.data(), dout, n * es);
      for (std::size_t i = 0; i < n; ++i) {
        const double got = get(s.type, outh.data(), i), want = expected(p, R * n + i, s.op, s.type);
        if (!close_enough(got, want, s.type, s.op, roundings)) note(i, got, want);
      }
      return res;  // each rank holds a different slice: nothing to compare across ranks
    }
    case kft::collective::allgather: {
      std::vector<unsigned char> mine(n * es + 1), all(n * P * es + 1, 0xff);
      fill(mine, n, me, 0);
      void* dall = mem.alloc(n * P * es);
      mem.upload(dall, all.data(), n * P * es);
      void* din = s.in_place ? static_cast<unsigned char*>(dall) + R * n * es : mem.alloc(n * es);
      mem.upload(din, mine.data(), n * es);
      comm.allgather(din, dall, n, s.type, o);
      mem.download(all.data(), dall, n * P * es);
      for (std::size_t r = 0; r < P; ++r)
        for (std::size_t i = 0; i < n; ++i) {
          const double got = get(s.type, all.data(), r * n + i), want = input(static_cast<int>(r), i, s.op, s.type);
          if (got != want) note(r * n + i, got, want);
        }
      res.output_hash = bits_hash(all.data(), n * P * es) | 1;
      return res;
    }
    case kft::collective::none: break;
  }
  return res;
}

}  // namespace kft_test::conformance
