// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/memory.hpp
/// @brief Where the DDP reducer keeps bucket storage, and how it orders communication after the
/// gradients are written: `bucket_memory<Group>`.
///
/// The primary template is host memory (the reducer first asks a group with a shared segment
/// for room there), written by the caller's thread: nothing to order. A GPU group specialises it
/// (`kft/ddp/cuda.hpp`: device memory, the bucket's allreduce on the communicator's stream after
/// an event recorded on the compute stream). A specialisation provides:
///  - `static constexpr bool on_device`
///  - `bucket_memory(Group&, void* stream)` (stream: the caller's compute stream, or nullptr)
///  - `void* allocate(std::size_t bytes)` (zeroed) and `static void release(void*) noexcept`
///  - `void zero(void*, std::size_t bytes)`, `void copy(void* dst, const void* src, std::size_t bytes)`
///    (both ordered with the compute stream)
///  - `void upload(void* dst, const void* host, std::size_t)`, `void download(void* host, const void* src,
///    std::size_t)`: synchronous, for the reducer's own small collectives (model check, rebuild)
///  - `void before_launch()`: later communication sees every gradient written so far
///  - `void after_finish()`: later compute sees the reduced gradients
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include <kft/core/namespace.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief True for a communicator whose buffers live on a device (`static constexpr bool device_buffers`).
template <class G>
constexpr bool device_buffers_v = [] {
  if constexpr (requires { G::device_buffers; }) return static_cast<bool>(G::device_buffers);
  else return false;
}();

template <class Group>
struct bucket_memory {
  static_assert(!device_buffers_v<Group>,
                "a reducer over a GPU communicator needs its device memory policy: #include <kft/ddp/cuda.hpp>");
  static constexpr bool on_device = false;
  bucket_memory(Group&, void*) {}
  void* allocate(std::size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  static void release(void* p) noexcept { std::free(p); }
  void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  void upload(void* dst, const void* host, std::size_t bytes) { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, std::size_t bytes) const { std::memcpy(host, src, bytes); }
  void before_launch() {}
  void after_finish() {}
};

}  // namespace ddp
KFT_NAMESPACE_END
