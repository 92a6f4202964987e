#include "server/app/shard.hpp"

#include "server/conn/echo_app.hpp"
#include "server/pubsub/broadcast_app.hpp"
#include "server/pubsub/session.hpp"

namespace wspush::server {
namespace {

/// Events a shard's inbox holds before the hub refuses publishes (hub.hpp): a few seconds of
/// a heavy publisher, and at most one 48-byte cell each.
constexpr std::size_t event_inbox_capacity = 1 << 16;

}  // namespace

shard::shard(shard_shared& s, int index, int listen_fd) : _s(s), _listen_fd(listen_fd), _loop(s.cfg.loop) {
  const config& cfg = s.cfg;
  if (cfg.mode == app_mode::echo) {
    _app = std::make_unique<echo_app>(s.deflate);
    return;
  }
  pubsub::registry_options ro{cfg.session.max_topics_per_connection, std::uint32_t(proto::max_topic_bytes), 0};
  _fanout = std::make_unique<pubsub::fanout>(_loop, event_inbox_capacity, s.hub->events().part_count(), ro);
  if (cfg.mode == app_mode::broadcast)
    _app = std::make_unique<pubsub::broadcast_app>(*s.hub, *_fanout);
  else {
    auto session = std::make_unique<pubsub::session>(cfg.session, s.tokens, *s.hub, *_fanout,
                                                     cfg.conn.max_message_bytes, index == 0, s.users);
    if (s.bus) session->use_bus(*s.bus, std::uint32_t(index), cfg.conn.max_pending_bytes);
    if (s.presence) session->use_presence(*s.presence);
    session->use_revocations(s.revoked);
    _session = session.get();
    _app = std::move(session);
  }
}

shard::~shard() {
  // The connections go before the application they call; the inboxes (the fanout's, the
  // upgrades') before the loop they are registered with.
  _conns.reset();
  _upgrades.reset();
  _app.reset();
  _fanout.reset();
}

bool shard::start(std::string& why, bool& fell_back) noexcept {
  if (!_loop.start(_s.cfg.io == io_kind::uring, _listen_fd, why, fell_back)) return false;
  // A session on the Redis bus holds a connection while Redis answers it (conn_ops::hold):
  // what the client sends meanwhile must wait in the kernel, and TCP slow the client.
  if (_s.bus && _s.cfg.mode == app_mode::pubsub) _loop.io().bound_read_ahead();
  try {
    if (_s.tls)
      _transport = std::make_unique<tls_transport>(_loop.io(), *_s.tls, _s.buffers, _tls_counts);
    else
      _transport = std::make_unique<tcp_transport>(_loop.io());
    _conns = std::make_unique<connections>(_s.cfg.conn, _loop, *_transport, *_app, _s.buffers, _s.open_connections);
    _upgrades = std::make_unique<pool_upgrade_runner>(_loop, _s.tasks, _s.tokens, *_conns, _s.users);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
  _upgrades->set_revocations(_s.revoked);
  _conns->set_upgrade_runner(*_upgrades);
  if (_s.site) _conns->set_static_site(*_s.site);
  if (_s.deflate) _conns->set_compression(*_s.deflate);
  _conns->set_upgrade_gate(_s.upgrade_gate);  // even without a rate: SIGHUP may give one
  _conns->set_connection_limit(_s.max_connections);
  return true;
}

void shard::set_client_message_rate(double per_second, std::uint32_t burst) noexcept {
  if (_session) _session->set_client_message_rate(per_second, burst);
}

}  // namespace wspush::server
