#include "pool/buffer_pool.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <new>

#include "pool/detail/spin.hpp"

namespace wspush::pool {

namespace detail {

/// Blocks are allocated 64-byte aligned: header and the start of the data share a line.
constexpr std::align_val_t block_align{64};

/// One size class. `leased`/`cached` are written under `lock` and read lock-free by
/// stats(); a relaxed load+store under the lock avoids a second locked instruction.
struct alignas(cache_line) size_class {
  spin_lock lock;
  bool dead = false;  // the buffer_pool is gone: release to the heap
  block_header* free_head = nullptr;
  std::size_t idle = 0;  // the free list's shortest length since the last trim (under `lock`)
  std::atomic<std::size_t> leased{0};
  std::atomic<std::size_t> cached{0};
  std::atomic<std::uint64_t> heap_allocs{0};
};
static_assert(sizeof(size_class) == cache_line, "size_class budget: one cache line");

inline void bump(std::atomic<std::size_t>& v, std::ptrdiff_t d) noexcept {
  v.store(v.load(std::memory_order_relaxed) + std::size_t(d), std::memory_order_relaxed);
}

/// The pool's shared state. Reference counted: one reference for the buffer_pool
/// object, and, once that is gone, one per block still out (see ~buffer_pool).
struct pool_state {
  explicit pool_state(std::size_t cap) : cap_bytes(cap) {}

  lease acquire(std::size_t min_capacity) noexcept;
  void give_back(std::size_t idx, block_header* b) noexcept;
  block_header* allocate(std::size_t idx) noexcept;
  static void free_block(block_header* b) noexcept;
  void unref() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  const std::size_t cap_bytes;
  std::atomic<std::size_t> refs{1};
  std::array<size_class, buffer_pool::class_count> classes;
};

block_header* pool_state::allocate(std::size_t idx) noexcept {
  std::size_t cap = buffer_pool::class_size(idx);
  void* mem = ::operator new(sizeof(block_header) + cap, block_align, std::nothrow);
  if (mem == nullptr) return nullptr;
  classes[idx].heap_allocs.fetch_add(1, std::memory_order_relaxed);
  return ::new (mem) block_header{this, nullptr, std::uint32_t(cap), 0, {0}, std::uint8_t(idx)};
}

void pool_state::free_block(block_header* b) noexcept {
  b->~block_header();
  ::operator delete(static_cast<void*>(b), block_align);
}

lease pool_state::acquire(std::size_t min_capacity) noexcept {
  std::size_t idx = buffer_pool::class_index(min_capacity);
  if (idx >= buffer_pool::class_count) return {};
  size_class& c = classes[idx];
  c.lock.lock();
  if (c.dead) {
    c.lock.unlock();
    return {};
  }
  block_header* b = c.free_head;
  if (b != nullptr) {
    c.free_head = b->next_free;
    bump(c.cached, -1);
    c.idle = std::min(c.idle, c.cached.load(std::memory_order_relaxed));
  }
  bump(c.leased, 1);  // counted before allocating, so ~buffer_pool sees it
  c.lock.unlock();
  if (b == nullptr) {
    b = allocate(idx);
    if (b == nullptr) {
      give_back(idx, nullptr);
      return {};
    }
  }
  b->size = 0;
  b->next_free = nullptr;  // no twin
  return lease(b);
}

/// Ends one lease of class `idx`: caches `b`, frees it, or (if the pool is gone) frees
/// it and drops the reference the block held on this state. `b` may be null (a failed
/// allocation undoing its count).
void pool_state::give_back(std::size_t idx, block_header* b) noexcept {
  size_class& c = classes[idx];
  std::size_t block_bytes = buffer_pool::class_size(idx);
  c.lock.lock();
  bump(c.leased, -1);
  if (c.dead) {
    c.lock.unlock();
    if (b != nullptr) free_block(b);
    unref();  // may delete *this: nothing after it
    return;
  }
  if (b != nullptr && (c.cached.load(std::memory_order_relaxed) + 1) * block_bytes <= cap_bytes) {
    b->next_free = c.free_head;
    c.free_head = b;
    bump(c.cached, 1);
    b = nullptr;
  }
  c.lock.unlock();
  if (b != nullptr) free_block(b);
}

void release_block(block_header* b) noexcept {
  // The reference this block held on its twin (a twin may have one too: a short chain).
  if (block_header* twin = std::exchange(b->next_free, nullptr))
    if (twin->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) release_block(twin);
  b->owner->give_back(b->size_class, b);
}

}  // namespace detail

buffer_pool::buffer_pool(options o) : _state(new detail::pool_state(o.max_cached_bytes_per_class)) {}

/// Marks every class dead under its lock and hands the state one reference per block
/// still out; a release that comes later sees `dead` and drops that reference.
buffer_pool::~buffer_pool() {
  for (auto& c : _state->classes) {
    c.lock.lock();
    c.dead = true;
    detail::block_header* list = std::exchange(c.free_head, nullptr);
    c.cached.store(0, std::memory_order_relaxed);
    std::size_t out = c.leased.load(std::memory_order_relaxed);
    if (out != 0) _state->refs.fetch_add(out, std::memory_order_relaxed);
    c.lock.unlock();
    while (list != nullptr) {
      detail::block_header* next = list->next_free;
      detail::pool_state::free_block(list);
      list = next;
    }
  }
  _state->unref();
}

lease buffer_pool::acquire(std::size_t min_capacity) noexcept { return _state->acquire(min_capacity); }

std::size_t buffer_pool::prefill(std::size_t min_capacity, std::size_t count) noexcept {
  std::size_t idx = class_index(min_capacity);
  if (idx >= class_count) return 0;
  auto& c = _state->classes[idx];
  while (c.cached.load(std::memory_order_relaxed) < count) {
    detail::block_header* b = _state->allocate(idx);
    if (b == nullptr) break;
    c.lock.lock();
    detail::bump(c.leased, 1);
    c.lock.unlock();
    std::size_t before = c.cached.load(std::memory_order_relaxed);
    _state->give_back(idx, b);
    if (c.cached.load(std::memory_order_relaxed) <= before) break;  // cap reached: it was freed
  }
  return c.cached.load(std::memory_order_relaxed);
}

std::size_t buffer_pool::trim() noexcept {
  std::size_t freed = 0;
  for (std::size_t idx = 0; idx < class_count; ++idx) {
    auto& c = _state->classes[idx];
    detail::block_header* list = nullptr;
    c.lock.lock();
    std::size_t n = c.dead ? 0 : std::min(c.idle, c.cached.load(std::memory_order_relaxed));
    for (std::size_t k = 0; k < n; ++k) {  // any n of them: cached blocks are interchangeable
      detail::block_header* b = c.free_head;
      c.free_head = b->next_free;
      b->next_free = list;
      list = b;
    }
    detail::bump(c.cached, -std::ptrdiff_t(n));
    c.idle = c.cached.load(std::memory_order_relaxed);  // the next period starts with these
    c.lock.unlock();
    freed += n * class_size(idx);
    while (list != nullptr) {  // to the heap outside the lock
      detail::block_header* next = list->next_free;
      detail::pool_state::free_block(list);
      list = next;
    }
  }
  return freed;
}

buffer_pool::class_stats buffer_pool::stats(std::size_t index) const noexcept {
  const auto& c = _state->classes[index];
  return {class_size(index), c.leased.load(std::memory_order_relaxed),
          c.cached.load(std::memory_order_relaxed), c.heap_allocs.load(std::memory_order_relaxed)};
}

bool lease::reserve(std::size_t min_capacity) noexcept {
  if (_blk == nullptr) return false;
  if (min_capacity <= _blk->capacity) return true;
  lease bigger = _blk->owner->acquire(min_capacity);
  if (!bigger) return false;
  std::memcpy(bigger.data(), _blk->data(), _blk->size);
  bigger._blk->size = _blk->size;
  *this = std::move(bigger);
  return true;
}

}  // namespace wspush::pool
