/// @file kft/transport/shm/communicator.hpp
/// @brief Intra-node collectives over POSIX shared memory: kft's own fast path inside a node.
///
///     auto store = ...;                                   // the job's store, scoped to this node
///     kft::shm::communicator comm(store, local_rank, local_size);
///     comm.allreduce(std::span<const float>(grad), std::span<float>(grad), kft::ops::sum);
///     auto w = comm.allreduce_async(in, out, kft::ops::avg, {.algorithm = kft::algo::two_shot});
///     w.wait();
///
/// Algorithms (docs/algorithms.md has their step and byte costs):
///  - one-shot: every rank copies its input next to an epoch flag, then every rank reduces all
///    inputs itself. One synchronisation per call; double-buffered slots, so no barrier.
///  - two-shot: per cache-sized chunk, copy in, reduce-scatter (each rank reduces its slice of
///    the chunk from all ranks), allgather (each rank copies everyone's reduced slice). Chunks
///    alternate between two staging buffers, so ranks pipeline without barriers.
///  - zero-copy: buffers from `allocate()` live in the segment; collectives on them read peers'
///    data in place and skip the copy-in.
///
/// Every wait spins briefly, then yields, then sleeps (more ranks than cores must not livelock),
/// has a deadline, checks an abort flag and whether the ranks it waits for are still alive.
/// Every call publishes a signature (collective, dtype, count, op, root, algorithm, tag,
/// sequence number) that all ranks compare at their first synchronisation, so ranks that call
/// different collectives get a `mismatch_error` naming both sides instead of a hang or garbage.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <kft/collectives/options.hpp>
#include <kft/collectives/reduce_kernels.hpp>
#include <kft/core/backoff.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/parse.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/work.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/rendezvous/store.hpp>
#include <kft/transport/shm/segment.hpp>

KFT_NAMESPACE_BEGIN
namespace shm {

using namespace std::chrono_literals;

/// @brief Sizes and limits of a communicator, fixed at construction (all ranks must agree).
struct config {
  std::size_t staging_bytes = 256u << 10;  ///< per rank, per half of the double buffer (chunk size; both halves fit L2)
  std::size_t small_bytes = 32u << 10;     ///< per rank, per parity: the one-shot slot
  std::size_t pool_bytes = 0;              ///< room for symmetric zero-copy buffers (`allocate`)
  std::size_t streaming_bytes = 16u << 20;  ///< outputs from this size on bypass the caches
  std::chrono::milliseconds timeout = 300s;  ///< default deadline of every wait
  std::string name = "kft";                  ///< goes into the segment's name (e.g. the run id)
};

/// @brief The collectives, as named in messages and signatures.
enum class collective : std::uint8_t { allreduce, broadcast, reduce_scatter, allgather, barrier };

constexpr std::string_view name(collective c) {
  constexpr std::string_view names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather", "barrier"};
  return names[static_cast<int>(c)];
}

namespace detail {

inline constexpr std::uint64_t segment_magic = 0x316d68732d74666bULL;  // "kft-shm1"
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
  std::uint32_t pad = 0;

  bool operator==(const signature&) const = default;
};

static_assert(sizeof(signature) == 48);

/// The head of a rank's one-shot slot (one per call parity): the arrival flag, the call's
/// signature and the first bytes of data share one cache line, so a tiny collective costs the
/// reader one line per peer.
struct alignas(64) mailbox {
  std::atomic<std::uint64_t> seq;  // the call this mailbox holds; written last (release)
  signature sig;
  // data follows (mailbox_data_offset)
};
inline constexpr std::size_t mailbox_data_offset = 8 + sizeof(signature);

struct alignas(64) rank_ctrl {
  std::atomic<std::uint64_t> stage;  // chunk progress: chunk g is 3g+1 copied in, 3g+2 reduced, 3g+3 done
  char pad1[56];
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> ready;
  std::atomic<std::uint64_t> pid_ns;  // inode of the rank's pid namespace
};

struct alignas(64) header {
  std::uint64_t magic;
  std::uint32_t nranks;
  std::uint32_t version;
  std::uint64_t small_bytes, staging_bytes, pool_bytes;
  std::atomic<std::uint32_t> mapped;  // segment.hpp's counter: the last mapper unlinks
  std::atomic<std::uint32_t> ready;
  std::atomic<std::uint32_t> abort_claim;  // taken by the first rank to abort
  std::atomic<std::uint32_t> aborted;      // published after the reason and rank are written
  std::atomic<std::int32_t> abort_rank;
  char abort_reason[512];
};

constexpr std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace detail

/// @brief A communicator over the ranks of one node, through one shared segment.
///
/// Construction and destruction are the only collective set-up steps; every collective call
/// must be made by all ranks in the same order with matching arguments (checked). Move-only.
class communicator {
 public:
  /// @brief Collective over the `size` local ranks: creates (rank 0) or maps the segment, pre-faults
  /// it and waits for everyone.
  /// @param store reached by all local ranks; keys go under "shm/<cfg.name>/"
  /// @throws timeout_error naming the ranks that did not arrive, transport_error on shm failures
  communicator(std::shared_ptr<rendezvous::store> store, int rank, int size, config cfg = {})
      : s_(std::make_unique<state>()) {
    if (size < 1 || rank < 0 || rank >= size)
      throw usage_error("shm communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " is not a valid place",
                        error_site::of("shm init"));
    if (!store) throw usage_error("shm communicator needs a store", error_site::of("shm init"));
    s_->init(*store, rank, size, std::move(cfg));
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  ~communicator() = default;

  int rank() const noexcept { return s_->me; }
  int size() const noexcept { return s_->p; }
  /// @brief Calls made so far (the next call's sequence number is this + 1).
  std::uint64_t sequence() const noexcept { return s_->seq; }
  const config& settings() const noexcept { return s_->cfg; }

  // ---- runtime-typed collectives (the type-erased boundary) -----------------------------------

  /// @brief out = in reduced over all ranks. `in == out` is in place. `count` elements.
  void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    s_->run_sync([&] { s_->allreduce(in, out, count, t, op, o); });
  }
  /// @brief out = root's in. `in` is read on the root only; in == out is in place.
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o = {}) {
    s_->run_sync([&] { s_->broadcast(in, out, count, t, root, o); });
  }
  /// @brief out (recv_count) = slice `rank` of in (recv_count * size) reduced over all ranks.
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op, const options& o = {}) {
    s_->run_sync([&] { s_->reduce_scatter(in, out, recv_count, t, op, o); });
  }
  /// @brief out (send_count * size) = every rank's in (send_count), in rank order.
  void allgather(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    s_->run_sync([&] { s_->allgather(in, out, send_count, t, o); });
  }
  /// @brief Returns once every rank has called it.
  void barrier(const options& o = {}) {
    s_->run_sync([&] { s_->barrier(o); });
  }

  // ---- typed collectives --------------------------------------------------------------------

  template <class T, reduction Op>
  void allreduce(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    check_same_size(in.size(), out.size(), "allreduce");
    allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op>
  void allreduce(std::span<T> inout, Op op, const options& o = {}) {
    allreduce(std::span<const T>(inout), inout, op, o);
  }
  template <class T>
  void broadcast(std::span<T> inout, int root, const options& o = {}) {
    broadcast(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
  }
  template <class T>
  void broadcast(std::span<const T> in, std::span<T> out, int root, const options& o = {}) {
    check_same_size(in.size(), out.size(), "broadcast");
    broadcast(in.data(), out.data(), out.size(), dtype_of_v<T>, root, o);
  }
  template <class T, reduction Op>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    check_same_size(in.size(), out.size() * static_cast<std::size_t>(size()), "reduce_scatter (in = out x size)");
    reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out, const options& o = {}) {
    check_same_size(in.size() * static_cast<std::size_t>(size()), out.size(), "allgather (out = in x size)");
    allgather(in.data(), out.data(), in.size(), dtype_of_v<T>, o);
  }

  // ---- asynchronous variants: run in order on the communicator's progress thread -------------
  // The caller keeps the buffers alive and untouched until the work is done.

  work allreduce_async(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o = {}) {
    return s_->submit([s = s_.get(), in, out, count, t, op, o] { s->allreduce(in, out, count, t, op, o); });
  }
  work reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t, op_kind op,
                            const options& o = {}) {
    return s_->submit([s = s_.get(), in, out, recv_count, t, op, o] { s->reduce_scatter(in, out, recv_count, t, op, o); });
  }
  work allgather_async(const void* in, void* out, std::size_t send_count, dtype t, const options& o = {}) {
    return s_->submit([s = s_.get(), in, out, send_count, t, o] { s->allgather(in, out, send_count, t, o); });
  }

  template <class T, reduction Op>
  work allreduce_async(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    check_same_size(in.size(), out.size(), "allreduce");
    return s_->submit([s = s_.get(), in, out, o] {
      s->allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
    });
  }
  template <class T>
  work broadcast_async(std::span<T> inout, int root, const options& o = {}) {
    return s_->submit([s = s_.get(), inout, root, o] {
      s->broadcast(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
    });
  }
  template <class T, reduction Op>
  work reduce_scatter_async(std::span<const T> in, std::span<T> out, Op, const options& o = {}) {
    check_same_size(in.size(), out.size() * static_cast<std::size_t>(size()), "reduce_scatter (in = out x size)");
    return s_->submit([s = s_.get(), in, out, o] {
      s->reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
    });
  }
  template <class T>
  work allgather_async(std::span<const T> in, std::span<T> out, const options& o = {}) {
    check_same_size(in.size() * static_cast<std::size_t>(size()), out.size(), "allgather (out = in x size)");
    return s_->submit([s = s_.get(), in, out, o] { s->allgather(in.data(), out.data(), in.size(), dtype_of_v<T>, o); });
  }

  // ---- zero-copy buffers --------------------------------------------------------------------

  /// @brief A buffer inside the shared segment (collective: every rank makes the same sequence
  /// of allocations, so buffers sit at the same offset in every rank's region). Collectives on
  /// such buffers read the peers' data in place: no copy-in. Lives as long as the communicator.
  /// @throws usage_error when the pool (config::pool_bytes) is exhausted
  void* allocate_bytes(std::size_t bytes) { return s_->allocate(bytes); }
  template <class T>
  std::span<T> allocate(std::size_t count) {
    return {static_cast<T*>(allocate_bytes(count * sizeof(T))), count};
  }

  /// @brief What algo::automatic runs for this collective and message size; `zero_copy` says
  /// the input is a buffer from `allocate()` (no copy-in, which moves the crossovers).
  algo choose(collective c, std::size_t bytes, bool zero_copy = false) const { return s_->choose(c, bytes, zero_copy); }
  algo choose(std::string_view c, std::size_t bytes, bool zero_copy = false) const {
    for (int i = 0; i < 5; ++i)
      if (name(static_cast<collective>(i)) == c) return choose(static_cast<collective>(i), bytes, zero_copy);
    throw usage_error("no collective named \"" + std::string(c) + "\"", error_site::of("shm choose"));
  }

  /// @brief Stops the group: every rank's current or next wait fails with a remote_error that
  /// carries `reason`. For the failure path; the communicator cannot be used afterwards.
  void abort(const std::string& reason) noexcept { s_->abort(reason); }

 private:
  static void check_same_size(std::size_t a, std::size_t b, const char* what) {
    if (a != b)
      throw usage_error(std::string(what) + ": buffer sizes do not match (" + std::to_string(a) + " vs " +
                            std::to_string(b) + " elements)",
                        error_site::of(what));
  }

  struct state {
    config cfg;
    int me = 0, p = 1;
    segment seg;
    detail::header* hdr = nullptr;
    detail::rank_ctrl* ctrl = nullptr;
    unsigned char* regions = nullptr;
    std::size_t region_bytes = 0, small_off = 0, slot_bytes = 0, staging_off = 0, pool_off = 0;
    std::vector<const void*> srcs;      // reduction sources, sized once: no allocation per call
    std::vector<std::uint64_t> peer_off;  // allgather: each rank's zero-copy input offset
    bool oversubscribed = false;    // more local ranks than online CPUs
    std::uint64_t seq = 0;    // calls made
    std::uint64_t chunk = 0;  // staging chunks used (alternating buffers)
    std::size_t pool_used = 0;
    bool broken = false;
    std::string broken_reason;

    // progress thread for the async calls
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::packaged_task<void()>> queue;
    bool busy = false, stopping = false;
    std::atomic<int> pending{0};  // async calls queued or running
    std::thread worker;

    ~state() {
      {
        std::lock_guard lock(mu);
        stopping = true;
      }
      cv.notify_all();
      if (worker.joinable()) worker.join();
    }

    // -- set-up ---------------------------------------------------------------------------------

    void init(rendezvous::store& store, int rank, int size, config c) {
      cfg = std::move(c);
      // Like NCCL_BUFFSIZE: the environment can resize buffers without recompiling (all ranks
      // must see the same values; the segment header check catches disagreement).
      const auto env = environment::process();
      if (auto v = env_int(env, "KFT_SHM_STAGING_BYTES", 4096, 1 << 30, "shm communicator")) cfg.staging_bytes = static_cast<std::size_t>(*v);
      if (auto v = env_int(env, "KFT_SHM_SMALL_BYTES", 64, 1 << 26, "shm communicator")) cfg.small_bytes = static_cast<std::size_t>(*v);
      if (auto v = env_int(env, "KFT_SHM_STREAMING_BYTES", 0, 1 << 30, "shm communicator")) cfg.streaming_bytes = static_cast<std::size_t>(*v);
      me = rank;
      p = size;
      cfg.small_bytes = detail::round_up(std::max<std::size_t>(cfg.small_bytes, 64), 64);
      cfg.staging_bytes = detail::round_up(std::max<std::size_t>(cfg.staging_bytes, 4096), 4096);
      cfg.pool_bytes = detail::round_up(cfg.pool_bytes, 4096);
      const std::size_t page = 4096;
      const std::size_t ctrl_off = detail::round_up(sizeof(detail::header), 64);
      const std::size_t regions_off = detail::round_up(ctrl_off + sizeof(detail::rank_ctrl) * static_cast<std::size_t>(p), page);
      small_off = 0;
      slot_bytes = detail::round_up(detail::mailbox_data_offset + cfg.small_bytes, 64);
      staging_off = detail::round_up(2 * slot_bytes, page);
      pool_off = staging_off + 2 * cfg.staging_bytes;
      region_bytes = detail::round_up(pool_off + cfg.pool_bytes, page);
      const std::size_t total = regions_off + region_bytes * static_cast<std::size_t>(p);

      // One segment per communicator instance: ranks that build several get matching keys.
      const std::string scope = "shm/" + cfg.name + "/";
      const auto instance = store.add(scope + "instances/" + std::to_string(me), 1);
      const std::string key = scope + std::to_string(instance) + "/segment";
      seg = segment(store, key, me, p, total, cfg.name, offsetof(detail::header, mapped), cfg.timeout);
      hdr = reinterpret_cast<detail::header*>(seg.data());
      ctrl = reinterpret_cast<detail::rank_ctrl*>(seg.data() + ctrl_off);
      regions = seg.data() + regions_off;
      srcs.resize(static_cast<std::size_t>(p));
      peer_off.resize(static_cast<std::size_t>(p));
      oversubscribed = p > static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));

      if (me == 0) {  // the segment is zero-filled; atomics at zero are valid
        hdr->nranks = static_cast<std::uint32_t>(p);
        hdr->version = 1;
        hdr->small_bytes = cfg.small_bytes;
        hdr->staging_bytes = cfg.staging_bytes;
        hdr->pool_bytes = cfg.pool_bytes;
        hdr->abort_rank.store(-1);
        std::atomic_thread_fence(std::memory_order_release);
        reinterpret_cast<std::atomic<std::uint64_t>*>(&hdr->magic)->store(detail::segment_magic, std::memory_order_release);
      } else {
        const auto deadline = std::chrono::steady_clock::now() + cfg.timeout;
        backoff b;
        while (reinterpret_cast<std::atomic<std::uint64_t>*>(&hdr->magic)->load(std::memory_order_acquire) !=
               detail::segment_magic) {
          if (std::chrono::steady_clock::now() > deadline)
            throw timeout_error("shared segment " + seg.name() + " was never initialised by local rank 0",
                                site("shm init", 0));
          b.pause();
        }
        if (hdr->nranks != static_cast<std::uint32_t>(p) || hdr->small_bytes != cfg.small_bytes ||
            hdr->staging_bytes != cfg.staging_bytes || hdr->pool_bytes != cfg.pool_bytes)
          throw usage_error("local ranks disagree on the shm communicator's configuration (size " +
                                std::to_string(hdr->nranks) + " vs " + std::to_string(p) + ", or buffer sizes)",
                            site("shm init", 0));
      }
      // First touch of my own region from my own process (NUMA placement), then mark ready.
      std::memset(region(me), 0, region_bytes);
      ctrl[me].pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
      ctrl[me].pid_ns.store(pid_namespace(), std::memory_order_relaxed);
      ctrl[me].ready.store(1, std::memory_order_release);
      std::chrono::steady_clock::time_point init_deadline{};
      wait_peers([&](int r) { return ctrl[r].ready.load(std::memory_order_acquire); }, 1, "set-up", nullptr,
                 init_deadline, cfg.timeout);
      // Pre-fault my page tables for every peer's region: no page fault inside a collective.
      for (int r = 0; r < p; ++r) {
        volatile unsigned char* b = region(r);
        for (std::size_t off = 0; off < region_bytes; off += page) (void)b[off];
      }
    }

    unsigned char* region(int r) const { return regions + region_bytes * static_cast<std::size_t>(r); }
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
      std::lock_guard lock(mu);
      const std::size_t off = detail::round_up(pool_used, 64);
      if (off + bytes > cfg.pool_bytes)
        throw usage_error("shm pool exhausted: " + std::to_string(bytes) + " bytes asked, " +
                              std::to_string(cfg.pool_bytes - std::min(off, cfg.pool_bytes)) +
                              " left of config::pool_bytes = " + std::to_string(cfg.pool_bytes),
                          site("shm allocate", seq));
      pool_used = off + bytes;
      return pool(me) + off;
    }

    // -- sync/async plumbing -------------------------------------------------------------------

    template <class F>
    void run_sync(F&& f) {
      drain();  // earlier async calls come first
      f();
    }
    void drain() {
      if (pending.load(std::memory_order_acquire) == 0) return;  // the common case: no async work
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return queue.empty() && !busy; });
    }
    template <class F>
    work submit(F&& f) {
      std::packaged_task<void()> task(std::forward<F>(f));
      auto fut = task.get_future();
      pending.fetch_add(1, std::memory_order_acq_rel);
      {
        std::lock_guard lock(mu);
        queue.push_back(std::move(task));
        if (!worker.joinable()) worker = std::thread([this] { progress(); });
      }
      cv.notify_all();
      return work(std::move(fut));
    }
    void progress() {
      std::unique_lock lock(mu);
      while (true) {
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        auto task = std::move(queue.front());
        queue.pop_front();
        busy = true;
        lock.unlock();
        task();  // exceptions land in the future
        lock.lock();
        busy = false;
        pending.fetch_sub(1, std::memory_order_acq_rel);
        cv.notify_all();
      }
    }

    // -- errors, abort, liveness ---------------------------------------------------------------

    error_site site(const std::string& op, std::uint64_t sequence) const {
      error_site s;
      s.rank = me;
      s.world_size = p;
      s.operation = op;
      if (sequence) s.sequence = sequence;
      return s;
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

    void abort(const std::string& reason) noexcept {
      if (hdr == nullptr) return;
      // Claim first, fill in the reason, then publish: a reader that sees `aborted` sees both.
      std::uint32_t expected = 0;
      if (hdr->abort_claim.compare_exchange_strong(expected, 1)) {
        std::snprintf(hdr->abort_reason, sizeof hdr->abort_reason, "%s", reason.c_str());
        hdr->abort_rank.store(me, std::memory_order_relaxed);
        hdr->aborted.store(1, std::memory_order_release);
      }
      broken = true;
      if (broken_reason.empty()) broken_reason = reason;
    }

    // Fails this call: remember, tell the others, throw.
    template <class E>
    [[noreturn]] void fail(E err) {
      abort(err.what());
      throw err;
    }

    // Whether rank r's process still runs. Only meaningful for a peer in our pid namespace
    // (containers of one pod share /dev/shm but not pids); a zombie counts as dead.
    bool alive(int r) const {
      const auto pid = ctrl[r].pid.load(std::memory_order_relaxed);
      if (pid <= 0 || pid == ::getpid()) return true;  // ranks as threads share a pid
      if (ctrl[r].pid_ns.load(std::memory_order_relaxed) != ctrl[me].pid_ns.load(std::memory_order_relaxed)) return true;
      if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
      if (FILE* f = std::fopen(path, "r")) {
        char buf[512] = {};
        const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
        std::fclose(f);
        const char* close_paren = std::strrchr(buf, ')');
        if (n > 0 && close_paren != nullptr && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'))
          return false;
      }
      return true;
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
      for (std::uint32_t spin = 0;; ++spin) {
        bool all = true;
        for (int r = 0; r < p && all; ++r)
          if (r != me && value_of(r) < target) all = false;
        if (all) return;
        if (hdr->aborted.load(std::memory_order_acquire)) {
          const int who = hdr->abort_rank.load(std::memory_order_acquire);
          broken = true;
          throw remote_error("rank " + std::to_string(who) + " stopped the group: " + std::string(hdr->abort_reason),
                             site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                  current ? current->seq : 0));
        }
        b.pause();
        if ((spin & 63) != 63) continue;
        const auto now = std::chrono::steady_clock::now();
        if (deadline == std::chrono::steady_clock::time_point{}) {  // first slow poll of this call
          deadline = now + timeout;
          next_liveness = now + 50ms;
        }
        if (now >= next_liveness) {
          next_liveness = now + 100ms;
          for (int r = 0; r < p; ++r)
            if (r != me && value_of(r) < target && !alive(r))
              fail(remote_error("rank " + std::to_string(r) + " (pid " + std::to_string(ctrl[r].pid.load()) +
                                    ") died" + (current ? " during " + describe(*current) : std::string(" during set-up")) +
                                    ": its process is gone",
                                site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                     current ? current->seq : 0)));
        }
        if (now >= deadline) {
          std::string missing;
          for (int r = 0; r < p; ++r)
            if (r != me && value_of(r) < target)
              missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (at #" +
                         std::to_string(arrived(r)) + ")";
          fail(timeout_error((current ? describe_args(*current) : std::string()) + "timed out after " +
                                 kft::detail::describe_duration(timeout) + " in " + phase + " waiting for rank(s) " +
                                 missing,
                             site(current ? std::string(name(static_cast<collective>(current->coll))) : "shm init",
                                  current ? current->seq : 0)));
        }
      }
    }

    // -- one call ------------------------------------------------------------------------------

    struct call {
      detail::signature sig;
      mutable std::chrono::steady_clock::time_point deadline{};  // unset until a wait is slow
      std::chrono::milliseconds timeout;
    };

    call begin(collective c, dtype t, op_kind op, std::size_t count, int root, algo a, const options& o,
               std::uint64_t in_off, std::uint64_t out_off) {
      if (broken)
        throw usage_error("this communicator was stopped by an earlier failure (" + broken_reason + ")",
                          site(std::string(name(c)), seq + 1));
      if (hdr->aborted.load(std::memory_order_acquire)) {
        broken = true;
        broken_reason = hdr->abort_reason;
        throw remote_error("rank " + std::to_string(hdr->abort_rank.load()) + " stopped the group: " +
                               std::string(hdr->abort_reason),
                           site(std::string(name(c)), seq + 1));
      }
      call k;
      k.sig.seq = ++seq;
      k.sig.count = count;
      k.sig.in_off = in_off;
      k.sig.out_off = out_off;
      k.sig.root = root;
      k.sig.tag = o.tag;
      k.sig.coll = static_cast<std::uint8_t>(c);
      k.sig.type = static_cast<std::uint8_t>(t);
      k.sig.op = static_cast<std::uint8_t>(op);
      k.sig.algorithm = static_cast<std::uint8_t>(a);
      k.timeout = o.timeout.count() > 0 ? o.timeout : cfg.timeout;
      // The deadline is set by the first wait of the call that does not complete at once
      // (reading the clock costs as much as a fast one-shot call's synchronisation).
      box(me, k.sig.seq).sig = k.sig;
      return k;
    }

    // Publishes arrival (after any data written before it), waits for everyone's, and compares
    // signatures: the first synchronisation of every call.
    void arrive_and_check(const call& k) {
      box(me, k.sig.seq).seq.store(k.sig.seq, std::memory_order_release);
      wait_peers([&](int r) { return box(r, k.sig.seq).seq.load(std::memory_order_acquire); }, k.sig.seq, "arrival",
                 &k.sig, k.deadline, k.timeout);
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        detail::signature theirs = box(r, k.sig.seq).sig;
        // An allgather's zero-copy input may sit at a different place on every rank (in place:
        // out + rank * count); each rank reads it from the peer's signature instead.
        if (static_cast<collective>(k.sig.coll) == collective::allgather) theirs.in_off = k.sig.in_off;
        if (!(theirs == k.sig))
          fail(mismatch_error("rank " + std::to_string(r) + " is at " + describe(theirs) + ", rank " +
                                  std::to_string(me) + " at " + describe(k.sig),
                              site(std::string(name(static_cast<collective>(k.sig.coll))), k.sig.seq)));
      }
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
    void set_stage(std::uint64_t v) { ctrl[me].stage.store(v, std::memory_order_release); }

    // Staging chunk g may be written once every rank is done with chunk g-2 (same buffer).
    void claim_chunk(const call& k, std::uint64_t g) {
      if (g >= 2) wait_stage(k, 3 * (g - 2) + 3, "staging reuse");
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
      if (c == collective::barrier) return algo::one_shot;
      // One-shot below a crossover, two-shot above it. Medians of bench/campaign.py on 2 cores
      // (docs/performance.md): 2 ranks cross between 8 and 16 KiB; 3 and 4 ranks (more ranks
      // than cores, where every synchronisation may cost a yield to a peer) between 32 and
      // 64 KiB. Without oversubscription the crossover shrinks as one-shot's p-fold reads grow
      // (cost model in docs/algorithms.md).
      std::size_t limit = oversubscribed ? (32u << 10) : p <= 4 ? (8u << 10) : (4u << 10);
      // No reduction pass: one-shot stays ahead longer (broadcast: every rank reads one source).
      if (c == collective::broadcast) limit *= 4;
      if (c == collective::allgather) limit *= 2;
      // Two-shot skips its copy-in on pool buffers, one-shot's mailbox does not: with a
      // zero-copy input two-shot wins from 4 KiB (2 ranks).
      if (zero_copy && c == collective::allreduce && !oversubscribed) limit = 2u << 10;
      return bytes <= std::min(limit, cfg.small_bytes) ? algo::one_shot : algo::two_shot;
    }

    algo resolve(collective c, std::size_t bytes, const options& o, bool zero_copy = false) const {
      if (o.algorithm != algo::automatic && o.algorithm != algo::one_shot && o.algorithm != algo::two_shot)
        throw usage_error("algorithm " + std::string(name(o.algorithm)) +
                              " is not a shared-memory algorithm (one_shot, two_shot or auto)",
                          site(std::string(name(c)), seq + 1));
      return o.algorithm == algo::automatic ? choose(c, bytes, zero_copy) : o.algorithm;
    }

    // -- allreduce ------------------------------------------------------------------------------

    void allreduce(const void* in, void* out, std::size_t count, dtype t, op_kind op, const options& o) {
      const std::size_t es = size_of(t), bytes = count * es;
      const auto in_off = pool_offset(in, bytes), out_off = pool_offset(out, bytes);
      const algo a = resolve(collective::allreduce, bytes, o, in_off != detail::no_offset);
      auto k = begin(collective::allreduce, t, op, count, -1, a, o, in_off, out_off);
      if (a == algo::one_shot && bytes <= cfg.small_bytes) {
        unsigned char* slot = small(me, k.sig.seq);
        std::memcpy(slot, in, bytes);
        arrive_and_check(k);
        for (int r = 0; r < p; ++r) srcs[static_cast<std::size_t>(r)] = small(r, k.sig.seq);
        kernels::reduce(out, srcs.data(), p, count, t, op, p);
        return;
      }
      arrive_and_check(k);
      if (count == 0) return;
      const bool zc_in = in_off != detail::no_offset, zc_out = out_off != detail::no_offset;
      // Outputs bigger than the caches are written with streaming stores (no read-for-ownership).
      const bool stream = !zc_out && bytes >= cfg.streaming_bytes;
      // Chunk: a multiple of p elements that fits the staging buffer.
      std::size_t chunk_elems = cfg.staging_bytes / es;
      if (chunk_elems >= static_cast<std::size_t>(p)) chunk_elems -= chunk_elems % static_cast<std::size_t>(p);
      const auto* src_user = static_cast<const unsigned char*>(in);
      auto* dst_user = static_cast<unsigned char*>(out);
      for (std::size_t off = 0; off < count; off += chunk_elems) {
        const std::size_t n = std::min(chunk_elems, count - off);
        const std::uint64_t g = chunk++;
        const auto [sb, sn] = slice(n, me);
        claim_chunk(k, g);
        // 1. Copy in what the others will read: every slice but my own (I read mine in place).
        if (!zc_in) {
          if (a == algo::one_shot) {
            std::memcpy(staging(me, g), src_user + off * es, n * es);
          } else {
            std::memcpy(staging(me, g), src_user + off * es, sb * es);
            std::memcpy(staging(me, g) + (sb + sn) * es, src_user + (off + sb + sn) * es, (n - sb - sn) * es);
          }
        }
        set_stage(3 * g + 1);
        wait_stage(k, 3 * g + 1, "copy-in");
        auto src_of = [&](int r) -> const unsigned char* {
          return zc_in ? pool(r) + in_off + off * es : staging(r, g);
        };
        if (a == algo::one_shot) {  // chunked one-shot: everyone reduces everything
          for (int r = 0; r < p; ++r) srcs[static_cast<std::size_t>(r)] = src_of(r);
          if (zc_out) {
            // The output is in the shared pool, where peers may still be reading their inputs:
            // reduce aside, and write it only once everyone is done reading this chunk.
            // Scratch: my other staging buffer, which every peer finished with (chunk g-1)
            // before it flagged chunk g.
            unsigned char* scratch = staging(me, g + 1);
            kernels::reduce(scratch, srcs.data(), p, n, t, op, p);
            set_stage(3 * g + 2);
            wait_stage(k, 3 * g + 2, "one-shot reduce");
            std::memcpy(dst_user + off * es, scratch, n * es);
          } else {
            kernels::reduce(dst_user + off * es, srcs.data(), p, n, t, op, p);
          }
          set_stage(3 * g + 3);
          continue;
        }
        // 2. Reduce-scatter: my slice of the chunk from every rank, into shared memory where the
        //    others fetch it (my pool output, else my staging slice), and into my output.
        for (int r = 0; r < p; ++r)
          srcs[static_cast<std::size_t>(r)] =
              (r == me && !zc_in ? src_user + off * es : src_of(r)) + sb * es;
        unsigned char* shared_slice = zc_out ? pool(me) + out_off + (off + sb) * es : staging(me, g) + sb * es;
        kernels::reduce(shared_slice, srcs.data(), p, sn, t, op, p);
        if (!zc_out) kernels::copy(dst_user + (off + sb) * es, shared_slice, sn * es, stream);
        set_stage(3 * g + 2);
        wait_stage(k, 3 * g + 2, "reduce-scatter");
        // 3. Allgather: the others' reduced slices into my output.
        for (int r = 0; r < p; ++r) {
          if (r == me) continue;
          const auto [b0, bn] = slice(n, r);
          const unsigned char* from = zc_out ? pool(r) + out_off + (off + b0) * es : staging(r, g) + b0 * es;
          kernels::copy(dst_user + (off + b0) * es, from, bn * es, stream);
        }
        if (stream) kernels::stream_fence();
        set_stage(3 * g + 3);
      }
    }

    // -- broadcast ------------------------------------------------------------------------------

    void broadcast(const void* in, void* out, std::size_t count, dtype t, int root, const options& o) {
      if (root < 0 || root >= p)
        throw usage_error("broadcast root " + std::to_string(root) + " is not a rank of this communicator (size " +
                              std::to_string(p) + ")",
                          site("broadcast", seq + 1));
      const std::size_t es = size_of(t), bytes = count * es;
      const algo a = resolve(collective::broadcast, bytes, o);
      auto k = begin(collective::broadcast, t, op_kind::sum, count, root, a, o, detail::no_offset, detail::no_offset);
      auto* dst = static_cast<unsigned char*>(out);
      const auto* src = static_cast<const unsigned char*>(in);
      if (a == algo::one_shot && bytes <= cfg.small_bytes) {
        if (me == root) std::memcpy(small(me, k.sig.seq), in, bytes);
        arrive_and_check(k);
        if (me != root) std::memcpy(out, small(root, k.sig.seq), bytes);
        else if (out != in) std::memcpy(out, in, bytes);
        return;
      }
      arrive_and_check(k);
      // The root stages chunks; the others copy them out. Double-buffered like the two-shot.
      const std::size_t chunk_elems = cfg.staging_bytes / es;
      for (std::size_t off = 0; off < count; off += chunk_elems) {
        const std::size_t n = std::min(chunk_elems, count - off);
        const std::uint64_t g = chunk++;
        if (me == root) {
          claim_chunk(k, g);
          std::memcpy(staging(me, g), src + off * es, n * es);
          set_stage(3 * g + 1);
          if (out != in) std::memcpy(dst + off * es, src + off * es, n * es);
        } else {
          wait_stage_of(k, root, 3 * g + 1, "broadcast copy-in");
          std::memcpy(dst + off * es, staging(root, g), n * es);
        }
        set_stage(3 * g + 3);
      }
    }

    // -- reduce_scatter -------------------------------------------------------------------------

    void reduce_scatter(const void* in, void* out, std::size_t rc, dtype t, op_kind op, const options& o) {
      const std::size_t es = size_of(t), bytes = rc * es * static_cast<std::size_t>(p);
      const algo a = resolve(collective::reduce_scatter, bytes, o);
      auto k = begin(collective::reduce_scatter, t, op, rc, -1, a, o, detail::no_offset, detail::no_offset);
      if (a == algo::one_shot && bytes <= cfg.small_bytes) {
        std::memcpy(small(me, k.sig.seq), in, bytes);
        arrive_and_check(k);
        for (int r = 0; r < p; ++r) srcs[static_cast<std::size_t>(r)] = small(r, k.sig.seq) + static_cast<std::size_t>(me) * rc * es;
        kernels::reduce(out, srcs.data(), p, rc, t, op, p);
        return;
      }
      arrive_and_check(k);
      if (rc == 0) return;
      // Chunk m elements of every rank's slice: stage p pieces of m, reduce my piece.
      const std::size_t m_max = std::max<std::size_t>(1, cfg.staging_bytes / es / static_cast<std::size_t>(p));
      for (std::size_t off = 0; off < rc; off += m_max) {
        const std::size_t m = std::min(m_max, rc - off);
        const std::uint64_t g = chunk++;
        claim_chunk(k, g);
        unsigned char* mine = staging(me, g);
        for (int s = 0; s < p; ++s)
          std::memcpy(mine + static_cast<std::size_t>(s) * m * es,
                      static_cast<const unsigned char*>(in) + (static_cast<std::size_t>(s) * rc + off) * es, m * es);
        set_stage(3 * g + 1);
        wait_stage(k, 3 * g + 1, "copy-in");
        for (int r = 0; r < p; ++r)
          srcs[static_cast<std::size_t>(r)] = staging(r, g) + static_cast<std::size_t>(me) * m * es;
        kernels::reduce(static_cast<unsigned char*>(out) + off * es, srcs.data(), p, m, t, op, p);
        set_stage(3 * g + 3);
      }
    }

    // -- allgather ------------------------------------------------------------------------------

    void allgather(const void* in, void* out, std::size_t sc, dtype t, const options& o) {
      const std::size_t es = size_of(t), bytes = sc * es;
      const auto in_off = pool_offset(in, bytes);
      const algo a = resolve(collective::allgather, bytes, o);
      auto k = begin(collective::allgather, t, op_kind::sum, sc, -1, a, o, in_off, detail::no_offset);
      auto* dst = static_cast<unsigned char*>(out);
      if (a == algo::one_shot && bytes <= cfg.small_bytes) {
        std::memcpy(small(me, k.sig.seq), in, bytes);
        arrive_and_check(k);
        for (int r = 0; r < p; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * bytes, small(r, k.sig.seq), bytes);
        return;
      }
      arrive_and_check(k);
      if (sc == 0) return;
      const bool zc = in_off != detail::no_offset;
      for (int r = 0; r < p; ++r)  // where each rank's zero-copy input is (or no_offset: staged)
        peer_off[static_cast<std::size_t>(r)] = box(r, k.sig.seq).sig.in_off;
      const std::size_t chunk_elems = cfg.staging_bytes / es;
      for (std::size_t off = 0; off < sc; off += chunk_elems) {
        const std::size_t n = std::min(chunk_elems, sc - off);
        const std::uint64_t g = chunk++;
        claim_chunk(k, g);
        if (!zc) std::memcpy(staging(me, g), static_cast<const unsigned char*>(in) + off * es, n * es);
        set_stage(3 * g + 1);
        wait_stage(k, 3 * g + 1, "copy-in");
        for (int r = 0; r < p; ++r) {
          const auto ro = peer_off[static_cast<std::size_t>(r)];
          const unsigned char* from = ro != detail::no_offset ? pool(r) + ro + off * es : staging(r, g);
          unsigned char* to = dst + (static_cast<std::size_t>(r) * sc + off) * es;
          if (from != to) std::memcpy(to, from, n * es);
        }
        set_stage(3 * g + 3);
      }
    }

    void barrier(const options& o) {
      auto k = begin(collective::barrier, dtype::u8, op_kind::sum, 0, -1, algo::one_shot, o, detail::no_offset,
                     detail::no_offset);
      arrive_and_check(k);
    }
  };

  std::unique_ptr<state> s_;
};

/// @brief The communicator of this process's node: ranks on the same host (by the discovered
/// local view), meeting under "node/<hostname>/" in the job's store. The segment is named after
/// the job's run id (KFT_RUN_ID / TORCHELASTIC_RUN_ID) plus random bytes.
/// @throws usage_error when the launcher did not say which ranks share this node
inline communicator node_communicator(std::shared_ptr<rendezvous::store> store, const world_info& w, config cfg = {}) {
  if (!w.local_rank || !w.local_size)
    throw usage_error("the local view is unknown (backend " + w.backend +
                          "): cannot tell which ranks share this node; launch with kftrun, mpirun or srun",
                      error_site::of("shm init"));
  if (cfg.name == "kft") {  // name the segment after the job, as launchers know it
    const auto env = environment::process();
    if (auto id = env.get("KFT_RUN_ID").value_or(env.get("TORCHELASTIC_RUN_ID").value_or("")); !id.empty())
      cfg.name = "kft-" + id;
  }
  auto scoped = std::make_shared<rendezvous::prefix_store>(std::move(store), "node/" + w.hostname + "/" +
                                                                                 std::to_string(w.node_rank.value_or(0)) + "/");
  return communicator(std::move(scoped), *w.local_rank, *w.local_size, std::move(cfg));
}

}  // namespace shm
KFT_NAMESPACE_END
