// The connection lifecycle and the loop's events: accept, route bytes to the phase the
// connection is in, queue and write output under the slow-consumer bound, close, release.

#include "server/conn/connections.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include <sys/socket.h>
#include <unistd.h>

#include "proto/ws_handshake.hpp"
#include "server/base/log.hpp"

namespace wspush::server {

connections::connections(const conn_options& o, loop_ops& l, transport& t, application& app,
                         pool::buffer_pool& buffers, std::atomic<std::uint32_t>& open_count)
    : _o(o), _loop(l), _transport(t), _app(app), _buffers(buffers), _open_count(open_count), _http(*this, _ws),
      _ws(*this), _sse(*this) {
  _iov.resize(IOV_MAX);
  if (o.max_connection_lifetime > 0) _life_ticks = std::max<std::uint32_t>(1, l.ticks_for(o.max_connection_lifetime));
  _release_later.reserve(64);
  _stalls.reserve(64);
  _app.bind(*this);
}

connections::~connections() = default;

void connections::set_state(std::uint32_t slot, conn_state s) noexcept {
  connection& c = _table.at(slot);
  if (c.state != conn_state::free) _n.in_state[std::size_t(c.state)].sub();
  if (s != conn_state::free) _n.in_state[std::size_t(s)].add();
  c.state = s;
}

// ---- accept and events ------------------------------------------------------------------

void connections::on_accept(int fd) noexcept {
  if (fd < 0) {
    if (_draining) return;  // the listener was shut down on purpose (loop::begin_drain)
    // Out of file descriptors (or memory): stop taking connections for a moment instead of
    // spinning on the error. The kernel keeps the backlog meanwhile.
    log_ratelimited(log_level::warn, "accept failed: %s; pausing accepts for 100 ms", std::strerror(-fd));
    _loop.pause_accepting(_loop.ticks_for(0.1));
    return;
  }
  if (_draining) {
    ::close(fd);
    return;
  }
  _n.accepted.add();
  const std::uint32_t max = _limit ? _limit->load(std::memory_order_relaxed) : _o.max_connections;
  const std::uint32_t limit = max ? max : UINT32_MAX;
  std::uint32_t slot = _open_count.load(std::memory_order_acquire) >= limit ? no_index : _table.acquire(UINT32_MAX);
  if (slot != no_index && !_loop.track(slot)) {
    _table.release(slot);
    slot = no_index;
  }
  if (slot == no_index) return refuse_over_capacity(fd);
  _open_count.fetch_add(1, std::memory_order_relaxed);
  connection& c = _table.at(slot);
  c.fd = fd;
  c.flags = 0;
  c.ext = 0;
  set_state(slot, conn_state::upgrading);
  _loop.arm(slot, _loop.ticks_for(_o.upgrade_timeout));
  if (!_transport.open(fd, token_of(slot))) close_now(slot);
}

/// Over capacity: answered before any WebSocket state exists. A best-effort write: the socket
/// is fresh, its send buffer empty.
void connections::refuse_over_capacity(int fd) noexcept {
  char buf[256];
  std::size_t n = proto::encode_http_response(503, buf, "over capacity, retry later\n", "Retry-After: 5\r\n");
  [[maybe_unused]] auto r = ::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
  _n.upgrades_over_capacity.add();
}

void connections::on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept {
  if (lookup(t) == no_index) return;
  _n.bytes_in.add(bytes.size());
  if (!_transport.on_received(t, bytes, *this)) {
    std::uint32_t slot = lookup(t);  // the plaintext may have closed it already
    if (slot != no_index) close_now(slot);
  }
}

void connections::on_plaintext(conn_token t, std::span<std::uint8_t> bytes) noexcept {
  std::uint32_t slot = lookup(t);
  if (slot == no_index) return;
  connection& c = _table.at(slot);
  if (c.ext & ext_sse) {  // a stream's client has nothing to say: one that speaks is not one
    if (c.state == conn_state::open) close_now(slot);
    return;
  }
  switch (c.state) {
    case conn_state::upgrading: return _http.on_bytes(slot, bytes);
    case conn_state::upgrade_pending: return _http.on_early_bytes(slot, bytes);
    case conn_state::open:
      c.last_rx = _loop.now();  // any bytes prove the peer alive (an answer to our ping too)
      c.flags &= ~flag_ping_sent;
      return _ws.on_bytes(slot, bytes);
    case conn_state::closing: return _ws.on_bytes(slot, bytes);
    default: return;
  }
}

void connections::on_read_end(conn_token t, int) noexcept {
  std::uint32_t slot = lookup(t);
  if (slot == no_index || _table.at(slot).state == conn_state::dead) return;
  _transport.on_read_end(t);
  close_now(slot);  // end of stream or error: nothing more will arrive
}

void connections::on_read_paused(conn_token t) noexcept {
  std::uint32_t slot = lookup(t);
  if (slot == no_index || _table.at(slot).state == conn_state::dead) return;
  _table.at(slot).flags |= flag_rearm_read;
  list(slot);
}

void connections::on_timer(std::uint32_t slot) noexcept {
  switch (_table.at(slot).state) {
    case conn_state::upgrading:
    case conn_state::upgrade_pending:
      _n.upgrades_timeout.add();
      _n.timeouts.add();
      _transport.on_timeout(token_of(slot));
      close_now(slot);
      break;
    case conn_state::closing:
      _n.timeouts.add();
      close_now(slot);
      break;
    case conn_state::open: _ws.on_timer(slot); break;
    default: break;
  }
}

// ---- output -------------------------------------------------------------------------------

/// The kernel was offered this connection's earlier bytes and did not take them all: a short
/// write waits for room, or an asynchronous send issued two turns ago (so its submission has
/// been reaped, see out_queue.hpp) has not completed.
bool connections::stuck(const connection& c) const noexcept {
  if (c.flags & flag_wait_writable) return true;
  return (c.flags & flag_send_in_flight) && c.tx.sent_turn() + 1 < _loop.turn();
}

bool connections::queue(std::uint32_t slot, pool::frame_ref f, bool control) noexcept {
  connection& c = _table.at(slot);
  if (!f || c.state == conn_state::free || c.state == conn_state::dead) return false;
  if ((c.ext & ext_deflate) && f.has_twin()) f = f.twin();  // the compressed frame of the same message
  bool end_after = false;
  if (c.ext & ext_sse) {  // the same messages as events
    f = _in_batch && !control && _sse.stateless(slot) ? _sse.shared(f) : _sse.render(slot, f, end_after);
    if (!f) return close_now(slot), false;
    if (f.bytes().empty()) return true;  // nothing of it has a form on a stream
  }
  if (!c.tx.push(_buffers, std::move(f))) return close_now(slot), false;
  if (end_after) return _ws.start_close(slot, proto::close_code::try_again_later, false), true;  // its retry: is spread
  if (!control && c.state == conn_state::open) {
    switch (c.tx.judge(_o.max_pending_bytes, stuck(c))) {
      case out_queue::verdict::ok: break;
      case out_queue::verdict::over: _loop.yield_inbox(); break;  // let the flush run first
      case out_queue::verdict::slow: return close_slow_consumer(slot), false;
    }
  }
  list(slot);
  return true;
}

void connections::queue_pong(std::uint32_t slot, std::span<const std::uint8_t> payload) noexcept {
  connection& c = _table.at(slot);
  if (!c.tx.push_pong(_buffers, payload)) return close_now(slot);
  if (c.tx.judge(_o.max_pending_bytes, stuck(c)) == out_queue::verdict::slow) return close_slow_consumer(slot);
  list(slot);
}

/// A slow consumer: what it has not been offered yet it will not get (bounded memory beats
/// completeness: it reconnects and resumes from history); it is told 1013 and closed.
void connections::close_slow_consumer(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  _n.slow_consumer_closes.add();
  log_ratelimited(log_level::info, "closing a slow consumer (%llu bytes unread)", (unsigned long long)c.tx.bytes());
  c.tx.drop_unsent();
  _ws.start_close(slot, proto::close_code::try_again_later, true);
}

/// A send the kernel may not finish left more than the bound unsent. What waits behind the
/// frame being written was judged already; the frame itself may be larger than the bound, and
/// that is no fault while the reader takes it: the watch closes the connection only once the
/// kernel has taken nothing for stall_seconds (judge_stalls). One watch per queue.
void connections::watch_stall(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (c.state != conn_state::open || c.tx.bytes() <= _o.max_pending_bytes || !c.tx.watch()) return;
  _stalls.push_back({token_of(slot), c.tx.taken(), _loop.now()});
}

/// Once a tick: a watched connection still over the bound that is stuck (the kernel refused
/// its last send) and of whose queue the kernel took no byte for stall_seconds is a slow
/// consumer. A watch ends when the connection is back within the bound or no longer open.
void connections::judge_stalls(std::uint32_t tick) noexcept {
  const std::uint32_t grace = _loop.ticks_for(stall_seconds);
  for (std::size_t k = 0; k < _stalls.size();) {
    stall& s = _stalls[k];
    const std::uint32_t slot = lookup(s.token);
    connection* c = slot == no_index ? nullptr : &_table.at(slot);
    const bool over = c && c->state == conn_state::open && c->tx.bytes() > _o.max_pending_bytes;
    if (over && c->tx.taken() != s.taken) {  // the reader took something: the wait starts again
      s.taken = c->tx.taken();
      s.since = tick;
    }
    // `<=`: a whole stall_seconds, whatever part of its tick `since` fell in.
    if (over && (tick - s.since <= grace || !stuck(*c))) {
      ++k;
      continue;
    }
    s = _stalls.back();
    _stalls.pop_back();
    if (!c) continue;
    c->tx.unwatch();
    if (over) close_slow_consumer(slot);
  }
}

void connections::list(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (c.flags & flag_listed) return;
  c.flags |= flag_listed;
  _loop.list(slot);
}

void connections::on_flush(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  c.flags &= ~flag_listed;
  if (c.state == conn_state::free || c.state == conn_state::dead) return;
  if ((c.flags & flag_rearm_read) && c.state != conn_state::upgrade_pending && !_ws.held(slot)) {
    c.flags &= ~flag_rearm_read;
    _transport.resume_reading(c.fd, token_of(slot));
  }
  flush(slot);
}

/// Writes everything queued in one send (coalescing: a loopback send costs about the same CPU
/// whatever its size, so sends per subscriber decide fan-out speed). While a send is in flight
/// new frames queue behind it and leave with the next.
void connections::flush(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (c.flags & (flag_send_in_flight | flag_wait_writable)) return;
  while (!c.tx.empty()) {
    std::size_t offered = 0;
    int n = c.tx.gather(_iov, offered, _transport.max_send_bytes());
    _n.sends.add();
    send_result r = _transport.send(c.fd, token_of(slot), _iov.data(), n);
    if (r.outcome == send_outcome::pending) {
      c.flags |= flag_send_in_flight;
      c.tx.sending(offered, _loop.turn());
      return watch_stall(slot);
    }
    if (r.outcome == send_outcome::failed) return close_now(slot);
    _n.bytes_out.add(r.bytes);
    c.tx.consume(r.bytes);
    if (r.bytes < offered) {  // the socket is full: what it did not take is the backlog
      c.flags |= flag_wait_writable;
      _transport.wait_writable(c.fd, token_of(slot));
      if (c.state == conn_state::open && c.tx.judge(_o.max_pending_bytes, true) == out_queue::verdict::slow)
        return close_slow_consumer(slot);
      return watch_stall(slot);
    }
  }
  output_drained(slot);
}

void connections::output_drained(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (c.flags & flag_close_when_flushed) return close_now(slot);
  if (c.flags & flag_linger_when_flushed) {
    c.flags &= ~flag_linger_when_flushed;
    _transport.shutdown_write(c.fd, token_of(slot));
  }
}

void connections::on_send_done(conn_token t, int res) noexcept {
  // The transport hears of every completion first: some are its own writes (a TLS handshake
  // record), and it may still have bytes of a closed connection in flight.
  transport_event e = _transport.on_sent(t, res);
  std::uint32_t slot = lookup(t);
  if (slot == no_index || e.kind == transport_event::in_progress) return;
  send_ended(slot, e);
}

void connections::on_writable(conn_token t) noexcept {
  std::uint32_t slot = lookup(t);
  if (slot == no_index) return;
  connection& c = _table.at(slot);
  if (c.state == conn_state::free || c.state == conn_state::dead) return;
  transport_event e = _transport.on_writable(c.fd, t);
  if (e.kind == transport_event::in_progress) return;
  if (e.kind == transport_event::writable) {
    c.flags &= ~flag_wait_writable;
    return list(slot);
  }
  send_ended(slot, e);
}

/// The transport's write made progress: the connection's pending send ended (`e.plaintext` of
/// it taken), or the transport's own (nothing of the connection's was pending), or it failed.
void connections::send_ended(std::uint32_t slot, const transport_event& e) noexcept {
  connection& c = _table.at(slot);
  const bool was_pending = c.flags & flag_send_in_flight;
  c.flags &= ~flag_send_in_flight;
  std::size_t offered = was_pending ? c.tx.in_flight() : 0;
  if (c.state == conn_state::dead) {
    if (was_pending) c.tx.consume(0);  // the send is over: its frames may go
    if (_transport.idle(token_of(slot))) release(slot);
    return;
  }
  if (e.kind == transport_event::failed) {
    if (was_pending) c.tx.consume(0);
    return close_now(slot);
  }
  if (!was_pending) return list(slot);  // the transport's own bytes: ours may follow
  std::size_t taken = std::min(e.plaintext, offered);
  _n.bytes_out.add(taken);
  c.tx.consume(taken);
  if (taken < offered && c.state == conn_state::open &&
      c.tx.judge(_o.max_pending_bytes, true) == out_queue::verdict::slow)
    return close_slow_consumer(slot);
  list(slot);  // what queued meanwhile leaves with the next send, at the end of this iteration
}

send_counts connections::send_all(std::span<const conn_id> cs, const pool::frame_ref& f,
                                   std::uint32_t messages) noexcept {
  send_counts n;
  _in_batch = true;  // nothing may leave the application's array while we walk it
  for (conn_id c : cs) {
    if (_table.at(c).state != conn_state::open) ++n.closing;
    else if (queue(c, f)) ++n.queued;
    else ++n.slow;
  }
  _in_batch = false;
  _n.messages_out.add(n.queued * messages);
  _sse.end_batch();
  for (std::size_t k = 0; k < _release_later.size(); ++k) release(_release_later[k]);
  _release_later.clear();
  return n;
}

// ---- closing ------------------------------------------------------------------------------

void connections::close(conn_id c, proto::close_code code) noexcept { _ws.start_close(c, code, true); }

bool connections::is_open(conn_id c) const noexcept {
  return c < _table.capacity() && _table.at(c).state == conn_state::open;
}

std::size_t connections::unsent_bytes(conn_id c) const noexcept {
  return c < _table.capacity() ? std::size_t(_table.at(c).tx.bytes()) : 0;
}

void connections::stop_reading(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  c.flags |= flag_read_broken;
  c.drop_rx();
}

void connections::pause_reading(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  c.flags |= flag_rearm_read;
  _transport.pause_reading(c.fd, token_of(slot));
}

void connections::opened(std::uint32_t slot) noexcept {
  _table.at(slot).flags |= flag_app_open;
  if (!_life_ticks) return;
  if (slot >= _opened_at.size()) {
    try {
      _opened_at.resize(_table.capacity(), no_lifetime);  // once per chunk of the table, not per connection
    } catch (const std::bad_alloc&) {
      return;  // this one lives without a limit
    }
  }
  _opened_at[slot] = std::min(_loop.now(), no_lifetime - 1);
}

/// A connection's life is the lifetime +-10%, drawn from its token: each connection its own, so
/// that connections opened together (a reconnect storm) do not all end together either.
std::uint32_t connections::life_left(std::uint32_t slot) const noexcept {
  if (!_life_ticks || slot >= _opened_at.size() || _opened_at[slot] == no_lifetime) return UINT32_MAX;
  std::uint64_t h = make_token(slot, _table.at(slot).gen) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  const double draw = double(h >> 11) * 0x1p-53;  // [0, 1)
  const auto life = std::uint32_t(double(_life_ticks) * (0.9 + 0.2 * draw));
  const std::uint32_t age = _loop.now() - _opened_at[slot];
  return age >= life ? 0 : life - age;
}

void connections::stream_opened(std::uint32_t slot) noexcept {
  _table.at(slot).ext |= ext_sse;
  _n.streams_opened.add();
  _n.streams_open.add();
}


void connections::negotiated_deflate(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (!_compression || (c.ext & ext_deflate)) return;
  c.ext |= ext_deflate;
  _compression->joined();
}

/// Leaves the --max-connections count (once). A peer that sees the close may connect again at
/// once, on another shard too, and must find room: so the count goes down when the socket
/// closes, unless a send still holds the socket in the kernel; then it goes down when that
/// send ends, and the kernel has let go.
void connections::leave_count(connection& c) noexcept {
  if (c.flags & flag_counted_out) return;
  c.flags |= flag_counted_out;
  _open_count.fetch_sub(1, std::memory_order_release);
}

void connections::close_now(std::uint32_t slot) noexcept {
  connection& c = _table.at(slot);
  if (c.state == conn_state::free || c.state == conn_state::dead) return;
  _loop.cancel(slot);
  // Output it did not take: a peer that does not read. Reset, so the kernel frees the socket
  // now instead of probing a zero window for minutes.
  _transport.close(c.fd, token_of(slot), !c.tx.empty());
  // A send still in flight (the connection's, or the transport's own) holds the slot and the
  // count until its completion: the kernel has not let go of the socket yet.
  const bool in_flight = (c.flags & flag_send_in_flight) || !_transport.idle(token_of(slot));
  if (!in_flight) leave_count(c);
  c.fd = -1;
  c.drop_rx();
  set_state(slot, conn_state::dead);
  if (!in_flight) release(slot);  // else the send's completion does it
}

void connections::release(std::uint32_t slot) noexcept {
  if (_in_batch) {  // the application is walking its subscribers: release the slot after it
    _release_later.push_back(slot);
    return;
  }
  connection& c = _table.at(slot);
  c.tx.clear();
  leave_count(c);
  if (c.ext & ext_deflate) _compression->left();
  if (c.ext & ext_sse) {
    _sse.forget(slot);
    _n.streams_open.sub();
  }
  c.ext = 0;
  if (c.flags & flag_app_open) _app.on_close(slot);
  set_state(slot, conn_state::free);
  _table.release(slot);
}

// ---- drain ----------------------------------------------------------------------------------

std::uint64_t connections::on_drain_begin() noexcept {
  _draining = true;
  std::uint64_t open = 0;
  for (std::uint32_t i = 0; i < _table.capacity(); ++i) {
    connection& c = _table.at(i);
    if (c.state == conn_state::open) ++open;
    else if (c.state == conn_state::upgrading) close_now(i);
  }
  return open;
}

std::uint64_t connections::close_some(std::uint64_t n) noexcept {
  std::uint64_t closed = 0;
  for (; closed < n && _drain_cursor < _table.capacity(); ++_drain_cursor) {
    if (_table.at(_drain_cursor).state != conn_state::open) continue;
    _ws.start_close(_drain_cursor, proto::close_code::going_away, false);
    ++closed;
  }
  return closed;
}

}  // namespace wspush::server
