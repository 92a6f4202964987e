#pragma once
/// \file admin_server.hpp
/// The admin listener (docs/OPERATIONS.md: default 127.0.0.1:8081): HTTP/1.1 with keep-alive
/// and pipelining on a thread of its own, over the epoll io_backend. Admin traffic is a few
/// backends publishing and a scraper, so it is kept apart from the shards and simple: each
/// admin connection owns its input and output strings (unlike a public connection, which owns
/// no buffer while idle), and there are at most `max_connections` of them.
///
/// The thread never waits on anything but its own sockets: a publish to the Redis bus is
/// handed over and answered when Redis has answered (or `publish_timeout` has passed), while
/// every other connection is served; so /healthz and /readyz answer at once whatever Redis
/// does. A connection's pipelined requests are handled while earlier ones wait (so a
/// publisher's pipeline reaches Redis together), and answered in request order: an answer
/// ready at once waits behind the earlier ones. At most 64 requests of one connection wait at
/// once (past that its input is left in the kernel until answers went out), and at most
/// `max_waiting_publishes` publishes of the node (past it: 503).
///
/// Bounds and timeouts, so a slow or hostile client costs a slot and nothing else:
/// - a connection that has not presented the API key (*unkeyed*: every new one) may hold at
///   most `unkeyed_share` of the slots, must send each request head within `unkeyed_timeout`
///   and may idle no longer than that; when the share (or the table) is full, a new connection
///   takes the slot of the unkeyed connection that has been quiet the longest. So no number of
///   idle or keyless connections locks out a keyed publisher or a health probe: a new
///   connection always gets a slot, unless every slot is held by keyed connections (then 503);
/// - a request head is screened before its body is read (admin_api::screen): a publish without
///   the key is answered 401 and the connection closed, and no body is buffered for it;
/// - a request (head and body) must arrive within `request_timeout` of its first byte, else
///   408 and close; a keyed keep-alive connection idle for `idle_timeout` is closed;
/// - output not taken by the client for `request_timeout` closes the connection; while more
///   than 256 KiB of output waits, pipelined requests are not read further;
/// - after an error answer (written after the answers of the requests before it) the write
///   side is shut and the rest of the request read and dropped for at most `linger_timeout`,
///   so that the client sees the 4xx instead of a reset; nothing after it is handled.
///
/// Wiring (the lead): build a metrics_registry and a publish_sink, start the server after the
/// shards, call set_draining(true) on SIGTERM, stop() (or destroy) last.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "server/admin/admin_api.hpp"

namespace wspush::server {

struct admin_options {
  std::string listen = "127.0.0.1:8081";  // --admin-listen; port 0 picks a free one (see port())
  std::string api_key;                    // --api-key; empty: publish endpoints need none
  revoke_sink* revoker = nullptr;         // POST /disconnect (admin_api.hpp)
  std::uint32_t max_body_bytes = 1u << 20;   // --max-body-bytes: larger bodies get 413
  std::uint32_t max_head_bytes = 8192;       // request line and headers: larger get 431
  std::uint32_t max_connections = 256;
  std::uint32_t unkeyed_share = 192;  // slots unkeyed connections may hold (at most max_connections)
  double unkeyed_timeout = 5;   // seconds an unkeyed connection gets for a request head, or may idle
  double request_timeout = 10;  // seconds from a request's first byte to its last
  double idle_timeout = 60;     // seconds a keep-alive connection may wait for its next request
  double linger_timeout = 2;    // seconds spent draining a request after an error answer
  double publish_timeout = 5;   // seconds a publish waits for the bus: then 504 if it was sent, else 503
  std::uint32_t max_waiting_publishes = 4096;  // publishes (batch lines) waiting for the bus at once
  std::function<std::uint16_t(std::string_view topic, bool count_only, std::string& body)> presence;  // GET /presence
};

class admin_server {
 public:
  /// `metrics` may be null; both it and `sink` must outlive the server. The server registers
  /// its own series in it (wspush_admin_*, wspush_draining, the admin publishes): one admin
  /// server per registry.
  admin_server(admin_options o, publish_sink& sink, metrics_registry* metrics);
  ~admin_server();  // stops
  admin_server(const admin_server&) = delete;
  admin_server& operator=(const admin_server&) = delete;

  /// Binds the listener and starts the thread. Throws std::runtime_error when
  /// the address is bad or taken: start-up is the place for it.
  void start();
  /// Thread-safe, idempotent: closes every admin connection and joins the thread.
  void stop() noexcept;

  /// `/readyz` answers 503 while draining. Thread-safe.
  void set_draining(bool on) noexcept { _draining.store(on, std::memory_order_relaxed); }
  bool draining() const noexcept { return _draining.load(std::memory_order_relaxed); }

  /// --api-key from now on (key rotation on SIGHUP); any thread, after start().
  void set_api_key(std::string key);

  /// The bound address ("127.0.0.1:41235") and port, valid after start().
  const std::string& local_address() const noexcept { return _local; }
  std::uint16_t port() const noexcept { return _port; }

 private:
  class loop;
  admin_options _opt;
  publish_sink& _sink;
  metrics_registry* _metrics;
  std::atomic<bool> _draining{false};
  std::unique_ptr<loop> _loop;
  std::thread _thread;
  std::string _local;
  std::uint16_t _port = 0;
};

}  // namespace wspush::server
