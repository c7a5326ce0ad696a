// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/shm/state.hpp
/// @brief One shared-memory communicator's state and its synchronisation protocol: set-up of
/// the segment, the call protocol (number, publish the signature, arrive, compare), waits with
/// deadlines that also watch the abort flag and the peers' processes, and abort.
///
/// Every wait spins briefly, then yields, then sleeps (more ranks than cores must not
/// livelock), has a deadline that starts once a wait turns slow (reading the clock costs as
/// much as a fast call's synchronisation), checks the group's abort flag and whether the
/// ranks it waits for are still alive (pid + zombie check, in the same pid namespace). The
/// first synchronisation of every call compares every rank's signature (collective, dtype,
/// count, op, root, algorithm, tag, sequence number): different calls are a `mismatch_error`
/// naming both sides, not a hang or garbage.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/backoff.hpp>
#include <kft/core/flight_recorder.hpp>
#include <kft/core/futex.hpp>
#include <kft/core/collective.hpp>
#include <kft/core/deadline.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/checks.hpp>
#include <kft/transport/shm/config.hpp>
#include <kft/transport/shm/layout.hpp>
#include <kft/transport/shm/segment.hpp>
#include <kft/transport/shm/tuning.hpp>

KFT_NAMESPACE_BEGIN
namespace shm::detail {

struct state {
  config cfg;
  int me = 0, p = 1;
  segment seg;
  detail::header* hdr = nullptr;
  detail::rank_ctrl* ctrl = nullptr;
  unsigned char* regions = nullptr;
  std::size_t region_bytes = 0, region_stride = 0, small_off = 0, slot_bytes = 0, staging_off = 0, pool_off = 0;
  std::vector<const void*> srcs;      // reduction sources, sized once: no allocation per call
  std::vector<void*> dsts;             // the direct allreduce's outputs (p > 2, streamed), sized once
  // The direct zero-copy allreduce in place (p > 2) reduces and copies this much at a time.
  static constexpr std::size_t direct_block_bytes = 32u << 10;
  // With more ranks than CPUs the direct allreduce's blocks are claimed from a shared counter
  // (header::direct_next), at most this many bytes at a time; this call's claims start at direct_base.
  static constexpr std::size_t direct_claim_bytes = 256u << 10;
  std::uint64_t direct_base = 0;
  std::vector<std::uint64_t> peer_off;  // allgather: each rank's zero-copy input offset
  bool oversubscribed = false;    // more local ranks than online CPUs
  bool claims = false;            // the direct allreduce claims blocks (config::claim_blocks, resolved)
  bool huge = false;              // regions aligned for 2 MiB pages (config::huge_pages, resolved)
  std::size_t huge_bytes = 0;     // bytes of my region in 2 MiB pages
  std::string huge_note;          // why not all of it, when huge and the kernel refused
  std::uint64_t seq = 0;    // calls made
  // The blocking call's flight-recorder note (communicator::note_arrivals), written once this
  // rank's arrival is out (arrive_and_check); null for asynchronous calls and when none records.
  trace::arrival_note* note = nullptr;
  std::uint64_t chunk = 0;  // staging chunks used (alternating buffers)
  std::size_t pool_used = 0;
  // Bytes an allreduce copied between the caller's buffers and staging memory (copy-in, and
  // copy-out of what was reduced aside): zero for buffers in the pool above small_bytes.
  std::atomic<std::uint64_t> staged{0};
  std::atomic<std::uint64_t> claimed{0};  // blocks of direct allreduces this rank claimed
  kft::detail::failure_latch stop;  // the first failure; later calls are refused with it
  std::mutex alloc_mu;

  // -- set-up ---------------------------------------------------------------------------------

  void init(rendezvous::store& store, int rank, int size, config c) {
    cfg = std::move(c);
    me = rank;
    p = size;
    cfg.small_bytes = detail::round_up(std::max<std::size_t>(cfg.small_bytes, 64), 64);
    cfg.staging_bytes = detail::round_up(std::max<std::size_t>(cfg.staging_bytes, 4096), 4096);
    cfg.pool_bytes = detail::round_up(cfg.pool_bytes, 4096);
    const std::size_t page = 4096;
    if (cfg.huge_pages < -1 || cfg.huge_pages > 1)
      throw usage_error("shm config: huge_pages must be -1 (from huge_pages_from_bytes of pool), 0 (never) or 1 "
                        "(always), not " + std::to_string(cfg.huge_pages),
                        site("shm init", 0));
    huge = cfg.huge_pages == 1 || (cfg.huge_pages == -1 && cfg.pool_bytes > 0 && cfg.pool_bytes >= cfg.huge_pages_from_bytes);
    // With huge pages every rank's region starts and ends on a 2 MiB boundary (of the file and,
    // the segment being mapped at one, of every process's addresses), so that its 2 MiB pages
    // hold its own memory only.
    const std::size_t align = huge ? segment::huge_page_bytes : page;
    const std::size_t ctrl_off = detail::round_up(sizeof(detail::header), 64);
    const std::size_t regions_off = detail::round_up(ctrl_off + sizeof(detail::rank_ctrl) * static_cast<std::size_t>(p), align);
    small_off = 0;
    slot_bytes = detail::round_up(detail::mailbox_data_offset + cfg.small_bytes, 64);
    staging_off = detail::round_up(2 * slot_bytes, page);
    pool_off = staging_off + 2 * cfg.staging_bytes;
    region_bytes = detail::round_up(pool_off + cfg.pool_bytes, align);
    const std::size_t stride_align = cfg.region_align_bytes ? cfg.region_align_bytes : (huge ? 8u << 20 : page);
    if (stride_align % align != 0 || stride_align > (std::size_t{1} << 30))
      throw usage_error("shm config: region_align_bytes (KFT_SHM_REGION_ALIGN) must be a multiple of the regions' " +
                            std::string(huge ? "2 MiB" : "4 KiB") + " pages, at most 1 GiB, not " +
                            std::to_string(stride_align),
                        site("shm init", 0));
    region_stride = detail::round_up(region_bytes, stride_align);
    // The last region needs no gap after it.
    const std::size_t total = regions_off + region_stride * static_cast<std::size_t>(p - 1) + region_bytes;

    // One segment per communicator instance: ranks that build several get matching keys.
    // A shrunk group (group/shrink.hpp) meets under its generation: its ranks are renumbered.
    const std::string scope = "shm/" + cfg.name + (cfg.generation ? "/g" + std::to_string(cfg.generation) : "") + "/";
    const auto instance = store.add(scope + "instances/" + std::to_string(me), 1);
    const std::string key = scope + std::to_string(instance) + "/segment";
    seg = segment(store, key, me, p, total, cfg.name, cfg.timeout);
    hdr = reinterpret_cast<detail::header*>(seg.data());
    ctrl = reinterpret_cast<detail::rank_ctrl*>(seg.data() + ctrl_off);
    regions = seg.data() + regions_off;
    srcs.resize(static_cast<std::size_t>(p));
    dsts.resize(static_cast<std::size_t>(p));
    peer_off.resize(static_cast<std::size_t>(p));
    oversubscribed = p > static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    if (cfg.claim_blocks < -1 || cfg.claim_blocks > 1)
      throw usage_error("shm config: claim_blocks must be -1 (when the ranks outnumber the CPUs), 0 (never) or 1 "
                        "(always), not " + std::to_string(cfg.claim_blocks),
                        site("shm init", 0));
    claims = cfg.claim_blocks == 1 || (cfg.claim_blocks == -1 && oversubscribed);

    if (me == 0) {  // the segment is zero-filled; atomics at zero are valid
      hdr->nranks = static_cast<std::uint32_t>(p);
      hdr->version = detail::layout_version;
      hdr->small_bytes = cfg.small_bytes;
      hdr->staging_bytes = cfg.staging_bytes;
      hdr->pool_bytes = cfg.pool_bytes;
      hdr->region_stride = region_stride;
      hdr->claim_from_bytes = cfg.claim_from_bytes;
      hdr->claims = claims ? 1u : 0u;
      hdr->huge = huge ? 1u : 0u;
      hdr->abort_rank.store(-1);
      // The release store publishes every write above to a reader that acquires the magic.
      reinterpret_cast<std::atomic<std::uint64_t>*>(&hdr->magic)->store(detail::segment_magic, std::memory_order_release);
    } else {
      auto* magic = reinterpret_cast<std::atomic<std::uint64_t>*>(&hdr->magic);
      if (!poll_until([&] { return magic->load(std::memory_order_acquire) == detail::segment_magic; },
                      deadline::after(cfg.timeout)))
        throw timeout_error("shared segment " + seg.name() + " was never initialised by local rank 0",
                            site("shm init", 0));
      if (hdr->version != detail::layout_version)
        throw usage_error("local rank 0 runs another kft build (shared segment layout " + std::to_string(hdr->version) +
                              ", this build's " + std::to_string(detail::layout_version) +
                              "): every rank of a node must run the same kft",
                          site("shm init", 0));
      if (hdr->nranks != static_cast<std::uint32_t>(p) || hdr->small_bytes != cfg.small_bytes ||
          hdr->staging_bytes != cfg.staging_bytes || hdr->pool_bytes != cfg.pool_bytes ||
          hdr->region_stride != region_stride ||
          hdr->claim_from_bytes != cfg.claim_from_bytes || hdr->claims != (claims ? 1u : 0u) ||
          hdr->huge != (huge ? 1u : 0u))
        throw usage_error("local ranks disagree on the shm communicator's configuration (size " +
                              std::to_string(hdr->nranks) + " vs " + std::to_string(p) +
                              ", or buffer sizes, or claim_blocks / claim_from_bytes, or huge_pages, or region_align_bytes)",
                          site("shm init", 0));
    }
    // My own region in 2 MiB pages, taken from my own process (NUMA placement); then its first
    // touch from here (with 2 MiB pages one fault per 2 MiB), then mark ready.
    if (huge) huge_bytes = seg.back_with_huge_pages(regions_off + region_stride * static_cast<std::size_t>(me),
                                                    region_bytes, huge_note, site("shm init", 0));
    std::memset(region(me), 0, region_bytes);
    ctrl[me].pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
    ctrl[me].pid_ns.store(pid_namespace(), std::memory_order_relaxed);
    ctrl[me].world_rank.store(cfg.identity.world_rank >= 0 ? cfg.identity.world_rank : me, std::memory_order_relaxed);
    ctrl[me].outside_gen.store(0, std::memory_order_relaxed);
    ctrl[me].ready.store(1, std::memory_order_release);
    notify();
    std::chrono::steady_clock::time_point init_deadline{};
    wait_peers([&](int r) { return ctrl[r].ready.load(std::memory_order_acquire); }, 1, "set-up", nullptr,
               init_deadline, cfg.timeout);
    // Pre-fault my page tables for every peer's region: no page fault inside a collective.
    for (int r = 0; r < p; ++r) {
      volatile unsigned char* b = region(r);
      for (std::size_t off = 0; off < region_bytes; off += page) (void)b[off];
    }
  }

  unsigned char* region(int r) const { return regions + region_stride * static_cast<std::size_t>(r); }
  detail::mailbox& box(int r, std::uint64_t parity) const {
    return *reinterpret_cast<detail::mailbox*>(region(r) + small_off + (parity & 1) * slot_bytes);
  }
  // The one-shot data area of rank r's mailbox for a call of this parity.
  unsigned char* small(int r, std::uint64_t parity) const {
    return reinterpret_cast<unsigned char*>(&box(r, parity)) + detail::mailbox_data_offset;
  }
  std::uint64_t arrived(int r) const {
    return std::max(box(r, 0).seq.load(std::memory_order_relaxed), box(r, 1).seq.load(std::memory_order_relaxed));
  }
  unsigned char* staging(int r, std::uint64_t parity) const {
    return region(r) + staging_off + (parity & 1) * cfg.staging_bytes;
  }
  unsigned char* pool(int r) const { return region(r) + pool_off; }

  // Offset of [ptr, ptr+bytes) in my pool, or no_offset.
  std::uint64_t pool_offset(const void* ptr, std::size_t bytes) const {
    auto* b = static_cast<const unsigned char*>(ptr);
    if (cfg.pool_bytes == 0 || b < pool(me) || b + bytes > pool(me) + cfg.pool_bytes) return detail::no_offset;
    return static_cast<std::uint64_t>(b - pool(me));
  }

  void* allocate(std::size_t bytes) {
    std::lock_guard lock(alloc_mu);
    const std::size_t off = detail::round_up(pool_used, 64);
    if (off + bytes > cfg.pool_bytes)
      throw usage_error("shm pool exhausted: " + std::to_string(bytes) + " bytes asked, " +
                            std::to_string(cfg.pool_bytes - std::min(off, cfg.pool_bytes)) +
                            " left of config::pool_bytes = " + std::to_string(cfg.pool_bytes),
                        site("shm allocate", seq));
    pool_used = off + bytes;
    return pool(me) + off;
  }

  // -- errors, abort, liveness ---------------------------------------------------------------

  // A peer in messages: its index here and, when this node is part of a larger job, its rank
  // there ("rank 0 (job rank 2)").
  std::string job_rank(int r) const {
    if (cfg.identity.world_size < 0 || cfg.identity.world_size == p) return {};
    return " (job rank " + std::to_string(ctrl[r].world_rank.load(std::memory_order_relaxed)) + ")";
  }
  std::string who(int r) const { return "rank " + std::to_string(r) + job_rank(r); }

  error_site site(const std::string& op, std::uint64_t sequence) const {
    return error_site::in(cfg.identity, me, p, op, sequence);
  }
  // The same, naming the ranks (communicator ranks, given as job ranks) this rank waited for or
  // that failed its call: the flight recorder's dump keeps them (kft-trace follows them).
  error_site site(const std::string& op, std::uint64_t sequence, const std::vector<int>& peers) const {
    auto s = site(op, sequence);
    for (int r : peers)
      if (r >= 0) s.waiting_for.push_back(job_rank_of(r));
    return s;
  }
  int job_rank_of(int r) const {
    if (r < 0 || r >= p || cfg.identity.world_size < 0 || cfg.identity.world_size == p) return r;
    return ctrl[r].world_rank.load(std::memory_order_relaxed);
  }

  static bool valid(const detail::signature& g) { return g.coll < 5 && g.type < 7 && g.op < 5 && g.algorithm < 3; }

  static std::string describe(const detail::signature& g) {
    if (!valid(g))
      return "#" + std::to_string(g.seq) + " <unreadable signature: collective " + std::to_string(g.coll) +
             ", dtype " + std::to_string(g.type) + ", op " + std::to_string(g.op) + ">";
    const auto c = static_cast<collective>(g.coll);
    std::string s = "#" + std::to_string(g.seq) + " " + std::string(name(c));
    if (c == collective::barrier) return s;
    s += " " + std::string(name(static_cast<dtype>(g.type))) + " x " + std::to_string(g.count);
    if (c == collective::allreduce || c == collective::reduce_scatter)
      s += " (" + std::string(name(static_cast<op_kind>(g.op))) + ")";
    if (c == collective::broadcast) s += " (root " + std::to_string(g.root) + ")";
    s += " [" + std::string(name(static_cast<algo>(g.algorithm))) + "]";
    if (g.in_off != detail::no_offset) s += " zero-copy in@" + std::to_string(g.in_off);
    if (g.out_off != detail::no_offset) s += " zero-copy out@" + std::to_string(g.out_off);
    if (g.tag) s += " tag " + std::to_string(g.tag);
    return s;
  }

  // "(f32 x 1048576, avg, two_shot)": a call's arguments, after the "allreduce #41" prefix.
  static std::string describe_args(const detail::signature& g) {
    if (!valid(g)) return "";
    const auto c = static_cast<collective>(g.coll);
    if (c == collective::barrier) return "";
    std::string s = "(" + std::string(name(static_cast<dtype>(g.type))) + " x " + std::to_string(g.count);
    if (c == collective::allreduce || c == collective::reduce_scatter) s += ", " + std::string(name(static_cast<op_kind>(g.op)));
    if (c == collective::broadcast) s += ", root " + std::to_string(g.root);
    return s + ", " + std::string(name(static_cast<algo>(g.algorithm))) + ") ";
  }

  void abort(std::string_view why) noexcept {
    if (hdr == nullptr) return;
    const std::string reason(why);
    // Claim first, fill in the reason, then publish: a reader that sees `aborted` sees both.
    std::uint32_t expected = 0;
    if (hdr->abort_claim.compare_exchange_strong(expected, 1)) {
      std::snprintf(hdr->abort_reason, sizeof hdr->abort_reason, "%s", reason.c_str());
      hdr->abort_rank.store(me, std::memory_order_relaxed);
      hdr->aborted.store(1, std::memory_order_release);
      notify();
    }
    stop.set(reason);
  }

  // Fails this call: remember, tell the others, throw.
  template <class E>
  [[noreturn]] void fail(E err) {
    abort(err.what());
    throw err;
  }

  // Rank r's process state letter from /proc (R, S, D, T, t, Z, X ...), 0 when unknown: not
  // in our pid namespace (containers of one pod share /dev/shm but not pids), this process
  // (ranks as threads share a pid), or gone.
  char process_state(int r) const {
    const auto pid = ctrl[r].pid.load(std::memory_order_relaxed);
    if (pid <= 0 || pid == ::getpid()) return 0;
    if (ctrl[r].pid_ns.load(std::memory_order_relaxed) != ctrl[me].pid_ns.load(std::memory_order_relaxed)) return 0;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (FILE* f = std::fopen(path, "r")) {
      char buf[512] = {};
      const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      const char* close_paren = std::strrchr(buf, ')');
      if (n > 0 && close_paren != nullptr && close_paren[1] == ' ') return close_paren[2];
    }
    return 0;
  }

  // Whether rank r's process still runs. Only meaningful for a peer in our pid namespace; a
  // zombie counts as dead.
  bool alive(int r) const {
    const auto pid = ctrl[r].pid.load(std::memory_order_relaxed);
    if (pid <= 0 || pid == ::getpid()) return true;  // ranks as threads share a pid
    if (ctrl[r].pid_ns.load(std::memory_order_relaxed) != ctrl[me].pid_ns.load(std::memory_order_relaxed)) return true;
    if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
    const char st = process_state(r);
    return st != 'Z' && st != 'X';
  }

  // Whether rank r's process is stopped (SIGSTOP, SIGTSTP, a debugger): it finishes nothing,
  // whatever call it is in, until it is continued.
  bool stopped(int r) const {
    const char st = process_state(r);
    return st == 'T' || st == 't';
  }

  // -- a rank inside another communicator's call ----------------------------------------------

  // This rank enters a call of another communicator (the hierarchical allreduce's inter-node
  // step) that fails by itself within `bound`; `what` names it and whom it waits for. Until
  // leave_outside(), a peer whose wait for this rank times out waits `bound` longer once (this
  // rank's error then reaches it through abort) and names the chain.
  void enter_outside(std::string_view what, std::chrono::milliseconds bound) noexcept {
    auto& c = ctrl[me];
    // A seqlock's writer, without fences (which ThreadSanitizer does not model): each word is a
    // release store, so a reader whose acquire load sees a word of this call's text also sees
    // the last leave's even generation, and its recheck of the generation fails.
    constexpr std::size_t words = sizeof c.outside_what / sizeof c.outside_what[0];
    char text[words * 8] = {};
    std::memcpy(text, what.data(), std::min(what.size(), sizeof text - 1));
    for (std::size_t i = 0; i < words; ++i) {
      std::uint64_t w;
      std::memcpy(&w, text + 8 * i, 8);
      c.outside_what[i].store(w, std::memory_order_release);
    }
    const auto ms = std::clamp<std::chrono::milliseconds::rep>(bound.count(), 1, 0xffffffffLL);
    c.outside_ms.store(static_cast<std::uint32_t>(ms), std::memory_order_release);
    c.outside_gen.fetch_add(1, std::memory_order_release);  // odd: inside
  }
  void leave_outside() noexcept {
    if (ctrl[me].outside_gen.load(std::memory_order_relaxed) & 1u)
      ctrl[me].outside_gen.fetch_add(1, std::memory_order_release);  // even: back
  }
  // The most a wait gives a peer inside another communicator's call beyond the wait's own
  // timeout (communicator::expect_outside; 0: never, the default). Set before the first call.
  std::chrono::milliseconds outside_most{0};

  struct outside_note {
    std::string what;
    std::chrono::milliseconds bound{0};
  };
  // What rank r published about the other communicator's call it is in, if it is in one.
  std::optional<outside_note> outside_of(int r) const {
    const auto& c = ctrl[r];
    const auto g = c.outside_gen.load(std::memory_order_acquire);
    if ((g & 1u) == 0) return std::nullopt;
    constexpr std::size_t words = sizeof c.outside_what / sizeof c.outside_what[0];
    char text[words * 8 + 1] = {};
    for (std::size_t i = 0; i < words; ++i) {
      const std::uint64_t w = c.outside_what[i].load(std::memory_order_acquire);
      std::memcpy(text + 8 * i, &w, 8);
    }
    outside_note n{text, std::chrono::milliseconds(c.outside_ms.load(std::memory_order_acquire))};
    // A word from a later call carries that call's leave (its even generation) with it.
    if (c.outside_gen.load(std::memory_order_acquire) != g) return std::nullopt;  // it moved on meanwhile
    return n;
  }

  static std::uint64_t pid_namespace() {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  }

  // Waits until value_of(r) >= target for every rank r != me.
  template <class ValueOf>
  void wait_peers(ValueOf value_of, std::uint64_t target, const char* phase, const detail::signature* current,
                  std::chrono::steady_clock::time_point& deadline, std::chrono::milliseconds timeout) {
    backoff b = oversubscribed ? backoff::oversubscribed(std::chrono::microseconds(500))
                               : backoff(std::chrono::microseconds(500));
    auto next_liveness = std::chrono::steady_clock::time_point::max();
    std::chrono::milliseconds extended{0};  // granted once: the ranks waited for were inside other calls
    trace::waiting_now waits;  // (a dump meanwhile says whom this slow wait waits for)
    auto next_note = std::chrono::steady_clock::time_point{};
    for (std::uint32_t spin = 0;; ++spin) {
      bool all = true;
      for (int r = 0; r < p && all; ++r)
        if (r != me && value_of(r) < target) all = false;
      if (all) return;
      if (hdr->aborted.load(std::memory_order_acquire)) {
        // A peer that stopped the group after it got this far (it arrived, then found the
        // calls differ): its progress is seen first, so the caller's own check names what it
        // found (both ranks of a mismatch throw mismatch_error), and a later wait sees the stop.
        bool now = true;
        for (int r = 0; r < p && now; ++r)
          if (r != me && value_of(r) < target) now = false;
        if (now) return;
        const int by = hdr->abort_rank.load(std::memory_order_acquire);
        stop.set(who(by) + " stopped the group");
        throw remote_error(who(by) + " stopped the group: " + std::string(hdr->abort_reason),
                           site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                current ? current->seq : 0, {by}));
      }
      if (b.sleeps_next()) {  // sleep until a peer publishes (or the sleep's bound)
        hdr->sleepers.fetch_add(1, std::memory_order_seq_cst);
        const std::uint32_t seen = hdr->wake.load(std::memory_order_seq_cst);
        bool now = true;
        for (int r = 0; r < p && now; ++r)
          if (r != me && value_of(r) < target) now = false;
        if (!now && !hdr->aborted.load(std::memory_order_acquire)) futex_wait(hdr->wake, seen, b.sleep_time());
        hdr->sleepers.fetch_sub(1, std::memory_order_relaxed);
        b.slept();
      } else {
        b.pause();
      }
      if ((spin & 63) != 63) continue;
      const auto now = std::chrono::steady_clock::now();
      // The call's deadline is set by its first slow poll; liveness is looked at by every wait
      // of the call, including waits of later phases that start with the deadline already set.
      if (deadline == std::chrono::steady_clock::time_point{}) deadline = now + timeout;
      // A wait of 10 ms and more notes whom it waits for (no allocation: a fixed array), again
      // every 100 ms; a dump meanwhile shows it.
      if (next_note == std::chrono::steady_clock::time_point{}) next_note = now + 10ms;
      if (now >= next_note) {
        next_note = now + 100ms;
        std::array<int, 64> missing{};
        int n = 0;
        for (int r = 0; r < p && n < static_cast<int>(missing.size()); ++r)
          if (r != me && value_of(r) < target) missing[static_cast<std::size_t>(n++)] = job_rank_of(r);
        waits.set(missing.data(), n);
      }
      if (next_liveness == std::chrono::steady_clock::time_point::max()) next_liveness = now + 50ms;
      if (now >= next_liveness) {
        next_liveness = now + 100ms;
        for (int r = 0; r < p; ++r)
          if (r != me && value_of(r) < target && !alive(r))
            fail(remote_error(who(r) + " (pid " + std::to_string(ctrl[r].pid.load()) +
                                  ") died" + (current ? " during " + describe(*current) : std::string(" during set-up")) +
                                  ": its process is gone",
                              site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                   current ? current->seq : 0, {r})));
      }
      if (now >= deadline) {
        // A rank waited for that is itself inside another communicator's call (the inter-node
        // step of a hierarchical allreduce) is the middle of a chain: that call fails by its own
        // deadline and aborts this group with an error naming the rank it waited for. Wait that
        // long once, so that error, not this wait's, reaches this rank.
        std::string missing;
        std::vector<int> waited;
        std::chrono::milliseconds more{0};
        bool all_outside = true;
        for (int r = 0; r < p; ++r) {
          if (r == me || value_of(r) >= target) continue;
          waited.push_back(r);
          // A stopped process ends no call by itself: it is the end of the chain.
          const bool halted = stopped(r);
          const auto out = halted ? std::nullopt : outside_of(r);
          if (out) more = std::max(more, out->bound);
          else all_outside = false;
          missing += (missing.empty() ? "" : ", ") + std::to_string(r) + job_rank(r) + " (at #" +
                     std::to_string(arrived(r)) +
                     (halted ? ", its process is stopped"
                             : out ? ", itself waiting in " + out->what : std::string()) + ")";
        }
        more = std::min(more, outside_most);
        if (all_outside && more.count() > 0 && extended.count() == 0) {
          extended = more;
          deadline = now + more;
          continue;
        }
        fail(timeout_error((current ? describe_args(*current) : std::string()) + "timed out after " +
                               kft::detail::describe_duration(timeout) +
                               (extended.count() ? " + " + kft::detail::describe_duration(extended) +
                                                       " (the inner call's deadline)"
                                                 : std::string()) +
                               " in " + phase + " waiting for rank(s) " + missing,
                           site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                current ? current->seq : 0, waited)));
      }
    }
  }

  // -- one call ------------------------------------------------------------------------------

  struct call {
    detail::signature sig;
    std::uint64_t hash = 0;  // detail::signature_hash(sig), as published in the mailbox
    mutable std::chrono::steady_clock::time_point deadline{};  // unset until a wait is slow
    std::chrono::milliseconds timeout;
  };

  call begin(collective c, dtype t, op_kind op, std::size_t count, int root, algo a, const options& o,
             std::uint64_t in_off, std::uint64_t out_off) {
    if (stop.stopped()) stop.check(site(std::string(name(c)), seq));  // (the site only on the failure path)
    if (hdr->aborted.load(std::memory_order_acquire)) {
      stop.set(hdr->abort_reason);
      throw remote_error(who(hdr->abort_rank.load()) + " stopped the group: " + std::string(hdr->abort_reason),
                         site(std::string(name(c)), seq, {hdr->abort_rank.load()}));
    }
    call k;
    k.sig.seq = seq;  // numbered by the communicator when the call was issued
    k.sig.count = count;
    k.sig.in_off = in_off;
    k.sig.out_off = out_off;
    k.sig.root = root;
    k.sig.tag = o.tag;
    k.sig.coll = static_cast<std::uint8_t>(c);
    k.sig.type = static_cast<std::uint8_t>(t);
    k.sig.op = static_cast<std::uint8_t>(op);
    k.sig.algorithm = static_cast<std::uint8_t>(a);
    k.timeout = timeout_or(o, cfg.timeout);
    // The deadline is set by the first wait of the call that does not complete at once
    // (reading the clock costs as much as a fast one-shot call's synchronisation).
    auto& b = box(me, k.sig.seq);
    // The full signature's line, less the sequence number (the arrival flag holds it), is
    // rewritten only when the call's shape changes: repeated calls leave it shared with the
    // peers whose prefetchers pulled it in beside the flag's line, instead of taking it back.
    detail::signature shape = k.sig;
    shape.seq = 0;
    if (!(b.sig == shape)) b.sig = shape;
    b.sig_hash = k.hash = detail::signature_hash(k.sig);
    return k;
  }

  // Publishes arrival (after any data written before it), waits for everyone's, and compares
  // signatures: the first synchronisation of every call.
  void arrive_and_check(const call& k) {
    box(me, k.sig.seq).seq.store(k.sig.seq, std::memory_order_release);
    notify();
    // The call's flight-recorder entry, while the peers' flags are on their way. (Written
    // between the flag and notify's fence instead, it measured worse: +13-16% in half the runs.)
    if (note) [[unlikely]]  // (the recorder's path out of the way of the other)
      note->write(static_cast<collective>(k.sig.coll), static_cast<dtype>(k.sig.type), k.sig.count, k.sig.seq,
                  static_cast<algo>(k.sig.algorithm), k.sig.root);
    wait_peers([&](int r) { return box(r, k.sig.seq).seq.load(std::memory_order_acquire); }, k.sig.seq, "arrival",
               &k.sig, k.deadline, k.timeout);
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      // The hash sits in the line the arrival flag was read from; the full signature (the line
      // before) is read only when they differ, to say how.
      if (box(r, k.sig.seq).sig_hash == k.hash) continue;
      detail::signature theirs = box(r, k.sig.seq).sig;
      theirs.seq = box(r, k.sig.seq).seq.load(std::memory_order_relaxed);
      // A peer refused the call (its own arguments): every rank refuses it, and nothing was
      // exchanged, so the next call pairs up as usual. The peer's own error names the argument.
      if (theirs.refused)
        throw usage_error(who(r) + " refused " + describe(k.sig) + " (its error names the argument at fault); "
                              "no rank ran the call",
                          site(std::string(name(static_cast<collective>(k.sig.coll))), k.sig.seq));
      // An allgather's zero-copy input may sit at a different place on every rank (in place:
      // out + rank * count); each rank reads it from the peer's signature instead.
      if (static_cast<collective>(k.sig.coll) == collective::allgather) theirs.in_off = k.sig.in_off;
      if (!(theirs == k.sig))
        fail(mismatch_error(who(r) + " is at " + describe(theirs) + ", rank " +
                                std::to_string(me) + " at " + describe(k.sig),
                            site(std::string(name(static_cast<collective>(k.sig.coll))), k.sig.seq, {r})));
    }
  }

  // Refuses this rank's call `c` (numbered `seq`) for its own arguments, which only this rank
  // can see (a root's input, buffers that overlap): the refusal takes the place of this rank's
  // arrival, so each peer's arrival check refuses the call too, naming this rank, instead of
  // waiting out the timeout, and the ranks go on with their next call together. Waits until
  // every rank has arrived (nothing of the call is exchanged), then throws `err`.
  [[noreturn]] void refuse(collective c, const usage_error& err) {
    if (p > 1) {
      call k;
      k.sig.seq = seq;
      k.sig.coll = static_cast<std::uint8_t>(c);
      k.sig.refused = 1;
      k.timeout = cfg.timeout;
      auto& b = box(me, seq);
      detail::signature shape = k.sig;
      shape.seq = 0;
      b.sig = shape;
      b.sig_hash = k.hash = detail::signature_hash(k.sig);
      b.seq.store(seq, std::memory_order_release);
      notify();
      wait_peers([&](int r) { return box(r, seq).seq.load(std::memory_order_acquire); }, seq, "arrival", &k.sig,
                 k.deadline, k.timeout);
    }
    throw err;
  }

  void wait_stage(const call& k, std::uint64_t target, const char* phase) {
    wait_peers([&](int r) { return ctrl[r].stage.load(std::memory_order_acquire); }, target, phase, &k.sig,
               k.deadline, k.timeout);
  }
  void wait_stage_of(const call& k, int r, std::uint64_t target, const char* phase) {
    // Only rank r matters (broadcast root); reuse wait_peers with a view that ignores others.
    wait_peers([&](int q) { return q == r ? ctrl[q].stage.load(std::memory_order_acquire) : ~0ULL; }, target, phase,
               &k.sig, k.deadline, k.timeout);
  }
  void set_stage(std::uint64_t v) {
    ctrl[me].stage.store(v, std::memory_order_release);
    notify();
  }
  // Chunk g is finished here: nothing of it will be read or written by this rank again. Its
  // stage moves to 3g+3 unless it already runs ahead (a pipelined copy-in of the next chunk).
  void finish_chunk(std::uint64_t g) {
    if (ctrl[me].stage.load(std::memory_order_relaxed) < 3 * g + 3) ctrl[me].stage.store(3 * g + 3, std::memory_order_release);
    ctrl[me].done.store(g + 1, std::memory_order_release);
    notify();
  }
  // Waits until every peer finished `chunks` chunks (chunk index chunks-1 and all before it).
  void wait_done(const call& k, std::uint64_t chunks, const char* phase) {
    wait_peers([&](int r) { return ctrl[r].done.load(std::memory_order_acquire); }, chunks, phase, &k.sig, k.deadline,
               k.timeout);
  }

  // After publishing progress: wakes the ranks sleeping in wait_peers, if any. The fence pairs
  // with a sleeper's read-modify-write of `sleepers` before its last look at the flags: either
  // we see it counted, or it sees what we published.
  void notify() noexcept {
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer does not model fences: the same order from a read-modify-write, which
    // reads the latest count (slower under contention, so only here).
    if (hdr->sleepers.fetch_add(0, std::memory_order_seq_cst) == 0) return;
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (hdr->sleepers.load(std::memory_order_relaxed) == 0) return;
#endif
    hdr->wake.fetch_add(1, std::memory_order_relaxed);
    futex_wake_all(hdr->wake);
  }

  // Staging chunk g may be written once every rank is done with chunk g-2 (same buffer).
  void claim_chunk(const call& k, std::uint64_t g) {
    if (g >= 2) wait_done(k, g - 1, "staging reuse");
  }

  // Slice r of n elements split p ways (the first n % p slices get one more).
  std::pair<std::size_t, std::size_t> slice(std::size_t n, int r) const {
    const std::size_t q = n / static_cast<std::size_t>(p), rem = n % static_cast<std::size_t>(p);
    const std::size_t ru = static_cast<std::size_t>(r);
    const std::size_t begin = ru * q + std::min(ru, rem);
    return {begin, q + (ru < rem ? 1 : 0)};
  }

  // -- choice ---------------------------------------------------------------------------------

  algo choose(collective c, std::size_t bytes, bool zero_copy) const {
    return choose_algorithm(cfg.crossovers, c, p, oversubscribed, zero_copy, bytes, cfg.small_bytes);
  }

  algo resolve(collective c, std::size_t bytes, const options& o, bool zero_copy = false) {
    if (o.algorithm != algo::automatic && o.algorithm != algo::one_shot && o.algorithm != algo::two_shot)
      refuse(c, usage_error("algorithm " + std::string(name(o.algorithm)) +
                                " is not a shared-memory algorithm (one_shot, two_shot or auto)",
                            site(std::string(name(c)), seq)));
    return o.algorithm == algo::automatic ? choose(c, bytes, zero_copy) : o.algorithm;
  }
};

}  // namespace shm::detail
KFT_NAMESPACE_END
