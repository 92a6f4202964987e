#pragma once
/// \file options.hpp
/// Command line of wspush-loadgen. Parsing may throw std::runtime_error (start-up only).

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::loadgen {

enum class scenario : std::uint8_t { idle, fanout, mailboxes, churn, reconnect_storm, slow_consumers };
/// pubsub: the wspush protocol (sub, events, admin publish). broadcast: any server that sends
/// every text message to every client (wspush --mode=broadcast, Node `ws`, uWebSockets...).
enum class protocol : std::uint8_t { pubsub, broadcast };
enum class publish_via : std::uint8_t { admin, ws };
enum class storm_kind : std::uint8_t { client, server };
/// ws: each connection upgrades to WebSocket and sends its `sub`. sse: each opens an event
/// stream of its topic (GET --url's path?topics=T, Server-Sent Events) and only reads.
enum class transport_kind : std::uint8_t { ws, sse };

/// At most this many --publish-steps (the parent refuses a step message past it).
inline constexpr std::size_t max_publish_steps = 64;

std::string_view scenario_name(scenario s) noexcept;

/// Default wait between the last connection up and the first publish. The set-up leaves TCP
/// timers behind (retransmission timers of the replies already acknowledged, delayed ACKs) that
/// run out over about 200 ms, TCP's minimum retransmission timeout; a burst published before
/// that shares the server's core with them and reads up to a quarter slower
/// (docs/PERFORMANCE.md, "The load generator's burst figure against a counting client").
inline constexpr double settle_seconds = 0.25;

/// Everything the parent and its children need; children inherit it across fork().
struct options {
  scenario sc = scenario::fanout;
  protocol proto = protocol::pubsub;
  publish_via via = publish_via::admin;
  storm_kind storm = storm_kind::client;
  transport_kind transport = transport_kind::ws;
  std::string url;
  std::string host_header;   ///< "host:port"
  bool tls = false;          ///< wss:// or https://: each connection does a TLS handshake first (the certificate is not checked)
  std::string path = "/ws";  ///< the upgrade's path, or with sse the event streams' (/sse)
  sockaddr_in server{};
  sockaddr_in admin{};
  std::string admin_host;    ///< "host:port" for the admin Host header
  bool admin_given = false;
  std::string api_key;
  std::string jwt_secret;
  double token_ttl = 3600;
  std::string topic = "lg-fanout";
  std::string topic_prefix = "lg-mb-";
  bool own_topics = false;           ///< idle: each connection on its own topic, as mailboxes
  bool own_users = false;            ///< each connection's token names its own user (sub "u<index>")
  std::uint32_t connections = 1000;
  std::uint32_t procs = 0;           ///< 0: one per 10,000 connections
  double connect_rate = 0;           ///< connections/s over all processes; 0: --inflight bound
  std::uint32_t inflight = 256;      ///< upgrades in progress per process when not rate limited
  std::vector<in_addr> sources;      ///< source addresses, round robin; empty: the kernel picks
  std::uint64_t messages = 0;        ///< 0: derived (200, or publish_rate * seconds)
  double publish_rate = 0;           ///< messages/s; 0: as fast as the server takes them
  double seconds = 10;               ///< publishing time when --publish-rate is given
  /// --publish-steps: the publish rate of each step, in order (empty: one rate, --publish-rate).
  /// Step k publishes rate * --step-seconds messages at its rate, then nothing for --step-pause
  /// seconds, so that what it sent is delivered before the next step begins.
  std::vector<double> step_rates;
  double step_seconds = 10;
  double step_pause = 3;
  std::uint32_t size = 64;
  std::uint32_t pipeline = 32;       ///< admin publish requests in flight
  std::uint32_t publish_batch = 1;   ///< admin: messages per request (over 1: POST /publish/batch)
  double hold = -1;                  ///< seconds to hold once all are up (idle: 10; others: settle_seconds)
  double churn_rate = 100;           ///< churn: closes+reopens per second over all processes
  double churn_fraction = 0.5;
  double slow_fraction = 0.1;
  double storm_at = -1;              ///< seconds into publishing; <0: at half of it
  double connect_timeout = 60;
  double attempt_timeout = 10;       ///< a reconnect (churn, storm) not ready by then is retried
  double timeout = 120;              ///< run phase bound
  double drain_timeout = 5;          ///< after the last publish, give up when nothing came for this long
  double sample_interval = 1;
  int server_pid = 0;
  bool json = false;
  bool compression = false;          ///< offer permessage-deflate as browsers do, inflate what comes compressed
  bool quiet = false;
  bool progress = false;             ///< force the live line even when stderr is not a terminal
  std::string report;                ///< HTML report path

  [[nodiscard]] bool publishes() const noexcept { return sc != scenario::idle; }
  /// Topic of connection `global` (its index over all processes).
  [[nodiscard]] std::string topic_of(std::uint32_t global) const;
  /// Whether `topic` is connection `global`'s topic; allocates nothing (the receive path).
  [[nodiscard]] bool topic_matches(std::uint32_t global, std::string_view topic) const noexcept;
  /// Number of topics the publisher cycles through.
  [[nodiscard]] std::uint32_t topic_count() const noexcept {
    return sc == scenario::mailboxes ? connections : 1;
  }
  /// Messages the publisher sends to topic `t` (publishes go round robin over the topics), of
  /// its first `sent` (all of them by default).
  [[nodiscard]] std::uint64_t messages_for(std::uint32_t t, std::uint64_t sent) const noexcept {
    const std::uint32_t n = topic_count();
    return sent / n + (t < sent % n ? 1 : 0);
  }
  [[nodiscard]] std::uint64_t messages_for(std::uint32_t t) const noexcept { return messages_for(t, messages); }
  /// Messages step k publishes (steps only).
  [[nodiscard]] std::uint64_t step_messages(std::size_t k) const noexcept;
  /// The step message number `n` (counted over all topics) belongs to; 0 without steps.
  [[nodiscard]] std::size_t step_of(std::uint64_t n) const noexcept;
  /// Connection `global`'s role in churn / slow-consumers (spread evenly over processes).
  [[nodiscard]] bool is_churner(std::uint32_t global) const noexcept;
  [[nodiscard]] bool is_slow(std::uint32_t global) const noexcept;
};

extern const std::string_view usage_text;

/// Parses argv (`--opt VALUE` or `--opt=VALUE`). Throws std::runtime_error with a message
/// meant for the user.
options parse_options(int argc, char** argv);

/// "127.0.0.2-127.0.0.250" (inclusive), one address, or "none". Throws on a bad range.
std::vector<in_addr> parse_sources(std::string_view text);

}  // namespace wspush::loadgen
