// The WebSocket phase: frames in, complete messages to the application, control frames
// answered, the close handshake, and an open connection's one deadline.

#include "server/conn/ws_phase.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "proto/envelope.hpp"
#include "server/base/clock.hpp"
#include "server/base/log.hpp"
#include "server/conn/app.hpp"
#include "server/conn/connections.hpp"

namespace wspush::server {

/// The frame reader's handler for one connection.
struct ws_phase::events {
  ws_phase& ws;
  std::uint32_t slot;

  bool on_data(proto::opcode op, std::span<std::uint8_t> piece, bool first, bool last, bool compressed) noexcept {
    if (ws._c.at(slot).state != conn_state::open) return true;  // closing: discard data
    if (first && last && !compressed) return ws.deliver(slot, op, nullptr, piece, piece.size());
    ws_rx* rs = ws.rx(slot);
    if (!rs) return ws.close_on_error(slot, proto::close_code::internal_error), false;
    if (first) {
      rs->msg = ws._c.buffers().acquire(message_header_room + std::max<std::size_t>(piece.size() * 2, 4096));
      rs->msg_len = 0;
      rs->msg_op = op;
    }
    // A compressed message gathers whole, with room behind it for the inflater's tail.
    std::size_t need = message_header_room + rs->msg_len + piece.size() + (compressed ? proto::inflate_tail_room : 0);
    if (rs->msg) rs->msg.set_size(message_header_room + rs->msg_len);
    if (!rs->msg || (need > rs->msg.capacity() && !rs->msg.reserve(std::max(need, rs->msg.capacity() * 2))))
      return ws.close_on_error(slot, proto::close_code::too_big), false;
    if (!piece.empty()) std::memcpy(rs->msg.data() + message_header_room + rs->msg_len, piece.data(), piece.size());
    rs->msg_len += std::uint32_t(piece.size());
    if (!last) return true;
    pool::lease msg = std::move(rs->msg);
    msg.set_size(message_header_room + rs->msg_len);
    if (compressed) return ws.inflate(slot, rs->msg_op, msg, rs->msg_len);
    std::span<std::uint8_t> payload(msg.data() + message_header_room, rs->msg_len);
    return ws.deliver(slot, rs->msg_op, &msg, payload, msg.capacity() - message_header_room);
  }

  bool on_control(proto::opcode op, std::span<std::uint8_t> payload) noexcept {
    connection& c = ws._c.at(slot);
    if (op == proto::opcode::ping) {
      if (c.state == conn_state::open) ws._c.queue_pong(slot, payload);
      return ws._c.at(slot).state == conn_state::open;
    }
    if (op != proto::opcode::close) return true;  // pong: nothing to do
    if (c.state == conn_state::open) {
      // Echo the peer's code (none if it sent none), then close once that is on the wire.
      ws.queue_close(slot, payload.first(std::min<std::size_t>(payload.size(), 2)));
      ws._c.set_state(slot, conn_state::closing);
      ws._c.loop().arm(slot, ws._c.loop().ticks_for(ws._c.options().close_timeout));
    }
    ws._c.at(slot).flags |= flag_close_when_flushed;
    ws._c.stop_reading(slot);  // nothing follows a close frame
    ws._c.list(slot);
    return false;
  }
};

ws_rx* ws_phase::rx(std::uint32_t slot) noexcept {
  connection& c = _c.at(slot);
  if (!c.rx.ws) c.rx.ws = pool::leased<ws_rx>::make(_c.buffers(), 0);
  return c.rx.ws.get();
}

void ws_phase::start(std::uint32_t slot, std::span<std::uint8_t> early) noexcept {
  connection& c = _c.at(slot);
  const std::uint32_t gen = c.gen;
  c.last_rx = _c.loop().now();
  arm(slot, _c.loop().ticks_for(_c.options().ping_interval));  // keepalive from here on
  if (!early.empty() && c.gen == gen && c.state == conn_state::open) on_bytes(slot, early);
}

void ws_phase::on_bytes(std::uint32_t slot, std::span<std::uint8_t> bytes) noexcept {
  connection& c = _c.at(slot);
  if (c.flags & flag_read_broken) return;  // after an error or a close: discard
  const std::uint32_t gen = c.gen;
  ws_rx* rs = c.rx.ws.get();
  if (rs && rs->held) return keep(slot, bytes);  // bytes that were on their way when reading paused
  proto::ws_reader r = rs ? rs->reader : proto::ws_reader{};
  std::uint8_t tail[sizeof ws_rx::tail];
  std::size_t tail_len = 0, pos = 0, used = 0;

  if (rs && rs->tail_len) {
    // Join the kept tail with the start of the new bytes: a header or control frame is never
    // longer than the tail buffer, so this join always completes it if the bytes are there.
    std::size_t t = rs->tail_len, m = std::min(bytes.size(), sizeof tail - t);
    std::memcpy(tail, rs->tail, t);
    std::memcpy(tail + t, bytes.data(), m);
    rs->tail_len = 0;
    if (!consume(slot, r, {tail, t + m}, used)) return;
    if (held(slot)) {  // the application holds what follows the message just handed over
      c.rx.ws->reader = r;
      return keep(slot, std::span<const std::uint8_t>(tail + used, t + m - used), bytes.subspan(m));
    }
    if (used < t) {  // still incomplete: every new byte went into the join
      std::memmove(tail, tail + used, t + m - used);
      tail_len = t + m - used;
      pos = bytes.size();
    } else {
      pos = used - t;
    }
  }
  if (pos < bytes.size()) {
    auto rest = bytes.subspan(pos);
    if (!consume(slot, r, rest, used)) return;
    if (held(slot)) {
      c.rx.ws->reader = r;
      return keep(slot, rest.subspan(used));
    }
    tail_len = rest.size() - used;
    std::memcpy(tail, rest.data() + used, tail_len);
  }
  if (c.gen != gen || (c.state != conn_state::open && c.state != conn_state::closing)) return;

  // A partial header or control frame counts as unfinished as much as a partial payload: a
  // peer that trickles one must meet the message timeout too.
  bool unfinished = r.in_message() || r.mid_frame() || tail_len > 0;
  if (unfinished) {
    rs = rx(slot);
    if (!rs) return close_on_error(slot, proto::close_code::internal_error);
    rs->reader = r;
    rs->tail_len = std::uint8_t(tail_len);
    std::memcpy(rs->tail, tail, tail_len);
  } else {
    c.rx.ws.reset();
  }
  note_timer(slot, unfinished);
}

bool ws_phase::consume(std::uint32_t slot, proto::ws_reader& r, std::span<std::uint8_t> bytes,
                       std::size_t& used) noexcept {
  connection& c = _c.at(slot);
  const std::uint32_t gen = c.gen;
  const conn_options& o = _c.options();
  proto::ws_limits limits{std::min(o.max_frame_bytes, o.max_message_bytes), o.max_message_bytes,
                          (c.ext & ext_deflate) != 0};
  events h{*this, slot};
  auto res = r.consume(bytes, limits, h);
  if (c.gen != gen || c.state == conn_state::free || c.state == conn_state::dead) return false;
  if (res.status == proto::parse_status::error) {
    close_on_error(slot, res.error);
    return false;
  }
  if (c.flags & flag_read_broken) return false;  // a close frame, or a failure inside a handler
  used = res.consumed;
  return true;
}

bool ws_phase::deliver(std::uint32_t slot, proto::opcode op, pool::lease* block, std::span<std::uint8_t> payload,
                       std::size_t readable) noexcept {
  _c.counters_mut().messages_in.add();
  message m{op, payload, readable, block};
  const std::uint32_t gen = _c.at(slot).gen;
  _c.app().on_message(slot, m);
  const connection& c = _c.at(slot);
  return c.gen == gen && c.state == conn_state::open && !held(slot);  // held: stop right after it
}

/// A compressed message (`in_len` bytes, message_header_room into `in`, with room behind them)
/// inflated into a block of its own, at most --max-message-bytes: a first try sized for
/// ordinary JSON, then the bound. A bomb costs at most the bound's output twice over; past
/// it, 1009. Data that does not inflate is 1007, and so is inflated text that is not UTF-8.
bool ws_phase::inflate(std::uint32_t slot, proto::opcode op, pool::lease& in, std::size_t in_len) noexcept {
  if (!_inflater) _inflater = std::make_unique<proto::message_inflater>();
  if (!*_inflater) return close_on_error(slot, proto::close_code::internal_error), false;
  // The bound, or the largest block the pool has (32 MiB) if that is less: past it, 1009 too.
  const std::size_t limit = std::min<std::size_t>(_c.options().max_message_bytes,
                                                  pool::buffer_pool::max_block_size - message_header_room);
  const std::span<std::uint8_t> packed(in.data() + message_header_room, in.capacity() - message_header_room);
  const std::size_t first_try = std::min<std::size_t>(limit, std::max<std::size_t>(4096, in_len * 8));
  for (std::size_t room = first_try;; room = limit) {
    pool::lease out = _c.buffers().acquire(message_header_room + room);
    if (!out) return close_on_error(slot, proto::close_code::internal_error), false;
    room = std::min(limit, out.capacity() - message_header_room);  // the block's whole class, within the bound
    std::size_t n = 0;
    switch (_inflater->inflate(packed, in_len, {out.data() + message_header_room, room}, n)) {
      case proto::inflate_status::bad_data: return close_on_error(slot, proto::close_code::invalid_payload), false;
      case proto::inflate_status::too_big:
        if (room >= limit) return close_on_error(slot, proto::close_code::too_big), false;
        continue;
      case proto::inflate_status::ok: break;
    }
    const std::span<std::uint8_t> payload(out.data() + message_header_room, n);
    if (op == proto::opcode::text && !proto::is_valid_utf8(payload))
      return close_on_error(slot, proto::close_code::invalid_payload), false;
    in.reset();  // the compressed bytes are done with before the application runs
    _c.counters_mut().messages_in_compressed.add();
    out.set_size(message_header_room + n);
    return deliver(slot, op, &out, payload, out.capacity() - message_header_room);
  }
}

bool ws_phase::held(std::uint32_t slot) const noexcept {
  const connection& c = _c.at(slot);
  return (c.state == conn_state::open || c.state == conn_state::closing) && c.rx.ws && c.rx.ws->held;
}

void ws_phase::hold(std::uint32_t slot) noexcept {
  if (_c.at(slot).state != conn_state::open) return;
  ws_rx* rs = rx(slot);
  if (!rs) return close_on_error(slot, proto::close_code::internal_error);
  if (rs->held) return;
  rs->held = true;
  _c.pause_reading(slot);  // the kernel keeps what comes next
}

/// Keeps bytes of a held connection (a and then b), behind those kept already.
void ws_phase::keep(std::uint32_t slot, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept {
  ws_rx* rs = _c.at(slot).rx.ws.get();
  const std::size_t add = a.size() + b.size();
  if (add == 0 || keep_in_place(*rs, a, b)) return;
  if (!_replay) _c.counters_mut().held_input_bytes.add(add);  // taken from the kernel, not handed back
  std::size_t have = rs->kept.size() - rs->kept_from;
  if (have + add > max_kept_bytes) return close_on_error(slot, proto::close_code::policy_violation);
  if (rs->kept_from && rs->kept.size() + add > rs->kept.capacity()) {  // reuse the room handed over
    std::memmove(rs->kept.data(), rs->kept.data() + rs->kept_from, have);
    rs->kept.set_size(have);
    rs->kept_from = 0;
  }
  have = rs->kept.size();
  if (!rs->kept) rs->kept = _c.buffers().acquire(std::max<std::size_t>(add, 1024));
  if (!rs->kept || (have + add > rs->kept.capacity() && !rs->kept.reserve(std::max(have + add, rs->kept.capacity() * 2))))
    return close_on_error(slot, proto::close_code::internal_error);
  if (!a.empty()) std::memcpy(rs->kept.data() + have, a.data(), a.size());
  if (!b.empty()) std::memcpy(rs->kept.data() + have + a.size(), b.data(), b.size());
  rs->kept.set_size(have + add);
}

/// Held again while resume() hands kept bytes over: what stays (b, the end of those bytes,
/// behind a, at most a header's tail from the stack) becomes the kept bytes where it lies, in
/// the room already handed over. Resuming then costs what it handles, not a copy of the rest.
bool ws_phase::keep_in_place(ws_rx& rs, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept {
  if (!_replay || rs.kept) return false;
  std::span<const std::uint8_t> rest = b.empty() ? a : b, front = b.empty() ? b : a;
  const std::uint8_t *begin = _replay->data(), *end = begin + _replay->size();
  if (rest.data() < begin || rest.data() + rest.size() != end || std::size_t(rest.data() - begin) < front.size())
    return false;
  const std::size_t from = std::size_t(rest.data() - begin) - front.size();
  if (!front.empty()) std::memmove(_replay->data() + from, front.data(), front.size());
  rs.kept = std::move(*_replay);
  rs.kept_from = std::uint32_t(from);
  return true;
}

void ws_phase::resume(std::uint32_t slot) noexcept {
  connection& c = _c.at(slot);
  ws_rx* rs = c.rx.ws.get();
  if (!rs || !rs->held) return;
  rs->held = false;
  pool::lease kept = std::move(rs->kept);
  const std::size_t from = std::exchange(rs->kept_from, 0);
  if (c.state == conn_state::open || c.state == conn_state::closing) {
    c.flags |= flag_rearm_read;  // reading resumes at this iteration's flush
    _c.list(slot);
  }
  if (kept && kept.size() > from) {
    pool::lease* outer = std::exchange(_replay, &kept);
    on_bytes(slot, {kept.data() + from, kept.size() - from});
    _replay = outer;
    return;
  }
  if (!rs->reader.in_message() && !rs->reader.mid_frame() && rs->tail_len == 0 && !rs->msg) c.rx.ws.reset();
}

void ws_phase::queue_close(std::uint32_t slot, std::span<const std::uint8_t> payload) noexcept {
  pool::lease l = _c.buffers().acquire(proto::max_server_header_size + payload.size());
  if (!l) return;
  std::size_t hn = proto::encode_frame_header(
      std::span<std::uint8_t, proto::max_server_header_size>(l.data(), proto::max_server_header_size),
      proto::opcode::close, true, payload.size());
  if (!payload.empty()) std::memcpy(l.data() + hn, payload.data(), payload.size());
  l.set_size(hn + payload.size());
  _c.queue(slot, pool::frame_ref::adopt(std::move(l)), true);  // a close must get out: no bound
}

void ws_phase::close_on_error(std::uint32_t slot, proto::close_code code) noexcept {
  _c.counters_mut().protocol_errors.add();
  start_close(slot, code, true);
}

void ws_phase::start_close(std::uint32_t slot, proto::close_code code, bool linger) noexcept {
  connection& c = _c.at(slot);
  if (c.state != conn_state::open) return;
  std::uint8_t payload[2 + 16];
  std::size_t n = proto::encode_close_payload(code, proto::close_reason(code), payload);
  _c.set_state(slot, conn_state::closing);
  queue_close(slot, {payload, n});
  if (c.state != conn_state::closing) return;  // it could not be queued: the connection is gone
  if (c.ext & ext_sse) {  // a stream ends with its response: the client reconnects after `retry:`
    c.flags |= flag_close_when_flushed;
    _c.stop_reading(slot);
  } else if (linger) {
    // We stop parsing: half-close once the close frame is out, then wait for the peer's FIN.
    c.flags |= flag_linger_when_flushed;
    _c.stop_reading(slot);
  }
  _c.loop().arm(slot, _c.loop().ticks_for(_c.options().close_timeout));
}

/// One deadline per connection: the message timeout while a frame or message is unfinished,
/// otherwise the keepalive deadline (re-armed lazily from last_rx when it fires).
void ws_phase::note_timer(std::uint32_t slot, bool unfinished) noexcept {
  connection& c = _c.at(slot);
  if (c.state != conn_state::open) return;
  if (unfinished) {
    if (!(c.flags & flag_timer_message)) {
      c.flags |= flag_timer_message;
      arm(slot, _c.loop().ticks_for(_c.options().message_timeout));
    }
  } else if (c.flags & flag_timer_message) {
    c.flags &= ~flag_timer_message;
    arm(slot, _c.loop().ticks_for(_c.options().ping_interval));
  }
}

/// Arms an open connection's deadline `ticks` ahead, or at the application's expiry if that
/// comes first (flag_timer_exp then says so): a connection is closed within a tick of it.
void ws_phase::arm(std::uint32_t slot, std::uint32_t ticks) noexcept {
  connection& c = _c.at(slot);
  c.flags &= ~flag_timer_exp;
  ticks = std::min(ticks, std::max<std::uint32_t>(_c.life_left(slot), 1));  // on_timer looks at the lifetime first
  if (std::uint32_t exp = _c.app().expiry(slot)) {
    std::int64_t left_ms = std::min<std::int64_t>(std::int64_t(exp) * 1000 - realtime_ms(), 86'400'000);
    std::uint32_t until = left_ms <= 0 ? 1 : _c.loop().ticks_for(double(left_ms) / 1000.0);
    if (until <= ticks) {
      ticks = until;
      c.flags |= flag_timer_exp;
    }
  }
  _c.loop().arm(slot, ticks);
}

void ws_phase::rearm(std::uint32_t slot) noexcept {
  connection& c = _c.at(slot);
  if (c.state != conn_state::open) return;
  arm(slot, _c.loop().ticks_for(c.flags & flag_timer_message ? _c.options().message_timeout : _c.options().ping_interval));
}

void ws_phase::on_timer(std::uint32_t slot) noexcept {
  connection& c = _c.at(slot);
  const conn_options& o = _c.options();
  if (_c.life_left(slot) == 0) {  // --max-connection-lifetime: going away, as in a drain
    _c.counters_mut().lifetime_closes.add();
    return start_close(slot, proto::close_code::going_away, false);
  }
  if (c.flags & flag_timer_exp) {
    // The wheel's monotonic ticks and the wall clock may disagree by a little: if it is not
    // quite time yet, wait for the rest (every other deadline was later than this one).
    if (realtime_ms() >= std::int64_t(_c.app().expiry(slot)) * 1000) return _c.app().on_expired(slot);
    return arm(slot, UINT32_MAX);
  }
  if (c.ext & ext_sse) {  // a stream: a comment line every interval, and no answer to wait for
    queue_ping(slot);
    if (c.state == conn_state::open) arm(slot, _c.loop().ticks_for(o.ping_interval));  // (the comment may have closed it)
    return;
  }
  if (c.flags & flag_timer_message) {  // a frame or message started and did not finish in time
    _c.counters_mut().timeouts.add();
    return close_on_error(slot, proto::close_code::policy_violation);
  }
  if (c.flags & flag_ping_sent) {  // nothing came back since our ping
    _c.counters_mut().timeouts.add();
    return _c.close_now(slot);
  }
  const std::uint32_t silent = _c.loop().now() - c.last_rx, interval = _c.loop().ticks_for(o.ping_interval);
  if (silent < interval) return arm(slot, interval - silent);
  c.flags |= flag_ping_sent;
  queue_ping(slot);
  arm(slot, _c.loop().ticks_for(o.pong_timeout));
}

/// The keepalive: a ping frame, or for a client that asked for a heartbeat it can see, the text
/// `{"op":"ping"}` (its answer, or anything else it sends, counts as the pong).
void ws_phase::queue_ping(std::uint32_t slot) noexcept {
  const bool text = _c.at(slot).flags & flag_text_heartbeat;
  const std::string_view payload = text ? proto::heartbeat_ping : std::string_view{};
  pool::lease l = _c.buffers().acquire(2 + payload.size());
  if (!l) return;
  l.data()[0] = 0x80 | std::uint8_t(text ? proto::opcode::text : proto::opcode::ping);
  l.data()[1] = std::uint8_t(payload.size());
  if (text) std::memcpy(l.data() + 2, payload.data(), payload.size());
  l.set_size(2 + payload.size());
  _c.queue(slot, pool::frame_ref::adopt(std::move(l)));
}

}  // namespace wspush::server
