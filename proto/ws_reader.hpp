#pragma once
/// \file ws_reader.hpp
/// The server-side stateful frame reader: client→server frames in, events out.
///
/// It keeps no bytes. A frame header (≤ 14 bytes) or a whole control frame (≤ 131 bytes) is
/// consumed only once it is complete; until then `consume` answers need_more with `consumed`
/// short of the end, and the caller presents the unconsumed tail again, followed by new bytes,
/// on the next call. Data payload is consumed piecewise as it arrives and unmasked in place; the
/// reader remembers only how much of the frame remains, the mask and where in the mask it is.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/result.hpp"
#include "proto/utf8.hpp"
#include "proto/ws_close.hpp"
#include "proto/ws_frame.hpp"

namespace wspush::proto {

/// Size limits, checked at each frame header before the payload arrives.
struct ws_limits {
  std::uint32_t max_frame_bytes = 16u << 20;    // one frame's payload
  std::uint32_t max_message_bytes = 16u << 20;  // sum of a message's fragments
  bool deflate = false;  // permessage-deflate negotiated: RSV1 marks a compressed message
};

/// How much larger than `n` bytes a deflate stream of them may be: data that does not compress
/// goes in stored blocks of 5 header bytes each, and zlib with a small memLevel makes them as
/// short as 128 bytes (its deflateBound: n/32 + n/128 + n/2048 + 7, about 4%; Python
/// `websockets` at memLevel 5 adds 2.4%). A compressed message's allowance: 1/16 more.
constexpr std::uint64_t deflate_slack(std::uint64_t n) noexcept { return n / 16 + 64; }

/// `consumed` bytes from the start of the input are finished with. On `error`, `error` is the
/// close code to send and the reader must be reset() before any reuse.
struct read_result {
  parse_status status;
  std::size_t consumed;
  close_code error;
};

/// What consume() calls. Spans are valid only during the call; the handler may modify or copy
/// them. Returning false stops consumption right after that event.
template <class H>
concept ws_reader_handler = requires(H& h, opcode op, std::span<std::uint8_t> bytes, bool flag) {
  { h.on_control(op, bytes) } -> std::convertible_to<bool>;
} && (requires(H& h, opcode op, std::span<std::uint8_t> bytes, bool flag) {
  { h.on_data(op, bytes, flag, flag) } -> std::convertible_to<bool>;
} || requires(H& h, opcode op, std::span<std::uint8_t> bytes, bool flag) {
  { h.on_data(op, bytes, flag, flag, flag) } -> std::convertible_to<bool>;
});

class ws_reader {
 public:
  /// Handler concept (ws_reader_handler):
  ///   bool on_data(opcode message_op /*text|binary*/, std::span<std::uint8_t> piece, bool first, bool last) noexcept;
  ///       piece: unmasked payload bytes of a data message, possibly empty (an empty message, or
  ///       an empty final continuation frame: then called once with first/last as appropriate;
  ///       an empty frame in the middle of a message produces no call). Text pieces are already
  ///       UTF-8 validated incrementally (fail fast); `last` implies the text ended on a
  ///       code-point boundary. With limits.deflate, a message whose first frame has RSV1
  ///       set is compressed: its pieces are deflate data, not validated, and a handler that
  ///       takes a fifth argument, `bool compressed`, is told so (the caller inflates the whole
  ///       message and validates it; one that takes four never sees a compressed message
  ///       unless it set limits.deflate).
  ///   bool on_control(opcode op /*ping|pong|close*/, std::span<std::uint8_t> payload) noexcept;
  ///       a complete control frame, unmasked; a close payload is already validated with
  ///       parse_close_payload. Frames after a close are still read: stop by returning false.
  /// Returns done (all bytes consumed, or a handler returned false: then `consumed` counts the
  /// bytes up to and including that event), need_more (a partial header or control frame is
  /// left at `consumed`), or error with the close code: 1002 for protocol violations, 1007 for
  /// invalid UTF-8 (text or close reason), 1009 for size limits.
  template <ws_reader_handler Handler>
  read_result consume(std::span<std::uint8_t> bytes, const ws_limits& limits, Handler& handler) noexcept;

  /// Between the first and last frame of a data message.
  bool in_message() const noexcept { return (_flags & f_op_mask) != 0; }
  /// Part of a frame's payload still expected.
  bool mid_frame() const noexcept { return _remaining != 0; }
  void reset() noexcept { *this = ws_reader{}; }

 private:
  enum : std::uint8_t {
    f_op_mask = 0x03,  // message opcode: 0 none, 1 text, 2 binary
    f_fin = 0x04,      // the current data frame is the message's last
    f_started = 0x08,  // on_data has been called for this message
    f_compressed = 0x10,  // RSV1 on the message's first frame (permessage-deflate)
  };
  enum class step_kind : std::uint8_t { go_on, stop, need_more, error };
  struct step {
    step_kind kind;
    close_code error;
    std::size_t used;
  };

  opcode message_op() const noexcept { return static_cast<opcode>(_flags & f_op_mask); }
  close_code check_header(const frame_header& h, const ws_limits& limits) const noexcept;
  void start_data_frame(const frame_header& h) noexcept;
  template <class Handler>
  step frame_step(std::span<std::uint8_t> rest, const ws_limits& limits, Handler& handler) noexcept;
  template <class Handler>
  step control_step(std::span<std::uint8_t> rest, const frame_header& h, Handler& handler) noexcept;
  template <class Handler>
  step payload_step(std::span<std::uint8_t> rest, Handler& handler) noexcept;
  template <class Handler>
  step deliver(std::span<std::uint8_t> piece, bool last, std::size_t used, Handler& handler) noexcept;

  // Budget: 16 bytes, it lives in every connection record (uWS: "24 bytes perfectly").
  std::uint32_t _remaining = 0;      // payload bytes of the current data frame still expected
  std::uint32_t _message_bytes = 0;  // declared payload of the current message's frames so far
  std::array<std::uint8_t, 4> _mask{};
  utf8_validator _utf8;              // text messages only, across fragments
  std::uint8_t _mask_offset = 0;     // position in _mask of the next payload byte
  std::uint8_t _flags = 0;
};
static_assert(sizeof(ws_reader) <= 24, "ws_reader lives in every connection record");
static_assert(sizeof(ws_reader) == 16, "ws_reader layout changed: recheck the budget");

// ---- implementation -----------------------------------------------------------------------

inline close_code ws_reader::check_header(const frame_header& h, const ws_limits& limits) const noexcept {
  // RSV1 is permessage-deflate's "compressed" bit, only on the first frame of a data message
  // (RFC 7692 §6); other RSV bits are never negotiated. Clients must mask.
  const bool first_data = !is_control(h.raw_opcode) && h.raw_opcode != static_cast<std::uint8_t>(opcode::continuation);
  const bool rsv_ok = h.rsv == 0 || (h.rsv == 4 && limits.deflate && first_data);
  if (!rsv_ok || !h.masked || !is_known_opcode(h.raw_opcode)) return close_code::protocol_error;
  if (is_control(h.raw_opcode)) {
    // size 6 = 7-bit length + mask: a control frame with an extended length is not minimal,
    // and refusing it keeps a whole control frame within 131 bytes for the caller.
    const bool ok = h.fin && h.payload_len <= max_control_payload_size && h.size == 6;
    return ok ? close_code{} : close_code::protocol_error;
  }
  const bool continuation = h.raw_opcode == static_cast<std::uint8_t>(opcode::continuation);
  if (continuation != in_message()) return close_code::protocol_error;
  const std::uint64_t so_far = continuation ? _message_bytes : 0;
  // The limits are on what a message is: a compressed one that will not shrink (random bytes)
  // may come a little over them on the wire, and its inflated size is checked after.
  // Each bound stays within 32 bits: the reader counts in them.
  const bool compressed = continuation ? (_flags & f_compressed) != 0 : h.rsv != 0;
  auto bound = [compressed](std::uint32_t limit) {
    return std::min<std::uint64_t>(limit + (compressed ? deflate_slack(limit) : 0), UINT32_MAX);
  };
  if (h.payload_len > bound(limits.max_frame_bytes) || so_far + h.payload_len > bound(limits.max_message_bytes))
    return close_code::too_big;
  return close_code{};
}

inline void ws_reader::start_data_frame(const frame_header& h) noexcept {
  if (h.raw_opcode != static_cast<std::uint8_t>(opcode::continuation)) {
    _flags = static_cast<std::uint8_t>(h.raw_opcode | (h.rsv != 0 ? f_compressed : 0));  // op; not started
    _message_bytes = 0;
    _utf8.reset();
  }
  // check_header bounded payload_len and the sum by 32-bit bounds.
  _message_bytes += static_cast<std::uint32_t>(h.payload_len);
  _remaining = static_cast<std::uint32_t>(h.payload_len);
  _mask = h.mask;
  _mask_offset = 0;
  _flags = static_cast<std::uint8_t>(h.fin ? _flags | f_fin : _flags & ~f_fin);
}

template <class Handler>
ws_reader::step ws_reader::deliver(std::span<std::uint8_t> piece, bool last, std::size_t used,
                                   Handler& handler) noexcept {
  const opcode op = message_op();
  const bool compressed = (_flags & f_compressed) != 0;
  if (op == opcode::text && !compressed && (!_utf8.feed(piece) || (last && !_utf8.complete())))
    return {step_kind::error, close_code::invalid_payload, 0};
  const bool first = (_flags & f_started) == 0;
  _flags |= f_started;
  if (last) {  // the message is over before the handler runs, so stopping there is clean
    _flags = 0;
    _message_bytes = 0;
  }
  bool go_on;
  if constexpr (requires { handler.on_data(op, piece, first, last, compressed); })
    go_on = handler.on_data(op, piece, first, last, compressed);
  else
    go_on = handler.on_data(op, piece, first, last);
  return {go_on ? step_kind::go_on : step_kind::stop, close_code{}, used};
}

template <class Handler>
ws_reader::step ws_reader::payload_step(std::span<std::uint8_t> rest, Handler& handler) noexcept {
  const std::size_t take = std::min<std::size_t>(_remaining, rest.size());
  const auto piece = rest.first(take);
  _mask_offset = apply_mask(piece, _mask, _mask_offset);
  _remaining -= static_cast<std::uint32_t>(take);
  const bool last = _remaining == 0 && (_flags & f_fin) != 0;
  return deliver(piece, last, take, handler);
}

template <class Handler>
ws_reader::step ws_reader::control_step(std::span<std::uint8_t> rest, const frame_header& h,
                                        Handler& handler) noexcept {
  const std::size_t total = h.size + static_cast<std::size_t>(h.payload_len);
  if (rest.size() < total) return {step_kind::need_more, close_code{}, 0};
  const auto payload = rest.subspan(h.size, static_cast<std::size_t>(h.payload_len));
  apply_mask(payload, h.mask, 0);
  const auto op = static_cast<opcode>(h.raw_opcode);
  if (op == opcode::close) {
    const close_parse cp = parse_close_payload(payload);
    if (!cp.ok) return {step_kind::error, cp.error, 0};
  }
  const bool go_on = handler.on_control(op, payload);
  return {go_on ? step_kind::go_on : step_kind::stop, close_code{}, total};
}

template <class Handler>
ws_reader::step ws_reader::frame_step(std::span<std::uint8_t> rest, const ws_limits& limits,
                                      Handler& handler) noexcept {
  const header_result hr = parse_frame_header(rest);
  if (hr.status == parse_status::need_more) return {step_kind::need_more, close_code{}, 0};
  if (hr.status == parse_status::error) return {step_kind::error, close_code::protocol_error, 0};
  const frame_header& h = hr.header;
  if (const close_code e = check_header(h, limits); e != close_code{}) return {step_kind::error, e, 0};
  if (is_control(h.raw_opcode)) return control_step(rest, h, handler);
  start_data_frame(h);
  if (h.payload_len != 0) return {step_kind::go_on, close_code{}, h.size};
  // An empty frame: only the first and the last of a message are worth an event.
  if ((_flags & f_started) == 0 || h.fin) return deliver({}, h.fin, h.size, handler);
  return {step_kind::go_on, close_code{}, h.size};
}

template <ws_reader_handler Handler>
read_result ws_reader::consume(std::span<std::uint8_t> bytes, const ws_limits& limits, Handler& handler) noexcept {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const auto rest = bytes.subspan(pos);
    const step s = _remaining != 0 ? payload_step(rest, handler) : frame_step(rest, limits, handler);
    if (s.kind == step_kind::error) return {parse_status::error, pos, s.error};
    pos += s.used;
    if (s.kind == step_kind::need_more) return {parse_status::need_more, pos, close_code{}};
    if (s.kind == step_kind::stop) break;
  }
  return {parse_status::done, pos, close_code{}};
}

}  // namespace wspush::proto
