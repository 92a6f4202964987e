#include "server/base/heap.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>

#if __has_include(<mimalloc.h>)
#include <mimalloc.h>
// Weak: only the wspush executable links mimalloc; in the tests' binaries these are null.
#pragma weak mi_collect
#pragma weak mi_option_get
#pragma weak mi_option_set
#define WSPUSH_HEAP_MIMALLOC 1
#endif

namespace wspush::server {

namespace {

constexpr std::size_t worth_a_collect = std::size_t{1} << 20;

std::atomic<std::size_t> pending{0};      // released since the last epoch
std::atomic<std::uint64_t> epoch{0};      // one step per worth_a_collect released
thread_local std::uint64_t seen_epoch = 0;

}  // namespace

void heap_released(std::size_t bytes) noexcept {
  if (bytes == 0) return;
  if (pending.fetch_add(bytes, std::memory_order_relaxed) + bytes < worth_a_collect) return;
  pending.store(0, std::memory_order_relaxed);
  epoch.fetch_add(1, std::memory_order_relaxed);
}

void heap_collect() noexcept {
#ifdef WSPUSH_HEAP_MIMALLOC
  std::uint64_t now = epoch.load(std::memory_order_relaxed);
  if (now == seen_epoch || &mi_collect == nullptr) return;
  seen_epoch = now;
  // The decommit delay is process-wide: set it to 0 for the collect only, so the pages it
  // empties leave now rather than at a later touch this quiet thread may never make. One
  // thread at a time, so that none restores the delay under another's collect; other
  // threads' frees meanwhile decommit at once too, which costs them nothing but a syscall.
  static std::mutex option;
  std::lock_guard lock(option);
  long delay = mi_option_get(mi_option_decommit_delay);
  mi_option_set(mi_option_decommit_delay, 0);
  mi_collect(false);
  mi_option_set(mi_option_decommit_delay, delay);
#endif
}

}  // namespace wspush::server
