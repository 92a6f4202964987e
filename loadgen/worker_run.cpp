/// \file worker_run.cpp
/// The worker's loop, its receive path (frames → sequence accounting and latency) and the run
/// phase's timers (churn, client-side storm).
#include "loadgen/sys.hpp"
#include "loadgen/worker.hpp"

#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

namespace wspush::loadgen {

int worker::run() noexcept {
  _ep = epoll_with_control(_ctrl, ctrl_tag);
  if (_ep < 0) return 2;
  _start_ns = now_ns();
  _next_sample_ns = _start_ns + seconds_to_ns(_o.sample_interval);
  _connect_deadline = _start_ns + seconds_to_ns(_o.connect_timeout);
  _open_limit = rate_limiter(_o.connect_rate / _o.procs, _start_ns,
                             std::max<std::uint64_t>(1, static_cast<std::uint64_t>(_o.connect_rate / _o.procs / 20)));
  while (!_cmd.report && !_cmd.quit) {
    std::uint64_t now = now_ns();
    open_due(now);
    check_connect_phase(now);
    if (_cmd.go && !_go && !_initial) start_go(now);
    if (_go) {
      churn_tick(now);
      storm_tick(now);
    }
    if (now >= _next_sample_ns) {
      if (!_initial) expire_upgrades(now);
      send_sample(msg_kind::sample);
      ++_interval_no;
      const std::uint64_t step = seconds_to_ns(_o.sample_interval);
      while (_next_sample_ns <= now) _next_sample_ns += step;
    }
    wait(next_timeout(now_ns()));
  }
  // What is missing where nothing said so: a silent gap, unless its publish was never made
  // (answered 504 and not sent again: publish_unknown bounds those).
  _c[ctr::untold_loss] = 0;
  for (std::uint32_t i = 0; i < _conns.size(); ++i)
    if (_conns[i].checked && !_conns[i].told && _conns[i].received < wanted(i)) _c[ctr::untold_loss] += wanted(i) - _conns[i].received;
  send_sample(msg_kind::final_result);
  // Keep the sockets open until the parent has taken its last reading of the server.
  while (!_cmd.quit) wait(1000);
  return 0;
}

int worker::next_timeout(std::uint64_t now) const noexcept {
  std::uint64_t wake = std::min<std::uint64_t>(_next_sample_ns, now + 1'000'000'000ull);
  if (_initial) wake = std::min(wake, _connect_deadline);
  const std::uint32_t limit = _o.connect_rate > 0 ? 1u << 30 : _o.inflight;
  if (!_to_open.empty() && _in_progress < limit) {
    wake = std::min(wake, std::max(_to_open.front().first, now + _open_limit.wait_ns(now)));
  }
  if (_storm_due_ns != 0) wake = std::min(wake, _storm_due_ns);
  if (_go && _o.sc == scenario::churn && !_churners.empty()) wake = std::min(wake, now + _churn_limit.wait_ns(now));
  return wake <= now ? 0 : static_cast<int>((wake - now + 999'999) / 1'000'000);
}

int worker::wait(int timeout_ms) noexcept {
  epoll_event events[256];
  const int n = epoll_wait(_ep, events, 256, timeout_ms);
  for (int k = 0; k < n; ++k) dispatch(events[k].data.u64, events[k].events);
  return n;
}

void worker::read_command() noexcept { read_commands(_ctrl, _ep, _cmd); }

void worker::send_sample(msg_kind kind) noexcept {
  _c[ctr::unique] = _seq.unique;
  _c[ctr::duplicates] = _seq.duplicates;
  _c[ctr::gaps] = _seq.gaps;
  _c[ctr::reordered] = _seq.reordered;
  _c[ctr::stale] = _seq.stale;
  if (kind == msg_kind::final_result) {
    const std::string steps = encode_steps(_index, _steps);
    if (!write_all(_report, steps.data(), steps.size())) _exit(3);
  }
  const histogram& connect = kind == msg_kind::final_result ? *_connect : *_empty;
  const std::string msg = encode_msg(kind, _index, _interval_no, _c, *_interval, connect);
  if (!write_all(_report, msg.data(), msg.size())) _exit(3);   // the parent is gone
  _interval->reset();
}

void worker::dispatch(std::uint64_t tag, std::uint32_t events) noexcept {
  if (tag == ctrl_tag) return read_command();
  const auto i = static_cast<std::uint32_t>(tag);
  switch (_conns[i].state) {
    case conn_state::connecting: return on_connected(i);
    case conn_state::handshaking: return on_handshake(i);
    case conn_state::upgrading: return on_upgrade_bytes(i);
    case conn_state::subscribing:
    case conn_state::ready: return on_readable(i);
    case conn_state::paused:
      if (events & (EPOLLERR | EPOLLHUP)) {
        ++_c[ctr::disconnects];
        drop(i, false, 0);
      }
      return;
    default: return;
  }
}

// ---------------------------------------------------------------------------------------------
// Receiving

void worker::on_readable(std::uint32_t i) noexcept {
  for (;;) {
    const ssize_t n = io_recv(i, _rbuf.data(), _rbuf.size());
    if (n == -1) return;
    if (n <= 0) {
      ++_c[ctr::disconnects];
      return drop(i, reconnects() && _go, 50'000'000 + _rng.next() % 250'000'000);
    }
    _recv_ns = now_ns();
    feed(i, std::span<const std::uint8_t>(_rbuf.data(), static_cast<std::size_t>(n)));
    // Plain: one read per wake-up (epoll says again if there is more). TLS: what it has read
    // from the socket already, the socket will not announce.
    if (_tls == nullptr || _conns[i].fd < 0 || SSL_pending(_ssl[i]) == 0) return;
  }
}

/// One of our payloads: misdelivery (another connection's topic), sequence (loss, duplicates,
/// order), latency against the read's timestamp. Inline: the frame loop's per-message work.
[[gnu::always_inline]] inline void worker::on_payload(lg_conn& c, std::uint32_t i, const delivery& d) noexcept {
  ++_c[ctr::deliveries];
  if (_o.proto == protocol::pubsub && !d.memo_topic && !_o.topic_matches(_first + i, d.topic)) {
    ++_c[ctr::foreign];   // an event of a topic this connection did not subscribe to
    return;
  }
  if (!_last_ids.empty() && _streams.empty()) keep_id(i, d.id);   // a stream keeps its id: lines
  const bool fresh = c.seq.on_seq(static_cast<std::uint32_t>(d.seq), c.checked ? _seq : _scratch);
  const std::uint64_t latency = _recv_ns > d.send_ns ? _recv_ns - d.send_ns : 0;
  if (!_steps.empty() && c.checked) {
    // Mailboxes: message n went to topic n % topics as that topic's number n / topics.
    step_total& st = _steps[_o.step_of(d.seq * _o.topic_count() + _first + i)];
    if (fresh) {
      ++st.c[ctr::unique];
      st.latency->record(latency);
    } else {
      ++st.c[ctr::duplicates];
    }
  }
  if (!fresh) return;
  _interval->record(latency);
  _c.last_delivery_ns = _recv_ns;
  if (c.checked && ++c.received == wanted(i)) on_complete();
}

/// Routes the frame reader's events of one connection back into the worker. Our payloads
/// (events, or plain messages from a broadcast server; told by their first bytes) are accounted
/// right here in the frame loop; replies to the sub and anything else go to on_reply().
struct worker::sink {
  worker& w;
  lg_conn& c;
  std::uint32_t i;
  bool closed = false;
  std::uint16_t close_code = 0;

  // After a drop inside this read (an error reply, say) the rest of the read is ignored.
  [[nodiscard]] bool gone() const noexcept { return closed || c.fd < 0; }

  [[gnu::always_inline]] void on_message(std::span<const std::uint8_t> m, std::uint8_t op) noexcept {
    if (gone()) return;
    if (op & compressed_bit) {
      if (!c.deflate) return void(++w._c[ctr::protocol_errors]);  // RSV1 without the extension
      ++w._c[ctr::compressed];
      m = w._inflater->head(m);
    }
    const std::string_view msg(reinterpret_cast<const char*>(m.data()), m.size());
    if (w._o.proto == protocol::pubsub && !msg.starts_with(R"({"topic":")")) return w.on_reply(i, msg);
    const delivery d = w._memo->read(msg, c.seq.next());
    if (d.ok) return w.on_payload(c, i, d);
    ++w._c[ctr::foreign];
  }
  void on_ping(std::span<const std::uint8_t> payload) noexcept {
    if (gone()) return;
    ++w._c[ctr::pings];
    w.send_control(c, proto::opcode::pong, payload);
  }
  void on_close(std::span<const std::uint8_t> payload) noexcept {
    if (gone()) return;
    closed = true;
    if (payload.size() >= 2) close_code = static_cast<std::uint16_t>(payload[0] << 8 | payload[1]);
    w.send_control(c, proto::opcode::close, payload.first(std::min<std::size_t>(payload.size(), 2)));
  }
};

/// Routes the event-stream reader's events of one stream back into the worker: the same
/// accounting as the WebSocket's messages (an event's data is the message a WebSocket client
/// gets), named events (`subbed`, `lost`, `error`) to on_reply() as the replies they carry, the
/// keepalive comment counted as a ping. Every `id:` is kept for Last-Event-ID when the scenario
/// reconnects.
struct worker::stream_sink {
  worker& w;
  lg_conn& c;
  std::uint32_t i;
  bool closed = false;
  std::uint64_t retry_ns = 0;

  [[nodiscard]] bool gone() const noexcept { return closed || c.fd < 0; }

  [[gnu::always_inline]] void on_event(const sse_event& e) noexcept {
    if (gone()) return;
    if (e.has_id && !w._last_ids.empty()) w.keep_id(i, e.id);
    if (e.data.empty()) return;
    if (!e.name.empty() || !e.data.starts_with(R"({"topic":")")) return w.on_reply(i, e.data);
    const delivery d = w._memo->read(e.data, c.seq.next());
    if (d.ok) return w.on_payload(c, i, d);
    ++w._c[ctr::foreign];
  }
  void on_comment() noexcept {
    if (!gone()) ++w._c[ctr::pings];
  }
  /// The server writes `retry:` only as a stream's last words, before it closes: the close,
  /// and how long to wait before coming back (as EventSource waits; at most a minute).
  void on_retry(std::string_view value) noexcept {
    if (gone()) return;
    closed = true;
    std::uint64_t ms = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
    if (ec == std::errc{} && end == value.data() + value.size()) {
      retry_ns = std::min<std::uint64_t>(ms, 60'000) * 1'000'000;
    }
  }
};

void worker::feed(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept {
  if (!_streams.empty()) return feed_stream(i, bytes);
  lg_conn& c = _conns[i];
  sink s{*this, c, i};
  if (!c.reader.consume(bytes, s, _spills)) {
    ++_c[ctr::protocol_errors];
    drop(i, false, 0);
    return c.reader.reset(_spills);
  }
  if (c.fd < 0) c.reader.reset(_spills);   // dropped inside consume(): give back its spill
  if (c.fd < 0 || !s.closed) return;
  ++_c[ctr::server_closes];
  if (s.close_code == 1001) ++_c[ctr::close_1001];
  if (s.close_code == 1013) ++_c[ctr::close_1013];
  drop(i, reconnects() && _go, 50'000'000 + _rng.next() % 250'000'000);
}

void worker::feed_stream(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept {
  lg_conn& c = _conns[i];
  stream_sink s{*this, c, i};
  _streams[i].consume(bytes, s, _stream_spills);
  if (c.fd >= 0 && s.closed) {
    ++_c[ctr::server_closes];
    drop(i, reconnects() && _go, s.retry_ns != 0 ? s.retry_ns : 50'000'000 + _rng.next() % 250'000'000);
  }
  if (c.fd < 0) _streams[i].reset(_stream_spills);   // dropped inside consume() or just now: give back its spill
}

/// A pub/sub message that is not an event at first sight: a reply to the sub, an event in
/// another shape, or something else.
void worker::on_reply(std::uint32_t i, std::string_view msg) noexcept {
  lg_conn& c = _conns[i];
  switch (classify(msg)) {
    case server_msg::event: {
      const delivery d = read_delivery(msg);
      if (d.ok) return on_payload(c, i, d);
      ++_c[ctr::foreign];
      return;
    }
    case server_msg::subbed: {
      if (c.state != conn_state::subscribing) return;
      const bool lost = subbed_reports_lost(msg);
      if (lost) {
        ++_c[ctr::lost_reported];
        c.told = true;
      }
      // Before its first event, or once its topic was reported lost, a reconnecting connection
      // resumes from where `subbed` put it (the events replayed behind it move it on). A
      // stream's `subbed` event carries that position as its id: (kept already).
      if (!_last_ids.empty() && _streams.empty() && (lost || _last_ids[i].len == 0)) keep_id(i, subbed_position(msg));
      return become_ready(i);
    }
    case server_msg::error:
      ++_c[ctr::sub_errors];
      // Refused while subscribing: a reconnecting scenario tries again later, as a real client
      // does after `unavailable` (a node whose bus is busy or down); otherwise it stays closed.
      if (c.state == conn_state::subscribing) drop(i, reconnects() && _go, 200'000'000 + _rng.next() % 800'000'000);
      return;
    case server_msg::lost:  // told: what is missing after it is not silent
      ++_c[ctr::lost_notices];
      c.told = true;
      return;
    case server_msg::other: ++_c[ctr::foreign]; return;
  }
}

/// The id of the newest event, for `since` when the connection comes back.
void worker::keep_id(std::uint32_t i, std::string_view id) noexcept {
  if (id.empty() || id.size() > _last_ids[i].bytes.size()) return;
  std::memcpy(_last_ids[i].bytes.data(), id.data(), id.size());
  _last_ids[i].len = static_cast<std::uint8_t>(id.size());
}

/// A checked connection got every message it should.
void worker::on_complete() noexcept {
  ++_c[ctr::complete];
  if (--_pending_checked == 0) send_sample(msg_kind::sample);   // tell the parent at once
}

/// Closes an upgraded connection; reopens it after `delay_ns` when `reconnect`.
void worker::drop(std::uint32_t i, bool reconnect, std::uint64_t delay_ns) noexcept {
  lg_conn& c = _conns[i];
  const conn_state s = c.state;
  if (s != conn_state::subscribing && s != conn_state::ready && s != conn_state::paused) return;
  if (s == conn_state::subscribing) --_in_progress;
  else --_c[ctr::ready];
  --_c[ctr::open];
  io_close(i);
  ::close(c.fd);
  c.fd = -1;
  const std::uint64_t now = now_ns();
  if (_go && _o.sc == scenario::reconnect_storm && !c.storm_wait) {
    c.storm_wait = true;
    ++_storm_waiting;
    if (_c.storm_start_ns == 0) _c.storm_start_ns = now;
  }
  if (!reconnect) {
    c.state = conn_state::closed;
    if (c.checked && c.received < wanted(i) &&
        _pending_checked > 0 && --_pending_checked == 0) {
      send_sample(msg_kind::sample);
    }
    return;
  }
  ++_c[ctr::reconnects];
  c.state = conn_state::waiting;
  _to_open.emplace_back(now + delay_ns, i);
}

// ---------------------------------------------------------------------------------------------
// Run phase

void worker::start_go(std::uint64_t now) noexcept {
  _go = true;
  _go_ns = now;
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    lg_conn& c = _conns[i];
    const bool up = c.state == conn_state::ready || c.state == conn_state::paused;
    if (!up || c.slow || c.churner) continue;
    c.checked = true;
    _c[ctr::expected] += wanted(i);
    ++_pending_checked;
    // Each step expects what it sends to this connection's mailbox: of the messages up to its
    // end, those not sent before it began.
    std::uint64_t from = 0;
    for (std::size_t k = 0; k < _steps.size(); ++k) {
      const std::uint64_t to = from + _o.step_messages(k);
      _steps[k].c[ctr::expected] += _o.messages_for(_first + i, to) - _o.messages_for(_first + i, from);
      from = to;
    }
  }
  if (_o.sc == scenario::churn) _churn_limit = rate_limiter(_o.churn_rate / _o.procs, now, 16);
  if (_o.sc == scenario::reconnect_storm && _o.storm == storm_kind::client) {
    double at = _o.storm_at;
    if (at < 0) at = _o.publish_rate > 0 ? static_cast<double>(_o.messages) / _o.publish_rate / 2 : 1.0;
    _storm_due_ns = now + seconds_to_ns(at);
  }
  _c[ctr::going] = 1;
  send_sample(msg_kind::sample);   // the acknowledgement the parent waits for before publishing
}

void worker::churn_tick(std::uint64_t now) noexcept {
  if (_o.sc != scenario::churn || _churners.empty()) return;
  std::uint64_t n = _churn_limit.take(now, 64);
  for (std::size_t probes = 0; n > 0 && probes < _churners.size(); ++probes) {
    const std::uint32_t i = _churners[_churn_next++ % _churners.size()];
    if (_conns[i].state != conn_state::ready) continue;
    static constexpr std::uint8_t normal[2] = {0x03, 0xe8};   // 1000
    if (_streams.empty()) send_control(_conns[i], proto::opcode::close, normal);   // a stream just closes
    ++_c[ctr::closes_sent];
    drop(i, true, 0);
    --n;
  }
}

/// Client-side storm: every connection drops at once and reconnects at once, resuming with
/// `since` — the herd a server sees after a network blip or a load balancer restart.
void worker::storm_tick(std::uint64_t now) noexcept {
  if (_storm_due_ns == 0 || now < _storm_due_ns) return;
  _storm_due_ns = 0;
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    const conn_state s = _conns[i].state;
    if (s != conn_state::ready && s != conn_state::paused && s != conn_state::subscribing) continue;
    ++_c[ctr::closes_sent];
    drop(i, true, 0);
  }
}

}  // namespace wspush::loadgen
