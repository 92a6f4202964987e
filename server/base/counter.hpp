#pragma once
// A counter written by one thread (its shard) and read by any (a metrics scrape): relaxed load
// and store, so the hot path pays no locked instruction and readers never see a torn value.

#include <atomic>
#include <cstdint>

namespace wspush::server {

class relaxed_counter {
 public:
  void add(std::uint64_t n = 1) noexcept { _v.store(_v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  void sub(std::uint64_t n = 1) noexcept { _v.store(_v.load(std::memory_order_relaxed) - n, std::memory_order_relaxed); }
  void set(std::uint64_t v) noexcept { _v.store(v, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return _v.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> _v{0};
};

}  // namespace wspush::server
