// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/layout.hpp
/// @brief The shared segment's wire format: what every rank of a node reads and writes.
///
/// One segment per communicator: a header (configuration, abort flag and reason), one
/// `rank_ctrl` line per rank (pipeline stage, pid, readiness), then one region per rank:
/// two one-shot mailboxes (one per call parity), two staging buffers (the double buffer of the
/// chunked algorithms) and the zero-copy pool. Offsets are computed in `state::init`.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <kft/core/collective.hpp>
#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

namespace detail {

inline constexpr std::uint64_t segment_magic = 0x316d68732d74666bULL;  // "kft-shm1"
/// Bumped whenever the segment's layout or protocol changes: ranks of different kft builds
/// sharing one node refuse each other by it (2: `rank_ctrl::done`; 5: the mailbox's head line
/// holds a signature hash and 48 bytes of data, the full signature the line before; 6: regions
/// aligned to 2 MiB when huge pages are on, `header::huge`; 7: `signature::refused`; 9:
/// `rank_ctrl::outside_*`).
inline constexpr std::uint32_t layout_version = 9;
inline constexpr std::uint64_t no_offset = ~0ULL;

/// What a rank is doing in one call; compared across ranks.
struct signature {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::uint64_t in_off = no_offset;   // offset in the pool of a zero-copy input
  std::uint64_t out_off = no_offset;  // ... and output
  std::int32_t root = -1;
  std::uint32_t tag = 0;
  std::uint8_t coll = 0, type = 0, op = 0, algorithm = 0;
  std::uint32_t refused = 0;  // 1: the rank refused the call (state::refuse): nobody runs it

  bool operator==(const signature&) const = default;
};

static_assert(sizeof(signature) == 48);

/// A hash of what must agree between ranks: the signature, less an allgather's zero-copy
/// input offset (which may differ: each rank reads the peer's from `mailbox::sig`).
/// Six 64-bit words, a multiply and a shift each (~25 cycles: it is on every call's path).
inline std::uint64_t signature_hash(const signature& g) noexcept {
  std::uint64_t w[sizeof(signature) / 8];
  std::memcpy(w, &g, sizeof w);
  if (g.coll == static_cast<std::uint8_t>(collective::allgather)) w[2] = 0;  // in_off
  std::uint64_t x = 0x243f6a8885a308d3ULL;
  for (const std::uint64_t v : w) {
    x = (x ^ v) * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
  }
  return x;
}
static_assert(sizeof(signature) % 8 == 0);

/// A rank's one-shot slot (one per call parity). Its first line holds the call's full
/// signature less its sequence number (written only when it changes), read by peers only when
/// the hashes differ (for the error message) and for an allgather's zero-copy input offset. The second line holds the arrival flag, the signature's
/// hash and the first 48 bytes of data, so a collective of up to 48 bytes costs the reader one
/// line per peer.
struct alignas(64) mailbox {
  signature sig;
  char pad[64 - sizeof(signature)];
  std::atomic<std::uint64_t> seq;  // the call this mailbox holds; written last (release)
  std::uint64_t sig_hash;          // signature_hash(sig)
  // data follows (mailbox_data_offset)
};
inline constexpr std::size_t mailbox_data_offset = 64 + 8 + 8;
// seq at byte 64 and sig_hash at 72: the data's first 48 bytes share their line.
static_assert(sizeof(signature) + sizeof(mailbox::pad) == 64 && alignof(std::atomic<std::uint64_t>) == 8 &&
              sizeof(mailbox) == 128);

struct alignas(64) rank_ctrl {
  std::atomic<std::uint64_t> stage;  // chunk progress: chunk g is 3g+1 copied in, 3g+2 reduced, 3g+3 done
  // Chunks finished (g+1 once chunk g is done with): what a rank waits for before it writes
  // into a staging buffer again. Separate from `stage` because the two-shot allreduce copies
  // chunk g+1 in before it gathers chunk g (its stage runs ahead of what it has finished).
  std::atomic<std::uint64_t> done;
  char pad1[48];
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> ready;
  std::atomic<std::uint64_t> pid_ns;  // inode of the rank's pid namespace
  std::atomic<std::int32_t> world_rank;  // the rank's place in the whole job (config identity), for messages
  // While the rank is inside a call of another communicator (the hierarchical allreduce's
  // inter-node step, `state::enter_outside`): `outside_gen` is odd, `outside_ms` is how long
  // that call may still take to fail (its deadline + report grace), `outside_what` says which
  // call and whom it waits for ("gloo allreduce #12 (rail 0) for job rank 2"). A peer whose
  // wait for this rank times out waits that much longer once (the inner error then arrives by
  // abort) and names the chain. Written what-first, published by the generation (release).
  alignas(64) std::atomic<std::uint32_t> outside_gen;
  std::atomic<std::uint32_t> outside_ms;
  std::atomic<std::uint64_t> outside_what[15];  // NUL-padded text, read word by word
};
static_assert(sizeof(rank_ctrl) == 256);

struct alignas(64) header {
  std::uint64_t magic;
  std::uint32_t nranks;
  std::uint32_t version;
  std::uint64_t small_bytes, staging_bytes, pool_bytes;
  std::uint64_t region_stride;     // bytes from one rank's region to the next (config::region_align_bytes)
  std::uint64_t claim_from_bytes;  // the direct allreduce's claimed blocks: from this size,
  std::uint32_t claims;            // when 1 (every rank must agree: state.hpp)
  std::uint32_t huge;              // regions aligned for 2 MiB pages (config::huge_pages, resolved)
  std::atomic<std::uint32_t> ready;
  std::atomic<std::uint32_t> abort_claim;  // taken by the first rank to abort
  std::atomic<std::uint32_t> aborted;      // published after the reason and rank are written
  std::atomic<std::int32_t> abort_rank;
  char abort_reason[512];
  // Waking sleepers: a waiter past its spins counts itself in `sleepers` and futex-waits on
  // `wake`; a rank that publishes progress bumps `wake` and wakes them when there are any.
  alignas(64) std::atomic<std::uint32_t> sleepers;
  std::atomic<std::uint32_t> wake;
  // The direct zero-copy allreduce's block counter when ranks share CPUs: it only grows, and
  // every rank knows where each call's claims start (shm/allreduce.hpp).
  alignas(64) std::atomic<std::uint64_t> direct_next;
};

constexpr std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace detail

}  // namespace shm
KFT_NAMESPACE_END
