#pragma once
/// \file wire.hpp
/// The load generator's wire pieces that never touch a socket: upgrade request and response
/// check, the latency payload, the pub/sub messages it sends and reads, a streaming reader for
/// server frames that keeps only a few bytes per connection, and per-topic sequence accounting.

#include "proto/ws_frame.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace wspush::loadgen {

/// xorshift64*: mask keys and Sec-WebSocket-Key values need no cryptographic quality.
struct xorshift {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1DULL;
  }
  std::array<std::uint8_t, 4> mask() noexcept {
    const auto v = static_cast<std::uint32_t>(next() >> 32);
    return {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v >> 16),
            static_cast<std::uint8_t>(v >> 24)};
  }
};

// ---------------------------------------------------------------------------------------------
// Upgrade

/// A fresh random Sec-WebSocket-Key (24 characters).
std::string make_key(xorshift& rng);
/// Sec-WebSocket-Accept for a key (RFC 6455 4.2.2).
std::string expected_accept(std::string_view key);
/// `GET path[?token=T] HTTP/1.1` with the upgrade headers.
std::string make_upgrade_request(std::string_view path, std::string_view host, std::string_view key,
                                 std::string_view token);

/// What a complete response head (through the blank line) says.
struct upgrade_answer {
  int status = 0;        ///< HTTP status code; 0 when the status line is not HTTP/1.x
  bool accept_ok = false;  ///< 101 with the right Sec-WebSocket-Accept
};
upgrade_answer check_upgrade_response(std::string_view head, std::string_view accept) noexcept;

// ---------------------------------------------------------------------------------------------
// Payload: `{"s":SEQ,"t":SEND_NS}` (CLOCK_MONOTONIC, same machine), padded to `size` bytes with
// a `"p"` string. Valid JSON, so a pub/sub server forwards it as `data`, and valid UTF-8 text,
// so a broadcast server relays it as is.

inline constexpr std::size_t min_payload = 48;   ///< room for the largest s and t, and padding

/// Writes the payload into `out` (out.size() >= min_payload) and returns its length, which is
/// max(size, natural length).
std::size_t write_payload(std::span<char> out, std::size_t size, std::uint64_t seq, std::uint64_t send_ns) noexcept;

/// One delivery as the reader sees it. `topic`/`id` are views into the message (empty for a
/// plain broadcast message), valid while the message bytes are.
struct delivery {
  bool ok = false;
  std::uint64_t seq = 0;
  std::uint64_t send_ns = 0;
  std::string_view topic;
  std::string_view id;
};

/// Finds our payload in a plain message or in a pub/sub event
/// `{"topic":"T","id":"ID","data":{"s":..,"t":..,...}}`. Cheap: fixed format, no JSON parser.
delivery read_delivery(std::string_view msg) noexcept;

/// `{"op":"sub","topics":["T"]}`, with `,"since":{"T":"ID"}` when `since` is not empty.
std::string make_sub(std::string_view topic, std::string_view since);
/// `{"op":"pub","topic":"T","data":PAYLOAD}`
std::string make_pub(std::string_view topic, std::string_view payload);
/// `{"topic":"T","data":PAYLOAD}` — the admin API's POST /publish body.
std::string make_publish_body(std::string_view topic, std::string_view payload);

/// Server message kinds the load generator tells apart.
enum class server_msg : std::uint8_t { event, subbed, error, other };
server_msg classify(std::string_view msg) noexcept;
/// In a `subbed` reply: whether its `lost` list names anything.
bool subbed_reports_lost(std::string_view msg) noexcept;

// ---------------------------------------------------------------------------------------------
// Streaming reader for server frames (unmasked): several frames per read, a frame split over
// any number of reads, at most a header and the first bytes of a message kept between reads.

template <class Handler>
concept frame_handler = requires(Handler h, std::span<const std::uint8_t> s, std::uint8_t op) {
  h.on_message(s, op);  // a complete data message: its first bytes (up to keep_bytes)
  h.on_ping(s);
  h.on_close(s);
};

class frame_reader {
public:
  static constexpr std::size_t keep_bytes = 192;      ///< prefix of a data message kept
  static constexpr std::size_t control_bytes = 125;   ///< control payload limit (RFC 6455)

  /// Feeds bytes; returns false on a protocol violation (the caller drops the connection).
  template <frame_handler Handler>
  bool consume(std::span<const std::uint8_t> in, Handler& h) noexcept {
    while (!in.empty()) {
      if (_in_header) {
        if (!take_header(in)) return false;
        if (_in_header) return true;
        if (_remaining == 0 && !finish_frame(h)) return false;
        continue;
      }
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(_remaining, in.size()));
      keep(in.first(n));
      in = in.subspan(n);
      _remaining -= n;
      if (_remaining == 0 && !finish_frame(h)) return false;
    }
    return true;
  }

  /// Forget everything (a reconnect starts a new stream).
  void reset() noexcept { *this = frame_reader{}; }

private:
  bool take_header(std::span<const std::uint8_t>& in) noexcept;
  void keep(std::span<const std::uint8_t> bytes) noexcept;
  template <frame_handler Handler>
  bool finish_frame(Handler& h) noexcept;

  std::uint64_t _remaining = 0;
  std::array<std::uint8_t, proto::max_frame_header_size> _hdr{};
  std::array<std::uint8_t, keep_bytes> _data{};
  std::array<std::uint8_t, control_bytes> _ctrl{};
  std::uint8_t _hdr_len = 0;
  std::uint8_t _data_len = 0;
  std::uint8_t _ctrl_len = 0;
  std::uint8_t _op = 0;
  std::uint8_t _msg_op = 0;   ///< opcode of the data message in progress (0: none)
  bool _fin = false;
  bool _control = false;
  bool _in_header = true;
};

template <frame_handler Handler>
bool frame_reader::finish_frame(Handler& h) noexcept {
  _in_header = true;
  if (_control) {
    const std::span<const std::uint8_t> payload(_ctrl.data(), _ctrl_len);
    if (_op == static_cast<std::uint8_t>(proto::opcode::ping)) h.on_ping(payload);
    else if (_op == static_cast<std::uint8_t>(proto::opcode::close)) h.on_close(payload);
    else if (_op != static_cast<std::uint8_t>(proto::opcode::pong)) return false;
    return true;
  }
  if (_fin) {
    h.on_message(std::span<const std::uint8_t>(_data.data(), _data_len), _msg_op);
    _msg_op = 0;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Sequence accounting per receiving connection: the next expected number plus a 64-wide window
// of what arrived below it, so duplicates and late (reordered) arrivals are told apart exactly
// within the window, in 16 bytes per connection whatever the message count.

struct seq_counters {
  std::uint64_t unique = 0;      ///< distinct sequence numbers received
  std::uint64_t duplicates = 0;  ///< a number received again (within the window)
  std::uint64_t gaps = 0;        ///< times a number arrived ahead of the next expected one
  std::uint64_t reordered = 0;   ///< a number that filled an earlier gap
  std::uint64_t stale = 0;       ///< below the window: a duplicate or very late, cannot tell
};

class seq_tracker {
public:
  /// Accounts for one received number; returns true when it was new.
  bool on_seq(std::uint32_t s, seq_counters& c) noexcept {
    if (s >= _next) {
      if (s > _next) ++c.gaps;
      const std::uint64_t shift = std::uint64_t{s} - _next + 1;
      _window = shift >= 64 ? 0 : _window << shift;
      _window |= 1;
      _next = s + 1;
      ++c.unique;
      return true;
    }
    const std::uint32_t d = _next - 1 - s;
    if (d >= 64) {
      ++c.stale;
      return false;
    }
    const std::uint64_t bit = std::uint64_t{1} << d;
    if (_window & bit) {
      ++c.duplicates;
      return false;
    }
    _window |= bit;
    ++c.unique;
    ++c.reordered;
    return true;
  }
  [[nodiscard]] std::uint32_t next() const noexcept { return _next; }

private:
  std::uint64_t _window = 0;   ///< bit i: number _next-1-i was received
  std::uint32_t _next = 0;
};

static_assert(sizeof(seq_tracker) == 16, "per-connection accounting stays small");

}  // namespace wspush::loadgen
