#pragma once
/// \file report.hpp
/// The result of a run and its three renderings: a human summary, one JSON object, and a
/// self-contained HTML page (inline SVG drawn by inline JavaScript from embedded data; nothing
/// is fetched from the network) with connections over time, latency percentiles over time and
/// the latency histogram.

#include "loadgen/histogram.hpp"
#include "loadgen/options.hpp"
#include "loadgen/probe.hpp"
#include "loadgen/results.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace wspush::loadgen {

/// One step of --publish-steps: what was published at its rate and what arrived of it.
struct step_result {
  double rate = 0;                 ///< asked, messages/s
  std::uint64_t messages = 0;      ///< the step's messages
  std::uint64_t sent = 0;
  std::uint64_t expected = 0;      ///< deliveries due to the connections up when publishing began
  std::uint64_t delivered = 0;     ///< distinct, on those connections
  std::uint64_t duplicates = 0;
  std::uint64_t first_send_ns = 0, last_send_ns = 0;   ///< CLOCK_MONOTONIC
  const histogram* latency = nullptr;
  [[nodiscard]] double publish_s() const noexcept {
    return last_send_ns > first_send_ns ? static_cast<double>(last_send_ns - first_send_ns) / 1e9 : 0;
  }
  [[nodiscard]] std::uint64_t loss() const noexcept { return expected > delivered ? expected - delivered : 0; }
};

struct run_result {
  const options* o = nullptr;
  counters totals{};
  const histogram* latency = nullptr;
  const histogram* connect = nullptr;
  std::vector<timeline_point> timeline;
  std::vector<step_result> steps;      ///< --publish-steps, in order
  std::vector<std::string> problems;   ///< why the run is not ok (empty: ok)
  std::string started_utc;
  double connect_s = 0;                ///< start until every process had its connections up
  double publish_s = 0;                ///< first publish until the last delivery
  double settle_s = -1;                ///< last connection up until the first publish (-1: none)
  double storm_back_s = -1;            ///< reconnect-storm: first drop until all back (<0: n/a)
  std::uint64_t storm_left = 0;        ///< connections not back by the end
  proc_reading before{}, loaded{}, end{};   ///< server readings: start, all connected, end
  std::uint64_t held = 0;              ///< connections open when `loaded` was read

  [[nodiscard]] bool ok() const noexcept { return problems.empty(); }
  [[nodiscard]] double deliveries_per_s() const noexcept {
    return publish_s > 0 ? static_cast<double>(totals[ctr::deliveries]) / publish_s : 0;
  }
  /// Server memory growth per held connection (VmRSS), or <0 when not measured.
  [[nodiscard]] double rss_per_conn() const noexcept;
  [[nodiscard]] double slab_per_conn() const noexcept;
  /// Server CPU per delivery over the run, in µs, or <0 when not measured.
  [[nodiscard]] double cpu_per_delivery_us() const noexcept;
};

void print_text(std::FILE* out, const run_result& r);
void print_json(std::FILE* out, const run_result& r);
/// Writes the HTML report; false (with errno) when the file cannot be written.
bool write_html(const std::string& path, const run_result& r);

/// The histogram as (bucket lower bound ns, count) pairs, merged into about `bins` log-spaced
/// bins (for plotting).
std::vector<std::pair<std::uint64_t, std::uint64_t>> histogram_bins(const histogram& h, std::size_t bins);

}  // namespace wspush::loadgen
