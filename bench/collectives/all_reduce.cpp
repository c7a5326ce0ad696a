// SPDX-License-Identifier: Apache-2.0
// allreduce_perf: nccl-tests' all_reduce_perf for kft (harness.cpp has the table, flags,
// timing, peers and backends). What is allreduce's own: every rank sends and receives `count`
// elements; busbw = algbw x 2(n-1)/n; in place reads and writes the receive buffer.
#include "harness.hpp"

namespace kft_bench {

struct all_reduce {
  static constexpr coll kind = coll::allreduce;
  static constexpr kft::collective op = kft::collective::allreduce;
  static constexpr std::string_view kft_name = "allreduce";
  static constexpr const char* nccl_name = "all_reduce_perf";
  static constexpr bool has_op = true, has_root = false;

  static double bus_factor(int n) { return 2.0 * (n - 1) / n; }
  static shape shape_of(std::size_t size, std::size_t es, int) {
    shape s;
    s.count = size / es;
    s.send_bytes = s.recv_bytes = s.alg_bytes = s.count * es;
    return s;
  }
  static std::pair<const void*, void*> in_place(unsigned char* recv, std::size_t, std::size_t, int) { return {recv, recv}; }
  static void run(backend& b, const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind op, int,
                  const kft::options& o) {
    b.allreduce(in, out, n, t, op, o);
  }
  template <class T>
  static std::int64_t verify(check_ctx<T>& v, bool in_place) {
    auto mine = [&](std::size_t i) { return v.mine(i); };
    auto reduced = [&](std::size_t i) { return v.reduced(i); };
    if (!in_place) {
      v.out_of_place_with(v.cnt, mine);
    } else {
      v.fill_recv(0, v.cnt, mine);
      v.upload_recv();
      v.run_in_place();
    }
    return v.recv_wrong(0, v.cnt, v.tol, reduced);
  }
};

}  // namespace kft_bench

int main(int argc, char** argv) { return kft_bench::main_of<kft_bench::all_reduce>(argc, argv); }
