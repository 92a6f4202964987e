#pragma once
// --bus=redis[s]://[[user]:password@]host:port[/db]: where the Redis bus is (rediss://: over TLS).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::server::bus {

struct redis_target {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user;      // an ACL user (AUTH user password); empty: the default user
  std::string password;  // empty: no AUTH (or --redis-password-file's)
  unsigned db = 0;
  bool tls = false;      // rediss://: TLS, the certificate checked against `host`
  /// "redis://127.0.0.1:6379/0", "rediss://user:***@host:6379/0" (the password never appears).
  std::string describe() const;
  /// AUTH [user] password into argv/lens (room for 3); the count, 0 when there is no password.
  int auth_argv(const char** argv, std::size_t* lens) const noexcept {
    if (password.empty()) return 0;
    int n = 0;
    argv[n] = "AUTH", lens[n++] = 4;
    if (!user.empty()) argv[n] = user.c_str(), lens[n++] = user.size();
    argv[n] = password.c_str(), lens[n++] = password.size();
    return n;
  }
};

/// What to do about an error Redis gave a connection's set-up, in the user's words (with a
/// leading "; "), or empty: it wants a password (NOAUTH, or "unauthenticated bulk length" when
/// it cut a long first command short), the credentials are wrong, or the user lacks a right.
std::string_view refusal_hint(std::string_view redis_error) noexcept;

/// Parses a bus URL; throws std::invalid_argument with a message fit for the user.
redis_target parse_redis_url(std::string_view url, std::uint16_t default_port = 6379);

/// What --bus names beyond the embedded bus (issue 21, not wired yet):
///   redis://... (or rediss://...)                one Redis
///   redis://...,redis://...                   isolated shards, in this order (redis_route.hpp)
///   redis-cluster://[[user]:password@]host:port[,host:port...]   a Redis Cluster, by its seed
///   nodes (rediss-cluster://: over TLS)
///   redis-sentinel://[[user]:password@]host:port[,host:port...]/MASTER_NAME   one Redis whose
///   master the Sentinels name (rediss-sentinel://: the master and the Sentinels over TLS)
struct bus_spec {
  enum kind_t : std::uint8_t { single, shards, cluster, sentinel } kind = single;
  /// single: one; shards: each; cluster: the seeds (db 0); sentinel: the master's credentials
  /// and TLS, its address still to be asked (host empty)
  std::vector<redis_target> targets;
  std::vector<redis_target> sentinels;  ///< sentinel: where to ask (no credentials)
  std::string master_name;              ///< sentinel: the name the Sentinels monitor it by
  /// Whether any target is reached over TLS (rediss://).
  bool any_tls() const noexcept {
    for (const auto& t : targets)
      if (t.tls) return true;
    return false;
  }
};

/// Throws std::invalid_argument with a message fit for the user: a malformed URL, a shard
/// named twice, a cluster seed with a database.
bus_spec parse_bus_spec(std::string_view value);

}  // namespace wspush::server::bus
