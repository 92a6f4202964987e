#pragma once
/// \file spin.hpp
/// Low-level helpers shared by the pool's concurrent structures: a CPU pause hint, the
/// store→load fence the wake-up protocols rely on, and a tiny spinlock for very short
/// critical sections (a free-list pop is a handful of instructions).

#include <atomic>
#include <cstddef>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace wspush::pool::detail {

/// Size of a cache line, used to keep independently written fields apart.
inline constexpr std::size_t cache_line = 64;

/// Tells the CPU we are busy-waiting (PAUSE on x86): saves power and lets the sibling
/// hyper-thread run.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Full fence ordering an earlier store before a later load (the Dekker pattern every
/// "publish, then check whether someone sleeps" / "register as sleeper, then re-check"
/// pair needs). TSan does not model atomic_thread_fence and GCC warns about it there, so
/// under TSan a seq_cst RMW on a private atomic stands in (a locked instruction on x86,
/// which is the same barrier in hardware).
inline void store_load_fence() noexcept {
#if defined(__SANITIZE_THREAD__)
  static thread_local std::atomic<int> dummy{0};
  dummy.fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

/// Test-and-test-and-set spinlock. Meant for critical sections of a few instructions;
/// after a short spin it yields, so a holder preempted on a busy machine costs the
/// waiter a context switch rather than a full time slice of spinning.
class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0;; ++spins) {
      if (!_locked.exchange(true, std::memory_order_acquire)) return;
      while (_locked.load(std::memory_order_relaxed)) {
        if (++spins < 64) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  bool try_lock() noexcept { return !_locked.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { _locked.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> _locked{false};
};

/// Increment of a counter written by one thread only and read by others: a relaxed
/// load+store avoids the locked RMW (and its cache-line ownership fight) of fetch_add.
inline void owner_add(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace wspush::pool::detail
