#pragma once
/// \file results.hpp
/// What worker processes tell the parent, and how the parent adds it up. Pure: encoding and
/// decoding work on byte strings, so the aggregation across processes is unit-tested without a
/// fork. A worker sends `sample` messages (cumulative counters and the latency histogram of the
/// interval just ended) once per --sample-interval, and one `final` message (counters, the whole
/// run's latency and connect-time histograms); the publisher sends the same shapes.

#include "loadgen/histogram.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::loadgen {

// Counters summed across processes. X(name, description)
#define WSPUSH_LOADGEN_COUNTERS(X)                                                     \
  X(assigned, "connections this process was asked to hold")                             \
  X(going, "processes that have started the run phase")                                 \
  X(publisher_ready, "the publisher is connected and waits for the go")                 \
  X(connected, "upgrades (sse: streams opened) that succeeded, reconnects included")    \
  X(open, "connections open now")                                                       \
  X(ready, "connections upgraded and subscribed")                                       \
  X(reconnects, "connections opened again after a close")                               \
  X(closes_sent, "connections the load generator closed on purpose (churn, storm)")     \
  X(err_refused, "connect: ECONNREFUSED")                                               \
  X(err_timed_out, "connect: ETIMEDOUT")                                                \
  X(err_addr_not_avail, "connect: EADDRNOTAVAIL/EADDRINUSE (source ports exhausted)")   \
  X(err_reset, "connect/upgrade: ECONNRESET/EPIPE")                                     \
  X(err_too_many_files, "socket: EMFILE/ENFILE (open-files limit)")                     \
  X(err_other, "connect: another errno")                                                \
  X(err_closed_in_upgrade, "EOF before a complete upgrade response")                    \
  X(err_bad_accept, "101 without the right Sec-WebSocket-Accept (sse: 200, not text/event-stream)") \
  X(err_deadline, "not upgraded by the connect deadline")                               \
  X(err_tls, "wss://: the TLS handshake failed")                                        \
  X(http_401, "upgrade refused: 401")                                                   \
  X(http_403, "upgrade refused: 403")                                                   \
  X(http_503, "upgrade refused: 503")                                                   \
  X(http_other, "upgrade refused: another status")                                      \
  X(sub_errors, "error replies to sub or pub")                                          \
  X(lost_reported, "subbed replies whose lost list was not empty")                      \
  X(lost_notices, "lost notices in the stream: a topic's events may be missing")        \
  X(untold_loss, "deliveries missing on checked connections never told their topic was lost") \
  X(sent, "messages published")                                                         \
  X(publish_errors, "publishes the server refused or did not answer")                   \
  X(publish_retries, "admin publishes answered 503 (not published) and sent again")      \
  X(publish_unknown, "admin publishes answered 504 (sent to the bus, no answer: maybe published)") \
  X(expected, "deliveries the checked connections should get")                          \
  X(deliveries, "payload messages received, duplicates included")                       \
  X(unique, "distinct payload messages received on checked connections")                \
  X(duplicates, "a number received twice")                                              \
  X(gaps, "a number arrived ahead of the next expected")                                \
  X(reordered, "a number filled an earlier gap")                                        \
  X(stale, "older than the 64-wide window")                                             \
  X(foreign, "data messages that were not ours")                                        \
  X(deflate_conns, "upgrades that negotiated permessage-deflate")                       \
  X(tls_handshakes, "wss://: TLS handshakes completed")                                 \
  X(compressed, "messages that came compressed (RSV1)")                                 \
  X(complete, "checked connections that got every message")                             \
  X(disconnects, "EOF or reset on an upgraded connection")                              \
  X(server_closes, "close frames received (sse: retry: fields, a stream's last words)") \
  X(close_1001, "close frames with 1001 (going away)")                                  \
  X(close_1013, "close frames with 1013 (slow consumer, overload)")                     \
  X(protocol_errors, "malformed server frames")                                         \
  X(pings, "pings answered (sse: keepalive comments)")                                  \
  X(send_errors, "sends that failed")

enum class ctr : std::uint8_t {
#define WSPUSH_LOADGEN_ENUM(name, text) name,
  WSPUSH_LOADGEN_COUNTERS(WSPUSH_LOADGEN_ENUM)
#undef WSPUSH_LOADGEN_ENUM
      count
};

inline constexpr std::array<std::string_view, static_cast<std::size_t>(ctr::count)> ctr_names = {
#define WSPUSH_LOADGEN_NAME(name, text) #name,
    WSPUSH_LOADGEN_COUNTERS(WSPUSH_LOADGEN_NAME)
#undef WSPUSH_LOADGEN_NAME
};

/// A process's counters and moments. Plain data.
struct counters {
  std::array<std::uint64_t, static_cast<std::size_t>(ctr::count)> v{};
  std::uint64_t first_send_ns = 0;      ///< min over processes (0: none)
  std::uint64_t last_send_ns = 0;       ///< max
  std::uint64_t last_delivery_ns = 0;   ///< max
  std::uint64_t connect_done_ns = 0;    ///< max: when the last process had all its connections ready
  std::uint64_t storm_start_ns = 0;     ///< min: first connection dropped in the storm
  std::uint64_t storm_back_ns = 0;      ///< max: last connection ready again after it
  std::int64_t first_errno = 0;         ///< the first unclassified errno seen
  std::int64_t first_status = 0;        ///< the first unexpected HTTP status seen

  std::uint64_t& operator[](ctr c) noexcept { return v[static_cast<std::size_t>(c)]; }
  std::uint64_t operator[](ctr c) const noexcept { return v[static_cast<std::size_t>(c)]; }
  void add(const counters& o) noexcept;
  [[nodiscard]] std::uint64_t connect_errors() const noexcept;
  [[nodiscard]] std::uint64_t loss() const noexcept {
    return (*this)[ctr::expected] > (*this)[ctr::unique] ? (*this)[ctr::expected] - (*this)[ctr::unique] : 0;
  }
};

/// step: one step of --publish-steps (its index in `interval`): what a process counted of that
/// step's messages (a worker: unique, duplicates and the latency histogram; the publisher:
/// sent and its first and last send), sent once, before `final_result`.
enum class msg_kind : std::uint32_t { sample = 1, final_result = 2, step = 3 };

/// One decoded message from a child.
struct child_msg {
  msg_kind kind = msg_kind::sample;
  std::uint32_t child = 0;
  std::uint32_t interval = 0;   ///< sample: index of the interval that ended
  counters c{};
  std::unique_ptr<histogram> latency = std::make_unique<histogram>();   ///< sample: the interval's
  std::unique_ptr<histogram> connect = std::make_unique<histogram>();   ///< final: upgrade times
};

/// Frame: u32 total length (after itself), u32 kind, u32 child, u32 interval, counters, then the
/// latency histogram and the connect histogram in their sparse form.
std::string encode_msg(msg_kind kind, std::uint32_t child, std::uint32_t interval, const counters& c,
                       const histogram& latency, const histogram& connect);

/// Decodes one whole frame (length prefix included). False when malformed.
bool decode_msg(std::span<const std::uint8_t> frame, child_msg& out) noexcept;

/// Bytes of the next complete frame at the start of `buffered`, or 0 when it is not all there.
std::size_t frame_size(std::span<const std::uint8_t> buffered) noexcept;

/// One point of the time series: all processes' numbers for one interval.
struct timeline_point {
  double t_s = 0;                 ///< end of the interval, seconds since the run started
  std::uint64_t open = 0;
  std::uint64_t ready = 0;
  std::uint64_t connect_errors = 0;
  std::uint64_t deliveries = 0;   ///< cumulative
  std::uint64_t sent = 0;         ///< cumulative
  std::uint64_t lat_count = 0;    ///< latency samples in this interval
  std::uint64_t p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;   ///< ns
};

/// One step of --publish-steps: what one process counted of it, or (the parent's) the sum over
/// the processes.
struct step_total {
  counters c{};
  std::unique_ptr<histogram> latency = std::make_unique<histogram>();
};

/// A process's step messages, one per step, back to back (sent before its final_result).
std::string encode_steps(std::uint32_t child, std::span<const step_total> steps);

/// The parent's sum over every process: totals, whole-run histograms and the time series.
class aggregate {
public:
  explicit aggregate(std::uint32_t children, double interval_s) : _children(children), _interval_s(interval_s) {}

  /// Takes one decoded message. Samples update the child's latest counters and the interval's
  /// point; the final message replaces the child's counters and adds its whole-run histograms.
  void on_msg(const child_msg& m);

  /// Totals: the final counters of children that finished, the latest sample of the others.
  [[nodiscard]] counters totals() const;
  [[nodiscard]] const histogram& latency() const noexcept { return *_latency; }
  [[nodiscard]] const histogram& connect() const noexcept { return *_connect; }
  [[nodiscard]] std::uint32_t finished() const noexcept { return _finished; }
  /// One child's latest counters, and whether its final message arrived.
  [[nodiscard]] const counters& latest(std::uint32_t child) const noexcept { return _latest[child]; }
  [[nodiscard]] bool is_final(std::uint32_t child) const noexcept { return _final[child]; }
  /// The time series in order, every interval's percentiles computed from the merged histogram.
  [[nodiscard]] std::vector<timeline_point> timeline() const;
  /// Each step of --publish-steps (empty without).
  [[nodiscard]] const std::vector<step_total>& steps() const noexcept { return _steps; }

private:
  struct point {
    std::vector<counters> per_child;   ///< each child's counters at this interval's end
    std::vector<bool> seen;
    std::unique_ptr<histogram> latency = std::make_unique<histogram>();
  };

  std::uint32_t _children;
  double _interval_s;
  std::uint32_t _finished = 0;
  std::vector<counters> _latest = std::vector<counters>(_children);
  std::vector<bool> _final = std::vector<bool>(_children);
  std::map<std::uint32_t, point> _points;
  std::vector<step_total> _steps;
  std::unique_ptr<histogram> _latency = std::make_unique<histogram>();
  std::unique_ptr<histogram> _connect = std::make_unique<histogram>();
};

}  // namespace wspush::loadgen
