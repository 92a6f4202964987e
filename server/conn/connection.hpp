#pragma once
// The per-connection record. An idle open connection is this record and its kernel socket:
// no thread, no stack, no buffer. Partial input (an unfinished upgrade request, a frame
// header split across reads, a message still arriving) and queued output borrow leased
// blocks that go back to the pool as soon as they are empty.

#include <cstdint>

#include "pool/lease.hpp"
#include "server/reactor/io_backend.hpp"
#include "server/reactor/timer_wheel.hpp"

namespace wspush::server {

enum class conn_state : std::uint8_t {
  free,             // slot unused
  upgrading,        // reading the HTTP upgrade request
  upgrade_pending,  // the request is being handled by a pool worker
  open,             // WebSocket frames flow
  closing,          // we sent a close frame (or an HTTP error) and wait for the peer or a timeout
  dead,             // socket closed; the slot waits for a send still in flight
};

enum conn_flag : std::uint16_t {
  flag_send_in_flight = 1 << 0,   // an asynchronous send holds the head of the output queue
  flag_wait_writable = 1 << 1,    // a short synchronous send: waiting for on_writable
  flag_close_when_flushed = 1 << 2,
  flag_listed = 1 << 3,           // on the shard's flush list
  flag_rearm_read = 1 << 4,       // reading paused (io_uring buffers ran out): re-arm
  flag_read_broken = 1 << 5,      // input no longer parsed (after a protocol error)
  flag_linger_when_flushed = 1 << 6,  // half-close when flushed, then read until EOF or timeout
  flag_timer_message = 1 << 7,  // the armed deadline is the message timeout, not keepalive
  flag_ping_sent = 1 << 8,      // a keepalive ping is unanswered
  flag_timer_exp = 1 << 9,      // the armed deadline is the token's expiry
  // Bits 13..15: client messages refused in a row (pubsub); at 7 the connection is closed.
  flag_errors_shift = 13,
  flag_errors_mask = 7 << 13,
};

/// Budget: 48 bytes, so 1,000,000 idle connections cost 48 MB of records.
struct connection {
  std::int32_t fd = -1;
  std::uint32_t gen = 0;       // bumped on every reuse of the slot; part of the token
  timer_links timer;           // the deadline of the current stage
  std::uint32_t flush_next = no_index;  // flush list link; free list link when free
  pool::lease rx;              // partial input, see rx_state; empty when idle
  pool::lease tx;              // queued output, see out_queue; empty when idle
  std::uint32_t last_rx = 0;   // wheel tick of the last bytes received (keepalive)
  conn_state state = conn_state::free;
  std::uint16_t flags = 0;
};
static_assert(sizeof(connection) <= 48, "connection record over its 48-byte budget");

inline conn_token make_token(std::uint32_t index, std::uint32_t gen) noexcept {
  return (std::uint64_t(gen & 0xFFFFFF) << 32) | index;
}
inline std::uint32_t token_index(conn_token t) noexcept { return std::uint32_t(t); }
inline std::uint32_t token_gen(conn_token t) noexcept { return std::uint32_t(t >> 32) & 0xFFFFFF; }

}  // namespace wspush::server
