/// \file publisher.cpp
#include "loadgen/publisher.hpp"

#include "loadgen/sys.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <tuple>

namespace wspush::loadgen {

std::size_t response_reader::content_length(std::string_view head) noexcept {
  constexpr std::string_view name = "\r\ncontent-length:";
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos; at = head.find("\r\n", at + 2)) {
    const std::string_view line = head.substr(at, name.size());
    if (line.size() < name.size() ||
        !std::equal(line.begin(), line.end(), name.begin(), [](char a, char b) { return (a | 0x20) == (b | 0x20); })) {
      continue;
    }
    std::size_t pos = at + name.size();
    while (pos < head.size() && head[pos] == ' ') ++pos;
    std::size_t n = 0;
    std::from_chars(head.data() + pos, head.data() + head.size(), n);
    return n;
  }
  return 0;
}

publisher::publisher(const options& o, std::uint32_t index, int ctrl_fd, int report_fd)
    : _o(o), _payload(std::max<std::size_t>(o.size, min_payload) + 64), _index(index), _ctrl(ctrl_fd),
      _report(report_fd) {
  _rng.state = (now_ns() ^ 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(getpid())) | 1;
}

publisher::~publisher() {
  if (_fd >= 0) ::close(_fd);
  if (_ep >= 0) ::close(_ep);
}

namespace {
constexpr std::uint64_t ctrl_tag = 1;
constexpr std::uint64_t sock_tag = 2;

/// Waits for `events` on fd until deadline; false on timeout.
bool poll_until(int fd, short events, std::uint64_t deadline) noexcept {
  for (;;) {
    const std::uint64_t now = now_ns();
    if (now >= deadline) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000 + 1));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}
}  // namespace

/// Connects (and upgrades, over WebSocket) with retries every 100 ms until `deadline`.
bool publisher::connect(std::uint64_t deadline) noexcept {
  const bool admin = _o.via == publish_via::admin;
  const sockaddr_in& to = admin ? _o.admin : _o.server;
  while (now_ns() < deadline) {
    const int fd = start_connect(to, nullptr);
    int err = fd < 0 ? -fd : 0;
    if (fd >= 0 && poll_until(fd, POLLOUT, deadline)) {
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    } else if (fd >= 0) {
      err = ETIMEDOUT;
    }
    if (err == 0) {
      _fd = fd;
      _reader.reset(_spills);
      _responses.reset();
      if (admin || upgrade(deadline)) break;
      _fd = -1;
    } else {
      ++_c[classify_errno(err)];
      if (_c.first_errno == 0 && classify_errno(err) == ctr::err_other) _c.first_errno = err;
    }
    if (fd >= 0) ::close(fd);
    ::poll(nullptr, 0, 100);
  }
  if (_fd < 0) return false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = sock_tag;
  epoll_ctl(_ep, EPOLL_CTL_ADD, _fd, &ev);
  _want_out = false;
  return true;
}

/// The publisher's own WebSocket upgrade, blocking with a deadline (one connection, once).
bool publisher::upgrade(std::uint64_t deadline) noexcept {
  const std::string key = make_key(_rng);
  const std::string token = mint_token(_o.jwt_secret, _o.topic, true, _o.token_ttl);
  const std::string req = make_upgrade_request(_o.path, _o.host_header, key, token);
  if (::send(_fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return false;
  std::string resp;
  std::size_t end = std::string::npos;
  while (end == std::string::npos) {
    if (!poll_until(_fd, POLLIN, deadline)) return false;
    char buf[4096];
    const ssize_t n = ::recv(_fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return false;
    resp.append(buf, static_cast<std::size_t>(n));
    end = resp.find("\r\n\r\n");
  }
  const upgrade_answer a = check_upgrade_response(std::string_view(resp).substr(0, end + 4), expected_accept(key));
  if (a.status != 101 || !a.accept_ok) {
    ++_c[a.status == 101 ? ctr::err_bad_accept : classify_status(a.status)];
    if (_c.first_status == 0) _c.first_status = a.status;
    return false;
  }
  return true;   // bytes behind the head would be server frames: none come before we publish
}

int publisher::run() noexcept {
  _ep = epoll_with_control(_ctrl, ctrl_tag);
  if (_ep < 0) return 2;
  _next_sample_ns = now_ns() + seconds_to_ns(_o.sample_interval);
  if (connect(now_ns() + seconds_to_ns(_o.connect_timeout))) _c[ctr::publisher_ready] = 1;
  send_sample(msg_kind::sample);
  if (_fd >= 0) {
    while (!_cmd.go && !_cmd.report && !_cmd.quit) {
      epoll_event events[8];
      const int n = epoll_wait(_ep, events, 8, 1000);
      for (int k = 0; k < n; ++k) {
        if (events[k].data.u64 == ctrl_tag) read_command();
        else on_readable();
      }
    }
    if (_cmd.go && !_cmd.report && !_cmd.quit) publish_loop();
  }
  send_sample(msg_kind::final_result);
  while (!_cmd.quit) {
    pollfd p{_ctrl, POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) read_command();
  }
  return _fd >= 0 ? 0 : 1;
}

bool publisher::finished() const noexcept {
  return _next >= _o.messages && _out_off == _out.size() && _inflight.empty() && _retry.empty() &&
         !last_pause_pending(now_ns());
}

/// --publish-steps: every message is sent and the last step's pause has not run out (or not
/// begun): the run is not over, so that the step's window closes before the connections do.
bool publisher::last_pause_pending(std::uint64_t now) const noexcept {
  return !_steps.empty() && _next >= _o.messages && (_pause_until == 0 || now < _pause_until);
}

void publisher::publish_loop() noexcept {
  const std::uint64_t start = now_ns();
  const std::uint64_t deadline = start + seconds_to_ns(_o.timeout);
  const bool steps = !_o.step_rates.empty();
  _limit = rate_limiter(steps ? _o.step_rates[0] : _o.publish_rate, start, 64);
  _step_end = steps ? _o.step_messages(0) : _o.messages;
  _steps.resize(_o.step_rates.size());
  while (!finished() && !_cmd.report && !_cmd.quit && now_ns() < deadline) {
    std::uint64_t now = now_ns();
    if (_fd < 0 && !connect(now + 200'000'000)) continue;
    if (!_want_out) {
      fill(now);
      if (!flush()) continue;
    }
    now = now_ns();
    if (now >= _next_sample_ns) {
      send_sample(msg_kind::sample);
      ++_interval_no;
      while (_next_sample_ns <= now) _next_sample_ns += seconds_to_ns(_o.sample_interval);
    }
    std::uint64_t wake = std::min(_next_sample_ns, now + 100'000'000);
    const bool can_add = _next < _o.messages && !_want_out &&
                         (_o.via == publish_via::ws || _inflight.size() < _o.pipeline);
    if (can_add || last_pause_pending(now)) wake = std::min(wake, now + pace(now));
    if (!_retry.empty() && !_want_out) wake = std::min(wake, std::max(now, _retry.front().second));
    epoll_event events[8];
    const int n = epoll_wait(_ep, events, 8, wake <= now ? 0 : static_cast<int>((wake - now + 999'999) / 1'000'000));
    for (int k = 0; k < n; ++k) {
      if (events[k].data.u64 == ctrl_tag) {
        read_command();
      } else {
        if ((events[k].events & EPOLLOUT) && _want_out && !flush()) continue;
        if (events[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable();
      }
    }
  }
  for (const auto& r : _inflight) _c[ctr::publish_errors] += r.second;   // never answered within the bound
  _c[ctr::publish_errors] += _retry.size();                   // refused, and the bound ran out first
  const std::string step_msgs = encode_steps(_index, _steps);
  if (!write_all(_report, step_msgs.data(), step_msgs.size())) _exit(3);
}

/// Nanoseconds until the next message may go: the rate's wait, or the rest of a step's pause.
/// A step ends when its last message is sent; its pause counts from then, and the next step's
/// rate from the pause's end.
std::uint64_t publisher::pace(std::uint64_t now) noexcept {
  if (_next < _step_end || _steps.empty()) return _limit.wait_ns(now);
  if (_pause_until == 0) _pause_until = now + seconds_to_ns(_o.step_pause);
  if (now < _pause_until) return _pause_until - now;
  if (_step + 1 >= _o.step_rates.size()) return 0;  // the last step's pause is over: so is the run
  _pause_until = 0;
  _step_end += _o.step_messages(++_step);
  _limit = rate_limiter(_o.step_rates[_step], now, 64);
  return _limit.wait_ns(now);
}


/// Encodes what is due, bounded so every timestamp is taken just before its bytes go out.
void publisher::fill(std::uint64_t now) noexcept {
  if (_out_off == _out.size()) {
    _out.clear();
    _out_off = 0;
  }
  std::uint64_t room = 64;
  if (_o.via == publish_via::admin) room = _o.pipeline > _inflight.size() ? _o.pipeline - _inflight.size() : 0;
  while (room > 0 && !_retry.empty() && _retry.front().second <= now) {   // refused ones first, outside the rate
    encode_request(_retry.front().first, 1, true);
    _retry.pop_front();
    --room;
  }
  if (pace(now) > 0) return;
  const std::uint64_t batch = _o.via == publish_via::admin ? _o.publish_batch : 1;
  room = std::min<std::uint64_t>(room * batch, _step_end - _next);
  std::uint64_t n = _limit.take(now, room);
  while (n > 0) {
    const auto take = static_cast<std::uint32_t>(std::min(n, batch));
    encode_request(_next, take, false);
    _next += take;
    n -= take;
  }
}

/// Messages first..first+count-1 (fresh ones are consecutive; a retry goes alone): over the
/// admin API one request (`/publish`, or `/publish/batch` with one NDJSON line each), over
/// WebSocket one frame each.
void publisher::encode_request(std::uint64_t first, std::uint32_t count, bool again) noexcept {
  if (_o.via == publish_via::admin) {
    _inflight.emplace_back(first, count);
    _body.clear();
    for (std::uint32_t k = 0; k < count; ++k) {
      if (k) _body.push_back('\n');
      encode_one(first + k, now_ns(), again);
    }
    _out.append(count == 1 ? "POST /publish HTTP/1.1\r\nHost: " : "POST /publish/batch HTTP/1.1\r\nHost: ").append(_o.admin_host);
    _out.append(count == 1 ? "\r\nContent-Type: application/json\r\nContent-Length: "
                           : "\r\nContent-Type: application/x-ndjson\r\nContent-Length: ")
        .append(std::to_string(_body.size()));
    if (!_o.api_key.empty()) _out.append("\r\nAuthorization: Bearer ").append(_o.api_key);
    _out.append("\r\n\r\n").append(_body);
    return;
  }
  for (std::uint32_t k = 0; k < count; ++k) encode_one(first + k, now_ns(), again);
}

/// Message k, stamped `now`: admin, its publish body appended to the request body; WebSocket,
/// its frame appended to the output.
void publisher::encode_one(std::uint64_t k, std::uint64_t now, bool again) noexcept {
  const std::uint32_t topics = _o.topic_count();
  const std::string topic = _o.topic_of(static_cast<std::uint32_t>(k % topics));
  const std::size_t len = write_payload(_payload, _o.size, k / topics, now);
  const std::string_view payload(_payload.data(), len);
  if (_c.first_send_ns == 0) _c.first_send_ns = now;
  _c.last_send_ns = now;
  if (!again) ++_c[ctr::sent];
  if (!_steps.empty()) {
    counters& sc = _steps[_o.step_of(k)].c;
    if (sc.first_send_ns == 0) sc.first_send_ns = now;
    sc.last_send_ns = now;
    if (!again) ++sc[ctr::sent];
  }
  if (_o.via == publish_via::admin) {
    _body.append(make_publish_body(topic, payload));
    return;
  }
  const std::string pub = _o.proto == protocol::pubsub ? make_pub(topic, payload) : std::string(payload);
  const std::size_t at = _out.size();
  _out.resize(at + proto::max_frame_header_size + pub.size());
  auto* bytes = reinterpret_cast<std::uint8_t*>(_out.data() + at);
  const auto mask = _rng.mask();
  const std::size_t h = proto::encode_masked_frame_header(
      std::span<std::uint8_t, proto::max_frame_header_size>(bytes, proto::max_frame_header_size), proto::opcode::text,
      true, pub.size(), mask);
  std::memcpy(bytes + h, pub.data(), pub.size());
  proto::apply_mask(std::span<std::uint8_t>(bytes + h, pub.size()), mask, 0);
  _out.resize(at + h + pub.size());
}

/// Writes what is queued; false when the connection was lost.
bool publisher::flush() noexcept {
  while (_out_off < _out.size()) {
    const ssize_t n = ::send(_fd, _out.data() + _out_off, _out.size() - _out_off, MSG_NOSIGNAL);
    if (n > 0) {
      _out_off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!_want_out) {
        _want_out = true;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.u64 = sock_tag;
        epoll_ctl(_ep, EPOLL_CTL_MOD, _fd, &ev);
      }
      return true;
    }
    ++_c[ctr::send_errors];
    lose_connection();
    return false;
  }
  if (_want_out) {
    _want_out = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = sock_tag;
    epoll_ctl(_ep, EPOLL_CTL_MOD, _fd, &ev);
  }
  return true;
}

namespace {
/// The publisher's WebSocket input: echoes of a broadcast, error replies, pings.
struct pub_sink {
  counters& c;
  bool pubsub;
  bool closed = false;
  std::string pong;   // a ping to answer after the read
  void on_message(std::span<const std::uint8_t> m, std::uint8_t) noexcept {
    if (pubsub && classify(std::string_view(reinterpret_cast<const char*>(m.data()), m.size())) == server_msg::error) {
      ++c[ctr::publish_errors];
    }
  }
  void on_ping(std::span<const std::uint8_t> p) { pong.assign(reinterpret_cast<const char*>(p.data()), p.size()); }
  void on_close(std::span<const std::uint8_t>) noexcept { closed = true; }
};
}  // namespace

void publisher::on_readable() noexcept {
  if (_fd < 0) return;
  char buf[65536];
  const ssize_t n = ::recv(_fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) return lose_connection();
  if (_o.via == publish_via::admin) {
    const bool ok = _responses.consume(std::string_view(buf, static_cast<std::size_t>(n)),
                                       [this](int status) { on_response(status); });
    if (!ok) lose_connection();
    return;
  }
  pub_sink s{_c, _o.proto == protocol::pubsub, false, {}};
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf);
  if (!_reader.consume(std::span<const std::uint8_t>(bytes, static_cast<std::size_t>(n)), s, _spills) || s.closed) {
    return lose_connection();
  }
  if (!s.pong.empty()) {   // rare (the publisher is never silent for long): queue it like data
    const std::size_t at = _out.size();
    _out.resize(at + proto::max_frame_header_size + s.pong.size());
    auto* out = reinterpret_cast<std::uint8_t*>(_out.data() + at);
    const auto mask = _rng.mask();
    const std::size_t h = proto::encode_masked_frame_header(
        std::span<std::uint8_t, proto::max_frame_header_size>(out, proto::max_frame_header_size), proto::opcode::pong,
        true, s.pong.size(), mask);
    std::memcpy(out + h, s.pong.data(), s.pong.size());
    proto::apply_mask(std::span<std::uint8_t>(out + h, s.pong.size()), mask, 0);
    _out.resize(at + h + s.pong.size());
  }
}

/// An admin publish's answer (they come in order). 503 means nothing was published: the same
/// number goes again after a second (its Retry-After), within the run's bound. 504 means the
/// bus took it and did not answer: it may arrive, so it is not sent again (that could deliver
/// it twice); it is counted, and so is its loss if it never arrives.
void publisher::on_response(int status) noexcept {
  std::uint64_t k = 0;
  std::uint32_t n = 1;
  if (!_inflight.empty()) {
    std::tie(k, n) = _inflight.front();
    _inflight.pop_front();
  }
  // A batch is 200 unless every line was refused (503, Retry-After: each is sent again) or the
  // request failed as a whole; a line that failed alone shows as loss.
  if (status == 200) return;
  if (status == 503) {
    _c[ctr::publish_retries] += n;
    for (std::uint32_t j = 0; j < n; ++j) _retry.emplace_back(k + j, now_ns() + 1'000'000'000);
    return;
  }
  if (status == 504) {
    _c[ctr::publish_unknown] += n;
  } else {
    _c[ctr::publish_errors] += n;
  }
  if (_c.first_status == 0) _c.first_status = status;
}

/// The connection broke: requests in flight are lost (counted), and the loop reconnects.
void publisher::lose_connection() noexcept {
  if (_fd < 0) return;
  ::close(_fd);
  _fd = -1;
  for (const auto& r : _inflight) _c[ctr::publish_errors] += r.second;
  _inflight.clear();
  if (_out_off < _out.size() && _o.via == publish_via::ws) ++_c[ctr::publish_errors];   // a partly sent batch
  _out.clear();
  _out_off = 0;
  _want_out = false;
  ++_c[ctr::disconnects];
}

void publisher::read_command() noexcept { read_commands(_ctrl, _ep, _cmd); }

void publisher::send_sample(msg_kind kind) noexcept {
  const std::string msg = encode_msg(kind, _index, _interval_no, _c, *_empty, *_empty);
  if (!write_all(_report, msg.data(), msg.size())) _exit(3);
}

}  // namespace wspush::loadgen
