#pragma once
// The options of each floor, as plain structs with the defaults `wspush --help` shows. app/config
// fills them from the command line and the environment; each floor reads only its own, so no
// floor below app/ needs to know the whole configuration.

#include <cstdint>
#include <string>

namespace wspush::server {

/// The reactor loop (reactor/loop.hpp).
struct loop_options {
  double drain_seconds = 5;  ///< SIGTERM: the 1001 closes are spread over this window
};

/// The connection layer (conn/): limits and deadlines of one connection.
struct conn_options {
  std::string ws_path = "/ws";            ///< the one path that upgrades; any other gets 404
  std::string sse_path = "/sse";          ///< event streams (pub/sub only; empty: none)
  std::uint32_t max_connections = 0;      ///< per process; 0: bounded only by open files
  std::uint32_t upgrade_rate = 0;         ///< upgrades a second per process, bursts of a second's worth; 0: any
  std::uint32_t max_connections_per_user = 0;  ///< per process, by the token's `sub`; 0: any
  std::uint32_t max_request_bytes = 8192;  ///< an upgrade request past it: 431
  std::uint32_t max_frame_bytes = 16u << 20;
  std::uint32_t max_message_bytes = 16u << 20;
  std::uint64_t max_pending_bytes = 4u << 20;  ///< unsent output the kernel would not take: past it, 1013
  double upgrade_timeout = 5;
  double close_timeout = 5;
  double message_timeout = 30;  ///< a frame or message started and not finished by then: 1008
  double ping_interval = 30;    ///< keepalive: ping a connection silent this long
  double pong_timeout = 10;     ///< and close it if nothing arrives within this after the ping
  /// Each connection is closed with 1001 after this long, +-10% (its own draw), so that a fleet
  /// rebalances after a scale-up; 0: never.
  double max_connection_lifetime = 0;
  /// A client that connects with `?heartbeat=1` gets the keepalive as a text message
  /// `{"op":"ping"}` (a page can see it; browsers hide ping frames) when the application's
  /// protocol has an answer for it (pub/sub: `{"op":"pong"}`).
  bool text_heartbeat = false;
  /// permessage-deflate (RFC 7692) for clients that offer it; events of at least
  /// compression_min_bytes are compressed once per process for all of them.
  bool compression = true;
  std::uint32_t compression_min_bytes = 256;  // docs/PERFORMANCE.md: below it, a few bytes saved for 10+ µs per event
};

/// The pub/sub session (pubsub/session.hpp).
struct session_options {
  std::uint32_t max_topics_per_connection = 64;
  bool allow_client_publish = false;  ///< without tokens: may clients `pub`? (tokens: the `pub` claim decides)
  /// Messages a second a connection may send, in bursts of up to client_message_burst (0: any).
  double client_message_rate = 0;
  std::uint32_t client_message_burst = 20;
};

/// What a kind of topic gets: the global options (--history-size, --presence, ...) unless a
/// namespace of the config file (`[namespace."mailbox:"]`) covers the topic (pubsub/namespaces.hpp).
struct topic_options {
  std::uint32_t history_size = 100;  ///< events kept per topic
  double history_ttl = 300;          ///< their age limit, seconds; 0: none
  bool presence = false;             ///< who is subscribed can be asked (`presence`, GET /presence)
  bool join_leave = false;           ///< subscribers hear a user's first subscribe and last leave
  bool client_publish = true;        ///< false: clients' pubs are refused whatever their token grants
  bool compression = true;           ///< events get their permessage-deflate twin (when big enough)
};

/// One `[namespace."<prefix>"]` table: the topics that start with `prefix` (the longest one wins).
struct topic_namespace {
  std::string prefix;
  topic_options options;
  std::string where;  ///< "FILE:LINE" of its table, for messages
};

}  // namespace wspush::server
