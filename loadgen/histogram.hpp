#pragma once
/// \file histogram.hpp
/// Fixed-memory, log-bucketed latency histogram (HDR-style) and its compact wire form.
///
/// Values below 256 are counted exactly; above, every power of two is split into 128 linear
/// sub-buckets, so a bucket is at most 1/128 of its lower bound wide and the midpoint we report
/// is within ~0.4% of any value that fell into it. The whole uint64 range fits in 7,424
/// counters. Worker processes ship histograms to the parent in a sparse form (only the non-zero
/// buckets), so a one-second interval histogram costs a few hundred bytes on the pipe, and the
/// parent merges by adding counters: merging is exact, unlike averaging percentiles.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace wspush::loadgen {

/// Latency histogram in nanoseconds.
class histogram {
public:
  static constexpr unsigned sub_bits = 7;                               ///< 128 sub-buckets per octave
  static constexpr std::uint64_t sub_count = 1u << sub_bits;
  static constexpr std::size_t bucket_count = (65 - sub_bits) * sub_count;  ///< 7,424

  /// Counts one value.
  void record(std::uint64_t v) noexcept {
    ++_counts[index_of(v)];
    ++_total;
    _sum += v;
    if (v > _max) _max = v;
    if (v < _min) _min = v;
  }

  /// Adds another histogram's counts into this one.
  void merge(const histogram& o) noexcept {
    if (o._total == 0) return;
    for (std::size_t i = 0; i < bucket_count; ++i) _counts[i] += o._counts[i];
    _total += o._total;
    _sum += o._sum;
    if (o._max > _max) _max = o._max;
    if (o._min < _min) _min = o._min;
  }

  void reset() noexcept { *this = histogram{}; }

  /// Value at quantile q (0 < q <= 1): the midpoint of the bucket holding the ceil(q*total)-th
  /// smallest value, clamped to the exact min and max (q = 1 is the exact max). 0 when empty.
  [[nodiscard]] std::uint64_t quantile(double q) const noexcept {
    if (_total == 0) return 0;
    auto rank = static_cast<std::uint64_t>(q * static_cast<double>(_total) + 0.999999);
    if (rank < 1) rank = 1;
    if (rank >= _total) return _max;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < bucket_count; ++i) {
      seen += _counts[i];
      if (seen >= rank) return clamp(midpoint_of(i));
    }
    return _max;
  }

  [[nodiscard]] std::uint64_t total() const noexcept { return _total; }
  [[nodiscard]] std::uint64_t max() const noexcept { return _total ? _max : 0; }
  [[nodiscard]] std::uint64_t min() const noexcept { return _total ? _min : 0; }
  [[nodiscard]] double mean() const noexcept {
    return _total ? static_cast<double>(_sum) / static_cast<double>(_total) : 0.0;
  }
  [[nodiscard]] std::uint64_t count_at(std::size_t i) const noexcept { return _counts[i]; }

  /// Bucket of a value: exact below 256, then octave * 128 + the top 8 significant bits.
  static constexpr std::size_t index_of(std::uint64_t v) noexcept {
    if (v < 2 * sub_count) return static_cast<std::size_t>(v);
    const unsigned msb = 63u - static_cast<unsigned>(std::countl_zero(v));
    const unsigned shift = msb - sub_bits;
    return static_cast<std::size_t>(shift) * sub_count + static_cast<std::size_t>(v >> shift);
  }

  /// Smallest value that lands in bucket i.
  static constexpr std::uint64_t lower_of(std::size_t i) noexcept {
    if (i < 2 * sub_count) return i;
    const std::uint64_t shift = i / sub_count - 1;
    return (static_cast<std::uint64_t>(i) - shift * sub_count) << shift;
  }

  /// Midpoint of bucket i (what quantiles report).
  static constexpr std::uint64_t midpoint_of(std::size_t i) noexcept {
    if (i < 2 * sub_count) return i;
    const std::uint64_t shift = i / sub_count - 1;
    return lower_of(i) + ((std::uint64_t{1} << shift) >> 1);
  }

  /// Appends the sparse wire form: total, sum, min, max, the number of non-zero buckets, then
  /// (u16 index, u64 count) per non-zero bucket. Host byte order: both ends are one machine.
  void encode(std::string& out) const;

  /// Reads what encode() wrote at the start of `in` and adds it into this histogram. Returns the
  /// bytes used, or 0 when `in` is truncated or malformed (this histogram is then unchanged).
  std::size_t merge_encoded(std::span<const std::uint8_t> in) noexcept;

private:
  [[nodiscard]] std::uint64_t clamp(std::uint64_t v) const noexcept {
    return v < _min ? _min : (v > _max ? _max : v);
  }

  std::array<std::uint64_t, bucket_count> _counts{};
  std::uint64_t _total = 0;
  std::uint64_t _sum = 0;
  std::uint64_t _max = 0;
  std::uint64_t _min = ~std::uint64_t{0};
};

static_assert(histogram::index_of(255) == 255);
static_assert(histogram::index_of(256) == 256);
static_assert(histogram::lower_of(histogram::index_of(1'000'000)) <= 1'000'000);
static_assert(histogram::index_of(~std::uint64_t{0}) == histogram::bucket_count - 1);
static_assert(histogram::bucket_count < 65536, "bucket indexes travel as u16");

inline void histogram::encode(std::string& out) const {
  std::uint64_t head[5] = {_total, _sum, _min, _max, 0};
  for (std::size_t i = 0; i < bucket_count; ++i) head[4] += _counts[i] != 0;
  out.append(reinterpret_cast<const char*>(head), sizeof(head));
  for (std::size_t i = 0; i < bucket_count; ++i) {
    if (_counts[i] == 0) continue;
    const auto idx = static_cast<std::uint16_t>(i);
    out.append(reinterpret_cast<const char*>(&idx), sizeof(idx));
    out.append(reinterpret_cast<const char*>(&_counts[i]), sizeof(std::uint64_t));
  }
}

inline std::size_t histogram::merge_encoded(std::span<const std::uint8_t> in) noexcept {
  std::uint64_t head[5];
  if (in.size() < sizeof(head)) return 0;
  std::memcpy(head, in.data(), sizeof(head));
  constexpr std::size_t pair = sizeof(std::uint16_t) + sizeof(std::uint64_t);
  if (head[4] > bucket_count || in.size() - sizeof(head) < head[4] * pair) return 0;
  // Validate every index before touching the counters, so a bad message changes nothing.
  const std::uint8_t* p = in.data() + sizeof(head);
  std::uint64_t counted = 0;
  for (std::uint64_t k = 0; k < head[4]; ++k) {
    std::uint16_t idx;
    std::uint64_t n;
    std::memcpy(&idx, p + k * pair, sizeof(idx));
    std::memcpy(&n, p + k * pair + sizeof(idx), sizeof(n));
    if (idx >= bucket_count) return 0;
    counted += n;
  }
  if (counted != head[0]) return 0;
  for (std::uint64_t k = 0; k < head[4]; ++k) {
    std::uint16_t idx;
    std::uint64_t n;
    std::memcpy(&idx, p + k * pair, sizeof(idx));
    std::memcpy(&n, p + k * pair + sizeof(idx), sizeof(n));
    _counts[idx] += n;
  }
  if (head[0] != 0) {
    _total += head[0];
    _sum += head[1];
    if (head[2] < _min) _min = head[2];
    if (head[3] > _max) _max = head[3];
  }
  return sizeof(head) + head[4] * pair;
}

}  // namespace wspush::loadgen
