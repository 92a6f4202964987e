#pragma once
/// \file lease.hpp
/// A borrowed buffer: one pointer to a pooled block. Destroying the lease returns the
/// block to the pool it came from, so a connection holds memory only while data moves.

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace wspush::pool {

class buffer_pool;
class frame_ref;

namespace detail {

struct pool_state;

/// Header in front of every pooled block; the data follows it directly.
/// Budget: 32 bytes, so data is 32-byte aligned (blocks are allocated 64-byte aligned)
/// and a small frame shares its first cache line with the header.
struct alignas(32) block_header {
  pool_state* owner;           ///< where the block goes back to
  /// While cached: the free-list link. While out: a frame's twin (frame_ref::set_twin), the
  /// same message in another encoding, on which this block holds one reference; else null.
  block_header* next_free;
  std::uint32_t capacity;      ///< bytes of data (the size class)
  std::uint32_t size;          ///< bytes in use
  std::atomic<std::uint32_t> refs;  ///< frame_ref count (unused by a lease)
  std::uint8_t size_class;

  std::uint8_t* data() noexcept { return reinterpret_cast<std::uint8_t*>(this + 1); }
};
static_assert(sizeof(block_header) == 32, "block_header budget: 32 bytes");

/// Returns the block to its pool (or to the heap, see buffer_pool). Thread-safe.
void release_block(block_header* b) noexcept;

}  // namespace detail

/// Exclusive ownership of a pooled buffer. Empty when default-built or moved from.
/// `size()` (bytes in use) lives in the block header, not in the lease, so the lease is
/// exactly one pointer and a connection can keep one in a slab record for free.
class lease {
 public:
  lease() noexcept = default;
  lease(lease&& other) noexcept : _blk(std::exchange(other._blk, nullptr)) {}
  lease& operator=(lease&& other) noexcept {
    if (this != &other) {
      reset();
      _blk = std::exchange(other._blk, nullptr);
    }
    return *this;
  }
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  ~lease() { reset(); }

  explicit operator bool() const noexcept { return _blk != nullptr; }

  /// Start of the buffer; valid while this lease owns it. Null when empty.
  std::uint8_t* data() const noexcept { return _blk != nullptr ? _blk->data() : nullptr; }
  std::size_t capacity() const noexcept { return _blk != nullptr ? _blk->capacity : 0; }
  std::size_t size() const noexcept { return _blk != nullptr ? _blk->size : 0; }
  /// Precondition: not empty and `n <= capacity()`.
  void set_size(std::size_t n) noexcept {
    assert(_blk != nullptr && n <= _blk->capacity);
    _blk->size = static_cast<std::uint32_t>(n);
  }
  /// [data, data + size)
  std::span<std::uint8_t> bytes() const noexcept { return {data(), size()}; }

  /// Ensures `capacity() >= min_capacity`, moving to a bigger block of the same pool and
  /// keeping the first size() bytes. False (lease unchanged) if the size is over
  /// buffer_pool::max_block_size, memory is exhausted, or the lease is empty.
  bool reserve(std::size_t min_capacity) noexcept;

  /// Returns the block now.
  void reset() noexcept {
    if (_blk != nullptr) detail::release_block(std::exchange(_blk, nullptr));
  }

  /// For passing a lease through queues and tasks as a plain pointer: the lease becomes
  /// empty and the block stays leased until `from_raw` takes it back (exactly once).
  void* release_raw() noexcept { return std::exchange(_blk, nullptr); }
  static lease from_raw(void* raw) noexcept { return lease(static_cast<detail::block_header*>(raw)); }

 private:
  friend class buffer_pool;
  friend class frame_ref;
  friend struct detail::pool_state;
  explicit lease(detail::block_header* b) noexcept : _blk(b) {}
  detail::block_header* release_block() noexcept { return std::exchange(_blk, nullptr); }

  detail::block_header* _blk = nullptr;
};
static_assert(sizeof(lease) == sizeof(void*), "lease budget: one pointer");

}  // namespace wspush::pool
