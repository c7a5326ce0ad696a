// SPDX-License-Identifier: Apache-2.0
// broadcast_perf: nccl-tests' broadcast_perf for kft (harness.cpp has the rest). What is
// broadcast's own: `count` elements from the root to every rank; busbw = algbw; in place the
// root's receive buffer is its input.
#include "harness.hpp"

namespace kft_bench {

struct broadcast {
  static constexpr coll kind = coll::broadcast;
  static constexpr kft::collective op = kft::collective::broadcast;
  static constexpr std::string_view kft_name = "broadcast";
  static constexpr const char* nccl_name = "broadcast_perf";
  static constexpr bool has_op = false, has_root = true;

  static double bus_factor(int) { return 1.0; }
  static shape shape_of(std::size_t size, std::size_t es, int) {
    shape s;
    s.count = size / es;
    s.send_bytes = s.recv_bytes = s.alg_bytes = s.count * es;
    return s;
  }
  static std::pair<const void*, void*> in_place(unsigned char* recv, std::size_t, std::size_t, int) { return {recv, recv}; }
  static void run(backend& b, const void* in, void* out, std::size_t n, kft::dtype t, kft::op_kind, int root,
                  const kft::options& o) {
    b.broadcast(in, out, n, t, root, o);
  }
  template <class T>
  static std::int64_t verify(check_ctx<T>& v, bool in_place) {
    auto rooted = [&](std::size_t i) { return v.rooted(i); };
    if (!in_place) {
      auto mine = [&](std::size_t i) { return v.mine(i); };
      v.out_of_place_with(v.cnt, mine);
    } else {
      v.clear_recv();
      if (v.me == v.root) v.fill_recv(0, v.cnt, rooted);
      v.upload_recv();
      v.run_in_place();
    }
    return v.recv_wrong(0, v.cnt, 0, rooted);
  }
};

}  // namespace kft_bench

int main(int argc, char** argv) { return kft_bench::main_of<kft_bench::broadcast>(argc, argv); }
