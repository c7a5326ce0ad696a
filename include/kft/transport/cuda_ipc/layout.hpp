// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/cuda_ipc/layout.hpp
/// @brief What the ranks of a CUDA IPC communicator share, and the GPU tells the host: the
/// control block at the start of every rank's device region (its peers write into it through
/// their IPC mappings), the host-mapped status word in which the barrier kernel reports, and a
/// call's signature (what must agree between the ranks of one call). No kernels: any C++
/// compiler reads it.
///
/// A rank's region: the control block, then `config::staging_bytes` of staging from byte
/// `control_bytes` on.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_CUDA
#error "kft/transport/cuda_ipc/layout.hpp needs the CUDA component: configure kft with KFT_WITH_CUDA=ON and link kft::cuda"
#endif

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/hash.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/cuda_ipc/config.hpp>

KFT_NAMESPACE_BEGIN
namespace cuda_ipc::detail {

/// The first bytes of every rank's region; peers write into it through their IPC mapping.
struct control {
  unsigned long long flag[max_ranks];    // flag[j]: the last barrier epoch rank j signalled here
  unsigned long long sig[2][max_ranks];  // sig[e & 1][j]: rank j's call signature at epoch e
  unsigned long long aborted;            // nonzero: rank aborted - 1 aborted the group
};
/// Where staging starts in a region (16-byte aligned and more).
inline constexpr std::size_t control_bytes = 4096;
static_assert(sizeof(control) <= control_bytes);

/// What the barrier kernel found (`status::code`); the first finding stands.
enum : unsigned int {
  status_fine = 0,       ///< every barrier so far completed
  status_timed_out = 1,  ///< `peer` did not arrive within the call's deadline (timed on the GPU)
  status_aborted = 2,    ///< `peer` aborted the group
  status_mismatch = 3,   ///< `peer` is in a different call (its signature: `theirs`)
  status_stopped = 4,    ///< the host told the kernel to stop waiting (`status::stop`)
};

/// Host-mapped: what the barrier kernel found, and the host's request to stop waiting.
struct status {
  unsigned int code;  // status_fine ... status_stopped
  int peer;           // the rank at fault
  unsigned long long epoch;
  unsigned long long theirs;  // the peer's signature (mismatch)
  unsigned int stop;          // set by the host: give up waiting
};

/// Every rank's control block as this rank maps it (the barrier kernel's argument).
struct peers {
  control* ctl[max_ranks];
};

/// FNV-1a over what must agree between ranks: collective, count, dtype, op, root, tag,
/// algorithm. The chunking settings count too: ranks that cut a call differently would meet at
/// different barriers. Never 0 (a control block's initial value).
inline unsigned long long signature(collective c, std::size_t count, dtype t, op_kind op, int root, std::uint32_t tag,
                                    algo a, std::size_t staging_bytes, std::size_t one_shot_bytes) {
  std::uint64_t h = kft::detail::fnv1a_basis;
  for (const std::uint64_t v : {static_cast<std::uint64_t>(c), std::uint64_t{count}, static_cast<std::uint64_t>(t),
                                static_cast<std::uint64_t>(op), static_cast<std::uint64_t>(root + 1),
                                std::uint64_t{tag}, static_cast<std::uint64_t>(a), std::uint64_t{staging_bytes},
                                std::uint64_t{one_shot_bytes}})
    h = kft::detail::fnv1a_u64(v, h);
  return h | 1;
}

}  // namespace cuda_ipc::detail
KFT_NAMESPACE_END
