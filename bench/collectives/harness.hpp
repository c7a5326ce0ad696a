// SPDX-License-Identifier: Apache-2.0
// harness.hpp: nccl-tests' *_perf for kft's communicators, written once. Each collective has a
// short file (all_reduce.cpp, broadcast.cpp, reduce_scatter.cpp, all_gather.cpp) with what is
// its own (sizes, bus factor, in-place offsets, the call, the check), as nccl-tests' src/<coll>.cu
// next to its common.cu. `--backend shm|mpi|group|nccl` picks the communicator measured
// (backend.hpp). Run under mpirun (or kftrun, for shm) with every rank on one node:
//
//     mpirun -np 2 build/bench/allreduce_perf -b 8 -e 256M -f 2 --json /tmp/ar2.json
//     mpirun -np 2 build/bench/allreduce_perf --backend nccl -b 8 -e 1G -f 2   (one GPU per rank)
//
// What it prints is nccl-tests' table: the same flags (-b -e -i -f -n -w -c -d -o -r -a -T), the
// same header, row and footer formats (src/util.cu), the same sizes (count = size/typesize;
// per-rank counts of reduce_scatter/allgather rounded down to 16 bytes) and the same busbw
// factors (allreduce 2(n-1)/n, broadcast 1, reduce_scatter/allgather (n-1)/n), so scripts
// written for nccl-tests read it. Method:
//  - time: per size, w warm-up calls, a barrier, n back-to-back calls; a rank's time is the
//    average call; the row shows the slowest rank's (-a 3, kft's default; nccl-tests' -a 1,
//    the ranks' mean, is there too).
//  - checking (-c 1) happens before timing: inputs are small integers that depend on rank and
//    index, exact in every dtype (sums stay below 2^8 for bfloat16, 2^11 for half), so #wrong
//    counts exact mismatches, summed over ranks (f16/bf16 and `avg` on floats get a 1-2 ulp
//    tolerance). Outputs start as 0xff bytes (NaN for floats); an out-of-place call that
//    changes its input counts as wrong too.
//  - buffers: one send and one receive buffer of the largest size, touched before anything is
//    timed and reused for every size and every call (nothing is rotated, so sizes that fit in
//    the caches are timed in cache, as in nccl-tests and the OSU benchmarks).
//  - peers (allreduce_perf, on by default; float sum only): after kft's table, in the same run
//    and on the same buffers: a single-thread memcpy on rank 0 alone, Open MPI's MPI_Allreduce
//    as it comes, the same after mallopt() keeps freed memory (so its per-call temporaries do
//    not page-fault; what MALLOC_MMAP_THRESHOLD_ does), and Gloo's ring allreduce over TCP on
//    127.0.0.1 when built with Gloo. Their iterations are capped so that one size takes about
//    --peer-budget seconds.
//  - --latency: per-call p50/p99 of small float-sum allreduces, kft vs MPI_Allreduce (each call's
//    time is the slowest rank's; back-to-back one-shot calls overlap, so the table's average
//    call can be shorter than this p50).
//  - --algos: every forced algorithm timed right after each row, so "is auto the best choice"
//    is answered within one run (on a shared VM whole runs can be 2x apart).
//  - --p50: nccl-tests-like per-call columns (i_p50, i_p99) after each half of the table.
//
// Only rank 0 prints. Extra tables are '#' lines after nccl-tests' footer, so the only
// non-comment lines are nccl-tests' rows. The peers and --latency run for the host backends;
// NCCL's device buffers are filled and checked through host copies (not timed).
//
// Where the parts live. The harness is compiled once, in harness.cpp (the CMake object library
// kft_bench_harness, linked into every program beside kft_bench_backends): the rows, the run
// and main, with its parts flags.hpp (the flags), bench.hpp (a run's state and clock),
// report.hpp (the table, the JSON), peers.hpp (memcpy, MPI, Gloo and --latency beside kft) and
// multinode.hpp. A collective's file compiles only what is its own: its struct, turned into a
// `descriptor` (below: plain values and function pointers, its check once per dtype), and the
// checks it runs (checks.hpp). Per timed call the harness makes one indirect call, the
// descriptor's `run`, before the backend's virtual call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>

#include "backend.hpp"
#include "checks.hpp"

namespace kft_bench {

// ---- what a collective's file provides (all_reduce.cpp, ...) -----------------------------

enum class coll { allreduce, broadcast, reduce_scatter, allgather };

// Sizes of one row (nccl-tests GetCollByteCount): `count` is the per-call count argument.
struct shape {
  std::size_t count = 0, send_bytes = 0, recv_bytes = 0;
  std::size_t alg_bytes = 0;  // S in algbw = S / t
  std::size_t size() const { return std::max(send_bytes, recv_bytes); }
};

/// A collective's check of one dtype (checks.hpp): the elements it found wrong on this rank.
template <class T>
using verify_fn = std::int64_t (*)(check_ctx<T>& v, bool in_place);

/// A collective as the compiled harness sees it: what its file's struct says, as values and
/// plain function pointers (describe<C>() makes one).
struct descriptor {
  coll kind;
  kft::collective op;
  std::string_view kft_name;  // the JSON's "collective", the --help line
  const char* nccl_name;      // nccl-tests' program name, in the header and footer
  bool has_op, has_root;      // whether -o and -r apply
  double (*bus_factor)(int nranks);
  shape (*shape_of)(std::size_t size, std::size_t elem_size, int nranks);
  /// Where the in-place call reads and writes, inside the receive buffer.
  std::pair<const void*, void*> (*in_place)(unsigned char* recv, std::size_t count, std::size_t elem_size, int rank);
  /// The call: one backend method. The only one of these in the timed loop.
  void (*run)(backend& b, const void* in, void* out, std::size_t count, kft::dtype t, kft::op_kind op, int root,
              const kft::options& o);
  /// The check, once per dtype kft reduces: std::get<verify_fn<T>>(verify).
  std::tuple<verify_fn<float>, verify_fn<double>, verify_fn<kft::half>, verify_fn<kft::bfloat16>,
             verify_fn<std::int32_t>, verify_fn<std::int64_t>, verify_fn<std::uint8_t>>
      verify;
};

/// The descriptor of a collective's struct C (all_reduce.cpp, ...): its constants, its static
/// functions, and C::verify<T> for every dtype, instantiated in C's own file.
template <class C>
descriptor describe() {
  return {C::kind, C::op, C::kft_name, C::nccl_name, C::has_op, C::has_root,
          &C::bus_factor, &C::shape_of, &C::in_place, &C::run,
          {&C::template verify<float>, &C::template verify<double>, &C::template verify<kft::half>,
           &C::template verify<kft::bfloat16>, &C::template verify<std::int32_t>, &C::template verify<std::int64_t>,
           &C::template verify<std::uint8_t>}};
}

/// The program (harness.cpp): MPI when an MPI launcher started it, the flags, the run, and
/// errors as exit codes.
int run_program(const descriptor& c, int argc, char** argv);

/// A collective file's main: `return kft_bench::main_of<all_reduce>(argc, argv);`.
template <class C>
int main_of(int argc, char** argv) {
  return run_program(describe<C>(), argc, argv);
}

}  // namespace kft_bench
