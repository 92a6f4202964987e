#pragma once
// Start-up configuration. Every option is `--name VALUE`, `--name=VALUE`, or the
// environment variable WSPUSH_NAME (upper case, '-' as '_'); the command line wins.
// Parsing throws config_error (start-up is the one place exceptions may escape).

#include <cstdint>
#include <stdexcept>
#include <string>

namespace wspush::server {

enum class app_mode : std::uint8_t { pubsub, echo, broadcast };
enum class io_kind : std::uint8_t { uring, epoll };

struct config {
  std::string listen = "0.0.0.0:8080";
  std::string admin_listen = "127.0.0.1:8081";
  std::string api_key;                 // bearer key for the admin publish endpoints; empty: none
  std::uint32_t max_body_bytes = 1u << 20;  // admin request bodies past it: 413
  app_mode mode = app_mode::pubsub;
  io_kind io = io_kind::uring;
  unsigned threads = 0;  // 0: one per core
  bool auth_none = false;
  std::string jwt_secret;       // from --jwt-secret, or read from --jwt-secret-file
  bool reuseport = false;
  bool allow_client_publish = false;  // with --auth=none: clients may `pub`
  std::uint32_t max_topics_per_connection = 64;
  std::uint32_t history_size = 100;   // per topic
  double history_ttl = 300;
  std::uint64_t history_max_bytes = std::uint64_t(256) << 20;
  std::uint32_t max_connections = 0;  // 0: bounded only by open files
  std::uint32_t max_request_bytes = 8192;
  std::uint32_t max_frame_bytes = 16u << 20;
  std::uint32_t max_message_bytes = 0;  // 0 until parsed: 64 KiB in pubsub mode, 16 MiB in the others
  std::uint64_t max_pending_bytes = 4u << 20;
  double upgrade_timeout = 5;
  double close_timeout = 5;
  double message_timeout = 30;
  double ping_interval = 30;   // keepalive: ping a connection silent this long
  double pong_timeout = 10;    // and close it if nothing arrives within this after the ping
  double drain_seconds = 5;    // SIGTERM: 1001 closes spread over this window
  unsigned pool_workers = 1;       // initial
  unsigned pool_max_workers = 0;   // 0: cores
  unsigned pool_queue = 4096;
  bool show_help = false;

  /// The message size limit in force: max_message_bytes, or the mode's default while it is 0.
  std::uint32_t message_limit() const noexcept {
    return max_message_bytes ? max_message_bytes : mode == app_mode::pubsub ? 64u << 10 : 16u << 20;
  }
};

struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses argv and the environment. Throws config_error with a message fit for the user.
config parse_config(int argc, char** argv);
std::string help_text();
const char* mode_name(app_mode m) noexcept;

}  // namespace wspush::server
