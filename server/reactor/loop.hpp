#pragma once
// The reactor loop of one shard: it polls its io backend, hands I/O events to its handler (the
// connection layer), runs the timer wheel, drains its inboxes, paces a drain and writes the
// connections listed for output at the end of each iteration. It knows slots (small integers
// the handler assigns to its connections) and nothing of HTTP, WebSocket or topics.
//
//   poll ─▶ I/O events ─▶ handler      inboxes ─▶ their consumers (budgeted)
//        ─▶ wheel ticks ─▶ handler.on_timer(slot)
//        ─▶ drain pacing ─▶ handler.close_some(n)
//        ─▶ flush list ─▶ handler.on_flush(slot), a slice per iteration
//
// Per slot the loop keeps 16 bytes: the timer wheel's links and the flush list's link.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "server/base/counter.hpp"
#include "server/base/options.hpp"
#include "server/reactor/io_backend.hpp"
#include "server/reactor/timer_wheel.hpp"

namespace wspush::server {

class inbox_base;

/// What a loop drives. Spans are valid only during the call.
class loop_handler {
 public:
  virtual ~loop_handler() = default;
  /// The listener accepted `fd`, or accepting failed with -errno (then accepting pauses briefly).
  virtual void on_accept(int fd) noexcept = 0;
  virtual void on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept = 0;
  /// Reading stopped: 0 end of stream, else -errno.
  virtual void on_read_end(conn_token t, int res) noexcept = 0;
  /// Reading paused without an end (io_uring: receive buffers ran out, or one read of a
  /// bounded read-ahead ended): read again later.
  virtual void on_read_paused(conn_token t) noexcept = 0;
  virtual void on_send_done(conn_token t, int res) noexcept = 0;
  virtual void on_writable(conn_token t) noexcept = 0;
  /// The deadline armed for `slot` has come.
  virtual void on_timer(std::uint32_t slot) noexcept = 0;
  /// `slot`'s turn on the flush list (it was listed; it is no longer).
  virtual void on_flush(std::uint32_t slot) noexcept = 0;
  /// Once per iteration, after the timers and before the flush.
  virtual void on_turn() noexcept {}
  /// Once per tick (every loop_tick_ms), with the new tick.
  virtual void on_tick(std::uint32_t tick) noexcept {}
  /// A descriptor watched through the backend (io_backend::watch) is ready.
  virtual void on_ready(std::uint64_t key, bool readable, bool writable) noexcept {}
  /// Draining starts (accepting has stopped): close what has no graceful end at once and say
  /// how many connections the drain will close, spread over the drain window.
  virtual std::uint64_t on_drain_begin() noexcept = 0;
  /// Close up to `n` more connections gracefully; returns how many it closed (fewer: none left).
  virtual std::uint64_t close_some(std::uint64_t n) noexcept = 0;
  /// No connection holds a slot any more: a draining loop is done.
  virtual bool empty() const noexcept = 0;
};

/// What the connection layer may ask of its loop (the loop is one; tests fake it).
class loop_ops {
 public:
  virtual ~loop_ops() = default;
  /// The wheel's tick (loop_tick_ms each), and ticks covering `seconds` (at least one).
  virtual std::uint32_t now() const noexcept = 0;
  virtual std::uint32_t ticks_for(double seconds) const noexcept = 0;
  /// Counts loop iterations: a send submitted in an earlier turn has been offered to the kernel.
  virtual std::uint64_t turn() const noexcept = 0;
  /// Makes room for `slot`'s links (once per slot the handler starts using). False: no memory.
  virtual bool track(std::uint32_t slot) noexcept = 0;
  /// Arms (or moves) `slot`'s one deadline `ticks` ahead; cancel() disarms it.
  virtual void arm(std::uint32_t slot, std::uint32_t ticks) noexcept = 0;
  virtual void cancel(std::uint32_t slot) noexcept = 0;
  /// Puts `slot` on the flush list (FIFO; once): on_flush comes at the end of an iteration.
  virtual void list(std::uint32_t slot) noexcept = 0;
  /// Stops accepting for `ticks` (the kernel keeps the backlog meanwhile).
  virtual void pause_accepting(std::uint32_t ticks) noexcept = 0;
  /// Ends the inbox work of this iteration after the current item, so the flush comes first
  /// (a connection's output crossed its bound in the middle of a fan-out).
  virtual void yield_inbox() noexcept = 0;
  virtual io_backend& io() noexcept = 0;
};

inline constexpr std::uint32_t loop_tick_ms = 50;

/// What a loop counts (docs/METRICS.md): how long it works after each wake-up.
struct loop_counters {
  static constexpr std::uint64_t lag_bounds_ns[7] = {10'000, 100'000, 1'000'000, 5'000'000,
                                                    10'000'000, 50'000'000, 100'000'000};
  relaxed_counter lag_buckets[8];  // non-cumulative; the last is +Inf
  relaxed_counter lag_sum_ns;
};

class loop final : public loop_ops, private io_handler {
 public:
  explicit loop(loop_options o);
  ~loop() override;
  loop(const loop&) = delete;
  loop& operator=(const loop&) = delete;

  /// On the loop's own thread (io_uring rings belong to one thread): creates the backend and
  /// starts accepting from `listen_fd` (none if negative). With `uring` asked for and unavailable, falls back to
  /// epoll and says so in `fell_back` and `why`. False (with `why`) when no backend starts.
  bool start(bool uring, int listen_fd, std::string& why, bool& fell_back) noexcept;
  const char* backend_name() const noexcept { return _io ? _io->name() : "none"; }
  /// Runs until a drain has closed every connection. `h` must outlive the call.
  void run(loop_handler& h) noexcept;
  /// Any thread: begin draining (stop accepting, close connections over the drain window).
  void request_drain() noexcept;
  /// Any thread: makes the current or next poll return. Safe before start (then a no-op).
  void wake() noexcept;
  /// Any thread: the loop has returned from run(); posts to its inboxes are refused.
  bool stopped() const noexcept { return _stopped.load(std::memory_order_acquire); }
  const loop_counters& counters() const noexcept { return _n; }

  // inboxes register themselves (inbox.hpp)
  /// A descriptor read and written by its own library (a bus client): on_ready(key, ...) on
  /// the handler while it is readable / writable as asked. False when the backend cannot
  /// (io_uring: a bus loop is started on epoll).
  bool watch(int fd, std::uint64_t key, bool read, bool write) noexcept { return _io && _io->watch(fd, key, read, write); }
  void unwatch(int fd) noexcept {
    if (_io) _io->unwatch(fd);
  }
  void add_inbox(inbox_base& b);
  void remove_inbox(inbox_base& b) noexcept;

  // loop_ops
  std::uint32_t now() const noexcept override { return _wheel.now(); }
  std::uint32_t ticks_for(double seconds) const noexcept override;
  std::uint64_t turn() const noexcept override { return _turn; }
  bool track(std::uint32_t slot) noexcept override;
  void arm(std::uint32_t slot, std::uint32_t ticks) noexcept override { _wheel.arm(slot, ticks); }
  void cancel(std::uint32_t slot) noexcept override { _wheel.cancel(slot); }
  void list(std::uint32_t slot) noexcept override;
  void pause_accepting(std::uint32_t ticks) noexcept override;
  void yield_inbox() noexcept override { _yield = true; }
  io_backend& io() noexcept override { return *_io; }

 private:
  static constexpr std::uint32_t not_listed = UINT32_MAX, list_end = UINT32_MAX - 1;
  struct slot_links {
    timer_links timer;
    std::uint32_t flush_next = not_listed;
  };
  static_assert(sizeof(slot_links) == 16, "slot_links budget: 16 bytes a connection");
  static constexpr std::uint32_t chunk_size = 4096;
  slot_links& links(std::uint32_t slot) noexcept { return _links[slot / chunk_size][slot % chunk_size]; }
  bool listening() const noexcept { return _listen_fd >= 0; }
  struct timer_of {
    loop* l;
    timer_links& operator()(std::uint32_t slot) const noexcept { return l->links(slot).timer; }
  };

  // io_handler: the backend's events
  void on_accept(int, int fd) noexcept override { _h->on_accept(fd); }
  void on_data(conn_token t, std::span<std::uint8_t> b) noexcept override { _h->on_data(t, b); }
  void on_read_end(conn_token t, int res) noexcept override { _h->on_read_end(t, res); }
  void on_read_paused(conn_token t) noexcept override { _h->on_read_paused(t); }
  void on_send_done(conn_token t, int res) noexcept override { _h->on_send_done(t, res); }
  void on_writable(conn_token t) noexcept override { _h->on_writable(t); }
  void on_ready(std::uint64_t key, bool r, bool w) noexcept override { _h->on_ready(key, r, w); }
  void on_wake() noexcept override;
  void on_poll_woke() noexcept override;

  void drain_inboxes() noexcept;
  void begin_drain() noexcept;
  void drain_step() noexcept;
  void flush_listed() noexcept;
  bool flush_deferred() noexcept;
  void count_lag() noexcept;

  loop_options _o;
  loop_handler* _h = nullptr;
  std::unique_ptr<io_backend> _io;
  std::vector<std::unique_ptr<slot_links[]>> _links;
  timer_wheel<timer_of> _wheel;
  std::vector<inbox_base*> _inboxes;
  std::uint32_t _flush_head = list_end, _flush_tail = list_end;
  std::uint64_t _turn = 1;
  std::uint64_t _start_ns = 0, _woke_ns = 0;
  std::uint64_t _defer_since_ns = 0;  // the flush has waited for inbox work since then
  std::uint32_t _accept_resume_tick = 0;
  int _listen_fd = -1;  // -1: a loop may run without a listener (tests, a bus connection's loop)
  bool _accept_paused = false;
  bool _yield = false;
  bool _inbox_more = false;      // an inbox drain stopped at its budget
  bool _inbox_turn_used = false; // the inboxes were drained in this iteration
  bool _draining = false;
  std::atomic<bool> _drain_requested{false};
  std::atomic<bool> _stopped{false};
  struct {
    std::uint32_t start = 0, ticks = 1;
    std::uint64_t total = 0, done = 0;
  } _drain;  // SIGTERM: graceful closes spread over drain_seconds
  loop_counters _n;
};

}  // namespace wspush::server
