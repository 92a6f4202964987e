#pragma once
// permessage-deflate on the sending side: an event is compressed once per process, into a
// frame that rides with the plain one as its twin (pool/shared_frame.hpp), so a history, a
// replay and a fan-out share both; each connection is sent the one it negotiated. A connection
// keeps no compression state: the extension is one bit of its record.

#include <atomic>
#include <cstdint>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"

namespace wspush::server {

class compression {
 public:
  /// `min_bytes`: a payload shorter than this is sent plain to everyone (too small to gain).
  compression(bool on, std::uint32_t min_bytes) noexcept : _on(on), _min_bytes(min_bytes) {}

  /// Whether upgrades may negotiate permessage-deflate (--compression).
  bool on() const noexcept { return _on; }
  std::uint32_t min_bytes() const noexcept { return _min_bytes; }

  /// Connections that negotiated the extension, all shards: frames are compressed only while
  /// there is one to send them to. Any thread.
  void joined() noexcept { _users.fetch_add(1, std::memory_order_relaxed); }
  void left() noexcept { _users.fetch_sub(1, std::memory_order_relaxed); }
  std::uint32_t users() const noexcept { return _users.load(std::memory_order_relaxed); }
  /// Compressed twins made, and the payload bytes they held before and after: the ratio.
  std::uint64_t frames() const noexcept { return _frames.load(std::memory_order_relaxed); }
  std::uint64_t bytes_in() const noexcept { return _bytes_in.load(std::memory_order_relaxed); }
  std::uint64_t bytes_out() const noexcept { return _bytes_out.load(std::memory_order_relaxed); }

  /// Gives `frame` (one whole unfragmented data frame as the server sends it, not yet shared)
  /// its compressed twin, RSV1 set: when compression is on, a connection that negotiated it is
  /// open, the payload is at least min_bytes long, and it comes out smaller. Otherwise the frame
  /// stays as it is and goes plain to everyone. Any thread (each keeps its own compressor).
  void attach(pool::buffer_pool& buffers, pool::frame_ref& frame) noexcept;

 private:
  const bool _on;
  const std::uint32_t _min_bytes;
  std::atomic<std::uint32_t> _users{0};
  std::atomic<std::uint64_t> _frames{0}, _bytes_in{0}, _bytes_out{0};
};

}  // namespace wspush::server
