#pragma once
// The WebSocket phase: frames in (proto::ws_reader), messages to the application, control
// frames answered, the close handshake, and the one deadline of an open connection (message
// timeout while a frame or message is unfinished, keepalive otherwise, never past the
// application's expiry). An idle connection's reader is a fresh one on the stack; only a read
// that leaves something unfinished leases a ws_rx block to keep it until the next read.

#include <cstdint>
#include <memory>
#include <span>

#include "proto/ws_close.hpp"
#include "proto/ws_deflate.hpp"
#include "proto/ws_frame.hpp"
#include "proto/ws_reader.hpp"
#include "server/conn/connection.hpp"

namespace wspush::server {

class connections;

class ws_phase {
 public:
  explicit ws_phase(connections& c) noexcept : _c(c) {}

  /// The 101 is queued: the connection is open; `early` are bytes that came behind the request.
  void start(std::uint32_t slot, std::span<std::uint8_t> early) noexcept;
  /// Bytes for an open or closing connection.
  void on_bytes(std::uint32_t slot, std::span<std::uint8_t> bytes) noexcept;
  /// The open connection's deadline came.
  void on_timer(std::uint32_t slot) noexcept;
  /// Re-arms the keepalive deadline (the application's expiry changed).
  void rearm(std::uint32_t slot) noexcept;
  /// Sends a close frame with `code` and waits for the peer's (or the close timeout). With
  /// `linger` the input is no longer parsed: the write side is shut once the frame is out and
  /// the peer's end awaited.
  void start_close(std::uint32_t slot, proto::close_code code, bool linger) noexcept;
  /// A protocol error: close with `code` and count it.
  void close_on_error(std::uint32_t slot, proto::close_code code) noexcept;
  /// The application holds the connection's messages (conn_ops::hold); resume() lets them go.
  void hold(std::uint32_t slot) noexcept;
  void resume(std::uint32_t slot) noexcept;
  bool held(std::uint32_t slot) const noexcept;
  /// Most bytes kept for a held connection (past it: close 1008).
  static constexpr std::size_t max_kept_bytes = 1 << 20;

 private:
  struct events;
  bool consume(std::uint32_t slot, proto::ws_reader& r, std::span<std::uint8_t> bytes, std::size_t& used) noexcept;
  bool deliver(std::uint32_t slot, proto::opcode op, pool::lease* block, std::span<std::uint8_t> payload,
               std::size_t readable) noexcept;
  bool inflate(std::uint32_t slot, proto::opcode op, pool::lease& in, std::size_t in_len) noexcept;
  void note_timer(std::uint32_t slot, bool unfinished) noexcept;
  void queue_close(std::uint32_t slot, std::span<const std::uint8_t> payload) noexcept;
  void queue_ping(std::uint32_t slot) noexcept;
  void arm(std::uint32_t slot, std::uint32_t ticks) noexcept;
  ws_rx* rx(std::uint32_t slot) noexcept;
  void keep(std::uint32_t slot, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b = {}) noexcept;
  bool keep_in_place(ws_rx& rs, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept;

  connections& _c;
  /// The kept bytes resume() is handing over (nullptr otherwise): held again, what stays of
  /// them is kept where it lies, not copied.
  pool::lease* _replay = nullptr;
  /// permessage-deflate: every client message inflates on its own (client_no_context_takeover),
  /// so one inflater serves the shard; made on the first compressed message.
  std::unique_ptr<proto::message_inflater> _inflater;
};

}  // namespace wspush::server
