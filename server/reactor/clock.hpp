#pragma once
// The monotonic clock the loops, the timer wheel's ticks and the history's ages share.

#include <cstdint>
#include <ctime>

namespace wspush::server {

inline std::uint64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1'000'000'000 + std::uint64_t(ts.tv_nsec);
}

}  // namespace wspush::server
