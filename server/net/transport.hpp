#pragma once
// The seam between a socket and the protocol. What arrives on a socket goes through the
// connection's transport before any HTTP or WebSocket code sees it, and what the connection
// sends (plaintext frames from its out queue) goes through it on the way to the socket. Plain
// TCP passes both through untouched; TLS decrypts and encrypts here, and nothing above this
// seam changes.
//
// A transport is one per listener and shard (a shard's connections of that listener share it);
// per-connection state, if it needs any, is its own business, indexed by the connection token.

#include <cstdint>
#include <span>

#include <sys/uio.h>

#include "server/reactor/io_backend.hpp"

namespace wspush::server {

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
  /// none, e.g. while a handshake is under way).
  virtual void on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept = 0;
  /// Stops reading until resume_reading (the kernel keeps what arrives meanwhile).
  virtual void pause_reading(int fd, conn_token t) noexcept = 0;
  /// Reading had paused (pause_reading, or io_uring receive buffers ran out): read again.
  virtual void resume_reading(int fd, conn_token t) noexcept = 0;

  /// Offers plaintext to the socket (the iovecs are valid only during the call). Completed:
  /// `bytes` of plaintext were taken now (short: the socket is full, wait_writable()).
  /// Pending: on_sent() follows. Failed: the connection is dead.
  virtual send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept = 0;
  /// A pending send ended with `res` (bytes or -errno): the plaintext bytes it took, or -errno.
  virtual long on_sent(conn_token t, int res) noexcept = 0;
  /// Asks for on_writable once the socket has room again (after a short completed send).
  virtual void wait_writable(int fd, conn_token t) noexcept = 0;
  /// Half-closes: no more bytes will be sent (the peer sees the end after what was sent).
  virtual void shutdown_write(int fd) noexcept = 0;
  /// Closes `fd`; a send still in flight is cancelled and completes with an error. `abort`:
  /// unsent bytes are discarded and the peer gets a reset, so a peer that stopped reading
  /// cannot keep the socket alive in the kernel.
  virtual void close(int fd, conn_token t, bool abort) noexcept = 0;
};

}  // namespace wspush::server
