#pragma once
// --bus=redis://[:password@]host:port[/db]: where the Redis bus is.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::server::bus {

struct redis_target {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string password;  // empty: no AUTH
  unsigned db = 0;
  /// "redis://127.0.0.1:6379/0" (the password never appears).
  std::string describe() const;
};

/// Parses a bus URL; throws std::invalid_argument with a message fit for the user.
redis_target parse_redis_url(std::string_view url);

/// What --bus names beyond the embedded bus (issue 21, not wired yet):
///   redis://...                               one Redis
///   redis://...,redis://...                   isolated shards, in this order (redis_route.hpp)
///   redis-cluster://[:password@]host:port[,host:port...]   a Redis Cluster, by its seed nodes
struct bus_spec {
  enum kind_t : std::uint8_t { single, shards, cluster } kind = single;
  std::vector<redis_target> targets;  // single: one; shards: each; cluster: the seeds (db 0)
};

/// Throws std::invalid_argument with a message fit for the user: a malformed URL, a shard
/// named twice, a cluster seed with a database.
bus_spec parse_bus_spec(std::string_view value);

}  // namespace wspush::server::bus
