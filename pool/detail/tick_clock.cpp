#include "pool/detail/tick_clock.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace wspush::pool::detail {

namespace {

#if defined(__x86_64__)
/// CPUID 0x80000007 EDX bit 8: the TSC ticks at a constant rate in every P/C-state and
/// (with the kernel's checks) agrees across cores; without it RDTSC is no clock.
bool has_invariant_tsc() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (unsigned(__get_cpuid_max(0x80000000u, nullptr)) < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d & (1u << 8)) != 0;
}

/// One (tsc, ns) pair taken as tightly as possible: the TSC read on each side of the
/// clock read, retried a few times to keep the narrowest bracket (a preemption inside
/// the bracket would skew the rate).
struct sample {
  std::uint64_t tsc;
  std::int64_t ns;
};
sample take_sample() noexcept {
  sample best{0, 0};
  std::uint64_t best_width = ~std::uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    std::uint64_t t0 = __rdtsc();
    auto ns = std::chrono::steady_clock::now().time_since_epoch().count();
    std::uint64_t t1 = __rdtsc();
    if (t1 - t0 < best_width) {
      best_width = t1 - t0;
      best = {t0 + (t1 - t0) / 2, std::int64_t(ns)};
    }
  }
  return best;
}
#endif

}  // namespace

tick_clock::calibration tick_clock::calibrate() noexcept {
#if defined(__x86_64__)
  if (has_invariant_tsc()) {
    sample a = take_sample();
    sample b;
    do {
      b = take_sample();
    } while (b.ns - a.ns < 200'000);
    double rate = double(b.tsc - a.tsc) / double(b.ns - a.ns);
    if (rate > 0.05 && rate < 100.0) return {rate, true};
  }
#endif
  return {1.0, false};
}

}  // namespace wspush::pool::detail
