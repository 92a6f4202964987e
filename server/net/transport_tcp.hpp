#pragma once
// Plain TCP: the transport that passes bytes through untouched, straight onto the io backend.

#include "server/net/transport.hpp"

namespace wspush::server {

class tcp_transport final : public transport {
 public:
  /// `io` must outlive the transport.
  explicit tcp_transport(io_backend& io) noexcept : _io(io) {}
  const char* name() const noexcept override { return "tcp"; }

  bool open(int fd, conn_token t) noexcept override;
  bool on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept override {
    up.on_plaintext(t, bytes);
    return true;
  }
  void pause_reading(int fd, conn_token t) noexcept override { _io.stop_reading(fd, t); }
  void resume_reading(int fd, conn_token t) noexcept override { _io.start_reading(fd, t); }
  send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept override {
    return _io.send(fd, t, iov, iovcnt);
  }
  transport_event on_sent(conn_token, int res) noexcept override {
    if (res < 0) return {transport_event::failed, 0, res};
    return {transport_event::sent, std::size_t(res)};
  }
  void wait_writable(int fd, conn_token t) noexcept override { _io.wait_writable(fd, t); }
  void shutdown_write(int fd, conn_token) noexcept override;
  void close(int fd, conn_token t, bool abort) noexcept override;

 private:
  io_backend& _io;
};

}  // namespace wspush::server
