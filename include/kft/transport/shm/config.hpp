// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/config.hpp
/// @brief Sizes and limits of a shared-memory communicator, fixed at construction.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <kft/core/error.hpp>
#include <kft/core/timeout.hpp>
#include <kft/transport/shm/tuning.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

using namespace std::chrono_literals;

/// @brief Sizes and limits of a communicator, fixed at construction (all ranks must agree).
/// The transport reads no environment variable: `kft::group::shm_config(env)` applies
/// `KFT_SHM_*` for programs that want them (as the process groups do).
/// @brief The default chunk (`config::staging_bytes`): this CPU's L2 cache per core, rounded down
/// to a power of two and clamped to 256 KiB..1 MiB; 256 KiB where the system does not say.
/// Measured (docs/performance.md): on an AMD EPYC Zen 5 (1 MiB L2) 1 MiB chunks beat 256 KiB by
/// 10-20% from 16 MiB (a quarter of the synchronisations); 256 KiB was tuned on a machine with a
/// smaller L2. Every rank of a node computes the same value (the segment header checks it);
/// `bench/scripts/tune_shm.py` measures a machine and `KFT_SHM_TUNING` overrides it.
inline std::size_t default_staging_bytes() {
  static const std::size_t bytes = [] {
    constexpr std::size_t lo = 256u << 10, hi = 1u << 20;
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0) return std::clamp(std::bit_floor(static_cast<std::size_t>(l2)), lo, hi);
#endif
    return lo;
  }();
  return bytes;
}

struct config {
  std::size_t staging_bytes = default_staging_bytes();  ///< per rank, per half of the double buffer (the chunk size)
  std::size_t small_bytes = 32u << 10;     ///< per rank, per parity: the one-shot slot
  std::size_t pool_bytes = 0;              ///< room for symmetric zero-copy buffers (`allocate`)
  std::size_t streaming_bytes = 16u << 20;  ///< outputs from this size on bypass the caches
  /// The copy path (a private input or output) from this size on writes with streaming stores
  /// everything it writes: the staging its peers read and its output. A peer then reads the
  /// staging from memory instead of from the writer's cache, which on the machine measured
  /// moved the handoff faster (2 ranks on an AMD EPYC Zen 5 VM: 8.4 -> 16 GB/s at 1-16 MiB,
  /// 16-32 KiB +18-33%, not at 8 KiB; docs/algorithms.md). Tuning file / `KFT_SHM_COPY_STREAMING_BYTES`; a size above
  /// every message turns it off.
  std::size_t copy_streaming_bytes = 16u << 10;
  std::chrono::milliseconds timeout = default_job_timeout;  ///< default deadline of every wait (the groups apply KFT_TIMEOUT)
  std::string name = "kft";                  ///< goes into the segment's name (e.g. the run id)
  /// How many times this group has shrunk (group/shrink.hpp): 0 for a group as the job built
  /// it; the survivors of generation g build g + 1 under keys of their own.
  std::uint64_t generation = 0;
  /// A changed generation's ranks by their founding rank (the rank each had in generation 0,
  /// a node's local rank), and how many ranks generation 0 had; empty / 0 for generation 0.
  std::vector<int> members{};
  int founding_size = 0;
  group_identity identity{};                 ///< where this node's group sits in the job (messages)
  /// What algo::automatic runs, by size (tuning.hpp), first matching row first; a machine measured
  /// differently brings its own rows (`KFT_SHM_TUNING`, written by `bench/scripts/tune_shm.py`; `keep_table`).
  std::span<const crossover> crossovers = default_crossovers;
  /// Bind the progress thread (asynchronous calls) to this local rank's share of the CPUs
  /// (`async::placement`); the process groups set it from `KFT_PROGRESS_AFFINITY` (auto | none).
  bool bind_progress_thread = true;
  /// The direct zero-copy allreduce (p > 2) from this size cuts the message into blocks that
  /// whichever rank runs claims, instead of one fixed slice per rank, when `claim_blocks` says so:
  /// -1 (default) when the node's ranks outnumber its online CPUs, 0 never, 1 always.
  std::size_t claim_from_bytes = 16u << 20;
  int claim_blocks = -1;
  /// Back each rank's region of the segment with 2 MiB pages (Linux >= 6.1 `MADV_COLLAPSE`, which
  /// works whatever `/sys/kernel/mm/transparent_hugepage/shmem_enabled` says): -1 (default) when
  /// the zero-copy pool is at least `huge_pages_from_bytes`, 0 never, 1 always. Each rank
  /// populates and collapses its own region (first touch stays local to its NUMA node); a kernel
  /// that refuses leaves 4 KiB pages and says why (`communicator::huge_pages()`). Measured on a
  /// 2-vCPU VM, 4 ranks, 256 MiB zero-copy: 4.7-5.7 -> 7.4-7.7 GB/s busbw, and set-up twice as
  /// fast (one fault per 2 MiB; docs/algorithms.md "Pages", docs/performance.md).
  int huge_pages = -1;
  std::size_t huge_pages_from_bytes = 8u << 20;
  /// Ranks' regions start this many bytes apart, or a multiple of it (the distance rounded up;
  /// the bytes between a region's end and the next one's start are never touched, so they cost
  /// address space, not memory): 0 (default) is 8 MiB when the regions are in 2 MiB pages and
  /// 4 KiB otherwise; anything else must be a multiple of the pages (2 MiB or 4 KiB), at most 1 GiB. Measured on
  /// a 2-vCPU AMD EPYC Zen 5 VM, 4 ranks, 64-256 MiB zero-copy, 2 MiB pages: regions 2-6 MiB
  /// past a multiple of 64 MiB apart (what a power-of-two pool gives) ran at 6-9 GB/s busbw,
  /// any multiple of 8 MiB at 9-16 (docs/algorithms.md "Where the regions sit"). `KFT_SHM_REGION_ALIGN`.
  std::size_t region_align_bytes = 0;
};

}  // namespace shm
KFT_NAMESPACE_END
