#pragma once
/// \file admin_api.hpp
/// The admin API's request handling, without sockets: a parsed request in, a complete HTTP
/// response appended to a string out. admin_server runs it on its thread; tests call it
/// directly too. Routes (docs/OPERATIONS.md, "The admin listener"):
///
/// | route                | method | key  | answer |
/// |----------------------|--------|------|--------|
/// | `/publish`           | POST   | yes  | 200 `{"id":"18"}`; 400/503/504 `{"error":...}` |
/// | `/publish/batch`     | POST   | yes  | 200 `{"results":[{"id":"18"},{"error":"bad_request"},...]}` |
/// | `/disconnect`        | POST   | yes  | 200 `{"disconnected":3}`: `{"sub":"u42"}` revoked, its connections here closed |
/// | `/metrics`           | GET    | no   | 200 Prometheus text 0.0.4 |
/// | `/healthz`           | GET    | no   | 200 `{"status":"ok"}` while the process serves (liveness) |
/// | `/readyz`            | GET    | no   | 200 `{"status":"ready"}`; 503 `{"status":"draining"}`, `"bus_down"` or `"bus_stalled"` |
/// | `/presence?topic=T`  | GET    | yes  | 200 `{"topic":T,"users":{"u42":2},"user_count":1,"connections":2}` (`&count=1`: without `users`); 404 `not_enabled` |
///
/// A publish (and each line of a batch) is `{"topic":...,"data":...}` with an optional
/// `"idempotency_key"` (1-128 bytes of printable ASCII; else 400 with a reason).
///
/// Errors: unknown path 404, wrong method 405 (with `Allow`), missing or wrong key 401 (with
/// `WWW-Authenticate: Bearer`), POST without Content-Length 411, bad JSON 400, body over the
/// limit 413 (from the parser), sink unavailable 503 (with `Retry-After`), too many publishes
/// already waiting for the bus 503 (with `Retry-After`). Every error body is
/// `{"error":"<code>"}`, sometimes with a `"reason"`.
///
/// A sink outside the process (the Redis bus) answers publishes later: respond() then says
/// `pending`, and the answer is given by answer() once settle() has taken every outcome, or
/// once the caller's deadline for it has passed. The admin thread never waits on the bus.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <string_view>

#include "proto/http_request.hpp"

namespace wspush::server {

class metrics_registry;
class counter;

/// What a publish came to. `id_or_error` is the id (ok) or a short error code such as
/// "forbidden" (bad_request; empty means "bad_request"); it must stay valid until the sink's
/// next publish or collect call: the admin thread copies it at once.
struct publish_outcome {
  /// timeout: handed on (to Redis) and no answer came: it may have been published, so a retry
  /// may publish it twice (504). unavailable: it was not published (503, retry). pending: the
  /// sink answers later (see publish_sink): `ticket` names it.
  enum kind_t : std::uint8_t { ok, bad_request, unavailable, timeout, pending } kind;
  std::string_view id_or_error;
  std::uint64_t ticket = 0;
};

/// Told, from any thread, the tickets of pending publishes once their outcomes are known (those
/// that settled together at once, so that the admin thread is woken once for them).
using publish_notify = std::function<void(std::span<const std::uint64_t> tickets)>;

/// Where the admin API's publishes go: the hub (answers at once) or the Redis bus (answers
/// later, never making the admin thread wait).
class publish_sink {
 public:
  virtual ~publish_sink() = default;
  /// Called on the admin thread only. `topic` is valid (proto/topic.hpp); `data_raw` is the
  /// `data` value exactly as the publisher sent it, validated JSON, byte for byte;
  /// `idempotency_key` is empty (none) or valid (proto::is_valid_idempotency_key): a publish
  /// whose key was published on the topic within the window is answered ok with that
  /// publish's id, and not published again. The views are valid only during the call. A sink
  /// that cannot answer at once returns `pending` with a ticket; it then calls the notify of
  /// set_notify() with that ticket once the outcome is known, and collect() takes it.
  virtual publish_outcome publish(std::string_view topic, std::string_view data_raw,
                                  std::string_view idempotency_key) noexcept = 0;
  /// After the last publish of a request (one for /publish, once per /publish/batch): the
  /// moment to wake the shards once for everything just posted.
  virtual void end_batch() noexcept {}
  /// After the admin thread handled what one wake-up brought (every request of every connection
  /// that was readable): the moment to hand on at once what was posted without waking anyone.
  virtual void end_turn() noexcept {}
  /// Before any publish, from the thread that starts the admin server (and again with an
  /// empty function once it stopped): how to tell the admin thread about settled tickets.
  virtual void set_notify(publish_notify notify) noexcept {}
  /// Admin thread: the outcome of a pending publish; its ticket is spent. After notify named
  /// it, what became of it; before (the admin API stopped waiting): timeout if it was handed
  /// on, else unavailable, and then it is never sent. Never pending.
  virtual publish_outcome collect(std::uint64_t ticket) noexcept { return {publish_outcome::unavailable, {}}; }
  /// Whether publishes can be taken now (false while a bus outside the process is down):
  /// /readyz answers 503 bus_down while it is not.
  virtual bool ready() const noexcept { return true; }
  /// Why it is not ready, for /readyz (empty: nothing to say).
  virtual std::string not_ready_reason() const { return {}; }
  /// Whether the bus has left a command unanswered longer than it may: /readyz answers 503
  /// bus_stalled while it has.
  virtual bool stalled() const noexcept { return false; }
};

/// Where POST /disconnect goes (server/app/revoker.hpp): revokes the user `sub` (its older
/// tokens are refused, on every node) and closes its connections. Returns how many it closed
/// in this process. Admin thread; it may wait briefly for the shards' count.
class revoke_sink {
 public:
  virtual ~revoke_sink() = default;
  virtual std::uint32_t revoke(std::string_view sub) noexcept = 0;
};

struct admin_api_options {
  std::string api_key;  // empty: the publish endpoints are open (the listener is loopback by default)
  /// Publishes (lines) that may wait for the bus at once; a request that would take more is
  /// answered 503 with Retry-After (unless none waits: a batch larger than this goes alone).
  std::uint32_t max_waiting_publishes = 4096;
  /// GET /presence: writes the topic's presence as JSON into `body` and returns the status
  /// (200, or 404 where the topic's namespace keeps none). Empty: no topic keeps presence.
  std::function<std::uint16_t(std::string_view topic, bool count_only, std::string& body)> presence;
  revoke_sink* revoker = nullptr;  // null: /disconnect closes nothing (no users: echo or broadcast mode)
};

class admin_api {
 public:
  /// `metrics` may be null (no /metrics content, no request counters). `draining` must outlive this.
  admin_api(admin_api_options o, publish_sink& sink, metrics_registry* metrics, const std::atomic<bool>& draining);
  ~admin_api();
  admin_api(const admin_api&) = delete;
  admin_api& operator=(const admin_api&) = delete;

  /// What to do with a request once its head is in, before any of its body is read.
  enum class head_verdict : std::uint8_t {
    read_body,        ///< go on: read the body (if any) and respond()
    read_body_keyed,  ///< the same, and the request presented the API key
    answered,         ///< an error answer was appended; the request (it has no body) is done
    answered_close,   ///< an error answer was appended: read nothing more, close after it
  };
  /// Screens a request head: an unknown path, a wrong method, a publish without the key (401)
  /// or without Content-Length, or a body where none belongs are answered now, so that no body
  /// is ever read, let alone buffered, for a request that will be refused.
  head_verdict screen(const proto::http_request& req, std::string& out);

  /// What respond() did.
  enum class respond_result : std::uint8_t {
    keep_open,  ///< answered; the connection goes on
    close,      ///< answered; the connection must close after this response
    pending,    ///< nothing appended yet: publishes wait for the bus (answer() gives the response)
  };
  /// Appends the response to a complete request (screened again first). `body_readable`: bytes readable from
  /// req.body.data() (simdjson reads up to 64 bytes past the end; with fewer the body is
  /// copied). `tag` (non-zero) names the request if it ends up pending; the request's bytes
  /// need not outlive the call.
  respond_result respond(const proto::http_request& req, std::size_t body_readable, std::string& out,
                         std::uint64_t tag = 0);

  /// A ticket the sink's notify named: takes its outcome. Returns the tag of the request this
  /// completes (answer() it now), or 0 (more of it waits, or nothing waits on the ticket).
  std::uint64_t settle(std::uint64_t ticket);
  /// Appends the response to the pending request `tag`: once settle() returned its tag, or
  /// when its deadline passed (what still waits is then timeout, or unavailable if never sent).
  /// Returns true when the connection must close after it.
  bool answer(std::uint64_t tag, std::string& out);
  /// The connection of pending request `tag` went away: nobody wants its answer.
  void forget(std::uint64_t tag) noexcept;
  /// --api-key from now on (empty: none), for requests screened after this; any thread (SIGHUP).
  void set_api_key(std::string key);
  /// Publishes waiting for the bus now (at most max_waiting_publishes, or one large batch).
  std::size_t waiting_publishes() const noexcept;

  /// Appends the response to a request that could not be parsed (the parser's status and
  /// reason), or a 408/503 from the server itself; always with `Connection: close`.
  void respond_error(std::uint16_t status, std::string_view reason, std::string& out);

  /// The `Expect: 100-continue` interim answer.
  static constexpr std::string_view continue_response = "HTTP/1.1 100 Continue\r\n\r\n";

 private:
  struct state;
  std::unique_ptr<state> _s;
};

/// Appends `HTTP/1.1 <status>` with Content-Type, Content-Length, `Connection: close` when
/// `close`, `extra_headers` verbatim (each ending CRLF), then the body.
void append_http_response(std::string& out, std::uint16_t status, std::string_view content_type,
                          std::string_view body, bool close, std::string_view extra_headers = {});

}  // namespace wspush::server
