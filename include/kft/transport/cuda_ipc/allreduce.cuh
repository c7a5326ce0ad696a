// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/allreduce.cuh
/// @brief The CUDA IPC allreduce (nvcc), per staging chunk: one-shot (every rank reduces the
/// whole chunk from every rank's staging) below `one_shot_bytes`, two-shot from there (rank r
/// reduces slice r in place in its own staging; barrier; every rank gathers the slices), or as
/// `options::algorithm` says.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/allreduce.cuh needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif
#ifndef __CUDACC__
#error "kft/transport/cuda_ipc/allreduce.cuh holds CUDA kernels: compile the file that includes it with nvcc (a .cu source)"
#endif

#include <algorithm>
#include <cstddef>

#include <kft/core/options.hpp>
#include <kft/transport/cuda_ipc/call.cuh>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// Whether a chunk of `bytes` goes two-shot under algorithm `a` (auto: from `one_shot_bytes`,
/// with more than one rank).
inline bool two_shot(const state& s, algo a, std::size_t bytes) {
  return a == algo::two_shot || (a == algo::automatic && bytes >= s.cfg.one_shot_bytes && s.size > 1);
}

/// Rank r's slice of a two-shot chunk of `m` elements: [lo, hi), whole 16-byte vectors (the
/// last slices may be short or empty).
struct slice {
  std::size_t lo, hi;
};
inline slice slice_of(int r, int size, std::size_t m, std::size_t es) {
  const std::size_t k = static_cast<std::size_t>(size), v = 16 / es, per = ((m + k - 1) / k + v - 1) / v * v;
  const std::size_t lo = std::min(m, per * static_cast<std::size_t>(r));
  return {lo, std::min(m, lo + per)};
}

inline void allreduce(call& k, const void* in, void* out, std::size_t n, dtype t, op_kind op, algo a) {
  state& s = k.s;
  const std::size_t es = size_of(t), chunk = s.cfg.staging_bytes / es;
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    k.copy(k.stage(s.rank), at(in, off, es), m * es);
    k.sync();
    if (!two_shot(s, a, m * es)) {
      k.reduce(at(out, off, es), 0, m, t, op);
    } else {
      // Rank r reduces slice r in place in its staging; then every rank gathers the slices.
      const slice mine = slice_of(s.rank, s.size, m, es);
      if (mine.hi > mine.lo) k.reduce(k.stage(s.rank) + mine.lo * es, mine.lo * es, mine.hi - mine.lo, t, op);
      k.sync();
      for (int j = 0; j < s.size; ++j) {
        const slice theirs = slice_of(j, s.size, m, es);
        if (theirs.hi > theirs.lo)
          k.copy(at(out, off + theirs.lo, es), k.stage(j) + theirs.lo * es, (theirs.hi - theirs.lo) * es);
      }
    }
    k.sync();
  }
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
