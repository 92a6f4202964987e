#pragma once
// The application interface: what the WebSocket phase calls when a connection opens, sends a
// message or goes away (in the spirit of uWebSockets' WebSocketBehavior), and what the
// application may ask of the connection layer in return. echo, broadcast and the pub/sub
// session are applications; the connection layer knows none of them.
//
// Everything here runs on the shard's thread: an application is one object per shard, and
// the connections it sees are that shard's.

#include <cstdint>
#include <span>
#include <string_view>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"
#include "proto/ws_close.hpp"
#include "proto/ws_frame.hpp"

namespace wspush::server {

/// A connection of this shard, as the application sees it: valid from on_open until on_close
/// returns; the number may be reused for another connection afterwards.
using conn_id = std::uint32_t;

/// What the upgrade established. Views valid during on_open only.
struct open_info {
  std::int64_t exp = 0;       ///< the token's expiry, unix seconds (0: no token, no expiry)
  std::string_view topics;    ///< the token's grants in proto/jwt's compact form (empty without tokens)
  std::string_view pub;
  std::uint32_t user = 0;     ///< the token's `sub` in the process's user_table (0: none); the application leaves it at on_close
  std::int64_t iat = 0;       ///< the token's issue time, unix seconds (0: none)
  /// Set by an application whose on_open refuses the connection because its user was revoked
  /// after the token was checked: the upgrade is answered 401, counted as revoked.
  mutable bool revoked = false;
};

/// Room a message block keeps in front of the payload: enough for a server frame header, so
/// an application can frame the payload where it lies (proto::frame_in_place).
inline constexpr std::size_t message_header_room = proto::max_server_header_size;

/// A complete message. `payload` may be modified; it is valid during on_message only, unless
/// the application takes `block`.
struct message {
  proto::opcode op;
  std::span<std::uint8_t> payload;
  std::size_t readable;  ///< bytes readable from payload.data(), >= payload.size() (padding for parsers)
  /// Non-null when the payload was assembled in a leased block, message_header_room bytes in:
  /// the application may take it (move from it) to frame the payload in place.
  pool::lease* block;
};

/// Frames a message's payload for sending: where it lies when it came in a block with header
/// room (the application takes the block, no copy), else copied into a new block. Empty when
/// out of memory.
pool::frame_ref frame_message(pool::buffer_pool& buffers, message& m) noexcept;

/// What a fan-out to many connections came to.
struct send_counts {
  std::uint64_t queued = 0;  ///< frames queued
  std::uint64_t closing = 0; ///< connections already closing: they get nothing more
  std::uint64_t slow = 0;    ///< connections closed just now as slow consumers (1013), or out of memory
};

/// The connection layer, as an application sees it.
class conn_ops {
 public:
  virtual ~conn_ops() = default;
  /// Queues a frame for `c`. False when it was not queued: `c` is closing, or was closed just
  /// now as a slow consumer, or memory ran out.
  virtual bool send(conn_id c, pool::frame_ref f) noexcept = 0;
  /// Queues one shared frame for each of `cs`; the frame may hold several messages back to
  /// back (`messages`, for the counters). on_close is not called for any connection during
  /// the call (`cs` may be the application's own array).
  virtual send_counts send_all(std::span<const conn_id> cs, const pool::frame_ref& f,
                               std::uint32_t messages = 1) noexcept = 0;
  /// Starts the close handshake with `code` (the connection stops reading messages).
  virtual void close(conn_id c, proto::close_code code) noexcept = 0;
  /// Whether `c` is open (not closing).
  virtual bool is_open(conn_id c) const noexcept = 0;
  /// Bytes queued for `c` that the kernel has not taken yet (what --max-pending-bytes bounds):
  /// an application pacing a long answer sends more once the reader has taken what it had.
  virtual std::size_t unsent_bytes(conn_id c) const noexcept = 0;
  /// The application's expiry for `c` changed: the connection's deadline is re-armed.
  virtual void expiry_changed(conn_id c) noexcept = 0;
  /// Three bits of the connection record kept for the application (0..7), 0 at on_open.
  virtual std::uint8_t app_bits(conn_id c) const noexcept = 0;
  virtual void set_app_bits(conn_id c, std::uint8_t bits) noexcept = 0;
  /// Where frames are leased from.
  virtual pool::buffer_pool& buffers() noexcept = 0;
  /// Whether `c` negotiated permessage-deflate (a frame's compressed twin would reach it).
  virtual bool compresses(conn_id c) const noexcept { return false; }
  /// Hands `c` no further message until resume(c): called from on_message, the application
  /// finishes an asynchronous request (a `sub` waiting for a bus) before it sees the next one.
  /// What arrives meanwhile is kept, and reading pauses (the kernel keeps the rest).
  virtual void hold(conn_id c) noexcept = 0;
  /// Delivers what was kept, then reads again. Not from inside on_message for `c`.
  virtual void resume(conn_id c) noexcept = 0;
};

class application {
 public:
  virtual ~application() = default;
  /// Called once, before any other call, with the connection layer it serves.
  virtual void bind(conn_ops& ops) noexcept = 0;
  /// The upgrade succeeded. Runs before the 101 response is queued, so it must not send;
  /// false refuses the connection (the client gets 500).
  virtual bool on_open(conn_id c, const open_info& info) noexcept = 0;
  /// A complete message (text already UTF-8 validated).
  virtual void on_message(conn_id c, message& m) noexcept = 0;
  /// The connection is gone (closed by either side, or by a deadline): forget it.
  virtual void on_close(conn_id c) noexcept = 0;
  /// When `c`'s credentials expire, unix seconds (0: never). The connection's one deadline is
  /// never later than this, and on_expired is called once it has passed.
  virtual std::uint32_t expiry(conn_id c) const noexcept { return 0; }
  virtual void on_expired(conn_id c) noexcept {}
  /// Once per loop tick (reactor/loop.hpp loop_tick_ms), with the tick.
  virtual void on_tick(std::uint32_t tick) noexcept {}
};

}  // namespace wspush::server
