// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/concepts.hpp
/// @brief The written contract of a communicator: what every transport provides and what the
/// algorithms, process groups and the DDP layer may rely on.
///
///     static_assert(kft::async_communicator<kft::shm::communicator>);   // at the end of each transport
///
/// A `communicator` has a rank and a size in its group, numbers its calls (`sequence()`, the
/// number of calls made so far), runs the five collectives on untyped buffers (the type-erased
/// boundary: `dtype` + `op_kind`, so algorithms are not stamped out per element type), and
/// can be stopped: `abort(reason)` is group-scoped and returns (every rank's current or next
/// call fails with a `remote_error` naming the reason where the transport can tell them; MPI
/// cannot, see its header), never kills the job. Calls follow kft's conventions:
///  - `allreduce(in, out, count)`: out = in reduced over all ranks; in == out is in place.
///  - `broadcast(in, out, count, root)`: out = root's in; in is read on the root only.
///  - `reduce_scatter(in, out, recv_count)`: out = slice `rank` of in (recv_count x size)
///    reduced; in place when out == in + rank x recv_count.
///  - `allgather(in, out, send_count)`: out (send_count x size) = everyone's in, rank order;
///    in place when in == out + rank x send_count.
///  - `barrier()`.
/// An `algo` the transport does not implement is a `usage_error` naming it, never a silent
/// substitute. Every wait has a deadline (`options::timeout`, else the communicator's).
///
/// An `async_communicator` also starts each of them asynchronously and returns a
/// `work_handle` (in kft: `async::work`), which runs in submission order.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include <kft/core/collective.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>

KFT_NAMESPACE_BEGIN

/// @brief A handle of one asynchronous operation.
template <class W>
concept work_handle = std::movable<W> && requires(W& w, const W& cw, std::chrono::milliseconds d) {
  w.wait();
  { w.test() } -> std::convertible_to<bool>;
  { w.wait_for(d) } -> std::convertible_to<bool>;
  { cw.sequence() } -> std::same_as<std::uint64_t>;
  { cw.op() } -> std::same_as<collective>;
};

/// @brief The five collectives on untyped buffers, a place in a group, and abort.
template <class C>
concept communicator = requires(C& c, const C& cc, const void* in, void* out, std::size_t n, dtype t, op_kind op,
                                const options& o, std::string_view why) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  { cc.sequence() } -> std::same_as<std::uint64_t>;
  c.allreduce(in, out, n, t, op, o);
  c.broadcast(in, out, n, t, 0, o);
  c.reduce_scatter(in, out, n, t, op, o);
  c.allgather(in, out, n, t, o);
  c.barrier(o);
  { c.abort(why) } noexcept;
};

/// @brief A communicator whose collectives also run asynchronously, in submission order.
template <class C>
concept async_communicator =
    communicator<C> && requires(C& c, const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o) {
      { c.allreduce_async(in, out, n, t, op, o) } -> work_handle;
      { c.broadcast_async(in, out, n, t, 0, o) } -> work_handle;
      { c.reduce_scatter_async(in, out, n, t, op, o) } -> work_handle;
      { c.allgather_async(in, out, n, t, o) } -> work_handle;
      { c.barrier_async(o) } -> work_handle;
    };

KFT_NAMESPACE_END
