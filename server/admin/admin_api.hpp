#pragma once
/// \file admin_api.hpp
/// The admin API's request handling, without sockets: a parsed request in, a complete HTTP
/// response appended to a string out. admin_server runs it on its thread; tests call it
/// directly too. Routes (DESIGN.md, "Admin listener"):
///
/// | route                | method | key  | answer |
/// |----------------------|--------|------|--------|
/// | `/publish`           | POST   | yes  | 200 `{"id":"18"}`; 400/503 `{"error":...}` |
/// | `/publish/batch`     | POST   | yes  | 200 `{"results":[{"id":"18"},{"error":"bad_request"},...]}` |
/// | `/metrics`           | GET    | no   | 200 Prometheus text 0.0.4 |
/// | `/healthz`           | GET    | no   | 200 `{"status":"ok"}` |
/// | `/readyz`            | GET    | no   | 200 `{"status":"ready"}`, 503 `{"status":"draining"}` |
///
/// Errors: unknown path 404, wrong method 405 (with `Allow`), missing or wrong key 401 (with
/// `WWW-Authenticate: Bearer`), POST without Content-Length 411, bad JSON 400, body over the
/// limit 413 (from the parser), sink unavailable 503 (with `Retry-After`). Every error body is
/// `{"error":"<code>"}`, sometimes with a `"reason"`.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "proto/http_request.hpp"

namespace wspush::server {

class metrics_registry;
class counter;

/// What a publish came to. `id_or_error` is the id (ok) or a short error code such as
/// "forbidden" (bad_request; empty means "bad_request"); it must stay valid until the sink's
/// next publish call: the admin thread copies it into the response at once.
struct publish_outcome {
  /// timeout: handed on (to Redis) and no answer came: it may have been published, so a retry
  /// may publish it twice (504). unavailable: it was not published (503, retry).
  enum kind_t : std::uint8_t { ok, bad_request, unavailable, timeout } kind;
  std::string_view id_or_error;
};

/// Where the admin API's publishes go. The lead implements it over the hub and the bus.
class publish_sink {
 public:
  virtual ~publish_sink() = default;
  /// Called on the admin thread only. `topic` is valid (proto/topic.hpp); `data_raw` is the
  /// `data` value exactly as the publisher sent it, validated JSON, byte for byte. Both views
  /// are valid only during the call.
  virtual publish_outcome publish(std::string_view topic, std::string_view data_raw) noexcept = 0;
  /// After the last publish of a request (one for /publish, once per /publish/batch): the
  /// moment to wake the shards once for everything just posted.
  virtual void end_batch() noexcept {}
  /// Whether publishes can be taken now (false while a bus outside the process is down):
  /// /readyz answers 503 while it is not.
  virtual bool ready() const noexcept { return true; }
  /// A first pass over a batch (/publish/batch), before any publish() of it: a sink that sends
  /// to a bus may send them all back to back here; publish() then takes their answers, in the
  /// same order. Called only when wants_prepare().
  virtual bool wants_prepare() const noexcept { return false; }
  virtual void prepare(std::string_view topic, std::string_view data_raw) noexcept {}
};

struct admin_api_options {
  std::string api_key;  // empty: the publish endpoints are open (the listener is loopback by default)
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

  /// Appends the response to a complete request (screened again first). `body_readable`: bytes readable from
  /// req.body.data() (simdjson reads up to 64 bytes past the end; with fewer the body is
  /// copied). Returns true when the connection must close after this response.
  bool respond(const proto::http_request& req, std::size_t body_readable, std::string& out);

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
