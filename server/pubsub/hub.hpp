#pragma once
/// \file hub.hpp
/// The embedded bus: where a publish becomes one framed event, enters the history, and
/// reaches every shard. Each shard then fans the shared frame out to its own subscribers
/// (its topic_registry); nothing on that path is copied per subscriber.
///
///   publish(topic, data) ── history.append ──┬─▶ shard 0 inbox ─▶ its subscribers
///   (admin thread, or a shard for a         ├─▶ shard 1 inbox ─▶ ...
///    client's `pub`)                         └─▶ ...
///
/// The frame is posted to the shards from inside the history's append (under its part's
/// lock), so every shard sees a part's publishes in seq order; that is what makes the resume
/// seam exact (history.hpp).

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"
#include "server/pubsub/history.hpp"

namespace wspush::server {

class shard;

class hub {
 public:
  /// `shards` must outlive the hub and be complete before the first publish.
  hub(pubsub::history_options o, pool::buffer_pool& buffers, const std::vector<shard*>& shards);

  /// Any thread. Frames `{"topic":..,"id":..,"data":<data_raw>}` once, appends it to the
  /// history and posts it to every shard; `id` receives the event's id. `topic` must be valid
  /// (proto/topic.hpp) and `data_raw` one JSON value (it is copied byte for byte). With
  /// `wake` false the shards are not woken: call wake_all() after a batch. False when out of
  /// memory (nothing was published).
  bool publish(std::string_view topic, std::string_view data_raw, pubsub::history_id& id, bool wake) noexcept;
  void wake_all() noexcept;
  /// Some shard's inbox is crowded (shard::inbox_crowded). A publish from a shard's own thread
  /// (a client's `pub`) is refused then instead of waiting; other threads may wait.
  bool crowded() const noexcept;

  pubsub::history& history() noexcept { return _history; }

 private:
  pool::frame_ref encode(std::string_view topic, std::string_view id, std::string_view data_raw) noexcept;

  pubsub::history _history;
  pool::buffer_pool& _buffers;
  const std::vector<shard*>& _shards;
};

/// The topic of an event frame made by the hub (its payload starts `{"topic":"` and a topic
/// has no `"` and needs no escaping), without parsing JSON. Empty for any other frame.
std::string_view event_topic(std::span<const std::uint8_t> frame) noexcept;

}  // namespace wspush::server
