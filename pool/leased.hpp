#pragma once
/// \file leased.hpp
/// A leased block that starts with a live object: `leased<T>` owns a pooled block whose
/// first bytes hold a T constructed in place, and whose remaining bytes (the tail) are the
/// object's to use (request bytes behind an upgrade job, frame slots behind a queue's
/// header). Destroying it destroys the T, then returns the block. One pointer, move-only,
/// so it travels through queues and tasks as itself: ownership is in the type.

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#include "pool/buffer_pool.hpp"
#include "pool/lease.hpp"

namespace wspush::pool {

template <class T>
class leased {
  static_assert(alignof(T) <= 32, "pooled blocks are 32-byte aligned");

 public:
  leased() noexcept = default;
  leased(leased&&) noexcept = default;
  leased& operator=(leased&& other) noexcept {
    if (this != &other) {
      reset();
      _l = std::move(other._l);
    }
    return *this;
  }
  ~leased() { reset(); }

  /// A block of at least sizeof(T) + tail_bytes with a T built from `args`; empty when the
  /// pool has no memory (or the size is over its largest block).
  template <class... Args>
  static leased make(buffer_pool& pool, std::size_t tail_bytes, Args&&... args) noexcept {
    static_assert(std::is_nothrow_constructible_v<T, Args&&...>);
    leased out;
    out._l = pool.acquire(sizeof(T) + tail_bytes);
    if (out._l) {
      ::new (static_cast<void*>(out._l.data())) T(std::forward<Args>(args)...);
      out._l.set_size(sizeof(T));
    }
    return out;
  }

  explicit operator bool() const noexcept { return bool(_l); }
  T* get() const noexcept { return _l ? std::launder(reinterpret_cast<T*>(_l.data())) : nullptr; }
  T* operator->() const noexcept { return get(); }
  T& operator*() const noexcept { return *get(); }

  /// The bytes after the object, and how many there are.
  std::uint8_t* tail() const noexcept { return _l.data() + sizeof(T); }
  std::size_t tail_capacity() const noexcept { return _l ? _l.capacity() - sizeof(T) : 0; }

  /// Moves to a bigger block if the tail holds fewer than `min_tail` bytes, keeping the object
  /// and the first `keep` tail bytes (the object moves as bytes: T is trivially copyable).
  /// False (nothing changed) when out of memory.
  bool reserve_tail(std::size_t keep, std::size_t min_tail) noexcept {
    static_assert(std::is_trivially_copyable_v<T>, "reserve_tail moves the object with its bytes");
    if (min_tail <= tail_capacity()) return true;
    _l.set_size(sizeof(T) + keep);
    return _l.reserve(sizeof(T) + min_tail);
  }

  /// Destroys the object and returns the block now.
  void reset() noexcept {
    if (!_l) return;
    get()->~T();
    _l.reset();
  }

 private:
  lease _l;
};
static_assert(sizeof(leased<int>) == sizeof(void*), "leased budget: one pointer");

}  // namespace wspush::pool
