// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/typed_collectives.hpp
/// @brief The typed (`std::span<T>`) forms of the collectives, written once for every
/// communicator and group (a CRTP mixin over the untyped calls).
///
///     class communicator : public kft::typed_collectives<communicator> {
///       using typed = kft::typed_collectives<communicator>;
///      public:
///       KFT_TYPED_COLLECTIVES(typed);            // brings the span overloads into scope
///       void allreduce(const void* in, void* out, std::size_t n, dtype t, op_kind op, const options& o = {});
///       ...
///     };
///
/// The element type maps through `dtype_of<T>` (an unsupported type is a static_assert naming
/// the supported ones), the reduction through `Op::kind`; buffer sizes are checked here, so a
/// transport only checks what is its own. `Options` is the per-call options type (`options`,
/// or a transport's extension of it such as NCCL's stream; any other options type the derived
/// class's untyped calls take works too). The derived class provides the
/// untyped calls and `error_site next_site(collective) const` (the site of its next call).
#pragma once

#include <span>
#include <type_traits>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/transport/checks.hpp>

KFT_NAMESPACE_BEGIN

template <class Derived, class Options = options>
class typed_collectives {
 public:
  // ---- synchronous --------------------------------------------------------------------------
  template <class T, reduction Op, class O = Options>
  void allreduce(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    detail::require_same_count(in.size(), out.size(), "allreduce", site(collective::allreduce));
    self().allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op, class O = Options>
  void allreduce(std::span<T> inout, Op op, const O& o = {}) {
    allreduce(std::span<const T>(inout), inout, op, o);
  }
  template <class T, class O = Options>
  void broadcast(std::span<T> inout, int root, const O& o = {}) {
    self().broadcast(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
  }
  template <class T, class O = Options>
  void broadcast(std::span<const T> in, std::span<T> out, int root, const O& o = {}) {
    detail::require_same_count(in.size(), out.size(), "broadcast", site(collective::broadcast));
    self().broadcast(in.data(), out.data(), out.size(), dtype_of_v<T>, root, o);
  }
  template <class T, reduction Op, class O = Options>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    detail::require_same_count(in.size(), out.size() * ranks(), "reduce_scatter (in = out x size)",
                               site(collective::reduce_scatter));
    self().reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, class O = Options>
  void allgather(std::span<const T> in, std::span<T> out, const O& o = {}) {
    detail::require_same_count(in.size() * ranks(), out.size(), "allgather (out = in x size)", site(collective::allgather));
    self().allgather(in.data(), out.data(), in.size(), dtype_of_v<T>, o);
  }

  // ---- asynchronous: the caller keeps the buffers alive and untouched until the work is done
  template <class T, reduction Op, class O = Options>
  auto allreduce_async(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    detail::require_same_count(in.size(), out.size(), "allreduce", site(collective::allreduce));
    return self().allreduce_async(in.data(), out.data(), in.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, reduction Op, class O = Options>
  auto allreduce_async(std::span<T> inout, Op op, const O& o = {}) {
    return allreduce_async(std::span<const T>(inout), inout, op, o);
  }
  template <class T, class O = Options>
  auto broadcast_async(std::span<T> inout, int root, const O& o = {}) {
    return self().broadcast_async(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, root, o);
  }
  template <class T, reduction Op, class O = Options>
  auto reduce_scatter_async(std::span<const T> in, std::span<T> out, Op, const O& o = {}) {
    detail::require_same_count(in.size(), out.size() * ranks(), "reduce_scatter (in = out x size)",
                               site(collective::reduce_scatter));
    return self().reduce_scatter_async(in.data(), out.data(), out.size(), dtype_of_v<T>, Op::kind, o);
  }
  template <class T, class O = Options>
  auto allgather_async(std::span<const T> in, std::span<T> out, const O& o = {}) {
    detail::require_same_count(in.size() * ranks(), out.size(), "allgather (out = in x size)", site(collective::allgather));
    return self().allgather_async(in.data(), out.data(), in.size(), dtype_of_v<T>, o);
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
  std::size_t ranks() const { return static_cast<std::size_t>(self().size()); }
  error_site site(collective c) const { return self().next_site(c); }
};

/// @brief In a class deriving from `typed_collectives<C>`: makes the span overloads visible
/// next to the class's own untyped ones (C++ name hiding would hide them otherwise).
#define KFT_TYPED_COLLECTIVES(Base)   \
  using Base::allreduce;              \
  using Base::broadcast;              \
  using Base::reduce_scatter;         \
  using Base::allgather;              \
  using Base::allreduce_async;        \
  using Base::broadcast_async;        \
  using Base::reduce_scatter_async;   \
  using Base::allgather_async

KFT_NAMESPACE_END
