// SPDX-License-Identifier: Apache-2.0
// Counts heap allocations: include in exactly one translation unit of a program (it replaces
// the global operator new and delete). `kft_test::allocations` counts every thread's (atomic),
// `kft_test::thread_allocations` this thread's. Replacing the global operators with
// malloc/free is the standard's own pattern; GCC's new/delete pairing check cannot see that
// these are the replacements.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

namespace kft_test {
inline std::atomic<long> allocations{0};
inline thread_local long thread_allocations = 0;
inline void* counted_alloc(std::size_t n, std::size_t align) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  ++thread_allocations;
  void* p = align ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace kft_test

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) { return kft_test::counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return kft_test::counted_alloc(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
