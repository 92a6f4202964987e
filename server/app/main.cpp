// wspush: start-up, the shard threads, and shutdown on SIGTERM/SIGINT.

#include <csignal>
#include <cstdio>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#ifdef WSPUSH_MIMALLOC
#include <mimalloc.h>
#endif

#include "pool/buffer_pool.hpp"
#include "pool/task_pool.hpp"
#include "server/admin/admin_server.hpp"
#include "server/app/config.hpp"
#include "server/app/hub_sink.hpp"
#include "server/app/metrics_wiring.hpp"
#include "server/app/revoker.hpp"
#include "server/app/shard.hpp"
#include "server/base/log.hpp"
#include "server/bus/redis_bus.hpp"
#include "server/pubsub/namespaces.hpp"
#include "server/net/socket_ops.hpp"
#include "server/net/tls_context.hpp"
#include "server/web/site.hpp"

using namespace wspush::server;

namespace {

struct shard_start {
  bool ok = false;
  bool fell_back = false;
  std::string why;
};

/// One listening socket per shard. Without --reuseport every shard accepts from the same
/// socket; with it each has its own SO_REUSEPORT socket (the kernel spreads connections)
/// and other processes that also ask for it may share the port.
std::vector<int> open_listeners(const config& cfg) {
  endpoint ep = parse_endpoint(cfg.listen);
  std::vector<int> fds{make_listener(ep, 4096, cfg.reuseport)};
  ep = parse_endpoint(local_name(fds[0]));  // port 0: the others take the port it got
  for (unsigned k = 1; k < cfg.threads; ++k) fds.push_back(cfg.reuseport ? make_listener(ep, 4096, true) : fds[0]);
  return fds;
}

void log_startup(const config& cfg, const nofile_limits& nf) {
  log(log_level::info, "open files limit: soft %llu -> %llu (hard %llu)%s", (unsigned long long)nf.soft_before,
      (unsigned long long)nf.soft_after, (unsigned long long)nf.hard,
      nf.soft_after < 1024 * 64 ? "; each connection needs one: raise the hard limit (ulimit -Hn) for more" : "");
#ifdef WSPUSH_MIMALLOC
  log(log_level::info, "allocator: mimalloc %d", mi_version());
#endif
  if (cfg.auth_none)
    log(log_level::warn, "auth: NONE (--auth=none): anyone who can reach the port may connect without a token%s",
        cfg.mode != app_mode::pubsub ? ""
        : cfg.session.allow_client_publish ? " and subscribe to ANY topic and PUBLISH to any topic (--allow-client-publish)"
                                   : " and subscribe to ANY topic (clients cannot publish)");
  else
    log(log_level::info, "auth: HS256 tokens (?token= or cookie wspush_token)");
}

/// What SIGHUP changes at run time (config.hpp's is_reloadable): where each option lives.
struct reload_targets {
  config running;  // what is in effect: the start's, with the reloaded options taken in
  admin_server* admin = nullptr;
  shard_shared* shared = nullptr;
  std::vector<shard*> shards;
};

/// Sets the reloadable options of `c` where they take effect.
void apply_reloadable(const config& c, reload_targets& t) {
  set_log_level(c.logging);
  if (t.admin) t.admin->set_api_key(c.api_key);
  if (t.shared) {
    t.shared->max_connections.store(c.conn.max_connections, std::memory_order_relaxed);
    t.shared->upgrade_gate.configure(c.conn.upgrade_rate, c.conn.upgrade_rate);
  }
  for (shard* s : t.shards) s->set_client_message_rate(c.session.client_message_rate, c.session.client_message_burst);
}

/// SIGHUP: reads the --config file again, over the same command line and environment. The
/// reloadable options take their new values at once; each other option that changed is logged
/// as needing a restart. A file that does not parse changes nothing.
void reread_config(reload_targets& t, int argc, char** argv) {
  try {
    const config next = parse_config(argc, argv);
    const std::vector<config_change> changes = config_changes(t.running, next);
    if (!t.running.api_key.empty() && next.api_key.empty())
      log(log_level::warn, "SIGHUP: the API key is gone: /publish, /disconnect and /presence now answer anyone "
                           "who reaches the admin listener (%s)", next.admin_listen.c_str());
    apply_reloadable(next, t);
    take_reloadable(t.running, next);
    for (const config_change& c : changes)
      log(c.in_effect ? log_level::info : log_level::warn, "SIGHUP: %s", c.line.c_str());
    if (changes.empty()) log(log_level::info, "SIGHUP: %s read again: no option changed", t.running.config_file.c_str());
  } catch (const std::exception& e) {
    log(log_level::error, "SIGHUP: configuration NOT reloaded, the running one stays: %s", e.what());
  }
}

/// Waits for SIGTERM or SIGINT; a SIGHUP meanwhile reads the --config file again and reloads the
/// TLS certificate (from the running paths, whatever the file says).
int wait_for_signal(reload_targets& reload, int argc, char** argv, wspush::server::tls_server* tls) {
  const config& cfg = reload.running;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  for (;;) {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig != SIGHUP) return sig;
    if (!cfg.config_file.empty()) reread_config(reload, argc, argv);
    if (!tls) {
      if (cfg.config_file.empty()) log(log_level::info, "SIGHUP: nothing to reload (no --config, no --tls-cert)");
      continue;
    }
    std::string why;
    if (tls->reload(why))
      log(log_level::info, "SIGHUP: TLS certificate reloaded (%s); new handshakes use it, open connections continue",
          tls->current()->description().c_str());
    else
      log(log_level::error, "SIGHUP: TLS certificate NOT reloaded, the old one stays in use: %s", why.c_str());
  }
}

/// Whether the TLS transports hand each connection's transmit side to the kernel (--kernel-tls),
/// and the log line that says so.
bool kernel_tx_wanted(const config& cfg, std::string& line) {
  if (cfg.kernel_tls == kernel_tls_mode::off) {
    line = "kernel TLS: off (--kernel-tls=off): records are encrypted in user space";
    return false;
  }
  std::string why;
  if (wspush::server::kernel_tls_available(why)) {
    line = "kernel TLS: offered, transmit handed to the kernel after each handshake (receiving stays in user space)";
    return true;
  }
  if (cfg.kernel_tls == kernel_tls_mode::on) {
    line = "kernel TLS: not listed by the kernel (" + why + "); --kernel-tls=on tries the handoff after each "
           "handshake anyway, and a connection the kernel refuses stays in user space";
    return true;
  }
  line = "kernel TLS: not offered (" + why + "): records are encrypted in user space";
  return false;
}

/// The public listener's TLS, if asked for; exits with a message when the files are unusable.
std::unique_ptr<wspush::server::tls_server> make_tls(const config& cfg) {
  if (cfg.tls_cert.empty()) return nullptr;
  std::string kernel_line;
  const bool kernel_tx = kernel_tx_wanted(cfg, kernel_line);
  std::unique_ptr<wspush::server::tls_server> tls;
  try {
    tls = std::make_unique<wspush::server::tls_server>(wspush::server::tls_files{cfg.tls_cert, cfg.tls_key},
                                                       kernel_tx);
  } catch (const std::exception& e) {
    log(log_level::error, "%s", e.what());
    std::_Exit(2);
  }
  log(log_level::info, "TLS: %s (TLS 1.2-1.3, ALPN http/1.1, session tickets; SIGHUP reloads)",
      tls->current()->description().c_str());
  log(log_level::info, "%s", kernel_line.c_str());
  return tls;
}

/// Starts one thread per shard; each sets up its own backend (io_uring rings belong to the
/// thread that made them) and runs. Exits the process if any backend could not start.
std::vector<shard_start> start_shards(std::vector<std::unique_ptr<shard>>& shards, std::vector<std::thread>& threads) {
  std::vector<shard_start> starts(shards.size());
  std::latch ready(std::ptrdiff_t(shards.size()));
  for (std::size_t k = 0; k < shards.size(); ++k) {
    threads.emplace_back([&, k] {
      starts[k].ok = shards[k]->start(starts[k].why, starts[k].fell_back);
      shard_start mine = starts[k];
      ready.count_down();  // `starts` and `ready` may be gone after this
      if (mine.ok) shards[k]->run();
    });
  }
  ready.wait();
  for (auto& st : starts) {
    if (!st.ok) {
      log(log_level::error, "cannot start the io backend: %s", st.why.c_str());
      std::_Exit(1);
    }
  }
  return starts;
}

admin_options admin_options_of(const config& cfg) {
  admin_options o;
  o.listen = cfg.admin_listen;
  o.api_key = cfg.api_key;
  o.max_body_bytes = cfg.max_body_bytes;
  return o;
}

/// One line per namespace of the config file: what its topics get.
void log_namespaces(const config& cfg, const wspush::server::pubsub::namespaces& spaces) {
  if (cfg.mode != app_mode::pubsub) return;
  for (const topic_namespace& n : spaces.list()) {
    const topic_options& t = n.options;
    log(log_level::info, "namespace \"%s\" (%s): history %u events, %gs; presence %s, join/leave %s, client publish %s, "
        "compression %s", n.prefix.c_str(), n.where.c_str(), t.history_size, t.history_ttl, t.presence ? "on" : "off",
        t.join_leave ? "on" : "off", t.client_publish ? (cfg.auth_none ? "on" : "by token") : "off",
        t.compression ? "on" : "off");
    if (cfg.auth_none && t.client_publish && !cfg.session.allow_client_publish)
      log(log_level::warn, "auth: NONE, and namespace \"%s\" lets anyone PUBLISH to its topics (client-publish = true)",
          n.prefix.c_str());
  }
}

std::unique_ptr<wspush::server::pubsub::hub> make_hub(const config& cfg, wspush::pool::buffer_pool& buffers,
                                                      const wspush::server::pubsub::namespaces& spaces) {
  if (cfg.mode == app_mode::echo) return nullptr;
  wspush::server::pubsub::history_options ho;
  ho.spaces = &spaces;
  ho.size_per_topic = cfg.history_size;
  ho.ttl_ns = std::uint64_t(cfg.history_ttl * 1e9);
  ho.max_bytes = cfg.history_max_bytes;
  ho.idempotency_window_ns = std::uint64_t(cfg.idempotency_window * 1e9);
  auto h = std::make_unique<wspush::server::pubsub::hub>(ho, buffers);
  if (cfg.mode == app_mode::pubsub && cfg.bus.empty())
    log(log_level::info, "history: %u events per topic, %gs, at most %llu bytes in all (epoch %.*s)", cfg.history_size,
        cfg.history_ttl, (unsigned long long)cfg.history_max_bytes, int(h->events().epoch().size()),
        h->events().epoch().data());
  return h;
}

/// --bus=redis://...: the Redis bus (it connects, and keeps reconnecting, on its own thread).
std::unique_ptr<wspush::server::bus::redis_bus> make_bus(const config& cfg, wspush::pool::buffer_pool& buffers,
                                                          const wspush::server::pubsub::namespaces& spaces) {
  if (cfg.bus.empty()) return nullptr;
  wspush::server::bus::redis_bus_options o;
  const auto spec = wspush::server::bus::parse_bus_spec(cfg.bus);  // checked by parse_config
  o.targets = spec.targets;
  for (auto& t : o.targets)
    if (t.password.empty()) t.password = cfg.redis_password;  // --redis-password-file (none: empty)
  o.cluster = spec.kind == wspush::server::bus::bus_spec::cluster;
  o.sentinels = spec.sentinels;
  o.master_name = spec.master_name;
  // rediss://: the certificates are read now; a file that will not load stops the start.
  if (spec.any_tls())
    o.tls = std::make_shared<const wspush::server::tls_client_context>(
        wspush::server::tls_client_files{cfg.redis_tls.ca, cfg.redis_tls.cert, cfg.redis_tls.key});
  o.history_size = cfg.history_size;
  o.history_ttl = cfg.history_ttl;
  o.spaces = &spaces;
  // The largest event data either way in: an admin body, a client's message (each holds it).
  o.max_event_bytes = std::max<std::size_t>(cfg.max_body_bytes, cfg.conn.max_message_bytes);
  o.redis_timeout = cfg.redis_timeout;
  o.wait_replicas = cfg.redis_wait_replicas;
  o.wait_ms = cfg.redis_wait_ms;
  o.idempotency_window = cfg.idempotency_window;
  o.presence_ttl_ms = std::uint32_t(cfg.presence_ttl * 1000);
  o.revocation_ttl = cfg.revocation_ttl;
  o.max_revocations = cfg.max_revocations;
  std::string where;
  for (const auto& t : o.targets) where += (where.empty() ? "" : ", ") + t.describe();
  if (!o.master_name.empty()) {
    where = "master '" + o.master_name + "' as Sentinels ";
    for (std::size_t k = 0; k < o.sentinels.size(); ++k) where += (k ? ", " : "") + o.sentinels[k].host + ':' + std::to_string(o.sentinels[k].port);
    where += " name it";
  }
  log(log_level::info, "bus: Redis at %s%s; history in its streams: %u events per topic, %gs; events up to %zu bytes",
      where.c_str(), o.cluster ? " (Redis Cluster seeds)" : o.targets.size() > 1 ? " (isolated shards: each topic on one)" : "", cfg.history_size,
      cfg.history_ttl, o.max_event_bytes);
  return std::make_unique<wspush::server::bus::redis_bus>(o, buffers);
}

/// GET /presence on the Redis bus: the topic's hash in Redis, across the nodes (the admin thread
/// waits for it, at most --redis-timeout).
std::uint16_t render_bus_presence(wspush::server::bus::redis_bus& bus, const wspush::server::pubsub::namespaces& spaces,
                                  double timeout, std::string_view topic, bool count_only, std::string& body) {
  if (!spaces.of(topic).presence) {
    body = R"({"error":"not_enabled","reason":"the topic's namespace keeps no presence"})";
    return 404;
  }
  const auto a = bus.presence_wait(topic, count_only, std::chrono::milliseconds(std::int64_t(timeout * 1000)));
  if (!a.ok) {
    body = R"({"error":"unavailable","reason":"Redis did not answer"})";
    return 503;
  }
  std::vector<wspush::proto::presence_user> users;
  users.reserve(a.users.size());
  for (const auto& [user, n] : a.users) users.push_back({user, n});
  wspush::server::pubsub::render_presence_body(topic, count_only, users, a.user_count, a.connections, body);
  return 200;
}

int run(const config& cfg, int argc, char** argv) {
  nofile_limits nf = raise_nofile_limit();
  log_startup(cfg, nf);
  std::vector<int> listeners = open_listeners(cfg);

  wspush::pool::task_pool_options po;
  po.initial_workers = cfg.pool_workers;
  po.max_workers = cfg.pool_max_workers;
  po.queue_capacity = cfg.pool_queue;
  wspush::pool::task_pool tasks(po);
  wspush::pool::buffer_pool buffers;
  std::optional<wspush::proto::jwt_verifier> tokens;
  if (!cfg.auth_none) tokens.emplace(cfg.jwt_secret);
  // Options per kind of topic: read-only from here on, by the history, the hub, the sessions
  // (through the hub) and the Redis bus.
  const wspush::server::pubsub::namespaces spaces(cfg.topics, cfg.namespaces);
  log_namespaces(cfg, spaces);
  std::unique_ptr<wspush::server::pubsub::hub> hub = make_hub(cfg, buffers, spaces);
  std::unique_ptr<wspush::server::bus::redis_bus> bus = make_bus(cfg, buffers, spaces);
  const wspush::server::web::site site;
  std::unique_ptr<wspush::server::tls_server> tls = make_tls(cfg);
  // Compressed once per event, for every connection that negotiated it, whichever bus.
  wspush::server::compression deflate(cfg.conn.compression, cfg.conn.compression_min_bytes);
  if (hub) hub->set_compression(deflate);
  if (bus) bus->set_compression(deflate);
  shard_shared shared{cfg, tasks, buffers, tokens ? &*tokens : nullptr, hub.get(), &site, tls.get(), bus.get(), &deflate};
  shared.upgrade_gate.configure(cfg.conn.upgrade_rate, cfg.conn.upgrade_rate);
  shared.max_connections.store(cfg.conn.max_connections, std::memory_order_relaxed);
  user_table users(cfg.conn.max_connections_per_user);  // outlives the shards (they join and leave it)
  if (tokens && cfg.mode == app_mode::pubsub) shared.users = &users;  // the session leaves them
  std::optional<wspush::server::pubsub::presence_table> presence;
  if (cfg.mode == app_mode::pubsub && spaces.any_presence()) {
    presence.emplace();
    shared.presence = &*presence;
    if (bus) bus->set_presence(*presence, users);  // said to Redis, again and again (redis_bus_presence.cpp)
  }
  revocation_list revocations(cfg.revocation_ttl, cfg.max_revocations);
  if (tokens && cfg.mode == app_mode::pubsub && revocations.enabled()) shared.revoked = &revocations;
  std::vector<std::unique_ptr<shard>> shards;
  std::vector<shard*> shard_ptrs;
  std::vector<wspush::server::pubsub::event_port*> ports;
  for (unsigned k = 0; k < cfg.threads; ++k) {
    shards.push_back(std::make_unique<shard>(shared, int(k), listeners[k]));
    shard_ptrs.push_back(shards.back().get());
    if (shards.back()->port()) ports.push_back(shards.back()->port());
  }
  if (hub) hub->attach(ports);
  std::optional<revoker> revokes;  // POST /disconnect
  if (cfg.mode == app_mode::pubsub) revokes.emplace(revocations, shared.users, ports, bus.get());
  if (bus) {
    bus->attach(ports);
    if (revokes) bus->set_revoke_handler([&r = *revokes](std::string_view sub, std::int64_t at, bool loaded) {
      r.heard(sub, at, loaded);
    });
    std::string why;
    if (!bus->start(why)) {
      log(log_level::error, "cannot start the bus: %s", why.c_str());
      return 1;
    }
  }

  std::vector<std::thread> threads;
  std::vector<shard_start> starts = start_shards(shards, threads);
  if (starts[0].fell_back) log(log_level::info, "io backend: epoll (fallback: %s)", starts[0].why.c_str());
  else log(log_level::info, "io backend: %s", shards[0]->backend_name());
  metrics_registry metrics;
  register_process_metrics(metrics, shard_ptrs, tasks);
  register_compression_metrics(metrics, shard_ptrs, deflate);
  if (tls) register_tls_metrics(metrics, shard_ptrs);
  no_pubsub_sink no_sink;
  std::optional<hub_sink> sink;
  std::optional<bus_sink> redis_sink;
  if (hub && cfg.mode == app_mode::pubsub) {
    register_pubsub_metrics(metrics, shard_ptrs, *hub);
    if (bus) {
      register_bus_metrics(metrics, *bus, shard_ptrs);
      redis_sink.emplace(*bus);
    } else {
      sink.emplace(*hub);
    }
  }
  publish_sink& admin_sink = redis_sink ? static_cast<publish_sink&>(*redis_sink)
                             : sink     ? static_cast<publish_sink&>(*sink)
                                        : static_cast<publish_sink&>(no_sink);
  admin_options ao = admin_options_of(cfg);
  if (presence)
    ao.presence = [&](std::string_view topic, bool count_only, std::string& body) {
      if (bus) return render_bus_presence(*bus, spaces, cfg.redis_timeout, topic, count_only, body);
      return wspush::server::pubsub::render_presence(*presence, spaces, shared.users, topic, count_only, body);
    };
  if (revokes) register_revoke_metrics(metrics, revocations);
  if (presence) register_presence_metrics(metrics, shard_ptrs, *presence, bus.get());
  if (revokes) ao.revoker = &*revokes;
  admin_server admin(ao, admin_sink, &metrics);
  try {
    admin.start();
  } catch (const std::exception& e) {
    // The shards run already: they stop (nobody is connected yet) before the process says why.
    log(log_level::error, "cannot start the admin listener on %s: %s", cfg.admin_listen.c_str(), e.what());
    for (auto& s : shards) s->request_drain();
    for (auto& t : threads) t.join();
    if (bus) bus->stop();
    tasks.shutdown(wspush::pool::shutdown_mode::soft_timeout);
    return 1;
  }
  log(log_level::info, "admin API at %s (/healthz, /readyz, /metrics)", admin.local_address().c_str());
  log(log_level::info, "listening on %s (%s, mode=%s, threads=%u)", local_name(listeners[0]).c_str(),
      tls ? "TLS: wss:// and https://" : "plain: ws:// and http://", mode_name(cfg.mode), cfg.threads);

  reload_targets reload{cfg, &admin, &shared, shard_ptrs};
  int sig = wait_for_signal(reload, argc, argv, tls.get());
  // /readyz says 503 from now on (before the log line: whoever reads the log may ask at once);
  // the admin listener keeps answering.
  admin.set_draining(true);
  log(log_level::info, "%s: closing connections with 1001 over %gs and shutting down",
      sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg.loop.drain_seconds);
  for (auto& s : shards) s->request_drain();
  // A shard that has drained stops; the hub's ports never wait on it (publishes to it are
  // dropped and counted), so the admin listener keeps answering until every shard is done.
  for (auto& t : threads) t.join();
  if (bus) bus->stop();
  admin.stop();
  tasks.shutdown(wspush::pool::shutdown_mode::soft_timeout);
  std::uint64_t accepted = 0;
  for (auto& s : shards) accepted += s->conn_stats().accepted.get();
  for (std::size_t k = 0; k < listeners.size(); ++k)
    if (k == 0 || listeners[k] != listeners[0]) ::close(listeners[k]);
  log(log_level::info, "stopped (%llu connection%s accepted)", (unsigned long long)accepted,
      accepted == 1 ? "" : "s");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  try {
    cfg = parse_config(argc, argv);
  } catch (const config_error& e) {
    std::fprintf(stderr, "wspush: error: %s\n", e.what());
    return 2;
  }
  set_log_level(cfg.logging);
  if (cfg.show_help) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  // Signals are taken by sigwait in main; every thread started from here inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return run(cfg, argc, argv);
  } catch (const std::exception& e) {  // start-up: an address taken, a thread that would not start
    log(log_level::error, "%s", e.what());
    return 1;
  }
}
