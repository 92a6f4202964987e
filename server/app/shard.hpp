#pragma once
// A shard: one reactor thread and what runs on it. Its loop, the transport of its listener,
// its connections, and the application they run (pub/sub, echo or broadcast), wired together.
// Other threads reach it only through its inboxes (the hub's events, finished upgrades) and
// request_drain().

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "pool/buffer_pool.hpp"
#include "pool/task_pool.hpp"
#include "proto/jwt.hpp"
#include "server/app/config.hpp"
#include "server/base/revocation_list.hpp"
#include "server/conn/app.hpp"
#include "server/conn/connections.hpp"
#include "server/conn/static_site.hpp"
#include "server/conn/upgrade_runner.hpp"
#include "server/net/tls_context.hpp"
#include "server/net/transport_tcp.hpp"
#include "server/net/transport_tls.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/namespaces.hpp"
#include "server/pubsub/presence.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server {
namespace pubsub {
class session;
}

/// What the shards of a process share.
struct shard_shared {
  const config& cfg;
  pool::task_pool& tasks;
  pool::buffer_pool& buffers;
  const proto::jwt_verifier* tokens;  // null with --auth=none
  pubsub::hub* hub;                   // null in echo mode
  const static_site* site;            // the demo page and the client; null: none served
  const tls_server* tls = nullptr;     // the public listener's TLS; null: plain TCP
  pubsub::bus_port* bus = nullptr;     // the Redis bus; null: the embedded one (the hub)
  compression* deflate = nullptr;      // permessage-deflate; null: never negotiated
  std::atomic<std::uint32_t> open_connections{0};  // --max-connections spans the shards
  std::atomic<std::uint32_t> max_connections{0};   // --max-connections as it is now (0: none; SIGHUP)
  rate_gate upgrade_gate{};                          // --upgrade-rate spans the shards too (SIGHUP)
  user_table* users = nullptr;  // with tokens: who is connected (--max-connections-per-user)
  pubsub::presence_table* presence = nullptr;  // null: no topic keeps presence (nor join/leave)
  revocation_list* revoked = nullptr;  // with tokens: the users revoked lately (POST /disconnect)
};

class shard {
 public:
  /// Start-up (main thread): the loop and the application; the shard's event port exists from
  /// here on (hub::attach may take it).
  shard(shard_shared& s, int index, int listen_fd);
  ~shard();
  shard(const shard&) = delete;
  shard& operator=(const shard&) = delete;

  /// On the shard's own thread: the io backend (io_uring rings belong to the thread that made
  /// them), the transport and the connections. False (with `why`) when no backend starts.
  bool start(std::string& why, bool& fell_back) noexcept;
  /// On the shard's thread, after start(): runs until a drain has closed every connection.
  void run() noexcept { _loop.run(*_conns); }
  /// Any thread.
  void request_drain() noexcept { _loop.request_drain(); }
  const char* backend_name() const noexcept { return _loop.backend_name(); }

  pubsub::event_port* port() noexcept { return _fanout.get(); }
  const loop_counters& loop_stats() const noexcept { return _loop.counters(); }
  /// Valid after start().
  const conn_counters& conn_stats() const noexcept { return _conns->counters(); }
  /// Null in echo mode.
  const pubsub::pubsub_counters* pubsub_stats() const noexcept { return _fanout ? &_fanout->counters() : nullptr; }
  const tls_counters& tls_stats() const noexcept { return _tls_counts; }
  /// --client-message-rate and --client-message-burst from now on (SIGHUP); any thread.
  void set_client_message_rate(double per_second, std::uint32_t burst) noexcept;

 private:
  shard_shared& _s;
  int _listen_fd;
  loop _loop;
  std::unique_ptr<pubsub::fanout> _fanout;
  std::unique_ptr<application> _app;
  pubsub::session* _session = nullptr;  // _app in pubsub mode
  tls_counters _tls_counts;
  std::unique_ptr<transport> _transport;  // tcp_transport, or tls_transport with --tls-cert
  std::unique_ptr<connections> _conns;
  std::unique_ptr<pool_upgrade_runner> _upgrades;
};

}  // namespace wspush::server
