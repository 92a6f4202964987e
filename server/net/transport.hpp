#pragma once
// The seam between a socket and the protocol. What arrives on a socket goes through the
// connection's transport before any HTTP or WebSocket code sees it, and what the connection
// sends (plaintext frames from its out queue) goes through it on the way to the socket. Plain
// TCP passes both through untouched; TLS decrypts and encrypts here, and nothing above this
// seam changes.
//
// A transport is one per listener and shard (a shard's connections of that listener share it);
// per-connection state, if it needs any, is its own business: a connection token's low 32 bits
// are a small dense number (the connection's slot) it may index such state by.

#include <cstddef>
#include <cstdint>
#include <span>

#include <sys/uio.h>

#include "server/reactor/io_backend.hpp"

namespace wspush::server {

/// What a transport says when a write it was asked for makes progress (on_sent, on_writable).
struct transport_event {
  enum kind_t : std::uint8_t {
    writable,     ///< the socket has room again: the connection's own writing may go on (plain TCP)
    sent,         ///< the pending send is done: `plaintext` bytes of it were taken (0: the
                  ///< transport's own bytes, e.g. a TLS handshake record, with no send of the
                  ///< connection's behind them)
    in_progress,  ///< still writing: nothing to report yet
    failed,       ///< the connection is dead (`error` holds -errno)
  } kind;
  std::size_t plaintext = 0;
  int error = 0;
};

/// Receives the plaintext a transport decodes. The span is valid only during the call, and
/// the receiver may modify it (a WebSocket reader unmasks in place).
class plaintext_sink {
 public:
  virtual ~plaintext_sink() = default;
  virtual void on_plaintext(conn_token t, std::span<std::uint8_t> bytes) noexcept = 0;
};

class transport {
 public:
  virtual ~transport() = default;
  virtual const char* name() const noexcept = 0;

  /// A connection was accepted on `fd`: start reading; the loop's events for it carry `t`.
  virtual bool open(int fd, conn_token t) noexcept = 0;
  /// Socket bytes arrived for `t`: hand their plaintext to `up` (any number of calls, maybe
  /// none, e.g. while a handshake is under way). False when the connection must be closed (a
  /// protocol error of the transport's own, already answered if it could be).
  virtual bool on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept = 0;
  /// The peer's end of stream (or a read error) arrived; the connection closes next.
  virtual void on_read_end(conn_token t) noexcept {}
  /// The connection did not finish its upgrade within --upgrade-timeout; it closes next.
  virtual void on_timeout(conn_token t) noexcept {}
  /// Stops reading until resume_reading (the kernel keeps what arrives meanwhile).
  virtual void pause_reading(int fd, conn_token t) noexcept = 0;
  /// Reading had paused (pause_reading, or io_uring receive buffers ran out): read again.
  virtual void resume_reading(int fd, conn_token t) noexcept = 0;

  /// Offers plaintext to the socket (the iovecs are valid only during the call; at most
  /// max_send_bytes() of it, a first frame aside). Completed: `bytes` of plaintext were taken
  /// now (short: the socket is full, wait_writable()). Pending: the send's end is reported by
  /// on_sent() or on_writable(). Failed: the connection is dead.
  virtual send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept = 0;
  /// The most plaintext one send should offer (an encrypting transport holds its ciphertext).
  virtual std::size_t max_send_bytes() const noexcept { return SIZE_MAX; }
  /// A send the backend completed (io_uring) ended with `res` (bytes or -errno). Called for
  /// every completion of `t`, also after close(): the transport may have its own to finish.
  virtual transport_event on_sent(conn_token t, int res) noexcept = 0;
  /// The socket is writable again (epoll, after a wait_writable of the connection's or the
  /// transport's own).
  virtual transport_event on_writable(int fd, conn_token t) noexcept { return {transport_event::writable}; }
  /// Asks for on_writable once the socket has room again (after a short completed send).
  virtual void wait_writable(int fd, conn_token t) noexcept = 0;
  /// Half-closes: no more bytes will be sent (the peer sees the end after what was sent).
  virtual void shutdown_write(int fd, conn_token t) noexcept = 0;
  /// Closes `fd`; a send still in flight is cancelled and completes with an error. `abort`:
  /// unsent bytes are discarded and the peer gets a reset, so a peer that stopped reading
  /// cannot keep the socket alive in the kernel.
  virtual void close(int fd, conn_token t, bool abort) noexcept = 0;
  /// No write of the transport's own is in flight for `t` (after close: the connection's slot
  /// may be reused once this holds; the completion that makes it hold goes to on_sent).
  virtual bool idle(conn_token t) const noexcept { return true; }
};

}  // namespace wspush::server
