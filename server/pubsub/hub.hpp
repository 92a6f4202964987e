#pragma once
/// \file hub.hpp
/// Where a publish becomes one framed event, enters the history, and is handed to every shard
/// through its event port. Each shard then fans the shared frame out to its own subscribers
/// (fanout.hpp); nothing on that path is copied per subscriber.
///
///   publish(topic, data) ── history.append ──┬─▶ port of shard 0 ─▶ its subscribers
///   (admin thread, or a shard for a         ├─▶ port of shard 1 ─▶ ...
///    client's `pub`)                         └─▶ ...
///
/// The event is offered to the ports from inside the history's append (under its part's
/// lock), so every shard sees a part's publishes in seq order; that is what makes the resume
/// seam exact (history.hpp). A port never makes the hub wait: while any shard's inbox is
/// crowded a publish is refused (the admin API answers 503), and an event a port refuses
/// anyway (its shard has stopped, or its inbox filled in between) is counted and dropped for
/// that shard.
///
/// Vocabulary: the hub is this process's pub/sub center; the bus (embedded or, for many nodes,
/// Redis) is what carries publishes between nodes.

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"
#include "server/conn/compression.hpp"
#include "server/pubsub/event.hpp"
#include "server/pubsub/history.hpp"
#include "server/pubsub/namespaces.hpp"

namespace wspush::server::pubsub {

enum class publish_status : std::uint8_t {
  ok,
  busy,       ///< a shard's inbox is crowded: retry later (503)
  no_memory,  ///< nothing was published
};

class hub {
 public:
  /// `o.spaces`: the namespaces, read by the history, by the hub (compression) and by whoever
  /// asks spaces(); null: every topic has the history's size and TTL, client publish and
  /// compression.
  hub(history_options o, pool::buffer_pool& buffers);

  /// Start-up, before the first publish: one port per shard, each outliving the hub's use.
  void attach(std::vector<event_port*> ports) { _ports = std::move(ports); }
  /// Start-up: events get their compressed twin here, once for every shard (compression.hpp).
  void set_compression(compression& z) noexcept { _compression = &z; }

  /// Any thread. Frames `{"topic":..,"id":..,"data":<data_raw>}` once, appends it to the
  /// history and offers it to every shard; `id` receives the event's id. `topic` must be valid
  /// (proto/topic.hpp) and `data_raw` one JSON value (copied byte for byte). With `wake`
  /// false the shards are not woken: call wake_all() after a batch. With an
  /// `idempotency_key` (valid, proto/envelope.hpp; empty: none), a key already published on
  /// the topic within the history's idempotency window publishes nothing: ok, `id` receives
  /// that publish's id (history::append checks and appends under one lock).
  publish_status publish(std::string_view topic, std::string_view data_raw, history_id& id, bool wake,
                         std::string_view idempotency_key = {}) noexcept;
  /// Any thread. Offers a ready frame to every shard for the subscribers of `topic`, outside
  /// the history (broadcast mode). `topic` must be static text.
  publish_status relay(pool::frame_ref frame, std::string_view topic) noexcept;
  void wake_all() noexcept;
  /// Some shard's inbox is crowded.
  bool crowded() const noexcept;

  history& events() noexcept { return _history; }
  /// The options of each kind of topic (namespaces.hpp): any thread.
  const namespaces& spaces() const noexcept { return _spaces; }
  /// Events a port refused after the publish was accepted: their shard's subscribers missed them.
  std::uint64_t dropped() const noexcept { return _dropped.load(std::memory_order_relaxed); }

 private:
  pool::frame_ref encode(std::string_view topic, std::string_view id, std::string_view data_raw,
                         std::string_view& topic_in_frame) noexcept;
  void offer_all(const event& e, bool wake) noexcept;

  namespaces _own;  // without o.spaces: the history's limits for every topic
  const namespaces& _spaces;
  history _history;
  pool::buffer_pool& _buffers;
  compression* _compression = nullptr;
  std::vector<event_port*> _ports;
  std::atomic<std::uint64_t> _dropped{0};
};

}  // namespace wspush::server::pubsub
