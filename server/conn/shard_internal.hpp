#pragma once
// Layouts of the leased blocks a connection borrows while data moves. Shared by the shard's
// translation units only.

#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string_view>

#include "pool/lease.hpp"
#include "proto/http_upgrade.hpp"
#include "proto/ws_frame.hpp"
#include "proto/ws_reader.hpp"

namespace wspush::server {

class shard;

/// An upgrade request in progress: this header, then the request bytes. While the state is
/// `upgrading` it is the connection's rx block; once the request is complete the whole
/// block travels to a pool worker and back through the inbox.
struct upgrade_job {
  shard* owner = nullptr;
  std::uint64_t token = 0;
  proto::upgrade_parser parser{8192};  // replaced with the configured limit on creation
  std::uint32_t len = 0;       // request bytes (and any frame bytes right behind them)
  std::uint32_t consumed = 0;  // end of the request, set once parsed
  // Where the loop's parse found what the worker needs, as offsets into bytes(): the worker
  // does not parse the request again.
  std::uint32_t key_at = 0, key_len = 0, token_at = 0, token_len = 0;
  // The token's grants (compact form) the worker appends after the request bytes, and its exp.
  std::uint32_t grants_at = 0, topics_len = 0, pub_len = 0;
  std::int64_t exp = 0;
  void* response = nullptr;    // a frame_ref released to a raw pointer by the worker
  std::uint16_t status = 500;  // the worker's verdict: 101, or the HTTP status to answer
  std::string_view reason;     // static text for the error body
  std::uint8_t* bytes() noexcept { return reinterpret_cast<std::uint8_t*>(this + 1); }
  std::string_view text(std::uint32_t at, std::uint32_t len) noexcept {
    return {reinterpret_cast<const char*>(bytes()) + at, len};
  }
  /// Records where `part` (a view into bytes()) lies; an empty view is recorded as empty.
  void note(std::string_view part, std::uint32_t& at, std::uint32_t& len) noexcept {
    at = part.empty() ? 0 : std::uint32_t(part.data() - reinterpret_cast<const char*>(bytes()));
    len = std::uint32_t(part.size());
  }
};

/// Input state of an open connection that is in the middle of something: a frame header
/// split across reads (the tail), a frame's payload still arriving, a message assembling.
/// An idle connection has none of this: its reader is fresh and lives on the stack.
struct rx_state {
  static constexpr std::size_t header_room = proto::max_server_header_size;
  proto::ws_reader reader;
  pool::lease msg;            // [header_room][payload so far], framed in place when complete
  std::uint32_t msg_len = 0;
  proto::opcode msg_op = proto::opcode::text;
  std::uint8_t tail_len = 0;
  std::uint8_t tail[160];     // > 14 (a header) and > 131 (a whole control frame)
};

/// Queued output: a ring of frames (raw frame_ref pointers) following this header.
struct out_queue {
  std::uint32_t head = 0, count = 0, cap = 0;
  std::uint32_t offset = 0;   // bytes of the head frame already sent
  std::uint64_t bytes = 0;    // unsent bytes in the queue
  void** slots() noexcept { return reinterpret_cast<void**>(this + 1); }
};

/// memcpy that accepts an empty source (whose data() may be null: memcpy's is undefined then).
inline void copy_bytes(std::uint8_t* dst, std::span<const std::uint8_t> src) noexcept {
  if (!src.empty()) std::memcpy(dst, src.data(), src.size());
}

template <class T>
T* block_as(const pool::lease& l) noexcept {
  return std::launder(reinterpret_cast<T*>(l.data()));
}

}  // namespace wspush::server
