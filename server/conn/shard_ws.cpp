// The WebSocket phase: frames in, messages to the application (echo or broadcast), control
// frames answered. An idle connection's reader is a fresh one on the stack; only when a read
// leaves something unfinished (a split header, a payload still arriving, a fragmented
// message) does the connection lease an rx_state block to keep it until the next read.

#include <algorithm>
#include <cstring>

#include "proto/ws_close.hpp"
#include "server/app/log.hpp"
#include "server/conn/shard.hpp"
#include "server/conn/shard_internal.hpp"

namespace wspush::server {

struct shard::ws_events {
  shard* s;
  std::uint32_t i;

  rx_state* rx() noexcept {
    connection& c = s->_conns.at(i);
    if (!c.rx) {
      c.rx = s->_g.buffers->acquire(sizeof(rx_state));
      if (!c.rx) return nullptr;
      new (c.rx.data()) rx_state{};
    }
    return block_as<rx_state>(c.rx);
  }

  bool on_data(proto::opcode op, std::span<std::uint8_t> piece, bool first, bool last) noexcept {
    if (s->_conns.at(i).state != conn_state::open) return true;  // closing: discard data
    if (first && last) {
      pool::lease none;
      return s->deliver(i, op, none, piece);
    }
    rx_state* rs = rx();
    if (!rs) return s->fail(i, proto::close_code::internal_error), false;
    if (first) {
      rs->msg = s->_g.buffers->acquire(rx_state::header_room + std::max<std::size_t>(piece.size() * 2, 4096));
      rs->msg_len = 0;
      rs->msg_op = op;
    }
    std::size_t need = rx_state::header_room + rs->msg_len + piece.size();
    if (rs->msg) rs->msg.set_size(rx_state::header_room + rs->msg_len);
    if (!rs->msg || (need > rs->msg.capacity() && !rs->msg.reserve(std::max(need, rs->msg.capacity() * 2))))
      return s->fail(i, proto::close_code::too_big), false;
    copy_bytes(rs->msg.data() + rx_state::header_room + rs->msg_len, piece);
    rs->msg_len += std::uint32_t(piece.size());
    if (!last) return true;
    pool::lease msg = std::move(rs->msg);
    msg.set_size(rx_state::header_room + rs->msg_len);
    return s->deliver(i, rs->msg_op, msg, {});
  }

  bool on_control(proto::opcode op, std::span<std::uint8_t> payload) noexcept {
    connection& c = s->_conns.at(i);
    if (op == proto::opcode::ping) {
      if (c.state == conn_state::open) s->queue_control(i, proto::opcode::pong, payload);
      return true;
    }
    if (op != proto::opcode::close) return true;  // pong: nothing to do
    if (c.state == conn_state::open) {
      // Echo the peer's code (none if it sent none), then close once that is on the wire.
      s->queue_control(i, proto::opcode::close, payload.first(std::min<std::size_t>(payload.size(), 2)));
      s->set_state(i, conn_state::closing);
      s->_wheel.arm(i, s->ticks_for(s->_cfg.close_timeout));
    }
    c.flags |= flag_close_when_flushed | flag_read_broken;  // nothing follows a close frame
    s->list(i);
    return false;
  }
};

void shard::ws_read(std::uint32_t i, std::span<std::uint8_t> bytes) noexcept {
  connection& c = _conns.at(i);
  if (c.flags & flag_read_broken) return;  // after an error or a close: discard
  const std::uint32_t gen = c.gen;
  rx_state* rs = c.rx ? block_as<rx_state>(c.rx) : nullptr;
  proto::ws_reader r = rs ? rs->reader : proto::ws_reader{};
  std::uint8_t tail[sizeof rx_state::tail];
  std::size_t tail_len = 0, pos = 0, used = 0;

  if (rs && rs->tail_len) {
    // Join the kept tail with the start of the new bytes: a header or control frame is never
    // longer than the tail buffer, so this join always completes it if the bytes are there.
    std::size_t t = rs->tail_len, m = std::min(bytes.size(), sizeof tail - t);
    std::memcpy(tail, rs->tail, t);
    std::memcpy(tail + t, bytes.data(), m);
    rs->tail_len = 0;
    if (!ws_consume(i, r, {tail, t + m}, used)) return;
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
    if (!ws_consume(i, r, rest, used)) return;
    tail_len = rest.size() - used;
    std::memcpy(tail, rest.data() + used, tail_len);
  }
  if (c.gen != gen || (c.state != conn_state::open && c.state != conn_state::closing)) return;

  bool unfinished = r.in_message() || r.mid_frame() || tail_len > 0;
  if (unfinished) {
    rs = ws_events{this, i}.rx();
    if (!rs) return fail(i, proto::close_code::internal_error);
    rs->reader = r;
    rs->tail_len = std::uint8_t(tail_len);
    std::memcpy(rs->tail, tail, tail_len);
  } else if (c.rx) {
    block_as<rx_state>(c.rx)->~rx_state();
    c.rx.reset();
  }
  note_message_timer(i, r);
}

bool shard::ws_consume(std::uint32_t i, proto::ws_reader& r, std::span<std::uint8_t> bytes,
                       std::size_t& used) noexcept {
  const std::uint32_t gen = _conns.at(i).gen;
  proto::ws_limits limits{std::min(_cfg.max_frame_bytes, _cfg.message_limit()), _cfg.message_limit()};
  ws_events h{this, i};
  auto res = r.consume(bytes, limits, h);
  connection& c = _conns.at(i);
  if (c.gen != gen || c.state == conn_state::free || c.state == conn_state::dead) return false;
  if (res.status == proto::parse_status::error) {
    fail(i, res.error);
    return false;
  }
  if (c.flags & flag_read_broken) return false;  // a close frame, or a failure inside a handler
  used = res.consumed;
  return true;
}

bool shard::deliver(std::uint32_t i, proto::opcode op, pool::lease& msg, std::span<std::uint8_t> piece) noexcept {
  _n.messages_in.add();
  if (_cfg.mode == app_mode::pubsub) {
    if (!msg)
      return client_message(i, op, {reinterpret_cast<const char*>(piece.data()), piece.size()}, piece.size());
    constexpr std::size_t at = rx_state::header_room;
    return client_message(i, op, {reinterpret_cast<const char*>(msg.data()) + at, msg.size() - at},
                          msg.capacity() - at);
  }
  if (_cfg.mode == app_mode::broadcast && op != proto::opcode::text) return true;
  pool::lease frame;
  if (msg) {  // assembled in place: put the header right before the payload
    msg.set_size(proto::frame_in_place({msg.data(), msg.capacity()}, op, msg.size() - rx_state::header_room));
    frame = std::move(msg);
  } else {
    std::uint8_t hdr[proto::max_server_header_size];
    std::size_t hn = proto::encode_frame_header(std::span<std::uint8_t, proto::max_server_header_size>(hdr), op, true,
                                                piece.size());
    frame = _g.buffers->acquire(hn + piece.size());
    if (!frame) return fail(i, proto::close_code::internal_error), false;
    std::memcpy(frame.data(), hdr, hn);
    copy_bytes(frame.data() + hn, piece);
    frame.set_size(hn + piece.size());
  }
  pool::frame_ref f = pool::frame_ref::adopt(std::move(frame));
  if (_cfg.mode == app_mode::echo) {
    if (queue(i, std::move(f))) _n.messages_out.add();
  } else {
    for (shard* other : _g.shards)  // overload: never wait on a sibling's full inbox from here
      if (other != this && other->inbox_crowded()) return start_close(i, proto::close_code::try_again_later, true), false;
    for (shard* other : _g.shards)
      if (other != this) other->post({inbox_item::broadcast, pool::frame_ref(f).release_raw()});
    broadcast_local(f);
  }
  return _conns.at(i).state == conn_state::open;
}

void shard::broadcast_local(const pool::frame_ref& f) noexcept {
  std::uint64_t queued = 0;
  for (std::uint32_t i = 0; i < _conns.capacity(); ++i)
    if (_conns.at(i).state == conn_state::open) queued += queue(i, f);
  _n.messages_out.add(queued);
}

void shard::fail(std::uint32_t i, proto::close_code code) noexcept {
  _n.protocol_errors.add();
  start_close(i, code, true);
}

void shard::start_close(std::uint32_t i, proto::close_code code, bool linger) noexcept {
  connection& c = _conns.at(i);
  if (c.state != conn_state::open) return;
  std::uint8_t payload[2];
  std::size_t n = proto::encode_close_payload(code, {}, payload);
  set_state(i, conn_state::closing);
  queue_control(i, proto::opcode::close, {payload, n});
  if (linger) {
    // We stop parsing: half-close once the close frame is out, then wait for the peer's FIN.
    c.flags |= flag_read_broken | flag_linger_when_flushed;
    if (c.rx) {
      block_as<rx_state>(c.rx)->~rx_state();
      c.rx.reset();
    }
  }
  _wheel.arm(i, ticks_for(_cfg.close_timeout));
}

void shard::note_message_timer(std::uint32_t i, const proto::ws_reader& r) noexcept {
  // One deadline per connection: the message timeout while a frame or message is unfinished,
  // otherwise the keepalive deadline (re-armed lazily from last_rx when it fires).
  connection& c = _conns.at(i);
  if (c.state != conn_state::open) return;
  if (r.in_message() || r.mid_frame()) {
    if (!(c.flags & flag_timer_message)) {
      c.flags |= flag_timer_message;
      arm_open(i, ticks_for(_cfg.message_timeout));
    }
  } else if (c.flags & flag_timer_message) {
    c.flags &= ~flag_timer_message;
    arm_open(i, ticks_for(_cfg.ping_interval));
  }
}

void shard::on_open_timer(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  if (c.flags & flag_timer_exp) return on_expiry_timer(i);
  if (c.flags & flag_timer_message) {  // a frame or message started and did not finish in time
    _n.timeouts.add();
    return fail(i, proto::close_code::policy_violation);
  }
  if (c.flags & flag_ping_sent) {  // nothing came back since our ping
    _n.timeouts.add();
    return close_now(i);
  }
  const std::uint32_t silent = _wheel.now() - c.last_rx, interval = ticks_for(_cfg.ping_interval);
  if (silent < interval) return arm_open(i, interval - silent);
  c.flags |= flag_ping_sent;
  queue_control(i, proto::opcode::ping, {});
  arm_open(i, ticks_for(_cfg.pong_timeout));
}

}  // namespace wspush::server
