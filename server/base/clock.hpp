#pragma once
// The clocks every floor shares: the monotonic one the loops, the timer wheel's ticks and the
// history's ages use, and the wall clock that token expiry (`exp`, unix seconds) is read against.

#include <cstdint>
#include <ctime>

namespace wspush::server {

inline std::uint64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1'000'000'000 + std::uint64_t(ts.tv_nsec);
}

inline std::int64_t realtime_ms() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

}  // namespace wspush::server
