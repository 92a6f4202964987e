#pragma once
// A connection's queued output: shared frames in order, the first perhaps partly sent. It
// exists only while output is pending: an idle connection's queue is an empty pointer, and the
// block it lives in (a header, then a ring of frame references) goes back to the pool as soon
// as the last byte has left.
//
// It also holds the slow-consumer policy. The bound (--max-pending-bytes) judges the backlog
// the kernel would not take, never what merely piled up between two writes: a burst that
// lands within one loop iteration and that a fast reader absorbs must not trip it. So queuing
// past the bound is "over" (write it out soon), and only a connection the kernel has already
// refused (a short write, or an asynchronous send still waiting a turn after it was offered)
// is "slow" while over the bound. That verdict weighs what waits behind the frame being
// written, so one frame larger than the bound is judged by time instead: `taken` counts the
// bytes the kernel took, and the connection watches it (connections::judge_stalls).

#include <cstdint>
#include <span>

#include <sys/uio.h>

#include "pool/buffer_pool.hpp"
#include "pool/lease.hpp"
#include "pool/shared_frame.hpp"

namespace wspush::server {

class out_queue {
 public:
  enum class verdict : std::uint8_t {
    ok,    ///< within the bound
    over,  ///< over the bound, and the kernel has not been offered it yet: write it out now
    slow,  ///< over the bound after the kernel took what it could: a slow consumer
  };

  out_queue() noexcept = default;
  out_queue(out_queue&&) noexcept = default;
  out_queue& operator=(out_queue&& other) noexcept;
  ~out_queue() { clear(); }

  bool empty() const noexcept { return !_block || head().count == 0; }
  /// Unsent bytes (those of a send in flight included).
  std::uint64_t bytes() const noexcept { return _block ? head().bytes : 0; }
  std::uint32_t frames() const noexcept { return _block ? head().count : 0; }

  /// Appends a frame. False when out of memory (the frame is dropped).
  bool push(pool::buffer_pool& pool, pool::frame_ref f) noexcept;
  /// Queues the pong for a ping with `payload` (at most 125 bytes). A pong still waiting
  /// unsent is rewritten with this payload instead (RFC 6455 §5.5.3 lets an endpoint answer
  /// only the most recent ping): whatever a client sends, at most one pong waits.
  bool push_pong(pool::buffer_pool& pool, std::span<const std::uint8_t> payload) noexcept;

  /// Fills `iov` with the unsent bytes, oldest first; returns how many entries, and the bytes
  /// they cover in `offered`, at most `max_bytes` of them unless the first frame alone is more.
  /// The iovecs stay valid while the frames are queued.
  int gather(std::span<iovec> iov, std::size_t& offered, std::size_t max_bytes = SIZE_MAX) const noexcept;
  /// An asynchronous send of the first `offered` unsent bytes was issued in loop turn `turn`:
  /// those frames must not change or go until it ends (consume() ends it).
  void sending(std::size_t offered, std::uint64_t turn) noexcept;
  /// Bytes offered to the send in flight (0: none), and the loop turn it was issued in.
  std::uint64_t in_flight() const noexcept { return _block ? head().offered : 0; }
  std::uint64_t sent_turn() const noexcept { return _block ? head().sent_turn : 0; }
  /// `n` bytes left (the send in flight, if any, has ended): the frames they finish are
  /// released, and the block too once nothing is left.
  void consume(std::size_t n) noexcept;

  /// The slow-consumer policy: `stuck` says the kernel has been offered earlier bytes and has
  /// not taken them all (see the file comment). What is judged is the backlog behind the frame
  /// being written: one message may be larger than the bound (it is bounded by the message
  /// size limit) and still go out at the reader's pace.
  verdict judge(std::uint64_t bound, bool stuck) const noexcept {
    if (backlog() <= bound) return verdict::ok;
    return stuck ? verdict::slow : verdict::over;
  }
  /// Bytes the kernel has taken since the queue was last empty: the watch on a connection over
  /// the bound compares it from tick to tick to see whether the reader still takes anything.
  std::uint64_t taken() const noexcept { return _block ? head().taken : 0; }
  /// Marks a non-empty queue as watched; false if it already was (one watch per queue) or is empty.
  bool watch() noexcept {
    if (!_block || head().watched) return false;
    return head().watched = true;
  }
  void unwatch() noexcept {
    if (_block) head().watched = false;
  }
  /// Unsent bytes behind the first frame.
  std::uint64_t backlog() const noexcept {
    if (!_block || head().count == 0) return 0;
    return head().bytes - (at(0).bytes().size() - head().offset);
  }

  /// Drops the frames the kernel has not been offered yet (a connection being closed as a slow
  /// consumer: what it did not read it will not get). Bytes of a send in flight, or of a frame
  /// partly sent, stay.
  void drop_unsent() noexcept;
  /// Releases everything. Not while a send is in flight (its bytes would go with it).
  void clear() noexcept;

 private:
  struct header {
    std::uint32_t first = 0, count = 0, cap = 0;
    std::uint32_t offset = 0;       // bytes of the first frame already sent
    std::uint64_t bytes = 0;        // unsent bytes
    std::uint64_t offered = 0;      // bytes of the send in flight
    std::uint64_t sent_turn = 0;    // the loop turn that send was issued in
    std::uint64_t popped = 0;       // frames released so far (positions are absolute)
    std::uint64_t pong_at = UINT64_MAX;  // position of the pong that waits unsent, if any
    std::uint64_t taken = 0;        // bytes the kernel took so far
    bool watched = false;           // a stall watch follows this queue
  };
  static constexpr std::size_t first_block = 256;

  header& head() const noexcept { return *reinterpret_cast<header*>(_block.data()); }
  pool::frame_ref* slots() const noexcept { return reinterpret_cast<pool::frame_ref*>(_block.data() + sizeof(header)); }
  pool::frame_ref& at(std::uint32_t k) const noexcept { return slots()[(head().first + k) % head().cap]; }
  bool room(pool::buffer_pool& pool) noexcept;
  bool pong_waiting(header& h, std::uint32_t& k) const noexcept;

  pool::lease _block;
};
static_assert(sizeof(out_queue) == sizeof(void*), "out_queue budget: one pointer in the connection record");

}  // namespace wspush::server
