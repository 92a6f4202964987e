#pragma once
/// \file buffer_pool.hpp
/// Pooled buffers in power-of-two size classes, 256 B to 32 MiB (a 16 MiB payload plus
/// its frame header fits the top class). Blocks are leased while data moves and come
/// back on release; after warm-up, acquire and release of a cached class never touch
/// the heap. Thread-safe: a block may be acquired on one thread and released on another.

#include <bit>
#include <cstddef>
#include <cstdint>

#include "pool/lease.hpp"
#include "pool/shared_frame.hpp"

namespace wspush::pool {

/// Options of a buffer_pool (a namespace-level struct so that it can be a default
/// argument inside the class; spelled buffer_pool::options there).
struct buffer_pool_options {
  /// Bytes of free blocks each class keeps; blocks released beyond it go to the heap.
  std::size_t max_cached_bytes_per_class = std::size_t{64} << 20;
};

/// The pool. Each class has a free list behind a spinlock (a pop or push is a few
/// instructions, see pool_bench) and a cap on the bytes it keeps cached: blocks
/// released beyond the cap go back to the heap.
///
/// Lifetime rule: the buffer_pool may be destroyed while blocks are still leased (or
/// held by frame_refs). Destruction frees the cached blocks; the pool's internal state
/// then lives on until the last outstanding block comes back, and such blocks go
/// straight to the heap. `lease::reserve()` on a block of a destroyed pool fails.
class buffer_pool {
 public:
  using options = buffer_pool_options;

  struct class_stats {
    std::size_t block_size;    ///< data bytes per block of this class
    std::size_t leased;        ///< blocks out (leases and frames) right now
    std::size_t cached;        ///< blocks on the free list right now
    std::uint64_t heap_allocs; ///< blocks ever allocated from the heap for this class
  };

  static constexpr std::size_t min_block_size = 256;
  static constexpr std::size_t class_count = 18;
  static constexpr std::size_t max_block_size = min_block_size << (class_count - 1);  // 32 MiB

  /// Index of the smallest class holding `min_capacity` bytes; class_count if too big.
  static constexpr std::size_t class_index(std::size_t min_capacity) noexcept {
    if (min_capacity <= min_block_size) return 0;
    if (min_capacity > max_block_size) return class_count;
    return std::size_t(std::bit_width(min_capacity - 1)) - 8;
  }
  /// Data bytes of class `index` (< class_count).
  static constexpr std::size_t class_size(std::size_t index) noexcept { return min_block_size << index; }
  /// Heap bytes a block of data capacity `capacity` (a class size) occupies. Its 32-byte header
  /// takes the allocation just past a power of two, where size-class allocators (mimalloc,
  /// jemalloc) space their classes a quarter of that power apart: 1.25 x capacity.
  static constexpr std::size_t block_footprint(std::size_t capacity) noexcept { return capacity + capacity / 4; }

  /// Allocates the pool's small control state (may throw std::bad_alloc, at start-up).
  explicit buffer_pool(options o = {});
  ~buffer_pool();
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;

  /// A block with capacity >= min_capacity and size 0; empty if min_capacity is over
  /// max_block_size or memory is exhausted.
  lease acquire(std::size_t min_capacity) noexcept;

  /// Adds blocks to the cache of the class serving `min_capacity` until it holds
  /// `count` (bounded by the cap). Warm-up, so the first requests do not allocate.
  /// Returns how many blocks the class caches afterwards.
  std::size_t prefill(std::size_t min_capacity, std::size_t count) noexcept;

  /// Frees the cached blocks that sat idle since the previous trim: per class, as many as its
  /// free list never went below meanwhile (none of them was needed). Call it on a timer (once a
  /// second): a burst's blocks then leave the cache within two periods of the burst, while a
  /// steady load keeps the blocks it cycles through. Returns the bytes freed.
  std::size_t trim() noexcept;

  /// Snapshot of class `index` (< class_count); each field read atomically on its own.
  class_stats stats(std::size_t index) const noexcept;

 private:
  detail::pool_state* _state;
};

}  // namespace wspush::pool
