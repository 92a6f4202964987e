#include "server/reactor/loop.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "server/base/clock.hpp"
#include "server/base/log.hpp"
#include "server/reactor/inbox.hpp"

namespace wspush::server {
namespace {

constexpr std::uint32_t wheel_slots = 4096;  // 204 s per turn of the wheel
/// Work (fan-out deliveries) the inboxes may do per iteration: a few milliseconds of queueing;
/// the rest waits for the next iteration, which comes without waiting for events.
constexpr std::uint64_t inbox_budget = 131072;
/// Connections written per iteration. A fan-out to tens of thousands of subscribers goes out
/// in slices of this many, with the loop taking new events between slices.
constexpr std::uint32_t flush_slice = 1024;
/// While a burst is being fanned out (inbox work left over), the flush waits for the rest of it,
/// so that each connection gets the whole burst in one write (a loopback send costs about the
/// same whatever it carries: sends per subscriber decide a burst's cost). Output waits at most
/// this long, and not at all once a connection's output crosses its bound (yield_inbox).
constexpr std::uint64_t max_flush_defer_ns = 50'000'000;

}  // namespace

loop::loop(loop_options o) : _o(o), _wheel(wheel_slots, timer_of{this}) {}

loop::~loop() = default;

bool loop::start(bool uring, int listen_fd, std::string& why, bool& fell_back) noexcept {
  backend_options bo;
  fell_back = false;
  if (uring) {
    _io = make_uring_backend(bo, why);
    fell_back = !_io;
  }
  if (!_io) {
    std::string epoll_why;
    _io = make_epoll_backend(bo, epoll_why);
    if (!_io) {
      why += (why.empty() ? "" : "; ") + epoll_why;
      return false;
    }
  }
  _listen_fd = listen_fd;
  return !listening() || _io->add_listener(listen_fd, 0);
}

std::uint32_t loop::ticks_for(double seconds) const noexcept {
  double t = seconds * 1000.0 / loop_tick_ms;
  return t < 1 ? 1 : t > 1e9 ? 1'000'000'000u : std::uint32_t(t + 0.999);
}

bool loop::track(std::uint32_t slot) noexcept {
  while (slot >= _links.size() * chunk_size) {
    std::unique_ptr<slot_links[]> chunk(new (std::nothrow) slot_links[chunk_size]);
    if (!chunk) return false;
    try {
      _links.push_back(std::move(chunk));
    } catch (...) {
      return false;
    }
  }
  return true;
}

void loop::list(std::uint32_t slot) noexcept {
  slot_links& l = links(slot);
  if (l.flush_next != not_listed) return;
  l.flush_next = list_end;
  if (_flush_tail == list_end) _flush_head = slot;
  else links(_flush_tail).flush_next = slot;
  _flush_tail = slot;
}

void loop::flush_listed() noexcept {
  for (std::uint32_t n = 0; _flush_head != list_end && n < flush_slice; ++n) {
    std::uint32_t slot = _flush_head;
    slot_links& l = links(slot);
    _flush_head = l.flush_next;
    if (_flush_head == list_end) _flush_tail = list_end;
    l.flush_next = not_listed;
    _h->on_flush(slot);
  }
}

void loop::pause_accepting(std::uint32_t ticks) noexcept {
  _accept_resume_tick = std::max(_accept_resume_tick, _wheel.now() + ticks);
  if (!_accept_paused && listening()) _io->pause_accept(0);
  _accept_paused = true;
}

void loop::wake() noexcept {
  if (_io) _io->wake();
}

void loop::request_drain() noexcept {
  _drain_requested.store(true, std::memory_order_release);
  wake();
}

void loop::add_inbox(inbox_base& b) { _inboxes.push_back(&b); }

void loop::remove_inbox(inbox_base& b) noexcept {
  _inboxes.erase(std::remove(_inboxes.begin(), _inboxes.end(), &b), _inboxes.end());
}

void loop::on_poll_woke() noexcept { _woke_ns = monotonic_ns(); }

void loop::on_wake() noexcept {
  if (_inbox_turn_used) _inbox_more = true;  // one slice per iteration: the next one takes it
  else drain_inboxes();
}

/// Hands each inbox's items to its consumer, within one budget for all, so a burst of
/// publishes to a big topic is spread over iterations and the sockets are served between.
void loop::drain_inboxes() noexcept {
  std::uint64_t budget = inbox_budget;
  _inbox_more = false;
  _inbox_turn_used = true;
  _yield = false;
  for (inbox_base* b : _inboxes) _inbox_more |= b->drain(budget, _yield);
}

void loop::run(loop_handler& h) noexcept {
  _h = &h;
  _start_ns = monotonic_ns();
  _woke_ns = _start_ns;
  while (!(_draining && h.empty())) {
    // Output still listed or inbox work left over: poll without waiting.
    _inbox_turn_used = false;
    _io->poll(*this, _flush_head != list_end || _inbox_more ? 0 : int(loop_tick_ms));
    if (_inbox_more && !_inbox_turn_used) drain_inboxes();
    if (!_draining && _drain_requested.load(std::memory_order_acquire)) begin_drain();
    auto tick = std::uint32_t((monotonic_ns() - _start_ns) / (loop_tick_ms * 1'000'000ull)) + 1;
    if (tick != _wheel.now()) {
      _wheel.advance(tick, [&h](std::uint32_t slot) { h.on_timer(slot); });
      h.on_tick(tick);
    }
    h.on_turn();
    if (_accept_paused && !_draining && tick >= _accept_resume_tick) {
      _accept_paused = false;
      if (listening()) _io->resume_accept(0);
    }
    if (_draining && _drain.done < _drain.total) drain_step();
    if (!flush_deferred()) flush_listed();
    ++_turn;
    count_lag();
  }
  _stopped.store(true, std::memory_order_release);
  _io->poll(*this, 0);  // submit the last closes
  _h = nullptr;
}

bool loop::flush_deferred() noexcept {
  if (!_inbox_more || _yield) {
    _defer_since_ns = 0;
    return false;
  }
  std::uint64_t now = monotonic_ns();
  if (_defer_since_ns == 0) _defer_since_ns = now;
  if (now - _defer_since_ns < max_flush_defer_ns) return true;
  _defer_since_ns = now;  // waited long enough: a slice goes out, the next wait starts
  return false;
}

void loop::count_lag() noexcept {
  std::uint64_t lag = monotonic_ns() - _woke_ns;
  std::size_t b = 0;
  while (b < std::size(loop_counters::lag_bounds_ns) && lag > loop_counters::lag_bounds_ns[b]) ++b;
  _n.lag_buckets[b].add();
  _n.lag_sum_ns.add(lag);
}

void loop::begin_drain() noexcept {
  _draining = true;
  if (listening()) {
    _io->pause_accept(0);
    // Stop listening, not only accepting: the socket leaves its SO_REUSEPORT group, so the
    // kernel hands new connections to the processes still serving (a rolling restart) instead
    // of queueing them here for the whole drain, and what already waits in the backlog is
    // reset, so those clients retry elsewhere at once. The descriptor stays open (main closes
    // it). Shared by every shard without --reuseport: they all drain together.
    ::shutdown(_listen_fd, SHUT_RD);
  }
  _accept_paused = true;
  _drain.start = _wheel.now();
  _drain.ticks = ticks_for(_o.drain_seconds);
  _drain.total = _h->on_drain_begin();
  drain_step();
}

void loop::drain_step() noexcept {
  std::uint64_t elapsed = _wheel.now() - _drain.start + 1;
  std::uint64_t due = std::min<std::uint64_t>(_drain.total, (_drain.total * elapsed + _drain.ticks - 1) / _drain.ticks);
  if (due <= _drain.done) return;
  std::uint64_t want = due - _drain.done, closed = _h->close_some(want);
  _drain.done = closed < want ? _drain.total : due;  // fewer: the rest closed by themselves
}

}  // namespace wspush::server
