#pragma once
/// \file tick_clock.hpp
/// The clock behind the task-duration histogram. One read per task is the budget: on x86
/// with an invariant TSC that is RDTSC (~10 ns here) instead of clock_gettime (~23 ns);
/// elsewhere steady_clock nanoseconds. Ticks are converted to time only when stats are
/// read.

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace wspush::pool::detail {

struct tick_clock {
  /// Ticks per nanosecond and whether the TSC is used; measured once per process.
  struct calibration {
    double ticks_per_ns;
    bool uses_tsc;
  };
  /// Measured on first use (about 200 us of spinning, once per process).
  static const calibration& get() noexcept {
    static const calibration c = calibrate();
    return c;
  }

  static std::uint64_t now() noexcept {
#if defined(__x86_64__)
    if (get().uses_tsc) return __rdtsc();
#endif
    return std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }

 private:
  static calibration calibrate() noexcept;
};

}  // namespace wspush::pool::detail
