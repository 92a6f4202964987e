#pragma once
/// \file shared_frame.hpp
/// A frame encoded once and shared by every subscriber it goes to (fan-out): a pooled
/// block with an atomic reference count in its header. Copying a frame_ref is one
/// atomic increment; the last reference returns the block to its pool.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "pool/lease.hpp"

namespace wspush::pool {

/// Shared, read-only reference to a pooled block. One pointer. The bytes are immutable
/// once adopted: writers finish encoding into the lease before adopt().
class frame_ref {
 public:
  frame_ref() noexcept = default;

  /// Takes the block over from `l` (which becomes empty); refcount 1. An empty lease
  /// gives an empty frame_ref.
  static frame_ref adopt(lease&& l) noexcept {
    frame_ref f(l.release_block());
    if (f._blk != nullptr) f._blk->refs.store(1, std::memory_order_relaxed);
    return f;
  }

  frame_ref(const frame_ref& other) noexcept : _blk(other._blk) { add_ref(); }
  frame_ref& operator=(const frame_ref& other) noexcept {
    frame_ref copy(other);
    swap(copy);
    return *this;
  }
  frame_ref(frame_ref&& other) noexcept : _blk(std::exchange(other._blk, nullptr)) {}
  frame_ref& operator=(frame_ref&& other) noexcept {
    frame_ref moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~frame_ref() { reset(); }

  explicit operator bool() const noexcept { return _blk != nullptr; }

  /// The frame's bytes; valid while any reference to the block exists.
  std::span<const std::uint8_t> bytes() const noexcept {
    if (_blk == nullptr) return {};
    return {_blk->data(), _blk->size};
  }

  /// Bytes of data the block holds room for (its size class): what keeping the frame costs.
  std::size_t capacity() const noexcept { return _blk != nullptr ? _blk->capacity : 0; }

  /// Approximate when other threads copy or drop references concurrently.
  std::uint32_t use_count() const noexcept {
    return _blk != nullptr ? _blk->refs.load(std::memory_order_relaxed) : 0;
  }

  /// Drops this reference now.
  void reset() noexcept {
    if (_blk == nullptr) return;
    auto* b = std::exchange(_blk, nullptr);
    // acq_rel: every holder's reads of the bytes happen before the block is reused.
    if (b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) detail::release_block(b);
  }

  void swap(frame_ref& other) noexcept { std::swap(_blk, other._blk); }

  /// Pairs this frame with `twin`, the same message in another encoding (the permessage-deflate
  /// frame of an event): whoever shares this frame shares the twin with it, into a history, a
  /// replay, a joined run. Only while this is the frame's one reference, before it is shared,
  /// and at most once; otherwise false, and nothing changes.
  bool set_twin(frame_ref&& twin) noexcept {
    if (_blk == nullptr || !twin._blk || twin._blk == _blk || _blk->next_free != nullptr ||
        _blk->refs.load(std::memory_order_relaxed) != 1)
      return false;
    _blk->next_free = std::exchange(twin._blk, nullptr);  // its reference moves into this block
    return true;
  }
  /// A reference to the twin; empty when there is none.
  frame_ref twin() const noexcept {
    if (_blk == nullptr || _blk->next_free == nullptr) return {};
    frame_ref t(_blk->next_free);
    t.add_ref();
    return t;
  }
  bool has_twin() const noexcept { return _blk != nullptr && _blk->next_free != nullptr; }
  /// Bytes of data the twin's block holds room for; 0 when there is none.
  std::size_t twin_capacity() const noexcept { return has_twin() ? _blk->next_free->capacity : 0; }
  /// The twin's bytes (empty when there is none), valid while this frame lives.
  std::span<const std::uint8_t> twin_bytes() const noexcept {
    if (!has_twin()) return {};
    return {_blk->next_free->data(), _blk->next_free->size};
  }

  /// Gives up this reference as a raw pointer (for io_uring user_data, intrusive queues,
  /// C APIs); the count is unchanged. Null when empty. Take it back with from_raw().
  void* release_raw() noexcept { return std::exchange(_blk, nullptr); }
  /// Takes back a reference given up by release_raw(); exactly once per release_raw().
  static frame_ref from_raw(void* raw) noexcept {
    return frame_ref(static_cast<detail::block_header*>(raw));
  }

 private:
  explicit frame_ref(detail::block_header* b) noexcept : _blk(b) {}
  void add_ref() const noexcept {
    // relaxed: a new reference is made from an existing one, which keeps the block alive.
    if (_blk != nullptr) _blk->refs.fetch_add(1, std::memory_order_relaxed);
  }

  detail::block_header* _blk = nullptr;
};
static_assert(sizeof(frame_ref) == sizeof(void*), "frame_ref budget: one pointer");

}  // namespace wspush::pool
