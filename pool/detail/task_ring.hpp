#pragma once
/// \file task_ring.hpp
/// The task pool's queue: a bounded multi-producer multi-consumer ring (Vyukov's
/// per-cell sequence numbers) that can be closed. Closing is one bit in the enqueue
/// position, so "is the pool still open?" costs producers nothing extra: a push either
/// claims its cell before the bit is set (and will publish it) or sees the bit and fails.

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "pool/detail/spin.hpp"

namespace wspush::pool::detail {

enum class push_result : std::uint8_t { ok, full, closed };

/// Ring of `Task` (default-constructible, nothrow-movable, empty when default-built).
/// Capacity is a power of two fixed at construction; no allocation afterwards.
template <class Task>
class task_ring {
 public:
  static constexpr std::uint64_t closed_bit = std::uint64_t{1} << 63;

  explicit task_ring(std::uint32_t min_capacity)
      : _mask(round_up(min_capacity) - 1), _cells(new cell[_mask + 1]) {
    for (std::uint64_t i = 0; i <= _mask; ++i) _cells[i].seq.store(i, std::memory_order_relaxed);
  }

  std::uint64_t capacity() const noexcept { return _mask + 1; }

  /// Moves `t` into the ring on success; leaves it untouched otherwise.
  push_result try_push(Task& t) noexcept {
    std::uint64_t pos = _enq.load(std::memory_order_relaxed);
    cell* c;
    for (;;) {
      if ((pos & closed_bit) != 0) return push_result::closed;
      c = &_cells[pos & _mask];
      auto diff = std::int64_t(c->seq.load(std::memory_order_acquire)) - std::int64_t(pos);
      if (diff == 0) {
        if (_enq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        pos = _enq.load(std::memory_order_relaxed);
        return (pos & closed_bit) != 0 ? push_result::closed : push_result::full;
      } else {
        pos = _enq.load(std::memory_order_relaxed);
      }
    }
    c->task = std::move(t);
    c->seq.store(pos + 1, std::memory_order_release);
    return push_result::ok;
  }

  /// Moves the oldest published task into `out`; false if none is ready.
  bool try_pop(Task& out) noexcept {
    std::uint64_t pos = _deq.load(std::memory_order_relaxed);
    cell* c;
    for (;;) {
      c = &_cells[pos & _mask];
      auto diff = std::int64_t(c->seq.load(std::memory_order_acquire)) - std::int64_t(pos + 1);
      if (diff == 0) {
        if (_deq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;
      } else {
        pos = _deq.load(std::memory_order_relaxed);
      }
    }
    out = std::move(c->task);
    c->seq.store(pos + _mask + 1, std::memory_order_release);
    return true;
  }

  /// A task is published at the head (a pop would probably succeed). Read-only.
  bool has_ready() const noexcept {
    std::uint64_t pos = _deq.load(std::memory_order_relaxed);
    return _cells[pos & _mask].seq.load(std::memory_order_acquire) == pos + 1;
  }

  /// After close() no push succeeds; pushes that claimed a cell before still publish it.
  void close() noexcept { _enq.fetch_or(closed_bit, std::memory_order_seq_cst); }
  bool closed() const noexcept { return (_enq.load(std::memory_order_relaxed) & closed_bit) != 0; }

  /// Closed and every task ever pushed has been popped.
  bool drained() const noexcept {
    std::uint64_t enq = _enq.load(std::memory_order_acquire);
    return (enq & closed_bit) != 0 && _deq.load(std::memory_order_acquire) >= (enq & ~closed_bit);
  }

  /// Tasks pushed (or being pushed) and not yet popped; approximate under concurrency.
  std::uint64_t size_approx() const noexcept {
    std::uint64_t deq = _deq.load(std::memory_order_relaxed);
    std::uint64_t enq = _enq.load(std::memory_order_relaxed) & ~closed_bit;
    return enq > deq ? enq - deq : 0;
  }

 private:
  struct cell {
    std::atomic<std::uint64_t> seq;
    Task task;
  };

  static std::uint64_t round_up(std::uint32_t n) noexcept {
    std::uint64_t cap = 2;
    while (cap < n) cap <<= 1;
    return cap;
  }

  const std::uint64_t _mask;
  const std::unique_ptr<cell[]> _cells;
  // Producers and consumers each own one line; neither writes the other's.
  alignas(cache_line) std::atomic<std::uint64_t> _enq{0};
  alignas(cache_line) std::atomic<std::uint64_t> _deq{0};
};

}  // namespace wspush::pool::detail
