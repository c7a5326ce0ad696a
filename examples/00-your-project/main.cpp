// SPDX-License-Identifier: Apache-2.0
// Your program with kft: join the job (whatever launched it) and allreduce.
#include <cstdio>
#include <vector>

#include <kft/init.hpp>

int main(int argc, char** argv) {
  kft::session s = kft::init(argc, argv);  // who am I + a ready process group, whatever launched us
  std::vector<float> v(1024, float(s.rank() + 1));
  s.group().allreduce(v.data(), v.data(), v.size(), kft::dtype::f32, kft::op_kind::sum);
  if (s.rank() == 0) std::printf("rank 0 of %d: v[0] = %g\n", s.size(), double(v[0]));
}
