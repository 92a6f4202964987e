/// \file worker.cpp
/// The worker's set-up and its connection life cycle up to "ready" (connected, upgraded and,
/// with pub/sub, subscribed). The receive path and the run phase are in worker_run.cpp.
#include "loadgen/worker.hpp"

#include "loadgen/sys.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

namespace wspush::loadgen {

worker::worker(const options& o, std::uint32_t index, std::uint32_t first, std::uint32_t count, int ctrl_fd,
               int report_fd)
    : _o(o), _conns(count), _rbuf(256 * 1024), _open_limit(o.connect_rate / o.procs, now_ns(),
                                                            std::max<std::uint64_t>(1, std::uint64_t(o.connect_rate / o.procs / 20))),
      _index(index), _first(first), _ctrl(ctrl_fd), _report(report_fd) {
  _c[ctr::assigned] = count;
  _want_each = o.messages_for(0);
  const bool shared_topic = o.proto == protocol::pubsub && o.sc != scenario::mailboxes && !o.own_topics;
  _memo = std::make_unique<delivery_memo>(shared_topic ? o.topic : std::string());
  if (o.compression) _inflater = std::make_unique<head_inflater>();
  if (o.tls) {
    _tls = SSL_CTX_new(TLS_client_method());
    if (_tls == nullptr) throw std::runtime_error("wss://: SSL_CTX_new failed");
    SSL_CTX_set_verify(_tls, SSL_VERIFY_NONE, nullptr);  // it measures a server; it protects nothing
    SSL_CTX_set_mode(_tls, SSL_MODE_RELEASE_BUFFERS);    // idle connections hold no record buffers
    _ssl.assign(count, nullptr);
  }
  if (reconnects()) _last_ids.resize(count);
  if (o.transport == transport_kind::sse) _streams.resize(count);
  _steps.resize(o.step_rates.size());
  _rng.state = (now_ns() ^ (std::uint64_t{index} << 40) ^ static_cast<std::uint64_t>(getpid())) | 1;
  for (std::uint32_t i = 0; i < count; ++i) {
    _conns[i].slow = o.is_slow(first + i);
    _conns[i].churner = o.is_churner(first + i);
    if (_conns[i].churner) _churners.push_back(i);
    _to_open.emplace_back(0, i);
  }
}

worker::~worker() {
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    io_close(i);
    if (_conns[i].fd >= 0) ::close(_conns[i].fd);
  }
  if (_tls != nullptr) SSL_CTX_free(_tls);
  if (_ep >= 0) ::close(_ep);
}

bool worker::reconnects() const noexcept {
  return _o.sc == scenario::churn || _o.sc == scenario::reconnect_storm;
}

// ---------------------------------------------------------------------------------------------
// Opening

void worker::open_due(std::uint64_t now) noexcept {
  const std::uint32_t limit = _o.connect_rate > 0 ? 1u << 30 : _o.inflight;
  while (!_to_open.empty() && _to_open.front().first <= now && _in_progress < limit) {
    if (_open_limit.take(now, 1) == 0) break;
    const std::uint32_t i = _to_open.front().second;
    _to_open.pop_front();
    open_one(i, now);
  }
}

void worker::open_one(std::uint32_t i, std::uint64_t now) noexcept {
  lg_conn& c = _conns[i];
  c.state = conn_state::connecting;
  c.started_ns = now;
  c.reader.reset(_spills);   // here, not at the drop: a drop may happen inside the reader's consume()
  if (!_streams.empty()) _streams[i].reset(_stream_spills);
  ++_in_progress;
  const in_addr* src = _o.sources.empty() ? nullptr : &_o.sources[(_first + i) % _o.sources.size()];
  const int fd = start_connect(_o.server, src);
  if (fd < 0) return fail(i, classify_errno(-fd), -fd);
  c.fd = fd;
  epoll_event ev{};
  ev.events = EPOLLOUT | EPOLLIN;
  ev.data.u64 = i;
  epoll_ctl(_ep, EPOLL_CTL_ADD, fd, &ev);
}

/// An attempt that did not reach "ready". Retried later when the scenario reconnects and the
/// run has started; otherwise the connection stays closed.
void worker::fail(std::uint32_t i, ctr why, int err) noexcept {
  lg_conn& c = _conns[i];
  if (c.state == conn_state::connecting || c.state == conn_state::handshaking || c.state == conn_state::upgrading ||
      c.state == conn_state::subscribing) {
    --_in_progress;
  }
  if (c.state == conn_state::subscribing) --_c[ctr::open];
  io_close(i);
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
  c.upgrade.reset();
  ++_c[why];
  if (why == ctr::err_other && _c.first_errno == 0) _c.first_errno = err;
  if (_initial) {
    c.state = conn_state::closed;
    ++_settled;
    return;
  }
  if (_go && reconnects()) {
    c.state = conn_state::waiting;
    _to_open.emplace_back(now_ns() + 100'000'000 + _rng.next() % 200'000'000, i);
    return;
  }
  c.state = conn_state::closed;
}

void worker::on_connected(std::uint32_t i) noexcept {
  lg_conn& c = _conns[i];
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return fail(i, classify_errno(err), err);
  if (_tls == nullptr) return send_upgrade(i);
  ssl_st* s = SSL_new(_tls);
  if (s == nullptr) return fail(i, ctr::err_tls);
  SSL_set_fd(s, c.fd);
  SSL_set_connect_state(s);
  const std::string host = _o.host_header.substr(0, _o.host_header.rfind(':'));
  if (host.find_first_not_of("0123456789.") != std::string::npos) SSL_set_tlsext_host_name(s, host.c_str());  // a name, not an address
  _ssl[i] = s;
  c.state = conn_state::handshaking;
  on_handshake(i);
}

/// wss://: one step of the TLS handshake; then the upgrade request goes in it.
void worker::on_handshake(std::uint32_t i) noexcept {
  ERR_clear_error();
  const int r = SSL_do_handshake(_ssl[i]);
  if (r == 1) {
    ++_c[ctr::tls_handshakes];
    return send_upgrade(i);
  }
  switch (SSL_get_error(_ssl[i], r)) {
    case SSL_ERROR_WANT_READ: return watch(i, EPOLLIN);
    case SSL_ERROR_WANT_WRITE: return watch(i, EPOLLOUT);
    default: return fail(i, ctr::err_tls);
  }
}

void worker::send_upgrade(std::uint32_t i) noexcept {
  if (!_streams.empty()) return send_stream_request(i);
  lg_conn& c = _conns[i];
  const std::string key = make_key(_rng);
  const std::string token = mint_token(_o.jwt_secret, _o.topic_of(_first + i), false, _o.token_ttl, user_of(i));
  const std::string request = make_upgrade_request(_o.path, _o.host_header, key, token, _o.compression);
  const ssize_t n = io_send(i, request.data(), request.size());
  if (n != static_cast<ssize_t>(request.size())) {   // a fresh socket takes a few hundred bytes at once
    if (_tls != nullptr) return fail(i, ctr::err_tls);
    return fail(i, n < 0 ? classify_errno(errno) : ctr::err_other, n < 0 ? errno : EAGAIN);
  }
  c.upgrade = std::make_unique<upgrade_state>();
  c.upgrade->accept = expected_accept(key);
  c.state = conn_state::upgrading;
  watch(i, EPOLLIN);
}

/// --transport sse: the GET of the connection's event stream, with its token as the upgrade
/// carries it, and where it resumes (Last-Event-ID) when it comes back.
void worker::send_stream_request(std::uint32_t i) noexcept {
  lg_conn& c = _conns[i];
  const std::string topic = _o.topic_of(_first + i);
  const std::string token = mint_token(_o.jwt_secret, topic, false, _o.token_ttl, user_of(i));
  const std::string request = make_stream_request(_o.path, _o.host_header, topic, token, resume_id(i));
  const ssize_t n = io_send(i, request.data(), request.size());
  if (n != static_cast<ssize_t>(request.size())) {
    if (_tls != nullptr) return fail(i, ctr::err_tls);
    return fail(i, n < 0 ? classify_errno(errno) : ctr::err_other, n < 0 ? errno : EAGAIN);
  }
  c.upgrade = std::make_unique<upgrade_state>();
  c.state = conn_state::upgrading;
  watch(i, EPOLLIN);
}

void worker::watch(std::uint32_t i, std::uint32_t events) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = i;
  epoll_ctl(_ep, EPOLL_CTL_MOD, _conns[i].fd, &ev);
}

ssize_t worker::io_send(std::uint32_t i, const void* data, std::size_t len) noexcept {
  if (_tls == nullptr) return ::send(_conns[i].fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  ERR_clear_error();
  const int r = SSL_write(_ssl[i], data, static_cast<int>(len));
  return r > 0 ? r : -1;
}

ssize_t worker::io_recv(std::uint32_t i, void* buf, std::size_t len) noexcept {
  if (_tls == nullptr) {
    const ssize_t n = ::recv(_conns[i].fd, buf, len, 0);
    if (n >= 0) return n;
    return errno == EAGAIN || errno == EINTR ? -1 : -2;
  }
  ERR_clear_error();
  const int r = SSL_read(_ssl[i], buf, static_cast<int>(len));
  if (r > 0) return r;
  // Only EPOLLIN is watched once upgraded: a read that wants to write (a renegotiation, which
  // the server never asks for) would wait forever, so it counts as a broken connection.
  const int e = SSL_get_error(_ssl[i], r);
  if (e == SSL_ERROR_WANT_READ) return -1;
  return e == SSL_ERROR_ZERO_RETURN ? 0 : -2;
}

/// A TLS write that did not go through whole cannot be retried with other bytes (OpenSSL
/// wants the same buffer again), and a frame dropped midway would break the stream: the
/// connection ends (plain sockets only count a lost control frame).
void worker::tls_write_failed(std::uint32_t i) noexcept {
  const conn_state s = _conns[i].state;
  if (s != conn_state::subscribing && s != conn_state::ready && s != conn_state::paused) return;
  ++_c[ctr::disconnects];
  drop(i, reconnects() && _go, 50'000'000 + _rng.next() % 250'000'000);
}

void worker::io_close(std::uint32_t i) noexcept {
  if (_tls == nullptr || _ssl[i] == nullptr) return;
  SSL_free(_ssl[i]);
  _ssl[i] = nullptr;
}

void worker::on_upgrade_bytes(std::uint32_t i) noexcept {
  lg_conn& c = _conns[i];
  for (;;) {
    std::string& resp = c.upgrade->response;
    char buf[4096];
    const ssize_t n = io_recv(i, buf, sizeof(buf));
    if (n == -1) return;
    if (n == -2) return _tls != nullptr ? fail(i, ctr::err_tls) : fail(i, classify_errno(errno), errno);
    if (n == 0) return fail(i, ctr::err_closed_in_upgrade);
    const std::size_t before = resp.size();
    resp.append(buf, static_cast<std::size_t>(n));
    const std::size_t end = resp.find("\r\n\r\n", before >= 3 ? before - 3 : 0);
    if (end != std::string::npos) {
      finish_upgrade(i, end + 4);
      // What TLS has read already, the socket will not announce again.
      if (_tls != nullptr && c.fd >= 0 && _ssl[i] != nullptr && SSL_pending(_ssl[i]) > 0) on_readable(i);
      return;
    }
    if (resp.size() > 8192) return fail(i, ctr::err_other, EMSGSIZE);
    if (_tls == nullptr || SSL_pending(_ssl[i]) == 0) return;
  }
}

/// The response head is complete: check it, subscribe, and hand any bytes behind it to the
/// frame reader.
void worker::finish_upgrade(std::uint32_t i, std::size_t head_len) noexcept {
  if (!_streams.empty()) return finish_stream_head(i, head_len);
  lg_conn& c = _conns[i];
  const std::string resp = std::move(c.upgrade->response);
  const upgrade_answer a = check_upgrade_response(std::string_view(resp).substr(0, head_len), c.upgrade->accept);
  if (a.status != 101) {
    if (_c.first_status == 0) _c.first_status = a.status;
    return fail(i, classify_status(a.status));
  }
  if (!a.accept_ok) return fail(i, ctr::err_bad_accept);
  c.deflate = a.deflate;
  if (a.deflate) ++_c[ctr::deflate_conns];
  c.upgrade.reset();
  ++_c[ctr::connected];
  ++_c[ctr::open];
  if (_o.proto == protocol::pubsub) {
    c.state = conn_state::subscribing;
    if (!send_text(c, make_sub(_o.topic_of(_first + i), resume_id(i)))) return fail(i, ctr::err_reset);
  } else {
    become_ready(i);
  }
  if (resp.size() > head_len && c.fd >= 0) {   // frames right behind the 101 in the same read
    _recv_ns = now_ns();
    const auto* rest = reinterpret_cast<const std::uint8_t*>(resp.data()) + head_len;
    feed(i, std::span<const std::uint8_t>(rest, resp.size() - head_len));
  }
}

/// An event stream's head is complete: a 200 of text/event-stream, and the stream's sub is the
/// server's to make; its `subbed` event is the answer, as the WebSocket's `subbed` reply is.
/// Events right behind the head go to the stream's reader.
void worker::finish_stream_head(std::uint32_t i, std::size_t head_len) noexcept {
  lg_conn& c = _conns[i];
  const std::string resp = std::move(c.upgrade->response);
  const upgrade_answer a = check_stream_response(std::string_view(resp).substr(0, head_len));
  if (a.status != 200) {
    if (_c.first_status == 0) _c.first_status = a.status;
    return fail(i, classify_status(a.status));
  }
  if (!a.accept_ok) return fail(i, ctr::err_bad_accept);
  c.upgrade.reset();
  ++_c[ctr::connected];
  ++_c[ctr::open];
  c.state = conn_state::subscribing;
  if (resp.size() > head_len) {
    _recv_ns = now_ns();
    const auto* rest = reinterpret_cast<const std::uint8_t*>(resp.data()) + head_len;
    feed_stream(i, std::span<const std::uint8_t>(rest, resp.size() - head_len));
  }
}

void worker::become_ready(std::uint32_t i) noexcept {
  lg_conn& c = _conns[i];
  const std::uint64_t now = now_ns();
  --_in_progress;
  ++_c[ctr::ready];
  _connect->record(now - c.started_ns);
  if (_initial) ++_settled;
  if (c.storm_wait) {
    c.storm_wait = false;
    if (--_storm_waiting == 0) _c.storm_back_ns = now;
  }
  c.state = conn_state::ready;
  if (c.slow) {
    // A slow consumer: subscribed, then never reads again. Errors and hang-ups still wake us.
    c.state = conn_state::paused;
    epoll_event ev{};
    ev.events = 0;
    ev.data.u64 = i;
    epoll_ctl(_ep, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

/// One small masked text frame, sent at once (sub messages, right after the upgrade).
bool worker::send_text(lg_conn& c, std::string_view text) noexcept {
  std::string frame(proto::max_frame_header_size + text.size(), '\0');
  auto* bytes = reinterpret_cast<std::uint8_t*>(frame.data());
  const auto mask = _rng.mask();
  const std::size_t h = proto::encode_masked_frame_header(
      std::span<std::uint8_t, proto::max_frame_header_size>(bytes, proto::max_frame_header_size), proto::opcode::text,
      true, text.size(), mask);
  std::memcpy(bytes + h, text.data(), text.size());
  proto::apply_mask(std::span<std::uint8_t>(bytes + h, text.size()), mask, 0);
  const ssize_t n = io_send(index_of(c), bytes, h + text.size());
  if (n == static_cast<ssize_t>(h + text.size())) return true;
  ++_c[ctr::send_errors];
  return false;
}

/// A small masked control frame, sent straight away; a full socket buffer loses it (counted):
/// pongs and close answers are best effort in a load generator.
void worker::send_control(lg_conn& c, proto::opcode op, std::span<const std::uint8_t> payload) noexcept {
  std::array<std::uint8_t, proto::max_frame_header_size + frame_reader::control_bytes> frame{};
  const auto mask = _rng.mask();
  const std::size_t h = proto::encode_masked_frame_header(
      std::span<std::uint8_t, proto::max_frame_header_size>(frame.data(), proto::max_frame_header_size), op, true,
      payload.size(), mask);
  std::memcpy(frame.data() + h, payload.data(), payload.size());
  proto::apply_mask(std::span<std::uint8_t>(frame.data() + h, payload.size()), mask, 0);
  const ssize_t n = io_send(index_of(c), frame.data(), h + payload.size());
  if (n == static_cast<ssize_t>(h + payload.size())) return;
  ++_c[ctr::send_errors];
  if (_tls != nullptr) tls_write_failed(index_of(c));
}

/// Attempts still not ready after --connect-timeout end as `deadline` errors; once the run has
/// started, a reconnect gets --attempt-timeout and is then tried again (a SYN dropped by a full
/// backlog would otherwise wait out the kernel's retransmissions).
void worker::expire_upgrades(std::uint64_t now) noexcept {
  const std::uint64_t limit = seconds_to_ns(_go && reconnects() ? std::min(_o.connect_timeout, _o.attempt_timeout)
                                                                 : _o.connect_timeout);
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    const conn_state s = _conns[i].state;
    const bool pending = s == conn_state::connecting || s == conn_state::handshaking || s == conn_state::upgrading ||
                         s == conn_state::subscribing;
    if (pending && now - _conns[i].started_ns > limit) fail(i, ctr::err_deadline);
  }
}

void worker::check_connect_phase(std::uint64_t now) noexcept {
  if (!_initial) return;
  if (_settled < _conns.size() && now < _connect_deadline) return;
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    if (_conns[i].state != conn_state::ready && _conns[i].state != conn_state::paused &&
        _conns[i].state != conn_state::closed) {
      fail(i, ctr::err_deadline);
    }
  }
  _to_open.clear();
  _initial = false;
  _c.connect_done_ns = now;
  send_sample(msg_kind::sample);   // the parent waits for this to start the run
}

}  // namespace wspush::loadgen
