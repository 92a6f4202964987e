#pragma once
// The per-connection record. An idle open connection is this record, the loop's 16 bytes of
// links for its slot, and its kernel socket: no thread, no stack, no buffer. Partial input (an
// unfinished upgrade request, a frame header split across reads, a message still arriving)
// and queued output borrow leased blocks that go back to the pool as soon as they are empty.

#include <cstdint>
#include <memory>
#include <new>

#include "pool/lease.hpp"
#include "pool/leased.hpp"
#include "proto/http_upgrade.hpp"
#include "proto/ws_frame.hpp"
#include "proto/ws_reader.hpp"
#include "server/base/user_table.hpp"
#include "server/conn/out_queue.hpp"
#include "server/reactor/io_backend.hpp"

namespace wspush::server {

enum class conn_state : std::uint8_t {
  free,             // slot unused
  upgrading,        // reading the HTTP upgrade request
  upgrade_pending,  // the request is being handled by a pool worker
  open,             // WebSocket frames flow
  closing,          // we sent a close frame (or an HTTP error) and wait for the peer or a timeout
  dead,             // socket closed; the slot waits for a send still in flight to end
};
inline constexpr std::size_t conn_state_count = 6;

enum conn_flag : std::uint16_t {
  flag_send_in_flight = 1 << 0,   // an asynchronous send holds the head of the output queue
  flag_wait_writable = 1 << 1,    // a short synchronous send: waiting for on_writable
  flag_close_when_flushed = 1 << 2,
  flag_listed = 1 << 3,           // on the loop's flush list
  flag_rearm_read = 1 << 4,       // reading paused (io_uring buffers ran out, a read ended, a hold): re-arm
  flag_read_broken = 1 << 5,      // input no longer parsed (after a protocol error or a close)
  flag_linger_when_flushed = 1 << 6,  // half-close when flushed, then read until EOF or timeout
  flag_timer_message = 1 << 7,  // the armed deadline is the message timeout, not keepalive
  flag_ping_sent = 1 << 8,      // a keepalive ping is unanswered
  flag_timer_exp = 1 << 9,      // the armed deadline is the application's expiry
  flag_counted_out = 1 << 10,   // already left the --max-connections count
  flag_app_open = 1 << 11,      // the application accepted it (on_open): on_close is owed
  flag_text_heartbeat = 1 << 12,  // keepalive as the text `{"op":"ping"}` (?heartbeat=1)
  // Bits 13..15 belong to the application (conn_ops::app_bits).
  flag_app_shift = 13,
  flag_app_mask = 7 << 13,
};

/// An upgrade request in progress: this header, then the request bytes (and any frame bytes
/// that came right behind it). The whole block travels to a pool worker and back.
struct upgrade_job {
  std::uint64_t token = 0;
  proto::upgrade_parser parser{8192};  // the configured limit is set on creation
  std::uint32_t len = 0;       // bytes received
  std::uint32_t consumed = 0;  // end of the request, once parsed
  // Where the loop's parse found what the worker needs, as offsets into the bytes: the worker
  // does not parse the request again.
  std::uint32_t key_at = 0, key_len = 0, token_at = 0, token_len = 0;
  // The token's grants (compact form) the worker appends after the request bytes, and its exp.
  std::uint32_t grants_at = 0, topics_len = 0, pub_len = 0;
  std::int64_t exp = 0;
  std::int64_t iat = 0;        // the token's issue time (0: none): the shard checks revokes again
  bool heartbeat = false;      // ?heartbeat=1: keepalive as text
  std::uint8_t deflate = 0;    // permessage-deflate negotiated (1; 2: the offer named server_max_window_bits)
  // An event stream (GET --sse-path): its topics (percent-decoded, each followed by a LF) and
  // its positions (the stream id to resume from, or empty), written behind the request bytes.
  bool sse = false;
  std::uint8_t sse_topic_count = 0;
  std::uint32_t sse_at = 0, sse_topics_len = 0, sse_since_len = 0;
  // The token's user, counted in `users` by the worker until the application takes the
  // connection (which then leaves it when it closes); a job that goes no further leaves it in
  // http_phase::on_upgraded.
  user_table* users = nullptr;
  std::uint32_t user = user_table::nobody;
  bool revoked = false;        // refused (401) for a revoked user's token (revocation_list)
  std::uint16_t status = 500;  // the worker's verdict: 101, or the HTTP status to answer
  const char* reason = "";     // static text for the error body
  std::uint32_t reason_len = 0;
  std::uint8_t response[288];  // the 101 response, written by the worker (258 B at most, with permessage-deflate)
  std::uint32_t response_len = 0;
};
using upgrade_job_ref = pool::leased<upgrade_job>;

/// Input state of an open connection in the middle of something: a frame header or control
/// frame split across reads (the tail), a frame's payload still arriving, a message
/// assembling. An idle connection has none of this: its reader is fresh and lives on the stack.
struct ws_rx {
  proto::ws_reader reader;
  pool::lease msg;            // [message_header_room][payload so far], framed in place when complete
  std::uint32_t msg_len = 0;
  proto::opcode msg_op = proto::opcode::text;
  std::uint8_t tail_len = 0;
  bool held = false;          // the application asked to see no message until it resumes
  std::uint8_t tail[160];     // > 14 (a header) and > 131 (a whole control frame)
  pool::lease kept;           // held: the bytes behind the last message handed over...
  std::uint32_t kept_from = 0;  // ...from here on (those before it were handed over since)
};

/// A connection's partial input: which block it holds (if any) follows its state.
///   upgrading        job:   the request so far
///   upgrade_pending  early: bytes that arrived while a worker handles the request
///   open, closing    ws:    an unfinished frame or message
/// Each member is one pointer; the active one is switched only while empty.
union rx_hold {
  upgrade_job_ref job;
  pool::lease early;
  pool::leased<ws_rx> ws;
  rx_hold() noexcept : early() {}
  ~rx_hold() {}
};

/// Extensions a connection negotiated (connection::ext).
enum conn_ext : std::uint8_t {
  ext_deflate = 1 << 0,  // permessage-deflate: RSV1 messages in, compressed twins out
  ext_sse = 1 << 1,      // an event stream (sse_phase.hpp), not a WebSocket
  ext_sse_state = 1 << 2,  // a stream whose positions sse_phase keeps (several topics, or before `subbed`)
};

/// Budget: 32 bytes (plus the loop's 16 for the slot's links), so a million idle connections
/// cost 48 MB of records.
struct connection {
  std::int32_t fd = -1;
  std::uint32_t gen = 0;       // bumped on every reuse of the slot; part of the token
  rx_hold rx;
  out_queue tx;                // queued output; empty when idle
  std::uint32_t last_rx = 0;   // wheel tick of the last bytes received (keepalive); free-list link when free
  conn_state state = conn_state::free;
  std::uint8_t ext = 0;        // conn_ext bits (in what was padding)
  std::uint16_t flags = 0;

  connection() noexcept = default;
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() { drop_rx(); }

  /// Releases the partial input of the current state.
  void drop_rx() noexcept {
    switch (state) {
      case conn_state::upgrading: rx.job.reset(); break;
      case conn_state::open:
      case conn_state::closing: rx.ws.reset(); break;
      default: rx.early.reset(); break;
    }
  }
};
static_assert(sizeof(connection) <= 32, "connection record over its 32-byte budget");

inline conn_token make_token(std::uint32_t index, std::uint32_t gen) noexcept {
  return (std::uint64_t(gen & 0xFFFFFF) << 32) | index;
}
inline std::uint32_t token_index(conn_token t) noexcept { return std::uint32_t(t); }
inline std::uint32_t token_gen(conn_token t) noexcept { return std::uint32_t(t >> 32) & 0xFFFFFF; }

}  // namespace wspush::server
