// SPDX-License-Identifier: Apache-2.0
// reduce_scatter_perf: nccl-tests' reduce_scatter_perf for kft (harness.cpp has the rest).
// What is reduce-scatter's own: every rank sends `count` x n elements and receives its `count`
// (rounded down to 16 bytes, as nccl-tests does); busbw = algbw x (n-1)/n; in place the
// output is slice `rank` of the input.
#include "harness.hpp"

namespace kft_bench {

struct reduce_scatter {
  static constexpr coll kind = coll::reduce_scatter;
  static constexpr kft::collective op = kft::collective::reduce_scatter;
  static constexpr std::string_view kft_name = "reduce_scatter";
  static constexpr const char* nccl_name = "reduce_scatter_perf";
  static constexpr bool has_op = true, has_root = false;

  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static shape shape_of(std::size_t size, std::size_t es, int n) {
    const std::size_t un = static_cast<std::size_t>(n);
    shape s;
    s.count = (size / es / un) & ~(16 / es - 1);  // nccl-tests: & -(16/eltSize)
    s.recv_bytes = s.count * es;
    s.send_bytes = s.alg_bytes = s.recv_bytes * un;
    return s;
  }
  static std::pair<const void*, void*> in_place(unsigned char* recv, std::size_t count, std::size_t es, int me) {
    return {recv, recv + static_cast<std::size_t>(me) * count * es};
  }
  static void run(backend& b, const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op, int,
                  const kft::options& o) {
    b.reduce_scatter(in, out, n, t, op, o);
  }
  template <class T>
  static std::int64_t verify(check_ctx<T>& v, bool in_place) {
    const std::size_t all = v.cnt * static_cast<std::size_t>(v.p), mine_at = static_cast<std::size_t>(v.me) * v.cnt;
    auto mine = [&](std::size_t i) { return v.mine(i); };
    auto reduced = [&](std::size_t j) { return v.reduced(mine_at + j); };
    if (!in_place) {
      v.out_of_place_with(all, mine);
      return v.recv_wrong(0, v.cnt, v.tol, reduced);
    }
    v.fill_recv(0, all, mine);
    v.upload_recv();
    v.run_in_place();
    return v.recv_wrong(mine_at, v.cnt, v.tol, reduced);
  }
};

}  // namespace kft_bench

int main(int argc, char** argv) { return kft_bench::main_of<kft_bench::reduce_scatter>(argc, argv); }
