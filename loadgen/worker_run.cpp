/// \file worker_run.cpp
/// The worker's loop, its receive path (frames → sequence accounting and latency) and the run
/// phase's timers (churn, client-side storm).
#include "loadgen/sys.hpp"
#include "loadgen/worker.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace wspush::loadgen {

/// Routes the frame reader's events of one connection back into the worker.
struct worker::sink {
  worker& w;
  std::uint32_t i;
  bool closed = false;
  std::uint16_t close_code = 0;

  // After a drop inside this read (an error reply, say) the rest of the read is ignored.
  [[nodiscard]] bool gone() const noexcept { return closed || w._conns[i].fd < 0; }

  void on_message(std::span<const std::uint8_t> prefix, std::uint8_t /*op*/) noexcept {
    if (!gone()) w.on_message(i, std::string_view(reinterpret_cast<const char*>(prefix.data()), prefix.size()));
  }
  void on_ping(std::span<const std::uint8_t> payload) noexcept {
    if (gone()) return;
    ++w._c[ctr::pings];
    w.send_control(w._conns[i], proto::opcode::pong, payload);
  }
  void on_close(std::span<const std::uint8_t> payload) noexcept {
    if (gone()) return;
    closed = true;
    if (payload.size() >= 2) close_code = static_cast<std::uint16_t>(payload[0] << 8 | payload[1]);
    w.send_control(w._conns[i], proto::opcode::close, payload.first(std::min<std::size_t>(payload.size(), 2)));
  }
};

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
  lg_conn& c = _conns[i];
  const ssize_t n = ::recv(c.fd, _rbuf.data(), _rbuf.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    ++_c[ctr::disconnects];
    return drop(i, reconnects() && _go, 50'000'000 + _rng.next() % 250'000'000);
  }
  _recv_ns = now_ns();
  feed(i, std::span<const std::uint8_t>(_rbuf.data(), static_cast<std::size_t>(n)));
}

void worker::feed(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept {
  lg_conn& c = _conns[i];
  sink s{*this, i};
  if (!c.reader.consume(bytes, s)) {
    ++_c[ctr::protocol_errors];
    return drop(i, false, 0);
  }
  if (c.fd < 0 || !s.closed) return;
  ++_c[ctr::server_closes];
  if (s.close_code == 1001) ++_c[ctr::close_1001];
  if (s.close_code == 1013) ++_c[ctr::close_1013];
  drop(i, reconnects() && _go, 50'000'000 + _rng.next() % 250'000'000);
}

void worker::on_message(std::uint32_t i, std::string_view msg) noexcept {
  lg_conn& c = _conns[i];
  if (_o.proto == protocol::broadcast) {
    const delivery d = read_delivery(msg);
    if (d.ok) return on_payload(i, d);
    ++_c[ctr::foreign];
    return;
  }
  switch (classify(msg)) {
    case server_msg::event: {
      const delivery d = read_delivery(msg);
      if (d.ok) return on_payload(i, d);
      ++_c[ctr::foreign];
      return;
    }
    case server_msg::subbed:
      if (c.state != conn_state::subscribing) return;
      if (subbed_reports_lost(msg)) ++_c[ctr::lost_reported];
      return become_ready(i);
    case server_msg::error:
      ++_c[ctr::sub_errors];
      // Refused while subscribing: a reconnecting scenario tries again later, as a real client
      // does after `unavailable` (a node whose bus is busy or down); otherwise it stays closed.
      if (c.state == conn_state::subscribing) drop(i, reconnects() && _go, 200'000'000 + _rng.next() % 800'000'000);
      return;
    case server_msg::other: ++_c[ctr::foreign]; return;
  }
}

void worker::on_payload(std::uint32_t i, const delivery& d) noexcept {
  lg_conn& c = _conns[i];
  ++_c[ctr::deliveries];
  if (_o.proto == protocol::pubsub && !_o.topic_matches(_first + i, d.topic)) {
    ++_c[ctr::foreign];
    return;
  }
  if (!d.id.empty() && d.id.size() <= c.last_id.size()) {
    std::memcpy(c.last_id.data(), d.id.data(), d.id.size());
    c.last_id_len = static_cast<std::uint8_t>(d.id.size());
  }
  if (!c.seq.on_seq(static_cast<std::uint32_t>(d.seq), c.checked ? _seq : _scratch)) return;
  _interval->record(_recv_ns > d.send_ns ? _recv_ns - d.send_ns : 0);
  _c.last_delivery_ns = _recv_ns;
  if (!c.checked) return;
  const std::uint32_t topic = _o.sc == scenario::mailboxes ? _first + i : 0;
  if (++c.received == _o.messages_for(topic)) {
    ++_c[ctr::complete];
    if (--_pending_checked == 0) send_sample(msg_kind::sample);   // tell the parent at once
  }
}

/// Closes an upgraded connection; reopens it after `delay_ns` when `reconnect`.
void worker::drop(std::uint32_t i, bool reconnect, std::uint64_t delay_ns) noexcept {
  lg_conn& c = _conns[i];
  const conn_state s = c.state;
  if (s != conn_state::subscribing && s != conn_state::ready && s != conn_state::paused) return;
  if (s == conn_state::subscribing) --_in_progress;
  else --_c[ctr::ready];
  --_c[ctr::open];
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
    if (c.checked && c.received < _o.messages_for(_o.sc == scenario::mailboxes ? _first + i : 0) &&
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
    _c[ctr::expected] += _o.messages_for(_o.sc == scenario::mailboxes ? _first + i : 0);
    ++_pending_checked;
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
    send_control(_conns[i], proto::opcode::close, normal);
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
