// The upgrade phase: gather and parse the request in place, hand a complete upgrade to a
// worker, and on its return open the WebSocket phase (or answer an HTTP error and close).

#include "server/conn/http_phase.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "proto/sse.hpp"
#include "proto/topic.hpp"
#include "proto/ws_deflate.hpp"
#include "proto/ws_handshake.hpp"
#include "server/base/clock.hpp"
#include "server/base/log.hpp"
#include "server/base/random.hpp"
#include "server/conn/compression.hpp"
#include "server/conn/connections.hpp"
#include "server/conn/static_site.hpp"
#include "server/conn/upgrade_runner.hpp"
#include "server/conn/ws_phase.hpp"

namespace wspush::server {

http_phase::http_phase(connections& c, ws_phase& ws) noexcept
    : _c(c), _ws(ws), _rand((std::uint64_t(reinterpret_cast<std::uintptr_t>(this)) ^ monotonic_ns()) | 1) {}

void http_phase::on_bytes(std::uint32_t slot, std::span<const std::uint8_t> bytes) noexcept {
  connection& c = _c.at(slot);
  upgrade_job_ref& job = c.rx.job;
  if (!job) {
    job = upgrade_job_ref::make(_c.buffers(), std::max<std::size_t>(bytes.size(), 1024));
    if (!job) return _c.close_now(slot);
    job->parser = proto::upgrade_parser(_c.options().max_request_bytes);
  }
  if (!job.reserve_tail(job->len, std::size_t(job->len) + bytes.size())) return _c.close_now(slot);
  std::memcpy(job.tail() + job->len, bytes.data(), bytes.size());
  job->len += std::uint32_t(bytes.size());

  proto::upgrade_request req;
  auto r = job->parser.parse({reinterpret_cast<const char*>(job.tail()), job->len}, req);
  switch (r.outcome) {
    case proto::upgrade_outcome::need_more: return;
    case proto::upgrade_outcome::error: return answer(slot, r.status, r.reason);
    case proto::upgrade_outcome::plain_http:
      if (!_c.options().sse_path.empty() && req.path == _c.options().sse_path) return open_stream(slot, req, r.consumed);
      if (req.path == _c.options().ws_path)
        return answer(slot, 426, "This is a WebSocket endpoint: connect with Upgrade: websocket\n",
                      "Upgrade: websocket\r\n");
      if (const static_file* f = _site ? _site->find(req.path) : nullptr) return serve(slot, *f, req.method, req.if_none_match);
      return answer(slot, 404, "not found\n");
    case proto::upgrade_outcome::websocket: {
      if (req.path != _c.options().ws_path) return answer(slot, 404, "not found: WebSocket clients connect to the server's --ws-path\n");
      if (over_rate(slot)) return;
      auto offset = [&](std::string_view part) {
        return part.empty() ? 0u : std::uint32_t(part.data() - reinterpret_cast<const char*>(job.tail()));
      };
      job->consumed = std::uint32_t(r.consumed);
      job->key_at = offset(req.key), job->key_len = std::uint32_t(req.key.size());
      job->token_at = offset(req.token), job->token_len = std::uint32_t(req.token.size());
      job->heartbeat = _c.options().text_heartbeat && proto::query_value(req.query, "heartbeat") == "1";
      job->deflate = negotiate(req);
      return dispatch(slot);
    }
  }
}

/// `GET --sse-path?topics=a,b[&since=ID][&token=T]`: the topics and positions are checked and
/// decoded here, behind the request bytes; the token (query, cookie or `Authorization: Bearer`)
/// and the grants are the worker's, as for an upgrade.
void http_phase::open_stream(std::uint32_t slot, const proto::upgrade_request& req, std::uint32_t consumed) noexcept {
  if (req.method != "GET") return answer(slot, 405, "an event stream is opened with GET\n", "Allow: GET\r\n");
  upgrade_job_ref& job = _c.at(slot).rx.job;
  if (job->len != consumed) return answer(slot, 400, "nothing may follow an event stream's request\n");
  std::string_view token = req.token;
  auto bearer = [](std::string_view v) {  // `Bearer` is case-insensitive (RFC 9110 auth-scheme)
    constexpr std::string_view scheme = "bearer ";
    if (v.size() <= scheme.size()) return std::string_view{};
    for (std::size_t i = 0; i < scheme.size(); ++i)
      if ((v[i] | 0x20) != scheme[i]) return std::string_view{};
    return v.substr(scheme.size());
  };
  if (token.empty()) token = bearer(req.authorization);
  const std::string_view topics = proto::query_value(req.query, "topics");
  const bool from_header = !req.last_event_id.empty();
  const std::string_view since = from_header ? req.last_event_id : proto::query_value(req.query, "since");
  if (topics.empty()) return answer(slot, 400, "name the stream's topics: ?topics=mailbox:42,team:7\n");
  auto offset = [&](std::string_view part) {
    return part.empty() ? 0u : std::uint32_t(part.data() - reinterpret_cast<const char*>(job.tail()));
  };
  const std::uint32_t topics_at = offset(topics), since_at = offset(since);
  job->token_at = offset(token), job->token_len = std::uint32_t(token.size());
  // Decoded, they are no longer than on the wire (commas become LFs where they are), and one LF
  // ends the list.
  const std::uint32_t at = job->len;
  const std::size_t room = topics.size() + 1 + since.size();
  if (!job.reserve_tail(job->len, job->len + room)) return _c.close_now(slot);
  char* const base = reinterpret_cast<char*>(job.tail());
  const std::string_view raw_topics(base + topics_at, topics.size()), raw_since(base + since_at, since.size());
  char* out = base + at;
  // Decoded first, then split: a browser's URLSearchParams writes the commas as %2C. (So a
  // topic with a comma in its name cannot be streamed.)
  const std::size_t decoded = proto::percent_decode(raw_topics, {out, raw_topics.size()});
  if (decoded == SIZE_MAX) return answer(slot, 400, "a broken %-escape in topics\n");
  std::string_view names[proto::max_sse_topics];
  std::size_t count = 0;
  for (std::string_view rest(out, decoded);;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (count == proto::max_sse_topics) return answer(slot, 400, "too many topics: a stream names at most 16\n");
    if (!proto::is_valid_topic(item))
      return answer(slot, 400, "a topic is 1-128 bytes of visible ASCII but * \" \\ and , (percent-encoded or not)\n");
    if (std::find(names, names + count, item) != names + count)
      return answer(slot, 400, "a topic named twice in one stream\n");
    names[count++] = item;
    if (comma == std::string_view::npos) break;
    out[item.data() - out + item.size()] = '\n';
    rest.remove_prefix(comma + 1);
  }
  out += decoded;
  *out++ = '\n';
  const std::uint32_t topics_len = std::uint32_t(out - (base + at));
  std::size_t since_len = 0;
  if (!since.empty()) {
    since_len = from_header ? raw_since.size() : proto::percent_decode(raw_since, {out, raw_since.size()});
    if (from_header) std::memcpy(out, raw_since.data(), since_len);
    std::string_view positions[proto::max_sse_topics];
    if (since_len == SIZE_MAX || !proto::split_positions({out, since_len}, {positions, count}))
      return answer(slot, 400, from_header ? "malformed Last-Event-ID: not an id this stream's events carry\n"
                                           : "malformed since: one position per topic, joined by commas\n");
  }
  job->sse = true;
  job->sse_topic_count = std::uint8_t(count);
  job->sse_at = at;
  job->sse_topics_len = topics_len;
  job->sse_since_len = std::uint32_t(since_len);
  job->len = at + topics_len + std::uint32_t(since_len);
  job->consumed = consumed;
  if (over_rate(slot)) return;  // a request refused 400 spends none of the rate
  return dispatch(slot);
}

/// permessage-deflate when compression is on and the client offers it in terms this server can
/// take (ws_deflate.hpp); otherwise the connection goes on without it. An offer in a fifth or
/// later Sec-WebSocket-Extensions header is not seen (the parser keeps four).
std::uint8_t http_phase::negotiate(const proto::upgrade_request& req) noexcept {
  const compression* z = _c.compression_of();
  if (!z || !z->on() || req.extension_headers == 0) return 0;
  const std::size_t n = std::min<std::size_t>(req.extension_headers, req.extensions.size());
  bool window = false;
  if (proto::negotiate_deflate(std::span(req.extensions.data(), n), &window) != proto::deflate_offer::accepted) return 0;
  return window ? 2 : 1;
}

void http_phase::dispatch(std::uint32_t slot) noexcept {
  connection& c = _c.at(slot);
  upgrade_job_ref job = std::move(c.rx.job);
  job->token = _c.token_of(slot);
  _c.set_state(slot, conn_state::upgrade_pending);
  _c.pause_reading(slot);  // frames behind the request wait in the kernel, not in our memory
  if (!_runner->run(std::move(job))) {
    _held_back = true;
    _c.loop().pause_accepting(1);  // saturated: keep new connections in the kernel's backlog
  }
}

void http_phase::retry() noexcept {
  if (!_held_back) return;
  _held_back = !_runner->retry();
  if (_held_back) _c.loop().pause_accepting(1);
}

void http_phase::on_early_bytes(std::uint32_t slot, std::span<const std::uint8_t> bytes) noexcept {
  pool::lease& early = _c.at(slot).rx.early;
  std::size_t have = early.size();
  if (have + bytes.size() > max_early_bytes) {
    // Reading stopped when the request went to the worker; this many bytes cannot have been
    // on their way then. Answered, never dropped silently.
    return answer(slot, 400, "too many bytes before the upgrade completed\n");
  }
  if (!early) early = _c.buffers().acquire(std::max<std::size_t>(bytes.size(), 1024));
  if (!early || (have + bytes.size() > early.capacity() && !early.reserve(have + bytes.size())))
    return _c.close_now(slot);
  std::memcpy(early.data() + have, bytes.data(), bytes.size());
  early.set_size(have + bytes.size());
}

void http_phase::on_upgraded(upgrade_job_ref&& job) noexcept {
  // The worker counted the token's user: it is left here unless the application takes it.
  struct user_hold {
    upgrade_job& j;
    ~user_hold() {
      if (j.users) j.users->leave(j.user);
    }
  } hold{*job};
  std::uint32_t slot = _c.lookup(job->token);
  if (slot == no_index || _c.at(slot).state != conn_state::upgrade_pending) return;  // closed meanwhile
  if (_c.draining()) return answer(slot, 503, "shutting down, retry later\n", "Retry-After: 5\r\n");
  upgrade_job& j = *job;
  if (j.status == 429) {  // the user's connections are all open elsewhere: come back later, not at once
    char header[40];
    const int n = std::snprintf(header, sizeof header, "Retry-After: %u\r\n", unsigned(5 + next_random(_rand) % 26));
    return answer(slot, 429, {j.reason, j.reason_len}, {header, std::size_t(n)});
  }
  if (j.revoked) {  // a 401 like any bad token's, counted as what it is
    _c.counters_mut().upgrades_revoked.add();
    return respond(slot, j.status, {j.reason, j.reason_len}, {}, "text/plain");
  }
  if (j.status != 101) return answer(slot, j.status, {j.reason, j.reason_len});
  auto text = [&](std::uint32_t at, std::uint32_t len) {
    return std::string_view(reinterpret_cast<const char*>(job.tail()) + at, len);
  };
  open_info info{j.exp, text(j.grants_at, j.topics_len), text(j.grants_at + j.topics_len, j.pub_len), j.user, j.iat};
  pool::lease response = _c.buffers().acquire(j.response_len);
  if (!response) return answer(slot, 500, "internal error\n");
  if (!_c.app().on_open(slot, info)) {
    if (!info.revoked) return answer(slot, 500, "internal error\n");
    _c.counters_mut().upgrades_revoked.add();  // revoked while its token was being checked
    return respond(slot, 401, "token revoked", {}, "text/plain");
  }
  j.users = nullptr;  // the application has the user now: it leaves it when the connection closes
  _c.opened(slot);
  if (j.sse) {
    if (_c.at(slot).rx.early) return answer(slot, 400, "nothing may follow an event stream's request\n");
    std::memcpy(response.data(), j.response, j.response_len);
    response.set_size(j.response_len);
    return start_stream(slot, job, std::move(response));
  }
  if (j.heartbeat) _c.at(slot).flags |= flag_text_heartbeat;
  if (j.deflate) _c.negotiated_deflate(slot);
  std::memcpy(response.data(), j.response, j.response_len);
  response.set_size(j.response_len);
  connection& c = _c.at(slot);
  _c.counters_mut().upgrades_ok.add();
  pool::lease early = std::move(c.rx.early);  // bytes that arrived while the worker ran
  _c.set_state(slot, conn_state::open);
  _c.queue(slot, pool::frame_ref::adopt(std::move(response)), true);
  // Frame bytes that came with the request, then those that came while the worker ran.
  _ws.start(slot, {job.tail() + j.consumed, j.len - j.consumed});
  if (early && _c.at(slot).state == conn_state::open && _c.at(slot).gen == token_gen(j.token))
    _ws.on_bytes(slot, early.bytes());
}

/// An event stream's 200 is queued (before the connection is marked a stream: it goes as it
/// is), then the stream starts: its `sub` goes to the application.
void http_phase::start_stream(std::uint32_t slot, const upgrade_job_ref& job, pool::lease&& response) noexcept {
  const upgrade_job& j = *job;
  _c.counters_mut().upgrades_ok.add();
  _c.at(slot).rx.early.reset();  // a stream's client sends nothing after its request
  _c.set_state(slot, conn_state::open);
  _c.queue(slot, pool::frame_ref::adopt(std::move(response)), true);
  if (_c.at(slot).state != conn_state::open) return;
  _c.stream_opened(slot);
  _ws.start(slot, {});  // the keepalive and the token's expiry, as for a WebSocket
  if (_c.at(slot).state != conn_state::open) return;
  const char* base = reinterpret_cast<const char*>(job.tail());
  std::string_view topics[proto::max_sse_topics], positions[proto::max_sse_topics];
  std::string_view list(base + j.sse_at, j.sse_topics_len);
  const std::size_t n = j.sse_topic_count;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t lf = list.find('\n');
    topics[k] = list.substr(0, lf);
    list.remove_prefix(lf + 1);
  }
  if (j.sse_since_len) proto::split_positions({base + j.sse_at + j.sse_topics_len, j.sse_since_len}, {positions, n});
  _c.sse().start(slot, {topics, n}, {positions, n});
}

/// A static file: 200 with its ETag, or 304 when the client already holds that version. The
/// connection ends after it (browsers open another for the next file: there are three).
void http_phase::serve(std::uint32_t slot, const static_file& f, std::string_view method,
                       std::string_view if_none_match) noexcept {
  if (method != "GET") return answer(slot, 405, "only GET here\n", "Allow: GET\r\n");
  char headers[160];
  const int n = std::snprintf(headers, sizeof headers, "ETag: %.*s\r\nCache-Control: no-cache\r\n",
                              int(f.etag.size()), f.etag.data());
  const std::string_view extra(headers, n > 0 && std::size_t(n) < sizeof headers ? std::size_t(n) : 0);
  const bool fresh = if_none_match == "*" || (!if_none_match.empty() && if_none_match.find(f.etag) != std::string_view::npos);
  if (fresh) return answer(slot, 304, {}, extra, f.content_type);
  answer(slot, 200, f.body, extra, f.content_type);
}

/// --log-level=debug: a line per refused request (its status and why).
void http_phase::log_refusal(std::uint16_t status, std::string_view why) noexcept {
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.remove_suffix(1);
  if (why.size() > 200) why = why.substr(0, 200);
  log(log_level::debug, "upgrade refused: %u %.*s", unsigned(status), int(why.size()), why.data());
}

void http_phase::count_refusal(std::uint16_t status) noexcept {
  if (status < 400) return;  // a static file served
  conn_counters& n = _c.counters_mut();
  if (status == 401) n.upgrades_unauthorized.add();
  else if (status == 429) n.upgrades_user_limit.add();
  else if (status == 503) n.upgrades_over_capacity.add();
  else if (status >= 500) n.upgrades_error.add();
  else n.upgrades_bad_request.add();
}

/// --upgrade-rate: past it the upgrade is refused 503, with a Retry-After drawn so that the
/// refused come back spread over the time the gate needs for them (rate_gate::retry_after).
bool http_phase::over_rate(std::uint32_t slot) noexcept {
  rate_gate* gate = _c.upgrade_gate();
  if (!gate || gate->admit(std::int64_t(monotonic_ns()))) return false;
  char header[40];
  const int n = std::snprintf(header, sizeof header, "Retry-After: %u\r\n", unsigned(gate->retry_after(next_random(_rand))));
  _c.counters_mut().upgrades_rate_limited.add();
  log_refusal(503, "--upgrade-rate reached");
  respond(slot, 503, "too many connections opening this second: retry after the seconds Retry-After says\n",
          {header, std::size_t(n)}, "text/plain");
  return true;
}

void http_phase::answer(std::uint32_t slot, std::uint16_t status, std::string_view body,
                        std::string_view extra_headers, std::string_view content_type) noexcept {
  count_refusal(status);
  if (status >= 400) log_refusal(status, body);
  respond(slot, status, body, extra_headers, content_type);
}

void http_phase::respond(std::uint32_t slot, std::uint16_t status, std::string_view body,
                         std::string_view extra_headers, std::string_view content_type) noexcept {
  pool::lease l = _c.buffers().acquire(512 + body.size() + extra_headers.size());
  std::size_t n = l ? proto::encode_http_response_typed(status, content_type,
                                                        {reinterpret_cast<char*>(l.data()), l.capacity()}, body,
                                                        extra_headers)
                    : 0;
  if (n == 0) return _c.close_now(slot);
  l.set_size(n);
  connection& c = _c.at(slot);
  c.drop_rx();
  _c.set_state(slot, conn_state::closing);
  // Send the answer, then half-close and read until the peer closes (or the close timeout):
  // closing with unread request bytes would reset the connection and lose the answer.
  c.flags |= flag_read_broken | flag_linger_when_flushed;
  _c.loop().arm(slot, _c.loop().ticks_for(_c.options().close_timeout));
  _c.queue(slot, pool::frame_ref::adopt(std::move(l)), true);
}

}  // namespace wspush::server
