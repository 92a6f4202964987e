#pragma once
/// \file bench_histogram.hpp
/// Fixed-memory, log-bucketed latency histogram for the system benchmark client (HDR-like).
///
/// Values below 256 are counted exactly; above, every power of two is split into 128 linear
/// sub-buckets, so a bucket is at most 1/128 of its lower bound wide and the midpoint we report is
/// within ~0.4% of any value that fell into it. The whole uint64 range fits in 7,424 counters
/// (58 KiB), so children can ship their histogram to the parent as a plain array and the parent
/// merges by adding counters.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace wspush::bench {

/// Latency histogram in nanoseconds. Plain data: safe to write to a pipe and read back.
class latency_histogram {
public:
    static constexpr unsigned sub_bits = 7;                       ///< 128 sub-buckets per octave
    static constexpr std::uint64_t sub_count = 1u << sub_bits;    ///< 128
    static constexpr std::size_t bucket_count = (65 - sub_bits) * sub_count;  ///< 7,424

    /// Counts one value.
    void record(std::uint64_t value_ns) noexcept {
        ++_counts[index_of(value_ns)];
        ++_total;
        _sum += value_ns;
        if (value_ns > _max) _max = value_ns;
        if (value_ns < _min) _min = value_ns;
    }

    /// Adds another histogram's counts into this one (the parent merging its children).
    void merge(const latency_histogram& other) noexcept {
        for (std::size_t i = 0; i < bucket_count; ++i) _counts[i] += other._counts[i];
        _total += other._total;
        _sum += other._sum;
        if (other._max > _max) _max = other._max;
        if (other._min < _min) _min = other._min;
    }

    /// Value at quantile q (0 < q <= 1): the midpoint of the bucket holding the ceil(q*total)-th
    /// smallest value, clamped to the exact min and max (q = 1 is the exact max). 0 when empty.
    [[nodiscard]] std::uint64_t quantile(double q) const noexcept {
        if (_total == 0) return 0;
        auto rank = static_cast<std::uint64_t>(q * static_cast<double>(_total) + 0.999999);
        if (rank < 1) rank = 1;
        if (rank >= _total) return _max;   // the largest value is known exactly
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

static_assert(latency_histogram::index_of(255) == 255);
static_assert(latency_histogram::index_of(256) == 256);
static_assert(latency_histogram::lower_of(latency_histogram::index_of(1'000'000)) <= 1'000'000);
static_assert(latency_histogram::index_of(~std::uint64_t{0}) == latency_histogram::bucket_count - 1);
static_assert(sizeof(latency_histogram) <= 60 * 1024, "histogram is shipped over a pipe per child");

}  // namespace wspush::bench
