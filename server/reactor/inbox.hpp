#pragma once
// A loop's inbox: how other threads (pool workers, the hub, other shards) hand a loop work.
// Each consumer on the loop owns an inbox of its own item type; the loop owns the wake-up and
// drains every inbox once per iteration, within a budget of work, so a flood from one producer
// cannot hold up the sockets. Posting never waits: a full inbox, or one whose loop has stopped,
// refuses the item and leaves it with the caller.

#include <cstdint>
#include <utility>

#include "pool/mpsc_queue.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server {

/// What the loop sees of an inbox.
class inbox_base {
 public:
  virtual ~inbox_base() = default;
  /// Consumes items until `budget` units of work are spent, the queue is empty, or `stop`
  /// becomes true. True when items remain.
  virtual bool drain(std::uint64_t& budget, const bool& stop) noexcept = 0;
};

/// Consumes one item on the loop's thread; returns the units of work it cost (for the
/// loop's budget: a fan-out counts its deliveries, anything else 1).
template <class T>
class inbox_consumer {
 public:
  virtual ~inbox_consumer() = default;
  virtual std::uint64_t on_item(T&& item) noexcept = 0;
  /// After each pass over the inbox (the budget is spent or the inbox is empty): a consumer
  /// that gathers items into batches finishes the last one here.
  virtual void on_pass_end() noexcept {}
};

template <class T>
class inbox final : public inbox_base {
 public:
  /// Registers with `l` (start-up, before the loop runs); both `l` and `consumer` must outlive
  /// the inbox. Items still queued when it is destroyed are destroyed with it.
  inbox(loop& l, std::size_t capacity, inbox_consumer<T>& consumer)
      : _loop(l), _q(capacity), _consumer(consumer) {
    _loop.add_inbox(*this);
  }
  ~inbox() override { _loop.remove_inbox(*this); }
  inbox(const inbox&) = delete;
  inbox& operator=(const inbox&) = delete;

  /// Any thread. False when the inbox is full or its loop has stopped: `item` stays with the
  /// caller. With `wake` false the loop is not woken (a batch: call wake() after it).
  bool post(T&& item, bool wake = true) noexcept {
    if (_loop.stopped() || !_q.try_push(std::move(item))) return false;
    if (wake) _loop.wake();
    return true;
  }
  void wake() noexcept { _loop.wake(); }
  /// The loop has stopped: nothing posted now will be consumed.
  bool closed() const noexcept { return _loop.stopped(); }
  /// Over three quarters full (approximate, any thread): a producer that must not wait (a
  /// shard posting to a sibling, the admin API) refuses work instead of filling it up.
  bool crowded() const noexcept { return _q.size_approx() > _q.capacity() / 4 * 3; }
  std::size_t capacity() const noexcept { return _q.capacity(); }

  bool drain(std::uint64_t& budget, const bool& stop) noexcept override {
    T item;
    while (budget > 0 && !stop && _q.try_pop(item)) {
      std::uint64_t cost = _consumer.on_item(std::move(item));
      budget -= cost < budget ? cost : budget;
    }
    _consumer.on_pass_end();
    return _q.size_approx() > 0;
  }

 private:
  loop& _loop;
  pool::mpsc_queue<T> _q;
  inbox_consumer<T>& _consumer;
};

}  // namespace wspush::server
