#pragma once
// The admin listener's view of this process: /metrics series read from the shards and the
// pool at scrape time (docs/METRICS.md), and the publish sink of the modes that have no
// pub/sub yet.

#include <vector>

#include "pool/task_pool.hpp"
#include "server/admin/admin_api.hpp"
#include "server/admin/metrics.hpp"
#include "server/conn/shard.hpp"
#include "server/pubsub/hub.hpp"

namespace wspush::server {

/// Registers the connection, upgrade, message, byte, slow-consumer and pool series. The
/// shards and the pool must outlive the registry's scrapes.
void register_process_metrics(metrics_registry& m, const std::vector<shard*>& shards, pool::task_pool& tasks);

/// Registers the pub/sub series: publishes, fan-out, topics and subscriptions, history.
void register_pubsub_metrics(metrics_registry& m, const std::vector<shard*>& shards, hub& bus);

/// The admin API's publishes into the embedded bus. Shards are woken once per request.
class hub_sink final : public publish_sink {
 public:
  explicit hub_sink(hub& bus) : _hub(bus) {}
  publish_outcome publish(std::string_view topic, std::string_view data_raw) noexcept override {
    if (!_hub.publish(topic, data_raw, _id, false)) return {publish_outcome::unavailable, "out of memory"};
    return {publish_outcome::ok, _id.view()};
  }
  void end_batch() noexcept override { _hub.wake_all(); }

 private:
  hub& _hub;
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
