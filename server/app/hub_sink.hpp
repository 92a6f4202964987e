#pragma once
// The admin API's publishes (admin/admin_api.hpp's publish_sink), into the hub.

#include <chrono>
#include <string>

#include "server/admin/admin_api.hpp"
#include "server/bus/redis_bus.hpp"
#include "server/pubsub/hub.hpp"

namespace wspush::server {

/// Publishes into the hub; the shards are woken once per request.
class hub_sink final : public publish_sink {
 public:
  explicit hub_sink(pubsub::hub& h) : _hub(h) {}
  publish_outcome publish(std::string_view topic, std::string_view data_raw, std::string_view key) noexcept override {
    switch (_hub.publish(topic, data_raw, _id, false, key)) {
      case pubsub::publish_status::ok: return {publish_outcome::ok, _id.view()};
      case pubsub::publish_status::busy: return {publish_outcome::unavailable, "busy"};
      case pubsub::publish_status::no_memory: break;
    }
    return {publish_outcome::unavailable, "out of memory"};
  }
  void end_batch() noexcept override { _hub.wake_all(); }

 private:
  pubsub::hub& _hub;
  pubsub::history_id _id;
};

/// Publishes through the Redis bus without waiting: each publish is handed to the bus thread
/// and answered `pending`; the bus tells the admin loop (set_notify) when Redis has answered,
/// and collect() then takes the outcome. The bus thread is woken once per admin loop turn
/// (end_turn), so that the publishes of every pipelined request go to Redis together.
class bus_sink final : public publish_sink {
 public:
  explicit bus_sink(bus::redis_bus& b) : _bus(b) {}
  publish_outcome publish(std::string_view topic, std::string_view data_raw, std::string_view key) noexcept override {
    if (!_bus.up_for(topic))
      return {publish_outcome::unavailable, _bus.redis_count() == 1 ? "the bus is down" : "the topic's Redis is down"};
    try {
      return {publish_outcome::pending, {}, _bus.publish_queue(topic, data_raw, key, true, false)};
    } catch (const std::exception&) {
    }
    return {publish_outcome::unavailable, "the bus is down"};
  }
  void set_notify(publish_notify notify) noexcept override { _bus.set_publish_notify(std::move(notify)); }
  void end_turn() noexcept override { _bus.wake_for_posts(); }
  publish_outcome collect(std::uint64_t ticket) noexcept override {
    try {
      _id.clear();
      switch (_bus.publish_collect(ticket, _id, std::chrono::milliseconds{0})) {
        case bus::bus_publish::ok: return {publish_outcome::ok, _id};
        case bus::bus_publish::refused: return {publish_outcome::unavailable, "refused by Redis"};
        // Its text, when Redis ran it but fewer replicas had it than --redis-wait-replicas asks
        // (else empty: no answer came).
        case bus::bus_publish::unknown: return {publish_outcome::timeout, _id};
        case bus::bus_publish::unavailable: break;
      }
    } catch (const std::exception&) {
    }
    return {publish_outcome::unavailable, "the bus is down"};
  }
  /// Ready while any Redis of the bus is: with isolated shards, one that is down refuses only
  /// its own topics (every node of the fleet sees it down alike: taking them all out of a load
  /// balancer would refuse the rest too). wspush_bus_redis_up says which.
  bool ready() const noexcept override { return _bus.any_up(); }
  std::string not_ready_reason() const override { return _bus.down_reason(); }
  bool stalled() const noexcept override { return _bus.stalled(); }

 private:
  bus::redis_bus& _bus;
  std::string _id;
};

/// Echo and broadcast have no topics: every publish is answered 503 (unavailable).
class no_pubsub_sink final : public publish_sink {
 public:
  publish_outcome publish(std::string_view, std::string_view, std::string_view) noexcept override {
    return {publish_outcome::unavailable, "pub/sub is not enabled in this mode (echo, broadcast)"};
  }
};

}  // namespace wspush::server
