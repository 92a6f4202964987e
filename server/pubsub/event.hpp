#pragma once
/// \file event.hpp
/// A published message on its way from the hub to a shard's subscribers, and the port the hub
/// hands it through. An event owns its frame (encoded once, shared by every receiver) and
/// knows its topic and its place in the history, so no receiver parses the frame again.

#include <cstdint>
#include <string_view>

#include <memory>

#include "pool/shared_frame.hpp"
#include "server/pubsub/bus_port.hpp"

namespace wspush::server::pubsub {

/// The history part of an event that was not recorded in a history (a broadcast).
inline constexpr std::uint32_t no_part = UINT32_MAX;

struct event {
  pool::frame_ref frame;   ///< the WebSocket frame, ready to send
  std::string_view topic;  ///< inside `frame`'s bytes, or static text: valid while `frame` lives
  std::uint64_t seq = 0;   ///< its seq in history part `part` (the resume seam, history.hpp)
  std::uint32_t part = no_part;
  /// Not an event but a bus's answer to a `sub` (bus_port.hpp), owned by the event: it travels
  /// the same inbox so that it stays in order with the events around it.
  std::unique_ptr<bus_reply> reply;
};

/// Where the hub hands events: one port per shard. Any thread; never waits.
class event_port {
 public:
  virtual ~event_port() = default;
  /// Takes the event, or refuses it (its inbox is full, or its shard has stopped) and leaves
  /// it with the caller. With `wake` false the shard is not woken: wake() after a batch.
  virtual bool offer(event&& e, bool wake) noexcept = 0;
  virtual void wake() noexcept = 0;
  /// Its inbox is more than three quarters full: the hub refuses publishes instead of filling it.
  virtual bool crowded() const noexcept = 0;
};

}  // namespace wspush::server::pubsub
