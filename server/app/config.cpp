#include "server/app/config.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <thread>
#include <vector>

#include <toml++/toml.h>

#include "proto/topic.hpp"
#include "server/bus/redis_url.hpp"

namespace wspush::server {
namespace {

struct option {
  std::string_view name;
  std::string_view value_hint;  // empty: a flag without value
  std::string_view help;
  std::function<std::string(const config&)> show;  // default, for --help
  std::function<void(config&, std::string_view)> set;
  bool secret = false;  // its value is never logged (SIGHUP compares it as given)
};

std::string read_secret_file(const std::string& path, std::string_view flag = "--jwt-secret-file") {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(std::string(flag) + ": cannot read '" + path + "'");
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) throw config_error(std::string(flag) + ": '" + path + "' is empty");
  return secret;
}

[[noreturn]] void bad(std::string_view name, std::string_view value, std::string_view want) {
  throw config_error("--" + std::string(name) + ": '" + std::string(value) + "' is not " + std::string(want));
}

template <class T>
T parse_uint(std::string_view name, std::string_view v, T min, T max) {
  T out{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size() || out < min || out > max)
    bad(name, v, "a whole number in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return out;
}

double parse_seconds(std::string_view name, std::string_view v) {
  std::string s(v);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(d > 0) || d > 86400) bad(name, v, "a number of seconds in (0, 86400]");
  return d;
}

/// The one of `all` whose name (`name_of`, what --help shows) is `v`; else `want` in the error.
template <class E, std::size_t N>
E parse_choice(std::string_view name, std::string_view v, const E (&all)[N], const char* (*name_of)(E),
               std::string_view want) {
  for (E e : all)
    if (v == name_of(e)) return e;
  bad(name, v, want);
}

const char* io_name(io_kind k) noexcept { return k == io_kind::uring ? "uring" : "epoll"; }

bool parse_bool(std::string_view name, std::string_view v) {
  if (v == "" || v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad(name, v, "a boolean (true/false)");
}

std::string fmt_seconds(double d) {
  std::string s = std::to_string(d);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// NAME is the option as the user spells it (for messages), FIELD the config member it sets.
#define U32(name, field, min, max) \
  [](const config& c) { return std::to_string(c.field); }, [](config& c, std::string_view v) { \
    c.field = parse_uint<std::uint32_t>(name, v, min, max); }
#define SWITCH(name, field) \
  [](const config& c) { return std::string(c.field ? "true" : "false"); }, [](config& c, std::string_view v) { \
    c.field = parse_bool(name, v); }
#define SECS(name, field) \
  [](const config& c) { return fmt_seconds(c.field); }, [](config& c, std::string_view v) { \
    c.field = parse_seconds(name, v); }

constexpr std::uint32_t max_history_size = 1'000'000;

const std::vector<option>& options() {
  static const std::vector<option> opts = {
      {"listen", "ADDR:PORT", "public WebSocket listener (port 0: any free port)",
       [](const config& c) { return c.listen; }, [](config& c, std::string_view v) { c.listen = v; }},
      {"ws-path", "PATH", "the path WebSocket clients connect to (ws://host/PATH); any other path gets 404",
       [](const config& c) { return c.conn.ws_path; },
       [](config& c, std::string_view v) {
         if (v.empty() || v.front() != '/' || v.find_first_of("?# \t") != std::string_view::npos)
           bad("ws-path", v, "a path starting with / (no query)");
         c.conn.ws_path = v;
       }},
      {"sse-path", "PATH|off",
       "the path event streams are opened on (GET PATH?topics=a,b: Server-Sent Events for clients that cannot "
       "use WebSocket; --mode=pubsub only); off: none",
       [](const config& c) { return c.conn.sse_path.empty() ? std::string("off") : c.conn.sse_path; },
       [](config& c, std::string_view v) {
         if (v == "off") return c.conn.sse_path.clear();
         if (v.empty() || v.front() != '/' || v.find_first_of("?# \t") != std::string_view::npos)
           bad("sse-path", v, "a path starting with / (no query), or off");
         c.conn.sse_path = v;
       }},
      {"tls-cert", "FILE", "PEM certificate (then its chain) for TLS on the public listener: wss:// and https:// (with --tls-key; reloaded on SIGHUP)",
       [](const config& c) { return c.tls_cert.empty() ? std::string("(unset: plain ws://)") : c.tls_cert; },
       [](config& c, std::string_view v) { c.tls_cert = v; }},
      {"tls-key", "FILE", "PEM private key of --tls-cert",
       [](const config& c) { return c.tls_key.empty() ? std::string("(unset)") : c.tls_key; },
       [](config& c, std::string_view v) { c.tls_key = v; }},
      {"kernel-tls", "auto|on|off",
       "with --tls-cert, hand each connection's record encryption (sending) to the kernel after its handshake: "
       "auto where the kernel lists the tls module, on tries even where it does not (a connection the kernel "
       "refuses stays in user space), off never",
       [](const config& c) { return std::string(kernel_tls_name(c.kernel_tls)); },
       [](config& c, std::string_view v) {
         using enum kernel_tls_mode;
         c.kernel_tls = parse_choice("kernel-tls", v, {automatic, on, off}, kernel_tls_name, "auto, on or off");
       }},
      {"admin-listen", "ADDR:PORT", "admin listener: /publish, /publish/batch, /metrics, /healthz, /readyz",
       [](const config& c) { return c.admin_listen; }, [](config& c, std::string_view v) { c.admin_listen = v; }},
      {"api-key", "KEY", "bearer key the admin publish endpoints require (/metrics and health checks need none)",
       [](const config&) { return std::string("(unset)"); }, [](config& c, std::string_view v) { c.api_key = v; }, true},
      {"max-body-bytes", "N", "largest admin request body; past it: HTTP 413", U32("max-body-bytes", max_body_bytes, 1024, 1u << 30)},
      {"mode", "pubsub|echo|broadcast",
       "pubsub: the topic protocol (sub/unsub/pub, publish API, history); echo: every message back to its "
       "sender; broadcast: every text message to all",
       [](const config& c) { return std::string(mode_name(c.mode)); },
       [](config& c, std::string_view v) {
         using enum app_mode;
         c.mode = parse_choice("mode", v, {pubsub, echo, broadcast}, mode_name, "pubsub, echo or broadcast");
       }},
      {"io", "uring|epoll", "I/O backend; uring falls back to epoll by itself when io_uring is unavailable",
       [](const config& c) { return std::string(io_name(c.io)); },
       [](config& c, std::string_view v) {
         c.io = parse_choice("io", v, {io_kind::uring, io_kind::epoll}, io_name, "uring or epoll");
       }},
      {"threads", "N", "reactor threads (shards); 0: one per core",
       [](const config& c) { return std::to_string(c.threads); },
       [](config& c, std::string_view v) { c.threads = parse_uint<unsigned>("threads", v, 0, 1024); }},
      {"auth", "none", "none: no token required: anyone may connect and subscribe to any topic (else a JWT secret is required)",
       [](const config& c) { return std::string(c.auth_none ? "none" : "(unset)"); },
       [](config& c, std::string_view v) {
         if (v != "none") bad("auth", v, "'none'");
         c.auth_none = true;
       }},
      {"jwt-secret", "SECRET", "HS256 secret that signs the clients' tokens (?token= or cookie wspush_token)",
       [](const config&) { return std::string("(unset)"); },
       [](config& c, std::string_view v) {
         if (v.empty()) throw config_error("--jwt-secret: the secret is empty");
         c.jwt_secret = v;
       },
       true},
      {"jwt-secret-file", "FILE", "read the HS256 secret from FILE (one trailing newline is ignored)",
       [](const config&) { return std::string("(unset)"); },
       [](config& c, std::string_view v) { c.jwt_secret = read_secret_file(std::string(v)); }, true},
      {"bus", "URL",
       "embedded (this process alone), or redis://[[user]:password@]host:port[/db]: nodes share publishes and "
       "history through Redis 7; several redis:// URLs, comma-separated, are isolated shards: each topic lives on "
       "one (docs/REDIS.md says which), in the order given; redis-cluster://[[user]:password@]host:port[,host:port...] "
       "is a Redis Cluster, by its seed nodes (sharded pub/sub); redis-sentinel://[[user]:password@]host:port"
       "[,host:port...]/MASTER_NAME is the master the Sentinels name, followed through failovers. rediss://, "
       "rediss-cluster://, rediss-sentinel://: over TLS",
       [](const config& c) { return c.bus.empty() ? std::string("embedded") : c.bus; },
       [](config& c, std::string_view v) {
         if (v == "embedded") {
           c.bus.clear();
           return;
         }
         try {
           bus::parse_bus_spec(v);
         } catch (const std::invalid_argument& e) {
           throw config_error(e.what());
         }
         c.bus = v;
       },
       true},  // a URL may hold a password
      {"redis-timeout", "SECONDS",
       "with --bus=redis://...: a command Redis has not answered within this marks the bus stalled "
       "(/readyz 503, wspush_bus_stalled 1); an idle link is pinged every second",
       SECS("redis-timeout", redis_timeout)},
      {"redis-password-file", "FILE",
       "with --bus=redis://...: the password of every Redis whose URL gives none (one trailing newline is "
       "ignored), so that it never stands in a process list; with redis://user@host, that ACL user's",
       [](const config& c) { return c.redis_password_file.empty() ? std::string("none") : c.redis_password_file; },
       [](config& c, std::string_view v) {
         c.redis_password_file = v;
         c.redis_password = read_secret_file(c.redis_password_file, "--redis-password-file");
       }},
      {"redis-tls-ca", "FILE",
       "with rediss://: the CA (PEM) that signed Redis's certificate; the system's store when not given. The "
       "certificate must name the URL's host",
       [](const config& c) { return c.redis_tls.ca.empty() ? std::string("system store") : c.redis_tls.ca; },
       [](config& c, std::string_view v) { c.redis_tls.ca = v; }},
      {"redis-tls-cert", "FILE", "with rediss://: a client certificate (PEM) for Redis with tls-auth-clients yes",
       [](const config& c) { return c.redis_tls.cert.empty() ? std::string("none") : c.redis_tls.cert; },
       [](config& c, std::string_view v) { c.redis_tls.cert = v; }},
      {"redis-tls-key", "FILE", "with --redis-tls-cert: its private key (PEM)",
       [](const config& c) { return c.redis_tls.key.empty() ? std::string("none") : c.redis_tls.key; },
       [](config& c, std::string_view v) { c.redis_tls.key = v; }},
      {"redis-wait-replicas", "N",
       "with --bus=redis://...: a publish is answered 200 only once N replicas of its Redis have it (WAIT after "
       "each batch), so that a failover to one of them keeps it; fewer within --redis-wait-ms: 504, published on "
       "the master only. 0: answered once the master has it",
       U32("redis-wait-replicas", redis_wait_replicas, 0, 64)},
      {"redis-wait-ms", "MS",
       "with --redis-wait-replicas: how long a batch of publishes waits for its replicas (the Redis link waits "
       "with it: under half of --redis-timeout)",
       U32("redis-wait-ms", redis_wait_ms, 1, 60'000)},
      {"reuseport", "", "let several wspush processes share the listening port (SO_REUSEPORT)",
       [](const config& c) { return std::string(c.reuseport ? "true" : "false"); },
       [](config& c, std::string_view v) { c.reuseport = parse_bool("reuseport", v); }},
      {"max-connections", "N", "WebSocket connections per process; past it upgrades get 503 (0: no limit)",
       U32("max-connections", conn.max_connections, 0, 100'000'000)},
      {"upgrade-rate", "R",
       "upgrades (and event streams) a second per process, in bursts of up to a second's worth; past it 503 with a "
       "Retry-After that spreads the refused over the time they need (0: no limit)",
       U32("upgrade-rate", conn.upgrade_rate, 0, 10'000'000)},
      {"max-connections-per-user", "N",
       "connections one user (the token's sub) may hold open on this process; past it upgrades get 429 with "
       "Retry-After (0: no limit; tokens only)",
       U32("max-connections-per-user", conn.max_connections_per_user, 0, 10'000'000)},
      {"client-message-rate", "R",
       "messages a second each client connection may send, in bursts of --client-message-burst; past it "
       "{\"op\":\"error\",\"code\":\"rate_limited\"}, and 16 past it without slowing down: close 1008 (0: no limit)",
       [](const config& c) { return fmt_seconds(c.session.client_message_rate); },
       [](config& c, std::string_view v) {  // 0 (its default): no limit
         c.session.client_message_rate = v == "0" ? 0 : parse_uint<std::uint32_t>("client-message-rate", v, 1, 1'000'000);
       }},
      {"client-message-burst", "N", "messages a client connection may send at once before --client-message-rate applies",
       U32("client-message-burst", session.client_message_burst, 1, 1'000'000)},
      {"max-connection-lifetime", "S",
       "close each connection with 1001 after this long, +-10% drawn per connection, so that clients spread over "
       "the nodes again after a scale-up (they resume with since and lose nothing; 0: never)",
       [](const config& c) { return fmt_seconds(c.conn.max_connection_lifetime); },
       [](config& c, std::string_view v) {  // 0 (its default): never
         c.conn.max_connection_lifetime = v == "0" ? 0 : parse_seconds("max-connection-lifetime", v);
       }},
      {"max-request-bytes", "N", "largest upgrade request; past it: HTTP 431", U32("max-request-bytes", conn.max_request_bytes, 256, 65536)},
      {"max-frame-bytes", "N", "largest frame payload; past it: close 1009", U32("max-frame-bytes", conn.max_frame_bytes, 125, 1u << 30)},
      {"max-message-bytes", "N", "largest message; past it: close 1009 (0: 64 KiB in pubsub mode, 16 MiB in the others)",
       U32("max-message-bytes", conn.max_message_bytes, 0, 1u << 30)},
      {"compression", "on|off",
       "permessage-deflate for clients that offer it (browsers do): an event of at least --compression-min-bytes "
       "is compressed once for all of them; their messages inflate within --max-message-bytes",
       [](const config& c) { return std::string(c.conn.compression ? "on" : "off"); },
       [](config& c, std::string_view v) { c.conn.compression = parse_bool("compression", v); }},
      {"compression-min-bytes", "N", "events whose payload is shorter than this go uncompressed to everyone (too small to gain)",
       U32("compression-min-bytes", conn.compression_min_bytes, 0, 1u << 30)},
      {"max-pending-bytes", "N", "output a connection leaves unread (what the kernel would not take); past it: close 1013 (slow consumer)",
       [](const config& c) { return std::to_string(c.conn.max_pending_bytes); },
       [](config& c, std::string_view v) {
         c.conn.max_pending_bytes = parse_uint<std::uint64_t>("max-pending-bytes", v, 4096, std::uint64_t(1) << 34);
       }},
      {"allow-client-publish", "", "with --auth=none, let clients publish (`pub`); with tokens their `pub` claim decides",
       [](const config& c) { return std::string(c.session.allow_client_publish ? "true" : "false"); },
       [](config& c, std::string_view v) { c.session.allow_client_publish = parse_bool("allow-client-publish", v); }},
      {"max-topics-per-connection", "N", "subscriptions one connection may hold; past it: error too_many_subscriptions",
       U32("max-topics-per-connection", session.max_topics_per_connection, 1, 100'000)},
      {"history-size", "N", "events kept per topic for resume (`since`); 0 keeps none",
       U32("history-size", history_size, 0, max_history_size)},
      {"history-ttl", "SECONDS", "events older than this leave the history", SECS("history-ttl", history_ttl)},
      {"presence", "", "who is subscribed to a topic can be asked (`presence`, GET /presence); a namespace of the "
       "--config file may say otherwise for its topics", SWITCH("presence", topics.presence)},
      {"join-leave", "", "a topic's subscribers hear a user's first subscribe and last leave (join/leave events; "
       "presence is kept for it); a namespace of the --config file may say otherwise for its topics",
       SWITCH("join-leave", topics.join_leave)},
      {"presence-ttl", "SECONDS",
       "with --bus=redis://...: a node's word on who is subscribed lasts this long in Redis, said again every third "
       "of it; a node that dies without a word drops out of every presence within this time",
       SECS("presence-ttl", presence_ttl)},
      {"idempotency-window", "SECONDS",
       "a publish (admin API, batch line, client pub) carrying an idempotency_key already published on its topic "
       "within this is not published again: it is answered with the first one's id. With --bus=redis://... the "
       "keys live in Redis (every node, and backends' FCALL, see the same; give every node the same window), at "
       "most 10000 per topic and window (past them a publish is not remembered); embedded, at most 131072 in the "
       "process (past them the oldest are forgotten)",
       SECS("idempotency-window", idempotency_window)},
      {"revocation-ttl", "SECONDS",
       "a user revoked with POST /disconnect is remembered this long: its tokens issued no later than the revoke "
       "(iat, or none) are refused at the upgrade (401) and in an in-band auth; with --bus=redis://... the list is "
       "kept in Redis for every node (0: no list, a revoke only closes connections)",
       U32("revocation-ttl", revocation_ttl, 0, 31'536'000)},
      {"max-revocations", "N", "revoked users remembered at most; past it the oldest revoke is forgotten first",
       U32("max-revocations", max_revocations, 1, 100'000'000)},
      {"history-max-bytes", "N", "memory cap of the whole history (its blocks and bookkeeping as held in the heap); past it the oldest events go first",
       [](const config& c) { return std::to_string(c.history_max_bytes); },
       [](config& c, std::string_view v) {
         c.history_max_bytes = parse_uint<std::uint64_t>("history-max-bytes", v, 65536, std::uint64_t(1) << 40);
       }},
      {"upgrade-timeout", "SECONDS", "time allowed to complete the HTTP upgrade", SECS("upgrade-timeout", conn.upgrade_timeout)},
      {"close-timeout", "SECONDS", "time the peer gets to answer our close frame", SECS("close-timeout", conn.close_timeout)},
      {"message-timeout", "SECONDS", "time allowed for a started frame or message to complete (else close 1008)",
       SECS("message-timeout", conn.message_timeout)},
      {"ping-interval", "SECONDS", "ping a connection that has sent nothing for this long", SECS("ping-interval", conn.ping_interval)},
      {"pong-timeout", "SECONDS", "close a pinged connection that sends nothing back within this", SECS("pong-timeout", conn.pong_timeout)},
      {"drain-seconds", "SECONDS", "on SIGTERM, spread the 1001 closes over this window (clients reconnect staggered)",
       SECS("drain-seconds", loop.drain_seconds)},
      {"log-level", "error|warn|info|debug", "the least severe lines written to stderr: debug adds a line per "
       "refused upgrade and per admin request",
       [](const config& c) { return std::string(log_level_name(c.logging)); },
       [](config& c, std::string_view v) {
         using enum log_level;
         c.logging = parse_choice("log-level", v, {error, warn, info, debug}, log_level_name,
                                  "error, warn, info or debug");
       }},
      {"pool-workers", "N", "task pool workers started at once", U32("pool-workers", pool_workers, 1, 1024)},
      {"pool-max-workers", "N", "task pool workers at most (0: cores)", U32("pool-max-workers", pool_max_workers, 0, 1024)},
      {"pool-queue", "N", "task pool queue bound; when full, accepting pauses", U32("pool-queue", pool_queue, 16, 1u << 20)},
  };
  return opts;
}

std::string env_name(std::string_view name) {
  std::string e = "WSPUSH_";
  for (char ch : name) e += ch == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(ch)));
  return e;
}

const option* find_option(std::string_view name) {
  for (const option& o : options())
    if (o.name == name) return &o;
  return nullptr;
}

// ---- the --config file ----

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// What the file may give an option follows its default (as --help shows it): a switch takes
// true or false; an on/off option a boolean or the word; a number an integer or a float, or a
// string (every value goes through the command line's checks, as its text); anything else a string.
enum class toml_kind : std::uint8_t { boolean, boolean_or_string, number, string };

toml_kind toml_kind_of(const option& o) {
  if (o.value_hint.empty()) return toml_kind::boolean;
  const std::string d = o.show(config{});
  if (d == "on" || d == "off") return toml_kind::boolean_or_string;
  double n;
  auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), n);
  return ec == std::errc{} && end == d.data() + d.size() ? toml_kind::number : toml_kind::string;
}

/// The value as the command line would spell it; config_error when its TOML type does not fit.
std::string toml_value_text(const option& o, const toml::node& v) {
  const toml_kind kind = toml_kind_of(o);
  if (const auto* b = v.as_boolean(); b && (kind == toml_kind::boolean || kind == toml_kind::boolean_or_string))
    return b->get() ? "true" : "false";
  if (const auto* s = v.as_string(); s && kind != toml_kind::boolean) return s->get();
  if (kind == toml_kind::number) {
    if (const auto* i = v.as_integer()) return std::to_string(i->get());
    if (const auto* f = v.as_floating_point()) {
      char buf[64];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f->get());
      return std::string(buf, end);
    }
  }
  const char* want = kind == toml_kind::boolean             ? "true or false"
                     : kind == toml_kind::boolean_or_string ? "true or false (or \"on\", \"off\")"
                     : kind == toml_kind::number            ? "a number"
                                                            : "a string (in quotes)";
  throw config_error(std::string("expected ") + want + ", got " + toml_type_name(v.type()));
}

std::string position(const std::string& path, const toml::source_position& at) {
  return path + ':' + std::to_string(at.line) + ':' + std::to_string(at.column);
}

/// An option's message (`--name: ...`, as the command line gets it) about the file's `name = `.
std::string about_key(std::string_view name, const std::string& what) {
  const std::string flag = "--" + std::string(name);
  if (what.starts_with(flag) && what.size() > flag.size() && (what[flag.size()] == ':' || what[flag.size()] == ' '))
    return what.substr(2);
  return std::string(name) + ": " + what;
}

std::string read_config_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw config_error("--config: cannot read '" + path + "': " + std::strerror(errno));
  std::string text;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;  // a directory opens, and fails here
  std::fclose(f);
  if (err) throw config_error("--config: cannot read '" + path + "': " + std::strerror(err));
  return text;
}

// ---- [namespace."<prefix>"] tables: options of the topics that start with the prefix ----

/// A key of a namespace table: the global option whose value it takes when the table does not
/// give it (whose TOML type and checks it has too), and where it goes.
struct namespace_key {
  std::string_view key;
  std::string_view option;
  void (*set)(topic_options&, std::string_view);
};

constexpr namespace_key namespace_keys[] = {
    {"history-size", "history-size",
     [](topic_options& t, std::string_view v) {
       t.history_size = parse_uint<std::uint32_t>("history-size", v, 0, max_history_size);
     }},
    {"history-ttl", "history-ttl", [](topic_options& t, std::string_view v) { t.history_ttl = parse_seconds("history-ttl", v); }},
    {"presence", "presence", [](topic_options& t, std::string_view v) { t.presence = parse_bool("presence", v); }},
    {"join-leave", "join-leave", [](topic_options& t, std::string_view v) { t.join_leave = parse_bool("join-leave", v); }},
    {"client-publish", "allow-client-publish",
     [](topic_options& t, std::string_view v) { t.client_publish = parse_bool("client-publish", v); }},
    {"compression", "compression", [](topic_options& t, std::string_view v) { t.compression = parse_bool("compression", v); }},
};

const namespace_key* find_namespace_key(std::string_view key) {
  for (const namespace_key& k : namespace_keys)
    if (k.key == key) return &k;
  return nullptr;
}

/// A table's entries in the file's order (a toml::table is in key order).
template <class Table>
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const Table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> keys;
  for (auto&& [k, v] : t) keys.emplace_back(&k, &v);
  std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) {
    const auto &x = a.first->source().begin, &y = b.first->source().begin;
    return x.line != y.line ? x.line < y.line : x.column < y.column;
  });
  return keys;
}

/// The `namespace` table of the file: one table per prefix, each key checked as the option it
/// stands for is (a value is kept as its text and applied once the global values are known).
void read_namespaces(config& c, const std::string& path, const toml::node& all) {
  const toml::table* tables = all.as_table();
  if (!tables)
    throw config_error(position(path, all.source().begin) + ": namespace: expected tables [namespace.\"<prefix>\"], got " +
                       toml_type_name(all.type()));
  for (const auto& [pk, pv] : in_file_order(*tables)) {
    const std::string prefix(pk->str());
    const std::string at = position(path, pk->source().begin);
    const std::string what = "namespace \"" + prefix + '"';
    if (prefix.empty())
      throw config_error(at + ": " + what + ": the prefix is empty (for every topic, set the options themselves)");
    if (prefix.size() > proto::max_topic_bytes || !proto::all_topic_bytes(prefix))
      throw config_error(at + ": " + what + ": not a topic prefix: 1-128 bytes of visible ASCII other than *, \" and \\ "
                         "(the topics' own rule)");
    for (const config::namespace_given& g : c.namespaces_given)
      if (g.prefix == prefix) throw config_error(at + ": " + what + ": given twice (first at " + g.where + ")");
    const toml::table* keys = pv->as_table();
    if (!keys)
      throw config_error(at + ": " + what + ": expected a table [namespace.\"" + prefix + "\"], got " +
                         toml_type_name(pv->type()));
    config::namespace_given given{prefix, path + ':' + std::to_string(pk->source().begin.line), {}};
    for (const auto& [k, v] : in_file_order(*keys)) {
      const std::string_view name = k->str();
      const namespace_key* nk = find_namespace_key(name);
      if (!nk) {
        std::string known;
        for (const namespace_key& x : namespace_keys) known += (known.empty() ? "" : ", ") + std::string(x.key);
        throw config_error(position(path, k->source().begin) + ": " + what + ": unknown key \"" + std::string(name) +
                           "\" (a namespace takes " + known + ")");
      }
      std::string value;
      try {
        value = toml_value_text(*find_option(nk->option), *v);
        topic_options check;
        nk->set(check, value);
      } catch (const config_error& e) {
        throw config_error(position(path, v->source().begin) + ": " + what + ": " + about_key(name, e.what()));
      }
      given.keys.emplace_back(std::string(name), std::move(value));
    }
    c.namespaces_given.push_back(std::move(given));
  }
}

/// Sets each option of the file, in the file's order, with the command line's checks; an
/// unknown key or a bad value stops at the first, named with its line and column. `namespace`
/// is the one table: its tables are the namespaces (read_namespaces).
void apply_file(config& c, const std::string& path) {
  toml::table t;
  const std::string text = read_config_file(path);
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    // TOML refuses a table given twice, naming it garbled when its key is quoted: say it with
    // the line as written.
    if (what.find("redefine existing table") != std::string::npos) {
      std::size_t at = 0;
      for (auto n = e.source().begin.line; n > 1 && at != std::string::npos; --n) at = text.find('\n', at) + 1;
      std::string line = at < text.size() ? text.substr(at, text.find('\n', at) - at) : std::string();
      line.erase(0, line.find_first_not_of(" \t"));
      if (const auto end = line.find(']'); end != std::string::npos) line.resize(end + 1);
      what = "the table " + line + " is given twice: a table is written once (a namespace: one table per prefix)";
    }
    throw config_error(position(path, e.source().begin) + ": " + what);
  }
  for (const auto& [k, v] : in_file_order(t)) {
    const std::string_view name = k->str();
    const std::string at = position(path, k->source().begin);
    if (name == "namespace") {
      read_namespaces(c, path, *v);
      continue;
    }
    if (name == "config") throw config_error(at + ": config: --config belongs on the command line (or in WSPUSH_CONFIG), not in the file it names");
    const option* o = find_option(name);
    if (!o) {
      std::string dashed(name);
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      throw config_error(at + ": unknown option \"" + std::string(name) + '"' +
                         (dashed != name && find_option(dashed) ? " (spelled " + dashed + ", as on the command line)"
                                                                : std::string(" (see --help)")));
    }
    std::string value;
    try {
      value = toml_value_text(*o, *v);
      o->set(c, value);
    } catch (const config_error& e) {
      throw config_error(position(path, v->source().begin) + ": " + about_key(name, e.what()));
    }
    config::given_value g{value, path + ':' + std::to_string(k->source().begin.line)};
    c.in_file.insert_or_assign(std::string(name), g);
    c.given.insert_or_assign(std::string(name), std::move(g));
  }
}

}  // namespace

const char* mode_name(app_mode m) noexcept {
  switch (m) {
    case app_mode::pubsub: return "pubsub";
    case app_mode::echo: return "echo";
    case app_mode::broadcast: return "broadcast";
  }
  return "?";
}

const char* log_level_name(log_level l) noexcept {
  switch (l) {
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "?";
}

bool is_reloadable(std::string_view name) noexcept {
  for (std::string_view r : {"api-key", "max-connections", "upgrade-rate", "client-message-rate",
                             "client-message-burst", "log-level"})
    if (name == r) return true;
  return false;
}

void take_reloadable(config& running, const config& next) {
  running.api_key = next.api_key;
  running.conn.max_connections = next.conn.max_connections;
  running.conn.upgrade_rate = next.conn.upgrade_rate;
  running.session.client_message_rate = next.session.client_message_rate;
  running.session.client_message_burst = next.session.client_message_burst;
  running.logging = next.logging;
  for (const option& o : options()) {
    if (!is_reloadable(o.name)) continue;
    for (auto m : {&config::given, &config::in_file}) {
      auto& to = running.*m;
      const auto& from = next.*m;
      if (auto it = from.find(o.name); it != from.end()) to.insert_or_assign(std::string(o.name), it->second);
      else if (auto old = to.find(o.name); old != to.end()) to.erase(old);
    }
  }
}

const char* kernel_tls_name(kernel_tls_mode m) noexcept {
  switch (m) {
    case kernel_tls_mode::automatic: return "auto";
    case kernel_tls_mode::on: return "on";
    case kernel_tls_mode::off: return "off";
  }
  return "?";
}

config parse_config(int argc, char** argv) {
  config c;
  // The command line is read first for --config, and applied last: it wins over the
  // environment, which wins over the file.
  std::vector<std::pair<const option*, std::string_view>> args;
  bool config_given = false;
  for (int k = 1; k < argc; ++k) {
    std::string_view arg = argv[k];
    if (arg == "--help" || arg == "-h") {
      c.show_help = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") throw config_error("unexpected argument '" + std::string(arg) + "' (see --help)");
    arg.remove_prefix(2);
    std::string_view value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      value = arg.substr(eq + 1), arg = arg.substr(0, eq), has_value = true;
    }
    const option* o = find_option(arg);
    if (!o && arg != "config") throw config_error("unknown option --" + std::string(arg) + " (see --help)");
    if (!has_value && (!o || !o->value_hint.empty())) {
      if (k + 1 >= argc)
        throw config_error("--" + std::string(arg) + " needs a value: " + std::string(o ? o->value_hint : "FILE"));
      value = argv[++k];
    }
    if (o) {
      args.emplace_back(o, value);
      continue;
    }
    if (value.empty()) throw config_error("--config: the file name is empty");
    c.config_file = value, config_given = true;
  }
  if (const char* v = std::getenv("WSPUSH_CONFIG"); v && *v && !config_given) c.config_file = v;
  if (!c.config_file.empty()) apply_file(c, c.config_file);
  for (const option& o : options())
    if (const char* v = std::getenv(env_name(o.name).c_str())) {
      o.set(c, v);
      c.given.insert_or_assign(std::string(o.name), config::given_value{v, env_name(o.name)});
    }
  for (const auto& [o, value] : args) {
    o->set(c, value);
    c.given.insert_or_assign(std::string(o->name), config::given_value{std::string(value), "the command line"});
  }
  if (c.show_help) return c;
  if (c.auth_none && !c.jwt_secret.empty())
    throw config_error("--auth=none and a JWT secret contradict each other: give one of them");
  if (!c.auth_none && c.jwt_secret.empty())
    throw config_error("no token secret: give --jwt-secret or --jwt-secret-file (or WSPUSH_JWT_SECRET), "
                       "or --auth=none to let anyone connect without a token");
  if (!c.bus.empty() && c.mode != app_mode::pubsub)
    throw config_error("--bus=redis://... carries the pub/sub protocol: it needs --mode=pubsub");
  if (!c.bus.empty()) {
    const auto spec = bus::parse_bus_spec(c.bus);  // checked when set
    for (const auto& t : spec.targets)
      if (!t.user.empty() && t.password.empty() && c.redis_password.empty())
        throw config_error("--bus " + t.describe() + ": the ACL user '" + t.user +
                           "' needs a password: in the URL (user:password@) or with --redis-password-file");
    if (!spec.any_tls() && !(c.redis_tls.ca.empty() && c.redis_tls.cert.empty() && c.redis_tls.key.empty()))
      throw config_error("--redis-tls-ca, --redis-tls-cert and --redis-tls-key are for rediss:// URLs; --bus names none");
  } else if (!c.redis_password_file.empty() || !c.redis_tls.ca.empty() || !c.redis_tls.cert.empty()) {
    throw config_error("--redis-password-file and --redis-tls-* are for --bus=redis://...");
  }
  if (c.redis_tls.cert.empty() != c.redis_tls.key.empty())
    throw config_error("--redis-tls-cert and --redis-tls-key go together: give both or neither");
  if (c.redis_wait_replicas > 0 && c.bus.empty())
    throw config_error("--redis-wait-replicas waits for Redis replicas: it needs --bus=redis://...");
  if (c.redis_wait_replicas > 0 && 2.0 * c.redis_wait_ms >= c.redis_timeout * 1000)
    throw config_error("--redis-wait-ms must be under half of --redis-timeout: the link waits for WAIT (a batch for "
                       "at most two), and a wait that long would mark the bus stalled");
  if (c.presence_ttl < 3 || c.presence_ttl > 86400)
    throw config_error("--presence-ttl is 3 to 86400 seconds: a node says its presence again every third of it");
  if (c.idempotency_window < 1)
    throw config_error("--idempotency-window is at least 1 second: a retry comes later than that");
  if (c.tls_cert.empty() != c.tls_key.empty())
    throw config_error("--tls-cert and --tls-key go together: give both (TLS) or neither (plain ws://)");
  if (c.threads == 0) c.threads = std::max(1u, std::thread::hardware_concurrency());
  if (c.conn.max_message_bytes == 0) c.conn.max_message_bytes = c.mode == app_mode::pubsub ? 64u << 10 : 16u << 20;
  if (c.session.allow_client_publish && !c.auth_none)
    throw config_error("--allow-client-publish is for --auth=none; with tokens the `pub` claim decides who may publish");
  if (c.conn.max_frame_bytes > c.conn.max_message_bytes) c.conn.max_frame_bytes = c.conn.max_message_bytes;
  c.conn.text_heartbeat = c.mode == app_mode::pubsub;
  if (c.conn.max_connections_per_user > 0 && (c.auth_none || c.mode != app_mode::pubsub))
    throw config_error("--max-connections-per-user counts the users of tokens (their sub): it needs --jwt-secret and "
                       "--mode=pubsub");
  if (c.conn.sse_path == c.conn.ws_path)
    throw config_error("--sse-path and --ws-path must differ: one path opens WebSockets, the other event streams");
  if (c.mode != app_mode::pubsub) c.conn.sse_path.clear();  // streams speak the pub/sub protocol
  c.topics.history_size = c.history_size;
  c.topics.history_ttl = c.history_ttl;
  c.topics.client_publish = c.auth_none ? c.session.allow_client_publish : true;  // tokens: their `pub` claim decides
  c.topics.compression = c.conn.compression;
  for (const config::namespace_given& g : c.namespaces_given) {
    topic_namespace n{g.prefix, c.topics, g.where};
    for (const auto& [key, value] : g.keys) find_namespace_key(key)->set(n.options, value);  // checked when read
    c.namespaces.push_back(std::move(n));
  }
  return c;
}

std::vector<config_change> config_changes(const config& running, const config& next) {
  const auto value = [](const auto& given, std::string_view name) -> const std::string* {
    auto it = given.find(name);
    return it == given.end() ? nullptr : &it->second.value;
  };
  const auto same = [](const std::string* a, const std::string* b) { return a && b ? *a == *b : a == b; };
  std::vector<config_change> lines;
  for (const option& o : options()) {
    auto in_file = next.in_file.find(o.name);
    const std::string where = in_file != next.in_file.end() ? in_file->second.where : next.config_file;
    const std::string name(o.name);
    const std::string was = o.show(running), now = o.show(next);
    if (o.secret ? !same(value(running.given, name), value(next.given, name)) : was != now) {
      const std::string head = where + ": " + name + " changed" + (o.secret ? "" : " (" + was + " -> " + now + ")");
      if (is_reloadable(o.name))
        lines.push_back({head + ": in effect now", true});
      else
        lines.push_back({head + ": it needs a restart; " + (o.secret ? "the running value" : was) +
                         " stays in effect until then"});
      continue;
    }
    auto effective = next.given.find(o.name);
    if (!same(value(running.in_file, name), value(next.in_file, name)) && effective != next.given.end() &&
        (in_file == next.in_file.end() || effective->second.where != in_file->second.where))
      lines.push_back({where + ": " + name + " changed in the file, but " + effective->second.where +
                       " overrides it: nothing to do"});
  }
  // Namespaces, by prefix: what each table gives (a global option it takes is reported above).
  const auto find_ns = [](const config& c, const std::string& prefix) -> const config::namespace_given* {
    for (const config::namespace_given& g : c.namespaces_given)
      if (g.prefix == prefix) return &g;
    return nullptr;
  };
  using key_map = std::map<std::string, std::string>;
  for (const config::namespace_given& was : running.namespaces_given) {
    const config::namespace_given* now = find_ns(next, was.prefix);
    if (!now)
      lines.push_back({next.config_file + ": namespace \"" + was.prefix +
                       "\" removed: it needs a restart; it stays in effect until then"});
    else if (key_map(was.keys.begin(), was.keys.end()) != key_map(now->keys.begin(), now->keys.end()))
      lines.push_back({now->where + ": namespace \"" + was.prefix +
                       "\" changed: it needs a restart; the running one stays in effect until then"});
  }
  for (const config::namespace_given& now : next.namespaces_given)
    if (!find_ns(running, now.prefix))
      lines.push_back({now.where + ": namespace \"" + now.prefix + "\" added: it needs a restart to take effect"});
  return lines;
}

std::string help_text() {
  config d;
  std::string s =
      "usage: wspush [options]\n"
      "A WebSocket push server. Options also come from environment variables WSPUSH_<NAME>\n"
      "(e.g. --max-connections -> WSPUSH_MAX_CONNECTIONS) and from the TOML file of --config\n"
      "(max-connections = 100000); the command line wins, then the environment, then the file.\n\n";
  for (const option& o : options()) {
    std::string left = "  --" + std::string(o.name) + (o.value_hint.empty() ? "" : " " + std::string(o.value_hint));
    if (left.size() < 30) left.resize(30, ' ');
    else left += "\n" + std::string(30, ' ');
    s += left + std::string(o.help) + (is_reloadable(o.name) ? " (SIGHUP reloads it)" : "") + " [default: " +
         o.show(d) + "]\n";
  }
  s += "  --config FILE               read options from FILE, TOML: each option's long name as key (max-connections = "
       "100000), switches as true/false; the environment and the command line win over it. Read again on SIGHUP: "
       "--api-key, --max-connections, --upgrade-rate, --client-message-rate, --client-message-burst and "
       "--log-level change at once (unless the environment or the command line gives them); any other option "
       "changed there is logged as needing a restart, the running value stays [default: none]\n";
  s += "\nNamespaces (the --config file only): a table [namespace.\"<prefix>\"] gives the topics that start with\n"
       "<prefix> their own history-size, history-ttl, presence, join-leave, client-publish (false: clients' pubs\n"
       "are refused whatever their token grants) and compression; a key it does not give takes the global\n"
       "option's value, and the longest prefix a topic starts with wins. For example:\n"
       "  [namespace.\"mailbox:\"]\n"
       "  history-size = 20\n"
       "  history-ttl = 86400\n"
       "  client-publish = false\n";
  s += "  --help                      this text\n";
  return s;
}

}  // namespace wspush::server
