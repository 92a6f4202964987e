#pragma once
/// \file mpsc_queue.hpp
/// Bounded multi-producer single-consumer queue for small items (a handle, a small struct
/// that owns a frame_ref or a lease): any thread posts, one thread (a reactor) drains.
/// Lock-free ring with a sequence number per cell (Vyukov); the single consumer needs no
/// CAS. Waking the consumer is the caller's business (the reactor's eventfd).
///
/// Items may own resources: a cell holds a live T between push and pop, and the queue
/// destroys whatever is still queued when it is destroyed.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "pool/detail/spin.hpp"

namespace wspush::pool {

/// Items must be nothrow move-constructible. A failed try_push() leaves the item untouched
/// (the caller still owns it): it is moved from only once its cell is claimed.
template <class T>
class mpsc_queue {
  static_assert(std::is_nothrow_move_constructible_v<T>, "mpsc_queue items must be nothrow movable");

 public:
  /// Allocates `capacity` cells, rounded up to a power of two (at least 2). The only
  /// allocation the queue makes.
  explicit mpsc_queue(std::size_t capacity)
      : _mask(round_up(capacity) - 1), _cells(new cell[_mask + 1]) {
    for (std::size_t i = 0; i <= _mask; ++i) _cells[i].seq.store(i, std::memory_order_relaxed);
  }
  mpsc_queue(const mpsc_queue&) = delete;
  mpsc_queue& operator=(const mpsc_queue&) = delete;
  /// Destroys the items still queued. No producer may run concurrently.
  ~mpsc_queue() {
    T item;
    while (try_pop(item)) {
    }
  }

  std::size_t capacity() const noexcept { return _mask + 1; }

  bool try_push(const T& item) noexcept requires std::is_trivially_copyable_v<T> {
    T copy = item;
    return try_push(std::move(copy));
  }
  /// Any thread. False if the queue is full; `item` is then left as it was.
  bool try_push(T&& item) noexcept {
    std::size_t pos = _enq.load(std::memory_order_relaxed);
    cell* c;
    for (;;) {
      c = &_cells[pos & _mask];
      auto diff = std::intptr_t(c->seq.load(std::memory_order_acquire)) - std::intptr_t(pos);
      if (diff == 0) {
        if (_enq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;
      } else {
        pos = _enq.load(std::memory_order_relaxed);
      }
    }
    ::new (static_cast<void*>(c->storage)) T(std::move(item));
    c->seq.store(pos + 1, std::memory_order_release);
    return true;
  }

  /// The consumer thread only. False if nothing is published at the head (a producer
  /// that claimed the head cell but has not written it yet counts as nothing yet).
  bool try_pop(T& out) noexcept {
    std::size_t pos = _deq.load(std::memory_order_relaxed);
    cell& c = _cells[pos & _mask];
    if (c.seq.load(std::memory_order_acquire) != pos + 1) return false;
    T* held = std::launder(reinterpret_cast<T*>(c.storage));
    out = std::move(*held);
    held->~T();
    c.seq.store(pos + _mask + 1, std::memory_order_release);
    _deq.store(pos + 1, std::memory_order_relaxed);
    return true;
  }

  /// Items pushed and not yet popped; any thread, approximate under concurrency.
  std::size_t size_approx() const noexcept {
    std::size_t deq = _deq.load(std::memory_order_relaxed);
    std::size_t enq = _enq.load(std::memory_order_relaxed);
    return enq > deq ? enq - deq : 0;
  }

 private:
  struct cell {
    std::atomic<std::size_t> seq;
    alignas(T) unsigned char storage[sizeof(T)];  // a live T between push and pop
  };

  static std::size_t round_up(std::size_t n) noexcept {
    std::size_t cap = 2;
    while (cap < n) cap <<= 1;
    return cap;
  }

  const std::size_t _mask;
  const std::unique_ptr<cell[]> _cells;
  alignas(detail::cache_line) std::atomic<std::size_t> _enq{0};  // producers' line
  alignas(detail::cache_line) std::atomic<std::size_t> _deq{0};  // consumer's line
};

}  // namespace wspush::pool
