#include "server/admin/admin_api.hpp"

#include <unordered_map>
#include <vector>

#include <simdjson.h>

#include "proto/envelope.hpp"
#include "proto/http_upgrade.hpp"
#include "proto/sse.hpp"
#include "proto/topic.hpp"
#include "proto/ws_handshake.hpp"
#include "server/admin/metrics.hpp"

// Publish bodies are read twice, both times at GB/s: a DOM parse validates the whole document
// (simdjson's On Demand API checks only what it visits, and `data` goes to clients byte for
// byte, so it must be valid JSON), then an On Demand walk finds `topic` and the raw bytes of
// `data` in place. Both parsers keep their buffers between requests: after the first request
// of a given size, a publish allocates only its response text.
//
// A sink that answers later (the Redis bus) makes a request `pending`: what is known of its
// answer is kept by the connection's tag (a batch: the text up to its first pending line, then
// one entry per line), and each pending line's ticket points back at it. Only such requests
// allocate for it; a sink that answers at once takes the path above unchanged.

namespace wspush::server {
namespace {

constexpr std::string_view k_json = "application/json";

enum class route : std::uint8_t { none, publish, publish_batch, metrics, healthz, readyz, presence, disconnect };

route find_route(std::string_view path) noexcept {
  if (path == "/publish") return route::publish;
  if (path == "/publish/batch") return route::publish_batch;
  if (path == "/metrics") return route::metrics;
  if (path == "/healthz") return route::healthz;
  if (path == "/readyz") return route::readyz;
  if (path == "/presence") return route::presence;
  if (path == "/disconnect") return route::disconnect;
  return route::none;
}

/// `"..."` with JSON escapes: quote, backslash and control bytes (ids and codes are plain
/// ASCII in practice; this keeps a surprising one from breaking the document).
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

/// `{"error":"<code>"}` or `{"error":"<code>","reason":"<reason>"}`.
std::string error_body(std::string_view code, std::string_view reason = {}) {
  std::string b = "{\"error\":";
  append_json_string(b, code);
  if (!reason.empty()) {
    b += ",\"reason\":";
    append_json_string(b, reason);
  }
  return b += '}';
}

/// Constant-time for keys of the same length: a wrong key takes as long however much of it
/// matched. (The length itself is not secret enough to hide; keys are long random strings.)
bool same_key(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/// `Authorization: Bearer <key>` (scheme case-insensitive, RFC 6750 §2.1).
std::string_view bearer_token(std::string_view value) noexcept {
  if (value.size() < 7) return {};
  for (std::size_t i = 0; i < 6; ++i)
    if ((value[i] | 0x20) != "bearer"[i]) return {};
  if (value[6] != ' ') return {};
  value.remove_prefix(7);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  return value;
}

std::string_view trim_json_space(std::string_view s) noexcept {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

void append_http_response(std::string& out, std::uint16_t status, std::string_view content_type,
                          std::string_view body, bool close, std::string_view extra_headers) {
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out += proto::status_reason(status);
  out += "\r\nContent-Type: ";
  out += content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(body.size());
  out += "\r\nCache-Control: no-store\r\n";
  if (close) out += "Connection: close\r\n";
  out += extra_headers;
  out += "\r\n";
  out += body;
}

namespace {

/// A request whose publishes wait for the sink: what is known of its answer so far.
struct waiting_request {
  struct entry {
    publish_outcome::kind_t kind;
    std::uint64_t ticket;  // while pending
    std::string text;      // the id or the error code
  };
  bool batch = false, close = false;
  std::uint32_t unsettled = 0;  // entries still pending
  std::size_t lines = 0, unavailable = 0;  // a batch's lines before `rest`
  std::string head;          // a batch's answer up to its first pending line
  std::vector<entry> rest;   // from the first pending line on, in order
};

}  // namespace

struct admin_api::state {
  state(admin_api_options o, publish_sink& s, metrics_registry* m, const std::atomic<bool>& d)
      : opt(std::move(o)), sink(s), metrics(m), draining(d), api_key(std::make_shared<const std::string>(opt.api_key)) {}

  admin_api_options opt;  // its api_key as at start: api_key says what it is now
  publish_sink& sink;
  metrics_registry* metrics;
  const std::atomic<bool>& draining;
  std::atomic<std::shared_ptr<const std::string>> api_key;  // SIGHUP replaces it whole (key rotation)
  simdjson::dom::parser validator;
  simdjson::ondemand::parser reader;
  std::string scratch;  // a padded copy of a body that came without readable padding
  std::string text;     // response body under construction, reused
  counter* requests[3] = {};   // 2xx, 4xx, 5xx
  counter* publishes[4] = {};  // ok, bad_request, unavailable, timeout (publish_outcome::kind_t order)
  gauge* waiting_gauge = nullptr;
  std::unordered_map<std::uint64_t, waiting_request> waiting;  // by tag
  struct ticket_ref {
    std::uint64_t tag;
    std::uint32_t entry;
  };
  std::unordered_map<std::uint64_t, ticket_ref> tickets;  // pending publishes: ticket -> where it answers

  void reply(std::string& out, std::uint16_t status, std::string_view type, std::string_view body, bool close,
             std::string_view extra = {}) {
    if (requests[0]) requests[status >= 500 ? 2 : status >= 400 ? 1 : 0]->inc();
    append_http_response(out, status, type, body, close, extra);
  }

  /// GET /presence?topic=T[&count=1]: the topic's users and their connections (count=1: the
  /// counts only), as the presence reader writes them.
  void presence(const proto::http_request& req, std::string& out, bool close) {
    char decoded[proto::max_topic_bytes];
    const std::string_view raw = proto::query_value(req.query, "topic");
    const std::size_t n = proto::percent_decode(raw, decoded);
    const std::string_view topic(decoded, n == SIZE_MAX ? 0 : n);
    const std::string_view count = proto::query_value(req.query, "count");
    if (raw.empty() || topic.empty() || !proto::is_valid_topic(topic))
      return reply(out, 400, k_json, error_body("bad_request", "name a valid topic: /presence?topic=mailbox:42"), close);
    if (!count.empty() && count != "1" && count != "0")
      return reply(out, 400, k_json, error_body("bad_request", "count is 1 (the counts only) or 0"), close);
    if (!opt.presence) return reply(out, 404, k_json, error_body("not_enabled", "no topic keeps presence (--presence)"), close);
    text.clear();
    const std::uint16_t status = opt.presence(topic, count == "1", text);
    reply(out, status, k_json, text, close);
  }

  /// What a publish object names: views into the body (or into `reader`'s buffer for a key
  /// written with escapes), valid until the next publish is read.
  struct fields {
    std::string_view topic, data, key;  // key: empty when none
    bool have_topic = false, have_data = false, have_key = false;
  };
  std::string_view extract(std::string_view json, std::size_t readable, fields& out) noexcept;
  std::string_view read_field(simdjson::ondemand::field& f, fields& out) noexcept;
  publish_outcome publish_one(std::string_view json, std::size_t readable, std::string_view& reason) noexcept;
  void count(publish_outcome::kind_t k) noexcept {
    if (publishes[0] && k < publish_outcome::pending) publishes[k]->inc();
  }
  respond_result publish(const proto::http_request& req, std::size_t readable, std::string& out, bool close,
                         std::uint64_t tag);
  respond_result publish_batch(const proto::http_request& req, std::size_t readable, std::string& out, bool close,
                               std::uint64_t tag);
  void reply_publish(std::string& out, publish_outcome r, std::string_view reason, bool close);
  bool too_many_waiting(std::size_t lines) const noexcept {
    return !tickets.empty() && tickets.size() + lines > opt.max_waiting_publishes;
  }
  respond_result refuse_busy(std::string& out, std::size_t lines, bool close);
  respond_result disconnect(const proto::http_request& req, std::size_t readable, std::string& out, bool close);
  waiting_request& open_wait(std::uint64_t tag, bool batch, bool close);
  void add_entry(waiting_request& w, std::uint64_t tag, const publish_outcome& r);
  std::string bus_down_body();
  void take_outcome(waiting_request::entry& e) noexcept;
  void update_gauge() noexcept {
    if (waiting_gauge) waiting_gauge->set(static_cast<double>(tickets.size()));
  }
};

namespace {

std::string_view batch_code(publish_outcome::kind_t kind, std::string_view id_or_error) noexcept {
  return kind == publish_outcome::unavailable ? "unavailable"
         : kind == publish_outcome::timeout   ? "timeout"
         : id_or_error.empty()               ? "bad_request"
                                             : id_or_error;
}

/// One entry of a batch's results (after a comma if it is not the first).
void append_batch_entry(std::string& text, bool first, publish_outcome::kind_t kind, std::string_view id_or_error) {
  if (!first) text += ',';
  if (kind == publish_outcome::ok) {
    text += "{\"id\":";
    append_json_string(text, id_or_error);
    text += '}';
  } else {
    text += error_body(batch_code(kind, id_or_error));
  }
}

/// Non-blank lines of an NDJSON body: the publishes a batch would leave waiting.
std::size_t count_lines(std::string_view body) noexcept {
  std::size_t n = 0;
  while (!body.empty()) {
    const std::size_t lf = body.find('\n');
    n += body.substr(0, lf).find_first_not_of(" \t\r") != std::string_view::npos;
    body.remove_prefix(lf == std::string_view::npos ? body.size() : lf + 1);
  }
  return n;
}

}  // namespace

/// One field of a publish object: `topic`, `data` and `idempotency_key` are taken (each at most
/// once), others skipped. Returns a reason on failure.
std::string_view admin_api::state::read_field(simdjson::ondemand::field& f, fields& out) noexcept {
  namespace od = simdjson::ondemand;
  std::string_view key;
  if (f.unescaped_key().get(key)) return "malformed JSON";
  od::value& v = f.value();
  if (key == "topic") {
    if (out.have_topic) return "repeated topic";
    out.have_topic = true;
    return v.get_string().get(out.topic) ? "topic is not a string" : "";
  }
  if (key == "idempotency_key") {
    if (out.have_key) return "repeated idempotency_key";
    out.have_key = true;
    if (v.get_string().get(out.key) || !proto::is_valid_idempotency_key(out.key))
      return "idempotency_key must be a string of 1 to 128 bytes of printable ASCII";
    return "";
  }
  if (key != "data") return "";
  if (out.have_data) return "repeated data";
  out.have_data = true;
  std::string_view& data = out.data;
  od::json_type t;
  if (v.type().get(t)) return "malformed JSON";
  // raw_json and raw_json_token both run up to the next structural character: trim the
  // whitespace before it, so that `data` ends with the value's last byte.
  if (t == od::json_type::object) {
    od::object o;
    if (v.get_object().get(o) || o.raw_json().get(data)) return "malformed JSON";
  } else if (t == od::json_type::array) {
    od::array a;
    if (v.get_array().get(a) || a.raw_json().get(data)) return "malformed JSON";
  } else {
    data = v.raw_json_token();
  }
  data = trim_json_space(data);
  return "";
}

/// `{"topic":"...","data":...[,"idempotency_key":"..."]}` → topic, the raw bytes of data and
/// the key; a reason when it is not.
std::string_view admin_api::state::extract(std::string_view json, std::size_t readable, fields& out) noexcept {
  const char* p = json.data();
  if (readable < json.size() + simdjson::SIMDJSON_PADDING) {
    scratch.assign(json);
    scratch.resize(json.size() + simdjson::SIMDJSON_PADDING, ' ');
    p = scratch.data();
    readable = scratch.size();
  }
  simdjson::dom::element root;
  if (validator.parse(p, json.size(), false).get(root)) return "malformed JSON";
  if (!root.is_object()) return "body is not a JSON object";
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  if (reader.iterate(p, json.size(), readable).get(doc) || doc.get_object().get(obj)) return "malformed JSON";
  for (auto item : obj) {
    simdjson::ondemand::field f;
    if (std::move(item).get(f)) return "malformed JSON";
    if (const std::string_view why = read_field(f, out); !why.empty()) return why;
  }
  if (!out.have_topic) return "topic missing";
  if (!proto::is_valid_topic(out.topic)) return "invalid topic";
  if (!out.have_data) return "data missing";
  return "";
}

publish_outcome admin_api::state::publish_one(std::string_view json, std::size_t readable,
                                              std::string_view& reason) noexcept {
  fields f;
  reason = extract(json, readable, f);
  publish_outcome r = reason.empty() ? sink.publish(f.topic, f.data, f.key) : publish_outcome{publish_outcome::bad_request, {}};
  count(r.kind);
  return r;
}

admin_api::respond_result admin_api::state::refuse_busy(std::string& out, std::size_t lines, bool close) {
  if (publishes[0]) publishes[publish_outcome::unavailable]->inc(lines);
  reply(out, 503, k_json, error_body("unavailable", "too many publishes waiting for the bus"), close,
        "Retry-After: 1\r\n");
  return close ? respond_result::close : respond_result::keep_open;
}

waiting_request& admin_api::state::open_wait(std::uint64_t tag, bool batch, bool close) {
  waiting_request& w = waiting[tag];
  w = waiting_request{};
  w.batch = batch;
  w.close = close;
  return w;
}

void admin_api::state::add_entry(waiting_request& w, std::uint64_t tag, const publish_outcome& r) {
  w.rest.push_back({r.kind, r.ticket, std::string(r.id_or_error)});
  if (r.kind != publish_outcome::pending) return;
  tickets[r.ticket] = ticket_ref{tag, static_cast<std::uint32_t>(w.rest.size() - 1)};
  ++w.unsettled;
}

/// The sink's outcome of a pending entry (settled, or given up on: see publish_sink::collect).
void admin_api::state::take_outcome(waiting_request::entry& e) noexcept {
  publish_outcome r = sink.collect(e.ticket);
  if (r.kind == publish_outcome::pending) r = {publish_outcome::timeout, {}};  // a sink that broke its word
  e.kind = r.kind;
  try {
    e.text.assign(r.id_or_error);
  } catch (...) {
    e.text.clear();
  }
  count(r.kind);
}

/// /readyz while the bus is down: {"status":"bus_down"}, with the reason when the sink has one.
std::string admin_api::state::bus_down_body() {
  std::string b = "{\"status\":\"bus_down\"";
  try {
    const std::string why = sink.not_ready_reason();
    if (!why.empty()) {
      b += ",\"reason\":";
      append_json_string(b, why);
    }
  } catch (...) {
  }
  return b += '}';
}

void admin_api::state::reply_publish(std::string& out, publish_outcome r, std::string_view reason, bool close) {
  if (r.kind == publish_outcome::ok) {
    text = "{\"id\":";
    append_json_string(text, r.id_or_error);
    text += '}';
    return reply(out, 200, k_json, text, close);
  }
  if (r.kind == publish_outcome::unavailable)
    return reply(out, 503, k_json, error_body("unavailable"), close, "Retry-After: 1\r\n");
  if (r.kind == publish_outcome::timeout)
    return reply(out, 504, k_json,
                 error_body("timeout", r.id_or_error.empty() ? "no answer from the bus in time: it may have been published"
                                                             : r.id_or_error),
                 close);
  const std::string_view code = r.id_or_error.empty() ? "bad_request" : r.id_or_error;
  reply(out, 400, k_json, error_body(code, reason), close);
}

admin_api::respond_result admin_api::state::publish(const proto::http_request& req, std::size_t readable,
                                                    std::string& out, bool close, std::uint64_t tag) {
  if (too_many_waiting(1)) return refuse_busy(out, 1, close);
  std::string_view reason;
  const publish_outcome r = publish_one(req.body, readable, reason);
  sink.end_batch();
  if (r.kind == publish_outcome::pending) {
    add_entry(open_wait(tag, false, close), tag, r);
    update_gauge();
    return respond_result::pending;
  }
  reply_publish(out, r, reason, close);
  return close ? respond_result::close : respond_result::keep_open;
}

/// NDJSON: one publish a line, answered in order. Blank lines are skipped (the NDJSON
/// convention), so a trailing newline adds no entry. 503 only when every line met an
/// unavailable bus: then the whole batch may be retried; otherwise 200, entries say which
/// lines failed. Lines go to the sink one after the other without waiting: a sink that answers
/// later sends them to the bus back to back, and the answer waits for the last.
admin_api::respond_result admin_api::state::publish_batch(const proto::http_request& req, std::size_t readable,
                                                          std::string& out, bool close, std::uint64_t tag) {
  std::string_view body = req.body;
  if (!tickets.empty()) {  // only then can the bound refuse it (the count costs a pass over the body)
    if (const std::size_t n = count_lines(body); too_many_waiting(n)) return refuse_busy(out, n, close);
  }
  std::size_t lines = 0, unavailable = 0;
  waiting_request* w = nullptr;
  text = "{\"results\":[";
  while (!body.empty()) {
    const std::size_t lf = body.find('\n');
    const std::string_view line = trim_json_space(body.substr(0, lf));
    const std::size_t used = lf == std::string_view::npos ? body.size() : lf + 1;
    const std::size_t line_readable = readable - static_cast<std::size_t>(line.data() - req.body.data());
    body.remove_prefix(used);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    std::string_view reason;
    const publish_outcome r = publish_one(line, line_readable, reason);
    if (r.kind == publish_outcome::pending && !w) {  // from here on the answer is kept aside
      w = &open_wait(tag, true, close);
      w->head = text;
      w->lines = lines;
      w->unavailable = unavailable;
    }
    if (w) {
      add_entry(*w, tag, r);
      continue;
    }
    append_batch_entry(text, lines++ == 0, r.kind, r.id_or_error);
    unavailable += r.kind == publish_outcome::unavailable;
  }
  sink.end_batch();
  if (w) {
    update_gauge();
    return respond_result::pending;
  }
  text += "]}";
  const bool all_down = lines != 0 && unavailable == lines;
  reply(out, all_down ? 503 : 200, k_json, text, close, all_down ? "Retry-After: 1\r\n" : "");
  return close ? respond_result::close : respond_result::keep_open;
}

/// `{"sub":"<user>"}`: the user is revoked (admin_api.hpp revoke_sink). 400 when the body is not
/// such an object; a user with no connection is revoked all the same (`{"disconnected":0}`).
admin_api::respond_result admin_api::state::disconnect(const proto::http_request& req, std::size_t readable,
                                                       std::string& out, bool close) {
  constexpr std::size_t max_sub_bytes = 1024;
  const std::string_view json = req.body;
  const char* p = json.data();
  if (readable < json.size() + simdjson::SIMDJSON_PADDING) {
    scratch.assign(json);
    scratch.resize(json.size() + simdjson::SIMDJSON_PADDING, ' ');
    p = scratch.data();
  }
  std::string_view why, sub;
  simdjson::dom::element root;
  simdjson::dom::object obj;
  if (validator.parse(p, json.size(), false).get(root)) why = "malformed JSON";
  else if (root.get_object().get(obj)) why = "body is not a JSON object";
  else if (simdjson::dom::element v; obj.at_key("sub").get(v)) why = "sub missing";
  else if (v.get_string().get(sub)) why = "sub is not a string";
  else if (sub.empty() || sub.size() > max_sub_bytes) why = "sub must be a string of 1 to 1024 bytes";
  if (!why.empty()) {
    reply(out, 400, k_json, error_body("bad_request", why), close);
  } else {
    const std::uint32_t n = opt.revoker ? opt.revoker->revoke(sub) : 0;
    text = "{\"disconnected\":" + std::to_string(n) + "}";
    reply(out, 200, k_json, text, close);
  }
  return close ? respond_result::close : respond_result::keep_open;
}

admin_api::admin_api(admin_api_options o, publish_sink& sink, metrics_registry* metrics,
                     const std::atomic<bool>& draining)
    : _s(std::make_unique<state>(std::move(o), sink, metrics, draining)) {
  if (!metrics) return;
  _s->requests[0] = &metrics->add_counter("wspush_admin_requests_total", {}, {{"code", "2xx"}});
  _s->requests[1] = &metrics->add_counter("wspush_admin_requests_total", {}, {{"code", "4xx"}});
  _s->requests[2] = &metrics->add_counter("wspush_admin_requests_total", {}, {{"code", "5xx"}});
  _s->publishes[0] = &metrics->add_counter("wspush_publishes_total", {}, {{"source", "admin"}, {"result", "ok"}});
  _s->publishes[1] =
      &metrics->add_counter("wspush_publishes_total", {}, {{"source", "admin"}, {"result", "bad_request"}});
  _s->publishes[2] =
      &metrics->add_counter("wspush_publishes_total", {}, {{"source", "admin"}, {"result", "unavailable"}});
  _s->publishes[3] = &metrics->add_counter("wspush_publishes_total", {}, {{"source", "admin"}, {"result", "timeout"}});
  _s->waiting_gauge = &metrics->add_gauge("wspush_admin_publishes_waiting");
}

admin_api::~admin_api() = default;

void admin_api::set_api_key(std::string key) {
  _s->api_key.store(std::make_shared<const std::string>(std::move(key)), std::memory_order_release);
}

void admin_api::respond_error(std::uint16_t status, std::string_view reason, std::string& out) {
  const std::string_view code = status == 408 ? "timeout"
                                : status == 413 || status == 431 ? "too_large"
                                : status == 503 ? "unavailable"
                                : status >= 500 ? "not_implemented"
                                                : "bad_request";
  _s->reply(out, status, k_json, error_body(code, reason), true);
}

admin_api::head_verdict admin_api::screen(const proto::http_request& req, std::string& out) {
  state& s = *_s;
  const route r = find_route(req.path);
  // /disconnect is a keyed POST with a body like the publishes.
  const bool is_publish = r == route::publish || r == route::publish_batch || r == route::disconnect;
  const std::shared_ptr<const std::string> key = s.api_key.load(std::memory_order_acquire);
  const bool keyed = !key->empty() && same_key(bearer_token(req.header("authorization")), *key);
  const bool needs_key = is_publish || r == route::presence;  // who is online is the backend's to know
  // An answer that leaves a body unread must close the connection: the body is never read.
  bool close = !req.keep_alive || req.content_length > 0;
  if (r == route::none) {
    s.reply(out, 404, k_json, error_body("not_found"), close);
  } else if (req.method != (is_publish ? "POST" : "GET")) {
    s.reply(out, 405, k_json, error_body("method_not_allowed"), close, is_publish ? "Allow: POST\r\n" : "Allow: GET\r\n");
  } else if (needs_key && !key->empty() && !keyed) {
    // Always closed: a client without the key gets one answer per connection, not a slot to retry in.
    close = true;
    s.reply(out, 401, k_json, error_body("unauthorized"), close, "WWW-Authenticate: Bearer realm=\"wspush\"\r\n");
  } else if (is_publish && !req.has_content_length) {
    s.reply(out, 411, k_json, error_body("length_required"), close);
  } else if (!is_publish && req.content_length > 0) {
    s.reply(out, 400, k_json, error_body("bad_request", "no body expected"), close);
  } else {
    return keyed ? head_verdict::read_body_keyed : head_verdict::read_body;
  }
  return close ? head_verdict::answered_close : head_verdict::answered;
}

admin_api::respond_result admin_api::respond(const proto::http_request& req, std::size_t body_readable,
                                             std::string& out, std::uint64_t tag) {
  state& s = *_s;
  const bool close = !req.keep_alive;
  switch (screen(req, out)) {
    case head_verdict::answered: return close ? respond_result::close : respond_result::keep_open;
    case head_verdict::answered_close: return respond_result::close;
    default: break;
  }
  const route r = find_route(req.path);
  switch (r) {
    case route::publish: return s.publish(req, body_readable, out, close, tag);
    case route::publish_batch: return s.publish_batch(req, body_readable, out, close, tag);
    case route::disconnect: return s.disconnect(req, body_readable, out, close);
    case route::metrics:
      s.text.clear();
      if (s.metrics) s.metrics->render(s.text);
      s.reply(out, 200, metrics_registry::content_type, s.text, close);
      break;
    case route::healthz: s.reply(out, 200, k_json, "{\"status\":\"ok\"}", close); break;
    case route::presence: s.presence(req, out, close); break;
    default:
      if (s.draining.load(std::memory_order_relaxed)) s.reply(out, 503, k_json, "{\"status\":\"draining\"}", close);
      else if (!s.sink.ready()) s.reply(out, 503, k_json, s.bus_down_body(), close, "Retry-After: 1\r\n");
      else if (s.sink.stalled()) s.reply(out, 503, k_json, "{\"status\":\"bus_stalled\"}", close, "Retry-After: 1\r\n");
      else s.reply(out, 200, k_json, "{\"status\":\"ready\"}", close);
  }
  return close ? respond_result::close : respond_result::keep_open;
}

std::uint64_t admin_api::settle(std::uint64_t ticket) {
  state& s = *_s;
  const auto it = s.tickets.find(ticket);
  if (it == s.tickets.end()) return 0;  // given up on already (its answer went out as a timeout)
  const state::ticket_ref ref = it->second;
  s.tickets.erase(it);
  s.update_gauge();
  const auto w = s.waiting.find(ref.tag);
  if (w == s.waiting.end()) return 0;
  s.take_outcome(w->second.rest[ref.entry]);
  return --w->second.unsettled == 0 ? ref.tag : 0;
}

bool admin_api::answer(std::uint64_t tag, std::string& out) {
  state& s = *_s;
  const auto it = s.waiting.find(tag);
  if (it == s.waiting.end()) return false;
  waiting_request& w = it->second;
  for (waiting_request::entry& e : w.rest) {
    if (e.kind != publish_outcome::pending) continue;
    s.tickets.erase(e.ticket);
    s.take_outcome(e);  // the wait ran out: timeout if it reached the bus, else unavailable
  }
  s.update_gauge();
  const bool close = w.close;
  if (!w.batch) {
    s.reply_publish(out, {w.rest.front().kind, w.rest.front().text}, {}, close);
  } else {
    s.text = std::move(w.head);
    for (const waiting_request::entry& e : w.rest) {
      append_batch_entry(s.text, w.lines++ == 0, e.kind, e.text);
      w.unavailable += e.kind == publish_outcome::unavailable;
    }
    s.text += "]}";
    const bool all_down = w.lines != 0 && w.unavailable == w.lines;
    s.reply(out, all_down ? 503 : 200, k_json, s.text, close, all_down ? "Retry-After: 1\r\n" : "");
  }
  s.waiting.erase(it);
  return close;
}

void admin_api::forget(std::uint64_t tag) noexcept {
  state& s = *_s;
  const auto it = s.waiting.find(tag);
  if (it == s.waiting.end()) return;
  for (waiting_request::entry& e : it->second.rest) {
    if (e.kind != publish_outcome::pending) continue;
    s.tickets.erase(e.ticket);
    s.take_outcome(e);  // spends the ticket; one not yet sent is withdrawn
  }
  s.waiting.erase(it);
  s.update_gauge();
}

std::size_t admin_api::waiting_publishes() const noexcept { return _s->tickets.size(); }

}  // namespace wspush::server
