#pragma once
/// \file rate_limiter.hpp
/// Paces events (connection opens, publishes) at a fixed rate without drift: event k is due at
/// start + k / rate, so a late wake-up is made up at the next one instead of slowing the whole
/// run. The make-up is bounded by `burst`: after a long stall (the process was descheduled on a
/// loaded machine) at most `burst` events are released at once and the rest of the debt is
/// dropped, so a stall never turns into a thundering herd.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace wspush::loadgen {

class rate_limiter {
public:
  /// `per_second` <= 0 means unlimited: take() grants everything asked for.
  rate_limiter(double per_second, std::uint64_t start_ns, std::uint64_t burst = 64) noexcept
      : _rate(per_second), _start(start_ns), _burst(std::max<std::uint64_t>(burst, 1)) {}

  /// Grants up to `want` events that are due at `now_ns` and counts them as taken.
  std::uint64_t take(std::uint64_t now_ns, std::uint64_t want) noexcept {
    if (_rate <= 0) {
      _taken += want;
      return want;
    }
    std::uint64_t due = due_by(now_ns);
    if (due > _taken + _burst) {
      _dropped += due - _taken - _burst;   // forget the debt of a stall beyond the burst
      due = _taken + _burst;
    }
    const std::uint64_t n = std::min(want, due > _taken ? due - _taken : 0);
    _taken += n;
    return n;
  }

  /// Nanoseconds from `now_ns` until the next event is due (0: one is due now).
  [[nodiscard]] std::uint64_t wait_ns(std::uint64_t now_ns) const noexcept {
    if (_rate <= 0) return 0;
    const std::uint64_t at = due_at(_taken + _dropped);
    return at > now_ns ? at - now_ns : 0;
  }

  [[nodiscard]] std::uint64_t taken() const noexcept { return _taken; }
  [[nodiscard]] std::uint64_t dropped() const noexcept { return _dropped; }

private:
  /// Events due by `now`, counting dropped ones: the first is due at start itself.
  [[nodiscard]] std::uint64_t due_by(std::uint64_t now) const noexcept {
    if (now < _start) return 0;
    // ns * rate first, then / 1e9: exact for whole numbers, so an event due exactly now counts.
    const auto due = static_cast<std::uint64_t>(std::floor(static_cast<double>(now - _start) * _rate / 1e9)) + 1;
    return due > _dropped ? due - _dropped : 0;
  }
  [[nodiscard]] std::uint64_t due_at(std::uint64_t k) const noexcept {
    return _start + static_cast<std::uint64_t>(std::ceil(static_cast<double>(k) * 1e9 / _rate));
  }

  double _rate;
  std::uint64_t _start;
  std::uint64_t _burst;
  std::uint64_t _taken = 0;
  std::uint64_t _dropped = 0;
};

}  // namespace wspush::loadgen
