// The upgrade phase. The loop gathers the request and parses it (cheap, and it must know
// where the request ends); a complete, valid upgrade goes to a pool worker for the costly
// part (SHA-1 now, the token signature later) and comes back through the inbox. When the
// pool is saturated the shard stops accepting until it has room again, as the Go design
// this descends from did: new connections wait in the kernel's backlog, not in our memory.

#include <cstring>
#include <ctime>

#include "proto/ws_handshake.hpp"
#include "server/app/log.hpp"
#include "server/conn/shard.hpp"
#include "server/conn/shard_internal.hpp"

namespace wspush::server {
namespace {

constexpr std::uint32_t max_early_bytes = 64 * 1024;  // frames sent before our 101 arrives

/// The token check: none with --auth=none, else a valid, unexpired HS256 token from the
/// query or the cookie, whose grants and expiry are appended to the job (the lease may move:
/// `l` is updated). False with the job's status/reason set when the upgrade is refused.
bool check_token(const proto::jwt_verifier* tokens, pool::lease& l) noexcept {
  if (!tokens) return true;
  upgrade_job* j = block_as<upgrade_job>(l);
  std::string_view token = j->text(j->token_at, j->token_len);
  if (token.empty()) {
    j->status = 401, j->reason = "missing token (?token= or cookie wspush_token)";
    return false;
  }
  char storage[proto::jwt_claims_storage_bytes];
  proto::jwt_claims claims;
  auto r = tokens->verify(token, std::int64_t(std::time(nullptr)), storage, claims);
  if (!r.ok()) {
    j->status = 401, j->reason = r.message;  // static text
    return false;
  }
  std::string_view topics = claims.topics.bytes(), pub = claims.pub.bytes();
  std::size_t at = sizeof(upgrade_job) + j->len;
  l.set_size(at);
  if (!l.reserve(at + topics.size() + pub.size())) return false;  // status stays 500
  j = block_as<upgrade_job>(l);
  if (!topics.empty()) std::memcpy(l.data() + at, topics.data(), topics.size());
  if (!pub.empty()) std::memcpy(l.data() + at + topics.size(), pub.data(), pub.size());
  l.set_size(at + topics.size() + pub.size());
  j->grants_at = j->len;
  j->topics_len = std::uint32_t(topics.size());
  j->pub_len = std::uint32_t(pub.size());
  j->exp = claims.exp;
  return true;
}

/// Runs on a pool worker: the request's costly part (token signature, SHA-1 of the key),
/// then back to the owning shard. Touches nothing but the job block.
void run_upgrade_job(pool::buffer_pool& buffers, const proto::jwt_verifier* tokens, void* raw) noexcept {
  pool::lease l = pool::lease::from_raw(raw);
  if (check_token(tokens, l)) {
    upgrade_job& j = *block_as<upgrade_job>(l);
    pool::lease resp = buffers.acquire(256);
    std::size_t n = resp ? proto::encode_switching_protocols(
                               j.text(j.key_at, j.key_len), {reinterpret_cast<char*>(resp.data()), resp.capacity()})
                         : 0;
    if (n) {
      resp.set_size(n);
      j.response = pool::frame_ref::adopt(std::move(resp)).release_raw();
      j.status = 101;
    }
  }
  upgrade_job& j = *block_as<upgrade_job>(l);
  j.owner->post({inbox_item::upgrade_done, l.release_raw()});
}

/// Upgrades refused with an HTTP answer, by the kind of refusal (docs/METRICS.md).
void count_refusal(shard_counters& n, std::uint16_t status) noexcept {
  if (status == 401) n.upgrades_unauthorized.add();
  else if (status == 503) n.upgrades_over_capacity.add();
  else if (status >= 500) n.upgrades_error.add();
  else n.upgrades_bad_request.add();
}

}  // namespace

void shard::upgrade_read(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept {
  connection& c = _conns.at(i);
  if (!c.rx) {
    c.rx = _g.buffers->acquire(sizeof(upgrade_job) + std::max<std::size_t>(bytes.size(), 1024));
    if (!c.rx) return close_now(i);
    new (c.rx.data()) upgrade_job{};
    block_as<upgrade_job>(c.rx)->parser = proto::upgrade_parser(_cfg.max_request_bytes);
  }
  std::size_t need = sizeof(upgrade_job) + block_as<upgrade_job>(c.rx)->len + bytes.size();
  c.rx.set_size(need - bytes.size());
  if (need > c.rx.capacity() && !c.rx.reserve(std::max(need, c.rx.capacity() * 2))) return close_now(i);
  upgrade_job& j = *block_as<upgrade_job>(c.rx);
  std::memcpy(j.bytes() + j.len, bytes.data(), bytes.size());
  j.len += std::uint32_t(bytes.size());
  c.rx.set_size(need);

  proto::upgrade_request req;
  auto r = j.parser.parse({reinterpret_cast<const char*>(j.bytes()), j.len}, req);
  switch (r.outcome) {
    case proto::upgrade_outcome::need_more: return;
    case proto::upgrade_outcome::error: return answer_http(i, r.status, r.reason);
    case proto::upgrade_outcome::plain_http:
      return answer_http(i, 426, "This is a WebSocket endpoint: connect with Upgrade: websocket\n",
                         "Upgrade: websocket\r\n");
    case proto::upgrade_outcome::websocket:
      j.consumed = r.consumed;
      j.note(req.key, j.key_at, j.key_len);
      j.note(req.token, j.token_at, j.token_len);
      return upgrade_dispatch(i);
  }
}

void shard::upgrade_dispatch(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  upgrade_job& j = *block_as<upgrade_job>(c.rx);
  j.owner = this;
  j.token = token_of(i);
  set_state(i, conn_state::upgrade_pending);
  void* raw = c.rx.release_raw();
  if (!_retry.empty() || !schedule_upgrade(raw)) {
    _retry.push_back(raw);
    pause_accepting(1);
  }
}

bool shard::schedule_upgrade(void* raw) noexcept {
  pool::buffer_pool* buffers = _g.buffers;
  const proto::jwt_verifier* tokens = _g.tokens;
  return _g.tasks->try_schedule([buffers, tokens, raw] { run_upgrade_job(*buffers, tokens, raw); });
}

void shard::retry_upgrades() noexcept {
  std::size_t k = 0;
  while (k < _retry.size() && schedule_upgrade(_retry[k])) ++k;
  _retry.erase(_retry.begin(), _retry.begin() + k);
  if (!_retry.empty()) pause_accepting(1);  // still saturated: keep the backlog in the kernel
}

void shard::upgrade_done(void* raw) noexcept {
  pool::lease l = pool::lease::from_raw(raw);
  upgrade_job& j = *block_as<upgrade_job>(l);
  pool::frame_ref response = j.response ? pool::frame_ref::from_raw(j.response) : pool::frame_ref{};
  std::uint32_t i = lookup(j.token);
  if (i == no_index || _conns.at(i).state != conn_state::upgrade_pending) return;  // closed meanwhile
  connection& c = _conns.at(i);
  if (j.status != 101) return answer_http(i, j.status, j.status == 500 ? "internal error\n" : j.reason);
  if (_g.tokens && !_sessions.set(i, j.exp, j.text(j.grants_at, j.topics_len), j.text(j.grants_at + j.topics_len, j.pub_len)))
    return answer_http(i, 500, "internal error\n");
  _n.upgrades_ok.add();
  c.last_rx = _wheel.now();
  arm_open(i, ticks_for(_cfg.ping_interval));  // keepalive from here on (or the token's expiry)
  pool::lease early = std::move(c.rx);  // bytes that arrived while the worker ran
  set_state(i, conn_state::open);
  queue(i, std::move(response));
  if (j.consumed < j.len) ws_read(i, {j.bytes() + j.consumed, j.len - j.consumed});
  if (early && _conns.at(i).state == conn_state::open && _conns.at(i).gen == token_gen(j.token))
    ws_read(i, early.bytes());
}

void shard::answer_http(std::uint32_t i, std::uint16_t status, std::string_view body,
                        std::string_view extra_headers) noexcept {
  connection& c = _conns.at(i);
  count_refusal(_n, status);
  c.rx.reset();  // an upgrade_job: trivially destructible
  pool::lease l = _g.buffers->acquire(512 + body.size());
  std::size_t n = l ? proto::encode_http_response(status, {reinterpret_cast<char*>(l.data()), l.capacity()}, body,
                                                  extra_headers)
                    : 0;
  if (n == 0) return close_now(i);
  l.set_size(n);
  set_state(i, conn_state::closing);
  // Send the answer, then half-close and read until the peer closes (or the close timeout):
  // closing with unread request bytes would reset the connection and lose the answer.
  c.flags |= flag_read_broken | flag_linger_when_flushed;
  _wheel.arm(i, ticks_for(_cfg.close_timeout));
  queue(i, pool::frame_ref::adopt(std::move(l)));
}

void shard::on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept {
  std::uint32_t i = lookup(t);
  if (i == no_index) return;
  connection& c = _conns.at(i);
  _n.bytes_in.add(bytes.size());
  switch (c.state) {
    case conn_state::upgrading: return upgrade_read(i, bytes);
    case conn_state::upgrade_pending: {
      std::size_t have = c.rx ? c.rx.size() : 0;
      if (have + bytes.size() > max_early_bytes) return close_now(i);
      if (!c.rx) c.rx = _g.buffers->acquire(std::max<std::size_t>(bytes.size(), 1024));
      if (!c.rx || (have + bytes.size() > c.rx.capacity() && !c.rx.reserve(have + bytes.size()))) return close_now(i);
      std::memcpy(c.rx.data() + have, bytes.data(), bytes.size());
      c.rx.set_size(have + bytes.size());
      return;
    }
    case conn_state::open:
      c.last_rx = _wheel.now();  // any bytes prove the peer alive (an answer to our ping too)
      c.flags &= ~flag_ping_sent;
      return ws_read(i, bytes);
    case conn_state::closing: return ws_read(i, bytes);
    default: return;
  }
}

}  // namespace wspush::server
