// SPDX-License-Identifier: Apache-2.0
// allgather_perf: nccl-tests' all_gather_perf for kft (harness.cpp has the rest). What is
// allgather's own: every rank sends `count` elements (rounded down to 16 bytes) and receives
// all n pieces; busbw = algbw x (n-1)/n; in place the input is piece `rank` of the output.
#include "harness.hpp"

namespace kft_bench {

struct all_gather {
  static constexpr coll kind = coll::allgather;
  static constexpr kft::collective op = kft::collective::allgather;
  static constexpr std::string_view kft_name = "allgather";
  static constexpr const char* nccl_name = "all_gather_perf";
  static constexpr bool has_op = false, has_root = false;

  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static shape shape_of(std::size_t size, std::size_t es, int n) {
    const std::size_t un = static_cast<std::size_t>(n);
    shape s;
    s.count = (size / es / un) & ~(16 / es - 1);  // nccl-tests: & -(16/eltSize)
    s.send_bytes = s.count * es;
    s.recv_bytes = s.alg_bytes = s.send_bytes * un;
    return s;
  }
  static std::pair<const void*, void*> in_place(unsigned char* recv, std::size_t count, std::size_t es, int me) {
    return {recv + static_cast<std::size_t>(me) * count * es, recv};
  }
  static void run(backend& b, const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind, int,
                  const kft::options& o) {
    b.allgather(in, out, n, t, o);
  }
  template <class T>
  static std::int64_t verify(check_ctx<T>& v, bool in_place) {
    const std::size_t all = v.cnt * static_cast<std::size_t>(v.p);
    auto mine = [&](std::size_t i) { return v.mine(i); };
    auto gathered = [&](std::size_t i) { return v.gathered(i); };
    if (!in_place) {
      v.out_of_place_with(v.cnt, mine);
    } else {
      v.clear_recv();
      v.fill_recv(static_cast<std::size_t>(v.me) * v.cnt, v.cnt, mine);
      v.upload_recv();
      v.run_in_place();
    }
    return v.recv_wrong(0, all, 0, gathered);
  }
};

}  // namespace kft_bench

int main(int argc, char** argv) { return kft_bench::main_of<kft_bench::all_gather>(argc, argv); }
