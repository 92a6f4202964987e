#pragma once
// A rate every shard of the process shares, without a lock: the generic cell rate algorithm.
// One atomic holds the theoretical arrival time of the next request; a request is admitted if
// the gate is booked no further than its burst ahead of now, and books one interval more. A
// refused request books nothing, so a storm of refusals costs a load and a counter each.
//
// It also says how long a refused client should stay away: the refusals of the current second
// divided by the rate is how long the gate needs to take them all, and each client gets a
// random share of it, so that a reconnect storm comes back spread over that time instead of
// at once (and is refused again at once).

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace wspush::server {

class rate_gate {
 public:
  rate_gate() noexcept = default;
  rate_gate(double per_second, double burst) noexcept { configure(per_second, burst); }
  /// `per_second` requests a second (0: every request is admitted), and bursts of up to
  /// `burst` at once after a quiet spell. Any time, from any thread (SIGHUP): a request meanwhile
  /// may see the old interval with the new burst, or the other way round, once.
  void configure(double per_second, double burst) noexcept {
    _tolerance.store(per_second > 0 ? std::int64_t(std::max(burst - 1, 0.0) * 1e9 / per_second) : 0,
                     std::memory_order_relaxed);
    _rate.store(per_second, std::memory_order_relaxed);
    _interval.store(per_second > 0 ? std::int64_t(1e9 / per_second) : 0, std::memory_order_relaxed);
  }

  bool limits() const noexcept { return _interval.load(std::memory_order_relaxed) > 0; }

  /// Whether a request at `now_ns` (monotonic) goes through.
  bool admit(std::int64_t now_ns) noexcept {
    const std::int64_t interval = _interval.load(std::memory_order_relaxed);
    if (interval == 0) return true;
    const std::int64_t tolerance = _tolerance.load(std::memory_order_relaxed);
    std::int64_t tat = _tat.load(std::memory_order_relaxed);
    while (true) {
      const std::int64_t start = std::max(tat, now_ns);
      if (start - now_ns > tolerance) {
        note_refusal(now_ns);
        return false;
      }
      if (_tat.compare_exchange_weak(tat, start + interval, std::memory_order_relaxed)) return true;
    }
  }

  /// Seconds a refused client should wait before it tries again: 1 to the time the gate needs
  /// for this second's refusals (at least 2, at most 60), drawn with `random`.
  std::uint32_t retry_after(std::uint64_t random) const noexcept {
    const double backlog =
        double(_refused.load(std::memory_order_relaxed)) / std::max(_rate.load(std::memory_order_relaxed), 1e-9);
    const auto spread = std::uint32_t(std::clamp(backlog, 2.0, 60.0));
    return 1 + std::uint32_t(random % spread);
  }

 private:
  void note_refusal(std::int64_t now_ns) noexcept {
    const std::int64_t second = now_ns / 1'000'000'000;
    std::int64_t seen = _second.load(std::memory_order_relaxed);
    if (seen != second && _second.compare_exchange_strong(seen, second, std::memory_order_relaxed))
      _refused.store(0, std::memory_order_relaxed);
    _refused.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<std::int64_t> _interval{0}, _tolerance{0};
  std::atomic<double> _rate{0};
  std::atomic<std::int64_t> _tat{0};
  std::atomic<std::int64_t> _second{0};
  std::atomic<std::uint32_t> _refused{0};
};

}  // namespace wspush::server
