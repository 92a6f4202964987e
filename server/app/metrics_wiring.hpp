#pragma once
// The process's series in /metrics (docs/METRICS.md), read from the shards, the pool and the
// hub at scrape time.

#include <vector>

#include "pool/task_pool.hpp"
#include "server/admin/metrics.hpp"
#include "server/app/shard.hpp"
#include "server/bus/redis_bus.hpp"
#include "server/conn/compression.hpp"
#include "server/pubsub/hub.hpp"

namespace wspush::server {

/// Registers the connection, upgrade, message, byte, slow-consumer, loop and pool series. The
/// shards (started) and the pool must outlive the registry's scrapes.
void register_process_metrics(metrics_registry& m, const std::vector<shard*>& shards, pool::task_pool& tasks);
/// permessage-deflate: connections that negotiated it, events compressed and by how much.
void register_compression_metrics(metrics_registry& m, const std::vector<shard*>& shards, const compression& z);

/// Registers the pub/sub series: publishes, fan-out, topics and subscriptions, history.
/// With --bus=redis://...: the bus's state and traffic.
void register_bus_metrics(metrics_registry& m, bus::redis_bus& b, const std::vector<shard*>& shards);
/// With --tls-cert: the TLS handshake results.
void register_tls_metrics(metrics_registry& m, const std::vector<shard*>& shards);
void register_pubsub_metrics(metrics_registry& m, const std::vector<shard*>& shards, pubsub::hub& hub);
/// Presence (where a namespace keeps it): this node's part of it, and the join/leave events
/// handed to its shards. `bus`: the Redis bus (null: embedded), whose events Redis announced.
void register_presence_metrics(metrics_registry& m, const std::vector<shard*>& shards,
                               const pubsub::presence_table& table, const bus::redis_bus* bus);
/// The revocation list's size (POST /disconnect).
void register_revoke_metrics(metrics_registry& m, revocation_list& list);

}  // namespace wspush::server
