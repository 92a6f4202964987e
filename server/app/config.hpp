#pragma once
// Start-up configuration. Every option is `--name VALUE`, `--name=VALUE`, the environment
// variable WSPUSH_NAME (upper case, '-' as '_'), or `name = value` in the TOML file of
// `--config FILE`; the command line wins, then the environment, then the file.
// Parsing throws config_error (start-up is the one place exceptions may escape).
//
// The options of each floor are the floor's own struct (base/options.hpp); this one composes
// them with what only the wiring needs (addresses, mode, threads, secrets, pool, history).

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/base/log.hpp"
#include "server/base/options.hpp"

namespace wspush::server {

enum class app_mode : std::uint8_t { pubsub, echo, broadcast };
enum class io_kind : std::uint8_t { uring, epoll };
/// --kernel-tls: auto hands TLS records to the kernel where it lists the "tls" ULP; on tries
/// even where it does not (the module may load on first use); off never does.
enum class kernel_tls_mode : std::uint8_t { automatic, on, off };

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
  std::string bus;  // empty: the embedded bus; else redis://[:password@]host:port[/db]
  double redis_timeout = 3;  // a command unanswered this long: the Redis bus is stalled
  std::string redis_password_file;  // --redis-password-file (its contents: redis_password)
  std::string redis_password;
  struct {
    std::string ca, cert, key;  // rediss://: --redis-tls-ca, --redis-tls-cert, --redis-tls-key
  } redis_tls;
  std::uint32_t redis_wait_replicas = 0;  // durable publishes: replicas that must have each (WAIT)
  std::uint32_t redis_wait_ms = 500;      // how long WAIT waits for them
  std::string tls_cert, tls_key;  // both: the public listener speaks TLS (wss://, https://)
  kernel_tls_mode kernel_tls = kernel_tls_mode::automatic;
  std::uint32_t history_size = 100;   // per topic
  double history_ttl = 300;
  std::uint64_t history_max_bytes = std::uint64_t(256) << 20;
  // Idempotency keys are remembered this long: a backend's retries with backoff end well
  // within it, and it bounds what the keys cost (as long as the default history: a retry of an
  // event still in the history is caught).
  double idempotency_window = 300;
  // Presence on the Redis bus: how long a node's word lasts there (it says it again every third).
  double presence_ttl = 30;
  std::uint32_t revocation_ttl = 3600;     // POST /disconnect: how long a revoked user's older tokens are refused (0: off)
  std::uint32_t max_revocations = 100000;  // revoked users remembered (the oldest forgotten first)
  log_level logging = log_level::info;  // --log-level: the least severe line written
  unsigned pool_workers = 1;       // initial
  unsigned pool_max_workers = 0;   // 0: cores
  unsigned pool_queue = 4096;
  loop_options loop;
  conn_options conn{.max_message_bytes = 0};  // 0 until parsed: 64 KiB in pubsub mode, 16 MiB in the others
  session_options session;
  // The options of every topic (--history-size, --history-ttl, --presence, --join-leave,
  // --compression, and who may `pub`: the token's claim, or --allow-client-publish with
  // --auth=none), filled once the rest is parsed; history_size and history_ttl above are theirs.
  topic_options topics;
  // The file's `[namespace."<prefix>"]` tables, in its order: the keys each gives, as written
  // (checked when read), and where its table is ("FILE:LINE").
  struct namespace_given {
    std::string prefix, where;
    std::vector<std::pair<std::string, std::string>> keys;
  };
  std::vector<namespace_given> namespaces_given;
  // The same resolved: each key a table does not give takes the global value (`topics`).
  std::vector<topic_namespace> namespaces;
  std::string config_file;  // --config (or WSPUSH_CONFIG); empty: none
  struct given_value {
    std::string value;  // as written (a TOML value as its text)
    std::string where;  // "FILE:LINE", "WSPUSH_NAME" or "the command line"
  };
  // Each option given, by name: what took effect (the command line over the environment over
  // the file), and what the file says. SIGHUP compares them.
  std::map<std::string, given_value, std::less<>> given, in_file;
  bool show_help = false;
};

struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses argv, the environment and the --config file. Throws config_error with a message fit
/// for the user; one about the file starts with FILE:LINE:COLUMN.
config parse_config(int argc, char** argv);
/// One line of what SIGHUP found changed.
struct config_change {
  std::string line;
  bool in_effect = false;  // a reloadable option: its new value applies now (take_reloadable)
};
/// SIGHUP: `next` is parse_config of the same command line and environment over the file as it
/// is now. One line for each option whose value differs from the running one: in effect now
/// for the options that reload (is_reloadable), needing a restart for the others; one for each
/// option whose new value in the file is overridden, and one for each namespace table added,
/// removed or changed (a restart too).
std::vector<config_change> config_changes(const config& running, const config& next);
/// Whether SIGHUP changes option `name` (as --help spells it, without the dashes) at run time:
/// api-key, max-connections, upgrade-rate, client-message-rate, client-message-burst, log-level.
bool is_reloadable(std::string_view name) noexcept;
/// Copies the reloadable options of `next` (and what was given for them) into `running`, once
/// they are in effect, so that the next SIGHUP compares with them.
void take_reloadable(config& running, const config& next);
std::string help_text();
const char* mode_name(app_mode m) noexcept;
const char* kernel_tls_name(kernel_tls_mode m) noexcept;
const char* log_level_name(log_level l) noexcept;

}  // namespace wspush::server
