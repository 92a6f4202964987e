#pragma once
/// \file parking.hpp
/// Where threads sleep when there is nothing for them: workers waiting for work,
/// schedulers waiting for room. The fast path of a notifier is two loads (no lock, no
/// syscall) when nobody sleeps, which is the steady state of a busy pool.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "pool/detail/spin.hpp"

namespace wspush::pool::detail {

/// A set of parked threads and the wake-ups granted to them.
///
/// Protocol (no lost wake-ups):
/// - a notifier publishes its state change, calls store_load_fence(), then wake_one();
/// - a parker calls park_until(ready, deadline): under the mutex it registers in
///   `_waiting` (a seq_cst RMW), re-checks `ready()`, and only then sleeps.
/// Either the notifier sees the registration, or the parker's re-check sees the change.
/// `_tokens` counts wake-ups granted but not yet consumed, so that a burst of notifiers
/// does not make one syscall each while the woken thread is still getting up. Invariant
/// (under the mutex): `_tokens <= _waiting`.
class parking {
 public:
  using clock = std::chrono::steady_clock;

  /// Some parked thread has no wake-up pending. Call after store_load_fence()
  /// following the state change.
  bool needs_wake() const noexcept {
    return _waiting.load(std::memory_order_relaxed) > _tokens.load(std::memory_order_relaxed);
  }

  /// Wakes one parked thread if some parked thread has no wake-up pending.
  /// Call after store_load_fence() following the state change.
  void wake_one() noexcept {
    if (needs_wake()) wake_one_slow();
  }

  /// Wakes every parked thread (shutdown).
  void wake_all() noexcept {
    std::lock_guard lock(_mutex);
    _tokens.store(_waiting.load(std::memory_order_relaxed), std::memory_order_relaxed);
    _cv.notify_all();
  }

  /// Sleeps until woken, `ready()` holds, or `deadline` passes. Returns false on timeout
  /// (without a wake-up and with `ready()` false). `ready` is called under the mutex and
  /// must only read atomics.
  template <class Ready>
  bool park_until(Ready&& ready, clock::time_point deadline) noexcept {
    std::unique_lock lock(_mutex);
    _waiting.fetch_add(1, std::memory_order_seq_cst);
    store_load_fence();
    bool woken = true;
    while (_tokens.load(std::memory_order_relaxed) == 0 && !ready()) {
      if (_cv.wait_until(lock, deadline) == std::cv_status::timeout) {
        woken = _tokens.load(std::memory_order_relaxed) != 0 || ready();
        break;
      }
    }
    auto tokens = _tokens.load(std::memory_order_relaxed);
    if (tokens != 0) _tokens.store(tokens - 1, std::memory_order_relaxed);
    _waiting.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    // Pairs with the notifier's fence: whatever it published before granting (or
    // skipping, because a wake-up was pending) the token is visible to our re-check.
    store_load_fence();
    return woken;
  }

  /// Threads parked right now (or registering); for statistics.
  std::uint32_t waiting() const noexcept { return _waiting.load(std::memory_order_relaxed); }

 private:
  void wake_one_slow() noexcept {
    std::lock_guard lock(_mutex);
    auto waiting = _waiting.load(std::memory_order_relaxed);
    auto tokens = _tokens.load(std::memory_order_relaxed);
    if (waiting > tokens) {
      _tokens.store(tokens + 1, std::memory_order_relaxed);
      _cv.notify_one();
    }
  }

  std::atomic<std::uint32_t> _waiting{0};
  std::atomic<std::uint32_t> _tokens{0};
  std::mutex _mutex;
  std::condition_variable _cv;
};

}  // namespace wspush::pool::detail
