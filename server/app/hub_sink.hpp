#pragma once
// The admin API's publishes (admin/admin_api.hpp's publish_sink), into the hub.

#include "server/admin/admin_api.hpp"
#include "server/pubsub/hub.hpp"

namespace wspush::server {

/// Publishes into the hub; the shards are woken once per request.
class hub_sink final : public publish_sink {
 public:
  explicit hub_sink(pubsub::hub& h) : _hub(h) {}
  publish_outcome publish(std::string_view topic, std::string_view data_raw) noexcept override {
    switch (_hub.publish(topic, data_raw, _id, false)) {
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

/// Echo and broadcast have no topics: every publish is answered 503 (unavailable).
class no_pubsub_sink final : public publish_sink {
 public:
  publish_outcome publish(std::string_view, std::string_view) noexcept override {
    return {publish_outcome::unavailable, "pub/sub is not enabled in this mode (echo, broadcast)"};
  }
};

}  // namespace wspush::server
