// The loop of one shard: poll the backend, run the timers, flush what was queued. Work that
// arrives from other threads (finished upgrades, broadcasts, drain) comes through the inbox.

#include "server/conn/shard.hpp"

#include <algorithm>
#include <cerrno>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/ws_handshake.hpp"
#include "server/app/log.hpp"
#include "server/pubsub/hub.hpp"
#include "server/reactor/clock.hpp"

namespace wspush::server {
namespace {

constexpr std::uint32_t tick_ms = 50;
constexpr std::uint32_t wheel_slots = 4096;  // 204 s per turn
constexpr std::uint32_t inbox_capacity = 1 << 16;
/// Fan-out deliveries one loop iteration may queue from the inbox (see drain_inbox): a few
/// milliseconds of queueing; the sends they cause go out in slices of their own (shard_out.cpp).
constexpr std::uint64_t inbox_delivery_budget = 131072;
constexpr std::uint32_t expire_every_ticks = 1000 / tick_ms;  // the history's TTL sweep: once a second

}  // namespace

shard::shard(shard_group& group, int index, int listen_fd)
    : _g(group), _cfg(*group.cfg), _index(index), _listen_fd(listen_fd), _wheel(wheel_slots, links_of{&_conns}),
      _inbox(inbox_capacity), _topics(pubsub::registry_options{_cfg.max_topics_per_connection, std::uint32_t(proto::max_topic_bytes), 0}) {
  _iov.resize(1024);
  if (_cfg.mode == app_mode::pubsub) {
    _parser = std::make_unique<proto::envelope_parser>(_cfg.message_limit());
    _env = std::make_unique<proto::envelope>();
    if (_g.hub) _fanned.assign(_g.hub->history().shard_count(), 0);
  }
}

shard::~shard() {
  inbox_item item;
  while (_inbox.try_pop(item)) {  // frames or jobs nobody will handle now
    if (item.kind == inbox_item::broadcast || item.kind == inbox_item::event) pool::frame_ref::from_raw(item.ptr);
    else if (item.kind == inbox_item::upgrade_done) pool::lease::from_raw(item.ptr);
  }
}

bool shard::start_backend(std::string& why, bool& fell_back) noexcept {
  backend_options o;
  fell_back = false;
  if (_cfg.io == io_kind::uring) {
    _io = make_uring_backend(o, why);
    if (!_io) fell_back = true;
  }
  if (!_io) {
    std::string epoll_why;
    _io = make_epoll_backend(o, epoll_why);
    if (!_io) {
      why += (why.empty() ? "" : "; ") + epoll_why;
      return false;
    }
  }
  return _io->add_listener(_listen_fd, 0);
}

void shard::post(inbox_item item, bool wake) noexcept {
  // The loop drains its inbox every iteration, so a full inbox is momentary: wake the loop
  // (a quiet post may not have) and wait it out.
  while (!_inbox.try_push(item)) {
    _io->wake();
    sched_yield();
  }
  if (wake) _io->wake();
}

void shard::wake() noexcept { _io->wake(); }

std::uint32_t shard::ticks_for(double seconds) const noexcept {
  double t = seconds * 1000.0 / tick_ms;
  return t < 1 ? 1 : std::uint32_t(t + 0.999);
}

std::uint32_t shard::lookup(conn_token t) noexcept {
  connection* c = _conns.find(t);
  return c ? token_index(t) : no_index;
}

void shard::run() noexcept {
  _start_ns = monotonic_ns();
  while (!(_draining && _conns.size() == 0)) {
    // Output left on the flush list or events left in the inbox (a big fan-out goes out in
    // slices): do not wait for new events.
    _inbox_turn_used = false;
    _io->poll(*this, _flush_head != no_index || _inbox_more ? 0 : int(tick_ms));
    if (_inbox_more && !_inbox_turn_used) drain_inbox();
    auto tick = std::uint32_t((monotonic_ns() - _start_ns) / (tick_ms * 1'000'000ull)) + 1;
    if (tick != _wheel.now()) {
      _wheel.advance(tick, [this](std::uint32_t i) { on_timer(i); });
      if (_index == 0 && _g.hub && tick % expire_every_ticks == 0) _g.hub->history().expire(monotonic_ns());
    }
    if (_accept_paused && !_draining && _retry.empty() && tick >= _accept_resume_tick) {
      _accept_paused = false;
      _io->resume_accept(0);
    }
    if (!_retry.empty()) retry_upgrades();
    if (_draining && _drain.done < _drain.total) drain_step();
    flush_listed();
    std::uint64_t lag = monotonic_ns() - _woke_ns;
    std::size_t b = 0;
    while (b < std::size(shard_counters::lag_bounds_ns) && lag > shard_counters::lag_bounds_ns[b]) ++b;
    _n.lag_buckets[b].add();
    _n.lag_sum_ns.add(lag);
  }
  _io->poll(*this, 0);  // submit the last closes
}

void shard::on_poll_woke() noexcept { _woke_ns = monotonic_ns(); }

void shard::pause_accepting(std::uint32_t ticks) noexcept {
  _accept_resume_tick = _wheel.now() + ticks;
  if (!_accept_paused) _io->pause_accept(0);
  _accept_paused = true;
}

void shard::on_accept(int, int fd) noexcept {
  if (fd < 0) {
    // Out of file descriptors (or memory): stop taking connections for a moment instead of
    // spinning on the error. The kernel keeps the backlog meanwhile.
    log_ratelimited(log_level::warn, "accept failed: %s; pausing accepts for 100 ms", std::strerror(-fd));
    pause_accepting(ticks_for(0.1));
    return;
  }
  if (_draining) {
    ::close(fd);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  _n.accepted.add();
  std::uint32_t limit = _cfg.max_connections ? _cfg.max_connections : UINT32_MAX;
  std::uint32_t i = _g.connections.load(std::memory_order_acquire) >= limit ? no_index : _conns.acquire(UINT32_MAX);
  if (i == no_index) {
    // Over capacity: answer before any WebSocket state exists. A best-effort write: the
    // socket is fresh, its send buffer empty.
    char buf[256];
    std::size_t n = proto::encode_http_response(503, buf, "over capacity, retry later\n", "Retry-After: 5\r\n");
    [[maybe_unused]] auto r = ::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(fd);
    _n.upgrades_over_capacity.add();
    return;
  }
  _g.connections.fetch_add(1, std::memory_order_relaxed);
  connection& c = _conns.at(i);
  c.fd = fd;
  set_state(i, conn_state::upgrading);
  c.flags = 0;
  _wheel.arm(i, ticks_for(_cfg.upgrade_timeout));
  _io->start_reading(fd, token_of(i));
}

void shard::on_read_end(conn_token t, int res) noexcept {
  std::uint32_t i = lookup(t);
  if (i == no_index || _conns.at(i).state == conn_state::dead) return;
  close_now(i);  // end of stream or error: nothing more will arrive
}

void shard::on_read_paused(conn_token t) noexcept {
  std::uint32_t i = lookup(t);
  if (i == no_index || _conns.at(i).state == conn_state::dead) return;
  _conns.at(i).flags |= flag_rearm_read;
  list(i);
}

/// Every state change goes through here, so the per-state gauges stay exact.
void shard::set_state(std::uint32_t i, conn_state s) noexcept {
  connection& c = _conns.at(i);
  if (c.state != conn_state::free) _n.in_state[std::size_t(c.state)].sub();
  if (s != conn_state::free) _n.in_state[std::size_t(s)].add();
  c.state = s;
}

void shard::on_timer(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  switch (c.state) {
    case conn_state::upgrading:
    case conn_state::upgrade_pending:
      _n.upgrades_timeout.add();
      _n.timeouts.add();
      close_now(i);
      break;
    case conn_state::closing:
      _n.timeouts.add();
      close_now(i);
      break;
    case conn_state::open: on_open_timer(i); break;
    default: break;
  }
}

void shard::on_wake() noexcept {
  if (_inbox_turn_used) _inbox_more = true;  // one slice per iteration: the next one takes it
  else drain_inbox();
}

/// Handles what other threads posted, up to a budget of fan-out deliveries: a burst of
/// publishes to a big topic is spread over loop iterations (the rest waits in the inbox and
/// run() comes back for it without waiting for events), so reads, timers and sends of the
/// other connections are served between the slices.
void shard::drain_inbox() noexcept {
  const std::uint64_t stop_at = _n.deliveries.get() + inbox_delivery_budget;
  _inbox_more = false;
  _inbox_turn_used = true;
  inbox_item item;
  while (_inbox.try_pop(item)) {
    switch (item.kind) {
      case inbox_item::upgrade_done: upgrade_done(item.ptr); break;
      case inbox_item::broadcast: broadcast_local(pool::frame_ref::from_raw(item.ptr)); break;
      case inbox_item::event: on_event(pool::frame_ref::from_raw(item.ptr), item.seq, item.part); break;
      case inbox_item::drain: begin_drain(); break;
    }
    if (_n.deliveries.get() >= stop_at) {
      _inbox_more = true;
      return;
    }
  }
}

void shard::begin_drain() noexcept {
  // Stop accepting now; close the open connections with 1001 a slice per tick over
  // --drain-seconds, so their clients do not all reconnect in the same second.
  if (_draining) return;
  _draining = true;
  _io->pause_accept(0);
  _drain.start = _wheel.now();
  _drain.ticks = ticks_for(_cfg.drain_seconds);
  for (std::uint32_t i = 0; i < _conns.capacity(); ++i) {
    connection& c = _conns.at(i);
    if (c.state == conn_state::open) ++_drain.total;
    else if (c.state == conn_state::upgrading) close_now(i);
  }
  drain_step();
}

void shard::drain_step() noexcept {
  std::uint64_t elapsed = _wheel.now() - _drain.start + 1;
  std::uint64_t due = std::min<std::uint64_t>(_drain.total, (_drain.total * elapsed + _drain.ticks - 1) / _drain.ticks);
  for (; _drain.done < due && _drain.cursor < _conns.capacity(); ++_drain.cursor) {
    if (_conns.at(_drain.cursor).state != conn_state::open) continue;
    start_close(_drain.cursor, proto::close_code::going_away, false);
    ++_drain.done;
  }
  if (_drain.cursor == _conns.capacity()) _drain.done = _drain.total;  // the rest closed by themselves
}

}  // namespace wspush::server
