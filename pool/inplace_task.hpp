#pragma once
/// \file inplace_task.hpp
/// A move-only, type-erased `void()` callable stored inline: no heap, ever. The pool's
/// queue slots hold these, so scheduling a task is a copy of a few cache lines.

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace wspush::pool {

/// Move-only `void()` callable of at most `Capacity` bytes, stored inline.
///
/// Construction from a callable that is bigger than `Capacity` or more aligned than
/// `std::max_align_t` is a compile error (static_assert), never a silent allocation.
/// Destroying a task that never ran destroys the callable: that is how cancelled work
/// releases what it captured. A moved-from task is empty.
template <std::size_t Capacity>
class inplace_task {
 public:
  static constexpr std::size_t capacity = Capacity;
  static constexpr std::size_t alignment = alignof(std::max_align_t);

  inplace_task() noexcept = default;

  /// Wraps `fn`. Implicit, so `pool.schedule([&] { ... })` reads naturally.
  template <class Fn, class D = std::decay_t<Fn>,
            class = std::enable_if_t<!std::is_same_v<D, inplace_task> && std::is_invocable_v<D&>>>
  inplace_task(Fn&& fn) noexcept(std::is_nothrow_constructible_v<D, Fn&&>) {  // NOLINT: implicit
    static_assert(sizeof(D) <= Capacity, "callable too big for this inplace_task: capture less");
    static_assert(alignof(D) <= alignment, "over-aligned callable cannot be stored inline");
    static_assert(std::is_nothrow_move_constructible_v<D>, "callable must be nothrow movable");
    ::new (static_cast<void*>(_storage)) D(std::forward<Fn>(fn));
    _ops = &ops_for<D>;
  }

  inplace_task(inplace_task&& other) noexcept { take(other); }

  inplace_task& operator=(inplace_task&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }

  inplace_task(const inplace_task&) = delete;
  inplace_task& operator=(const inplace_task&) = delete;

  ~inplace_task() { reset(); }

  explicit operator bool() const noexcept { return _ops != nullptr; }

  /// Runs the callable. Precondition: not empty. May throw whatever the callable throws.
  void operator()() { _ops->invoke(_storage); }

  /// Destroys the callable (if any) without running it; the task becomes empty.
  void reset() noexcept {
    if (_ops != nullptr) {
      if (_ops->destroy != nullptr) _ops->destroy(_storage);
      _ops = nullptr;
    }
  }

 private:
  /// Per-type operations. A null `relocate` means "trivially copyable: memcpy the
  /// storage", a null `destroy` means "trivially destructible": the common capture-a-few-
  /// pointers lambda moves with one fixed-size copy and no indirect call.
  struct ops {
    void (*invoke)(void*);
    void (*relocate)(void* dst, void* src) noexcept;
    void (*destroy)(void*) noexcept;
  };

  template <class D>
  static constexpr ops ops_for{
      [](void* p) { (*static_cast<D*>(p))(); },
      std::is_trivially_copyable_v<D> ? nullptr
                                      : +[](void* dst, void* src) noexcept {
                                          D* s = static_cast<D*>(src);
                                          ::new (dst) D(std::move(*s));
                                          s->~D();
                                        },
      std::is_trivially_destructible_v<D> ? nullptr
                                          : +[](void* p) noexcept { static_cast<D*>(p)->~D(); }};

  void take(inplace_task& other) noexcept {
    _ops = other._ops;
    if (_ops == nullptr) return;
    if (_ops->relocate == nullptr) {
      std::memcpy(_storage, other._storage, Capacity);
    } else {
      _ops->relocate(_storage, other._storage);
    }
    other._ops = nullptr;
  }

  alignas(alignment) unsigned char _storage[Capacity];
  const ops* _ops = nullptr;
};

}  // namespace wspush::pool
