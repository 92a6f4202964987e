#pragma once
// The event-stream phase: a `GET /sse?topics=...` connection after its 200. The stream is the
// same pub/sub session as a WebSocket's: opening it hands the application the `sub` a
// WebSocket client would send (the topics, and `since` from Last-Event-ID or ?since=), and
// every message the application queues for it leaves as an event (proto/sse.hpp) instead of a
// frame: events with `id:` the stream's positions, replies as named events (`subbed`, `lost`;
// `error` as `refused`, not to be taken for EventSource's own `error`), the keepalive as a comment line, a close as `retry:` (a revoke's, 4403, after a `refused` event with code `revoked`) (spread at random, so a drain
// does not bring every browser back at once) and the end of the response.
//
// An idle stream of one topic keeps nothing here: its event id is the event's own id. A stream
// of several topics keeps each topic's position (the event id carries them all), and any stream
// keeps its request's positions until `subbed` has gone out.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pool/shared_frame.hpp"
#include "server/conn/connection.hpp"

namespace wspush::server {

class connections;

class sse_phase {
 public:
  explicit sse_phase(connections& c);

  /// The 200 is queued: hands the application the stream's `sub`. `topics` as the request named
  /// them (distinct, valid), `positions` one per topic (empty: none).
  void start(std::uint32_t slot, std::span<const std::string_view> topics,
             std::span<const std::string_view> positions) noexcept;
  /// The stream form of `frames` (server WebSocket frames back to back) for `slot`. Empty when
  /// out of memory. `close_after` is set when the stream ends with it (its `sub` was refused).
  pool::frame_ref render(std::uint32_t slot, const pool::frame_ref& frames, bool& close_after) noexcept;
  /// Whether `slot`'s events look the same as any other stateless stream's (one topic, opened).
  bool stateless(std::uint32_t slot) const noexcept;
  /// render() of a frame every stateless stream gets (a fan-out): made once until end_batch().
  pool::frame_ref shared(const pool::frame_ref& frames) noexcept;
  void end_batch() noexcept { _shared = {}, _shared_src = nullptr; }
  /// The connection is gone.
  void forget(std::uint32_t slot) noexcept;

 private:
  struct stream {
    std::vector<std::string> topics, at;  // the positions the next event id carries
    bool opening = true;                  // `subbed` has not gone out
  };
  std::uint32_t retry_ms() noexcept;
  static constexpr std::uint32_t no_slot = UINT32_MAX;  // render() for any stateless stream

  connections& _c;
  std::unordered_map<std::uint32_t, stream> _streams;
  std::string _id;  // scratch: an event id being joined
  const std::uint8_t* _shared_src = nullptr;
  pool::frame_ref _shared;
  std::uint64_t _rand;
};

}  // namespace wspush::server
