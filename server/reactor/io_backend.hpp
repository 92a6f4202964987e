#pragma once
// One interface over io_uring and epoll. The loop above it thinks in completions:
// "bytes arrived for connection T", "the send for T finished", "listener L accepted fd".
// The epoll backend produces the same events from readiness: it does the recv() itself
// and writes synchronously, telling the loop when a socket it could not finish on is
// writable again.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <sys/uio.h>

namespace wspush::server {

/// Identifies a connection slot and its generation: a completion carrying a stale
/// token (the slot was closed and reused since) is ignored by the loop. Only the low
/// 56 bits are used (backends keep the top byte for their own tags); 0 is never a token.
using conn_token = std::uint64_t;

/// Receives the events of one `io_backend::poll` call. Spans are valid only during the call.
class io_handler {
 public:
  virtual ~io_handler() = default;
  /// A listener accepted `fd` (>= 0), or accepting failed with -errno.
  virtual void on_accept(int listener, int fd) noexcept = 0;
  /// Bytes arrived for `t`; the backend owns them and takes them back when this returns.
  virtual void on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept = 0;
  /// Reading stopped for `t`: 0 is end of stream, otherwise -errno.
  virtual void on_read_end(conn_token t, int res) noexcept = 0;
  /// Reading stopped without an end of stream (io_uring only: the receive buffers ran out, or
  /// a read of bound_read_ahead ended): call start_reading again once this poll's events are
  /// handled.
  virtual void on_read_paused(conn_token t) noexcept = 0;
  /// An asynchronous send finished: bytes written, or -errno.
  virtual void on_send_done(conn_token t, int res) noexcept = 0;
  /// A socket that could not take all its output is writable again (epoll only).
  virtual void on_writable(conn_token t) noexcept = 0;
  /// Another thread called `wake`.
  virtual void on_wake() noexcept = 0;
  /// A watched descriptor (io_backend::watch) is ready: `key` is what watch() was given.
  virtual void on_ready(std::uint64_t key, bool readable, bool writable) noexcept {}
  /// The poll's wait ended; its events follow (for measuring how long the loop then works).
  virtual void on_poll_woke() noexcept {}
};

enum class send_outcome : std::uint8_t {
  completed,  // `bytes` written now (may be short: the caller waits for on_writable)
  pending,    // submitted; on_send_done follows
  failed,     // `error` holds -errno; the connection is dead
};
struct send_result {
  send_outcome outcome;
  int error;
  std::size_t bytes;
};

class io_backend {
 public:
  virtual ~io_backend() = default;
  virtual const char* name() const noexcept = 0;

  virtual bool add_listener(int fd, int listener) noexcept = 0;
  /// Stop taking connections off a listener's backlog (throttling, draining) and resume.
  virtual void pause_accept(int listener) noexcept = 0;
  virtual void resume_accept(int listener) noexcept = 0;

  virtual bool start_reading(int fd, conn_token t) noexcept = 0;
  /// Stops reading fd until start_reading is called again: the kernel keeps what arrives (and
  /// the peer's window closes). Bytes already on their way (io_uring completions queued before
  /// the stop takes effect) may still be delivered.
  virtual void stop_reading(int fd, conn_token t) noexcept = 0;
  /// The loop's connections may be paused while the application waits (conn_ops::hold), and
  /// a pause must leave what follows in the kernel: each read then takes one receive buffer and
  /// ends (on_read_paused; the loop asks for the next once it has handled this one), so a pause
  /// lets at most that buffer through. For io_uring, whose multishot recv takes a socket's
  /// backlog into the shared buffers (dozens at each wake-up) before the loop has seen the
  /// message that pauses it, and cancels asynchronously. epoll reads on demand already.
  virtual void bound_read_ahead() noexcept {}
  virtual send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept = 0;
  /// Ask for on_writable once the socket has room (after a short synchronous send).
  virtual void wait_writable(int fd, conn_token t) noexcept = 0;
  /// Stops all interest in fd, cancels what is in flight for it, and closes it. A send in
  /// flight still completes (with -ECANCELED if it had not finished): on_send_done follows
  /// with the old token. Other completions under way arrive later and are ignored.
  virtual void close(int fd, conn_token t) noexcept = 0;

  /// Readiness of a descriptor the loop does not read itself (a bus client's socket, which its
  /// own library reads and writes): on_ready(key, ...) while it is readable (`read`) or
  /// writable (`write`), level-triggered. Calling it again changes the interest; neither
  /// removes it (unwatch). False when the backend cannot (io_uring: a bus loop runs on epoll).
  virtual bool watch(int fd, std::uint64_t key, bool read, bool write) noexcept { return false; }
  virtual void unwatch(int fd) noexcept {}

  /// Submits what was queued, waits at most timeout_ms (-1: forever) and dispatches.
  virtual void poll(io_handler& h, int timeout_ms) noexcept = 0;
  /// Thread-safe: makes the current or next poll return and call on_wake.
  virtual void wake() noexcept = 0;
};

struct backend_options {
  unsigned ring_entries = 4096;    // io_uring submission queue size
  unsigned buffer_count = 256;     // provided receive buffers per loop (power of two)
  unsigned buffer_size = 16384;    // bytes each
};

/// Creates the io_uring backend, or nullptr with `why` set when io_uring cannot be set up.
std::unique_ptr<io_backend> make_uring_backend(const backend_options& o, std::string& why) noexcept;
std::unique_ptr<io_backend> make_epoll_backend(const backend_options& o, std::string& why) noexcept;

}  // namespace wspush::server
