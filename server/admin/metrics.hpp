#pragma once
/// \file metrics.hpp
/// A small Prometheus registry: counters, gauges and histograms with fixed label sets, plus
/// callbacks evaluated at scrape time, rendered as text format 0.0.4 by the admin listener.
///
/// Two ways to feed it, both cheap for the threads that do the work:
/// - owned instruments (`counter`, `gauge`, `histogram`): relaxed atomics, updated from any
///   thread, no lock, no allocation;
/// - callbacks (`add_counter_fn`, `add_gauge_fn`, `add_histogram_fn`): for values some other
///   part already keeps (a shard's counters, the pool's stats). They run on the admin thread
///   during a scrape and must be thread-safe themselves (relaxed atomic loads, or a snapshot).
/// Registration is start-up work: it allocates and throws std::invalid_argument on a bad or
/// duplicate name. It may happen while scrapes run (one mutex guards the registry); it never
/// blocks an update.

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wspush::server {

/// A label set, fixed when the series is registered: {{"state", "open"}}.
using metric_labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

/// A monotonically increasing count.
class counter {
 public:
  void inc(std::uint64_t n = 1) noexcept { _v.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const noexcept { return _v.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> _v{0};
};

/// A value that goes up and down.
class gauge {
 public:
  void set(double v) noexcept { _v.store(v, std::memory_order_relaxed); }
  void add(double d) noexcept { _v.fetch_add(d, std::memory_order_relaxed); }
  double value() const noexcept { return _v.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> _v{0};
};

/// A histogram as the scrape sees it. `counts` are per bucket, NOT cumulative (as
/// pool::pool_stats keeps them): counts[i] is the number in (bounds[i-1], bounds[i]], and
/// counts has one more entry than bounds, the last for (bounds.back(), +Inf).
struct histogram_snapshot {
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;
  double sum = 0;
};

/// Fixed buckets (ascending, finite upper bounds); observe() from any thread.
class histogram {
 public:
  explicit histogram(std::span<const double> bounds);
  void observe(double v) noexcept;
  histogram_snapshot snapshot() const;
  std::span<const double> bounds() const noexcept { return _bounds; }

 private:
  std::vector<double> _bounds;
  std::unique_ptr<std::atomic<std::uint64_t>[]> _counts;  // _bounds.size() + 1
  std::atomic<double> _sum{0};
};

enum class metric_type : std::uint8_t { counter, gauge, histogram };

/// A metric of the documented list (docs/METRICS.md): what the lead wires and a scraper reads.
struct metric_info {
  std::string_view name;
  metric_type type;
  std::string_view labels;  // label names, comma-separated; empty for none
  std::string_view help;
};

/// Every metric wspush exports, in the order of docs/METRICS.md.
std::span<const metric_info> standard_metrics() noexcept;
/// The standard entry named `name`, or nullptr.
const metric_info* find_standard_metric(std::string_view name) noexcept;

class metrics_registry {
 public:
  metrics_registry();
  ~metrics_registry();
  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  // An empty `help` takes the standard metric's help text. Series of one name share a family
  // (one HELP and TYPE line) and must all have the same type; a label set may appear once
  // per name. The references live as long as the registry.
  counter& add_counter(std::string_view name, std::string_view help = {}, metric_labels labels = {});
  gauge& add_gauge(std::string_view name, std::string_view help = {}, metric_labels labels = {});
  histogram& add_histogram(std::string_view name, std::span<const double> bounds, std::string_view help = {},
                           metric_labels labels = {});

  /// Scrape-time values. A counter_fn must never go down (Prometheus reads a drop as a reset).
  void add_counter_fn(std::string_view name, std::function<double()> fn, std::string_view help = {},
                      metric_labels labels = {});
  void add_gauge_fn(std::string_view name, std::function<double()> fn, std::string_view help = {},
                    metric_labels labels = {});
  void add_histogram_fn(std::string_view name, std::function<histogram_snapshot()> fn, std::string_view help = {},
                        metric_labels labels = {});

  /// Appends the text exposition (format 0.0.4) of every family, in registration order.
  void render(std::string& out) const;

  /// The Content-Type of what render writes.
  static constexpr std::string_view content_type = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct series;
  struct family;
  series& add_series(std::string_view name, metric_type type, std::string_view help, metric_labels labels);

  mutable std::mutex _mu;
  std::vector<std::unique_ptr<family>> _families;
};

}  // namespace wspush::server
