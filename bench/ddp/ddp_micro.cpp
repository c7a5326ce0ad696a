// SPDX-License-Identifier: Apache-2.0
// ddp_micro: Google Benchmark micro-benchmarks of the DDP layer's hot paths.
//
//     build-tests/bench/ddp_micro                         # all
//     build-tests/bench/ddp_micro --benchmark_filter=mark_ready
//
//  - mark_ready: one step of P parameters marked and finished, per parameter (the reducer's own
//    bookkeeping over a group whose collectives complete at once; and over a one-rank
//    shared-memory group, which adds the progress engine's hand-off per bucket);
//  - assign_buckets: the bucket assignment of P parameters;
//  - reduce: kft's reduction kernels (2 and 4 inputs, f32 and bf16) beside memcpy of the same
//    output bytes (bytes_per_second counts the bytes written).
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <kft/ddp/reducer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/kernels/reduce.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

namespace ddp = kft::ddp;

namespace {

// A one-rank group whose collectives are done when called: what is left is the reducer.
struct instant_group {
  int rank() const { return 0; }
  int size() const { return 1; }
  std::uint64_t sequence() const { return seq; }
  void allreduce(const void*, void*, std::size_t, kft::dtype, kft::op_kind, const kft::options&) { ++seq; }
  void broadcast(const void* in, void* out, std::size_t n, kft::dtype t, int, const kft::options&) {
    if (in != out) std::memcpy(out, in, n * kft::size_of(t));
    ++seq;
  }
  void reduce_scatter(const void*, void*, std::size_t, kft::dtype, kft::op_kind, const kft::options&) { ++seq; }
  void allgather(const void* in, void* out, std::size_t n, kft::dtype t, const kft::options&) {
    if (in != out) std::memcpy(out, in, n * kft::size_of(t));
    ++seq;
  }
  void barrier(const kft::options&) { ++seq; }
  void abort(std::string_view) noexcept {}
  kft::async::work allreduce_async(const void*, void*, std::size_t, kft::dtype, kft::op_kind, const kft::options&) {
    ++seq;
    return {};
  }
  kft::async::work broadcast_async(const void*, void*, std::size_t, kft::dtype, int, const kft::options&) { return {}; }
  kft::async::work reduce_scatter_async(const void*, void*, std::size_t, kft::dtype, kft::op_kind, const kft::options&) {
    return {};
  }
  kft::async::work allgather_async(const void*, void*, std::size_t, kft::dtype, const kft::options&) { return {}; }
  kft::async::work barrier_async(const kft::options&) { return {}; }
  std::uint64_t seq = 0;
};
static_assert(kft::async_communicator<instant_group>);

std::vector<ddp::parameter> model(std::size_t n, std::size_t count) {
  std::vector<ddp::parameter> ps;
  for (std::size_t i = 0; i < n; ++i) {
    std::string name = std::to_string(i);  // (not "p" + ...: GCC 12's -Wrestrict false positive at -O3)
    ps.push_back({count + i % 7, kft::dtype::f32, name.insert(0, 1, 'p')});
  }
  return ps;
}

template <class Reducer>
void steps(benchmark::State& st, Reducer& r) {
  const std::size_t n = r.parameters();
  for (auto _ : st) {
    for (std::size_t i = n; i-- > 0;) r.mark_ready(i);
    r.finish();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * n));
  st.counters["s_per_parameter"] = benchmark::Counter(static_cast<double>(n) * static_cast<double>(st.iterations()),
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void mark_ready_instant(benchmark::State& st) {
  instant_group g;
  ddp::reducer r(g, model(static_cast<std::size_t>(st.range(0)), 1024),
                 {.limits = {.first_bucket_bytes = 64u << 10, .bucket_bytes_cap = 256u << 10}});
  steps(st, r);
  st.counters["buckets"] = static_cast<double>(r.buckets().size());
}
BENCHMARK(mark_ready_instant)->Arg(16)->Arg(200)->Arg(2000)->Unit(benchmark::kMicrosecond);

void mark_ready_shm(benchmark::State& st) {
  auto store = std::make_shared<kft::rendezvous::memory_store>();
  kft::shm::config c;
  c.name = "ddp-micro";
  c.pool_bytes = 64u << 20;
  kft::group::process_group g(kft::shm::communicator(store, 0, 1, c), "shm");
  ddp::reducer r(g, model(static_cast<std::size_t>(st.range(0)), 1024),
                 {.limits = {.first_bucket_bytes = 64u << 10, .bucket_bytes_cap = 256u << 10}});
  steps(st, r);
  st.counters["buckets"] = static_cast<double>(r.buckets().size());
}
BENCHMARK(mark_ready_shm)->Arg(16)->Arg(200)->Arg(2000)->Unit(benchmark::kMicrosecond);

void assign_buckets(benchmark::State& st) {
  const auto ps = model(static_cast<std::size_t>(st.range(0)), 4096);
  for (auto _ : st) benchmark::DoNotOptimize(ddp::assign_buckets(ps, {}));
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0));
}
BENCHMARK(assign_buckets)->Arg(200)->Arg(10000)->Unit(benchmark::kMicrosecond);

// Reduction kernels against memcpy, by output bytes.
struct buffers {
  std::vector<std::vector<unsigned char>> in;
  std::vector<unsigned char> out;
  std::vector<const void*> srcs;
  buffers(int n, std::size_t bytes) : in(static_cast<std::size_t>(n), std::vector<unsigned char>(bytes, 1)), out(bytes, 0) {
    for (auto& v : in) srcs.push_back(v.data());
  }
};

void reduce_kernel(benchmark::State& st, kft::dtype t, int inputs) {
  const auto bytes = static_cast<std::size_t>(st.range(0));
  buffers b(inputs, bytes);
  const std::size_t count = bytes / kft::size_of(t);
  for (auto _ : st) {
    kft::kernels::reduce(b.out.data(), b.srcs.data(), inputs, count, t, kft::op_kind::sum, inputs);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * bytes));
}
void memcpy_kernel(benchmark::State& st) {
  const auto bytes = static_cast<std::size_t>(st.range(0));
  buffers b(1, bytes);
  for (auto _ : st) {
    std::memcpy(b.out.data(), b.in[0].data(), bytes);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * bytes));
}
BENCHMARK(memcpy_kernel)->RangeMultiplier(16)->Range(4 << 10, 64 << 20);
BENCHMARK_CAPTURE(reduce_kernel, f32_2in, kft::dtype::f32, 2)->RangeMultiplier(16)->Range(4 << 10, 64 << 20);
BENCHMARK_CAPTURE(reduce_kernel, f32_4in, kft::dtype::f32, 4)->RangeMultiplier(16)->Range(4 << 10, 64 << 20);
BENCHMARK_CAPTURE(reduce_kernel, bf16_2in, kft::dtype::bf16, 2)->RangeMultiplier(16)->Range(4 << 10, 64 << 20);
BENCHMARK_CAPTURE(reduce_kernel, f16_2in, kft::dtype::f16, 2)->RangeMultiplier(16)->Range(4 << 10, 64 << 20);

}  // namespace

BENCHMARK_MAIN();
