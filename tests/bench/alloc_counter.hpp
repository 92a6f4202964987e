#pragma once
// Counts every global operator new of the benchmark binary, so a benchmark can report heap
// allocations per operation next to its time. Include it in exactly one source file of a
// binary (it defines the replacement operators).

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace wspush::bench {
inline std::atomic<std::uint64_t> heap_allocations{0};

/// Counts allocations made inside the measured calls only (the benchmark framework's own
/// bookkeeping around them is left out): wrap each call in `begin()`/`end()`.
struct alloc_probe {
  std::uint64_t counted = 0, mark = 0;
  void begin() noexcept { mark = heap_allocations.load(std::memory_order_relaxed); }
  void end() noexcept { counted += heap_allocations.load(std::memory_order_relaxed) - mark; }
  double per(std::uint64_t ops) const noexcept { return ops ? double(counted) / double(ops) : 0.0; }
};
}  // namespace wspush::bench

namespace wspush::bench::detail {
inline void* counted(std::size_t n, std::size_t align) noexcept {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (align <= alignof(std::max_align_t)) return std::malloc(n ? n : 1);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}
}  // namespace wspush::bench::detail

void* operator new(std::size_t n) {
  if (void* p = wspush::bench::detail::counted(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = wspush::bench::detail::counted(n, std::size_t(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return wspush::bench::detail::counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return wspush::bench::detail::counted(n, std::size_t(a));
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
