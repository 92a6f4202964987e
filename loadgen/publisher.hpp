#pragma once
/// \file publisher.hpp
/// The publisher process: once the parent says go, publishes --messages payloads (each with its
/// sequence number and send time) at --publish-rate or as fast as the server takes them, round
/// robin over the scenario's topics, through the admin API (`POST /publish`, pipelined on one
/// keep-alive connection) or over its own WebSocket connection (`pub` messages, or plain text
/// for a broadcast server). Reports to the parent in the workers' format.

#include "loadgen/histogram.hpp"
#include "loadgen/options.hpp"
#include "loadgen/rate_limiter.hpp"
#include "loadgen/results.hpp"
#include "loadgen/sys.hpp"
#include "loadgen/wire.hpp"

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace wspush::loadgen {

/// Parses HTTP/1.1 responses from a byte stream (the admin API's answers to pipelined
/// requests): status and Content-Length body. Pure, so it is unit-tested on split input.
class response_reader {
public:
  /// Feeds bytes; calls `on_status(int)` once per complete response. False on garbage.
  template <class F>
  bool consume(std::string_view in, F&& on_status) {
    _buf.append(in);
    for (;;) {
      const std::size_t head_end = _buf.find("\r\n\r\n");
      if (head_end == std::string::npos) return _buf.size() < 65536;
      const std::string_view head(_buf.data(), head_end);
      if (head.size() < 12 || !head.starts_with("HTTP/1.")) return false;
      const int status = (head[9] - '0') * 100 + (head[10] - '0') * 10 + (head[11] - '0');
      const std::size_t body = content_length(head);
      if (_buf.size() < head_end + 4 + body) return true;
      _buf.erase(0, head_end + 4 + body);
      on_status(status);
    }
  }
  void reset() noexcept { _buf.clear(); }

private:
  static std::size_t content_length(std::string_view head) noexcept;
  std::string _buf;
};

class publisher {
public:
  publisher(const options& o, std::uint32_t index, int ctrl_fd, int report_fd);
  ~publisher();
  publisher(const publisher&) = delete;
  publisher& operator=(const publisher&) = delete;

  /// Runs until told to quit; returns the process exit code.
  int run() noexcept;

private:
  bool connect(std::uint64_t deadline) noexcept;
  bool upgrade(std::uint64_t deadline) noexcept;
  void fill(std::uint64_t now) noexcept;
  void encode_request(std::uint64_t first, std::uint32_t count, bool again) noexcept;
  void encode_one(std::uint64_t k, std::uint64_t now, bool again) noexcept;
  void on_response(int status) noexcept;
  bool flush() noexcept;
  void on_readable() noexcept;
  void lose_connection() noexcept;
  void read_command() noexcept;
  void send_sample(msg_kind kind) noexcept;
  [[nodiscard]] std::uint64_t pace(std::uint64_t now) noexcept;
  [[nodiscard]] bool finished() const noexcept;
  [[nodiscard]] bool last_pause_pending(std::uint64_t now) const noexcept;
  void publish_loop() noexcept;

  const options& _o;
  std::unique_ptr<histogram> _empty = std::make_unique<histogram>();
  counters _c{};
  frame_reader _reader;
  spill_pool _spills;
  response_reader _responses;
  rate_limiter _limit{0, 0};
  xorshift _rng{};
  std::string _out;
  std::size_t _out_off = 0;
  std::vector<char> _payload;
  std::uint64_t _next = 0;        ///< next message number to encode
  std::size_t _step = 0;          ///< --publish-steps: the step under way
  std::uint64_t _step_end = 0;    ///< the first message number past it
  std::uint64_t _pause_until = 0; ///< its pause ends then (0: not in its pause)
  std::vector<step_total> _steps; ///< per step: sent, first and last send (no latency here)
  /// admin: each request sent and not answered, in order: its first message number and count
  std::deque<std::pair<std::uint64_t, std::uint32_t>> _inflight;
  std::string _body;              ///< admin: the request body being encoded (encode_one appends)
  /// admin: publishes answered 503 (nothing was published), sent again with the same number
  /// when due (Retry-After), so a refusal leaves no gap for the subscribers to count
  std::deque<std::pair<std::uint64_t, std::uint64_t>> _retry;  ///< (number, due ns)
  std::uint64_t _next_sample_ns = 0;
  std::uint32_t _index;
  std::uint32_t _interval_no = 0;
  int _fd = -1;
  int _ep = -1;
  int _ctrl;
  int _report;
  commands _cmd;  ///< what the parent asked for so far
  bool _want_out = false;
};

}  // namespace wspush::loadgen
