#include "server/bus/redis_link.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <new>

#include "server/base/clock.hpp"
#include "server/base/log.hpp"

namespace wspush::server::bus {

namespace {

constexpr std::size_t in_size = 64 << 10;   // one read; the parser copies what a reply keeps
constexpr int reads_per_wake = 16;          // then the loop's other work gets its turn
constexpr std::size_t keep_out = 1 << 20;   // output buffer kept between writes

std::string_view text(const resp::reply& r) noexcept { return {r.str, r.len}; }

/// A few words on a reply the link could not place, for the log.
std::string describe(const resp::reply& r) {
  char b[96];
  switch (r.type) {
    case resp::reply_type::status:
    case resp::reply_type::error:
      std::snprintf(b, sizeof b, "%c%.*s", r.type == resp::reply_type::status ? '+' : '-', int(std::min<std::size_t>(r.len, 40)), r.str);
      break;
    case resp::reply_type::integer: std::snprintf(b, sizeof b, ":%lld", r.integer); break;
    case resp::reply_type::string: std::snprintf(b, sizeof b, "a bulk string of %zu bytes", r.len); break;
    case resp::reply_type::nil: std::snprintf(b, sizeof b, "nil"); break;
    case resp::reply_type::array: std::snprintf(b, sizeof b, "an array of %zu", r.elements); break;
  }
  return b;
}

}  // namespace

redis_link::~redis_link() { abort(); }

bool redis_link::connect(const std::string& host, int port, std::string& why) noexcept {
  if (_fd >= 0) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char service[16];
  std::snprintf(service, sizeof service, "%d", port);
  addrinfo* res = nullptr;
  // Resolving blocks the bus thread, as hiredis's connect did; the URL usually names an address.
  if (const int rc = ::getaddrinfo(host.c_str(), service, &hints, &res); rc != 0) {
    why = ::gai_strerror(rc);
    return false;
  }
  int fd = -1, err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) break;
    err = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    why = std::strerror(err);
    return false;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  _in.reset(new (std::nothrow) char[in_size]);
  if (!_in || !_loop.watch(fd, _key, false, true)) {  // writable: connected, or failed
    ::close(fd);
    _in.reset();
    why = "cannot watch the socket";
    return false;
  }
  if (_o.tls) {
    try {
      _host = host;
    } catch (...) {
      ::close(fd);
      _in.reset();
      why = "no memory";
      return false;
    }
  }
  _fd = fd;
  _up = _closing = _subscribed = _handshaking = false;
  _want_write = true;
  _parser.reset();
  return true;
}

void redis_link::disconnect() noexcept {
  if (_fd < 0) return;
  if (!_up || _pending.empty()) return close_now(true, "disconnected");
  _closing = true;  // answered() closes it after the last reply
}

void redis_link::abort() noexcept { close_now(false, {}); }

bool redis_link::command(int argc, const char** argv, const std::size_t* lens, reply_fn fn, void* priv) noexcept {
  if (!connected() || argc < 1) return false;
  std::uint32_t pushes = 0;
  bool unsubscribe = false;
  if (_o.subscriber) {
    const std::string_view verb(argv[0], lens[0]);
    if (verb == "SUBSCRIBE" || verb == "UNSUBSCRIBE" || verb == "SSUBSCRIBE" || verb == "SUNSUBSCRIBE") {
      pushes = argc > 1 ? std::uint32_t(argc - 1) : 1;  // one push per channel
      unsubscribe = verb == "UNSUBSCRIBE" || verb == "SUNSUBSCRIBE";
      _subscribed = true;
    } else if (verb == "PING" && _subscribed) {
      pushes = 1;  // in pub/sub mode Redis answers a PING with a `pong` push
    }
  }
  const std::size_t mark = _out.size();
  try {
    char num[24];
    auto put = [&](char c, std::size_t n) {
      num[0] = c;
      char* end = std::to_chars(num + 1, num + sizeof num - 2, n).ptr;
      *end++ = '\r';
      *end++ = '\n';
      _out.append(num, end);
    };
    put('*', std::size_t(argc));
    for (int k = 0; k < argc; ++k) {
      put('$', lens[k]);
      _out.append(argv[k], lens[k]);
      _out.append("\r\n", 2);
    }
    const std::uint64_t now = monotonic_ns();
    _pending.push_back({fn, priv, now, pushes, unsubscribe});
    _last_sent_ns = now;
  } catch (...) {
    _out.resize(mark);
    return false;
  }
  if (!_want_write) {
    _want_write = true;  // written at the next wake-up: what this loop turn queues leaves together
    rewatch();
  }
  return true;
}

void redis_link::on_ready(bool readable, bool writable) noexcept {
  if (_fd < 0) return;
  if (!_up) {
    if (!readable && !writable) return;
    if (_handshaking) return handshake_step();
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(_fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err != 0) return close_now(true, std::strerror(err));
    if (!_o.tls) return connected_now();
    std::string why;
    if (!_tls.start(*_o.tls, _fd, _host, why)) return close_now(true, why);
    _handshaking = true;
    return handshake_step();
  }
  if (_read_wants_write && writable) {
    _read_wants_write = false;
    rewatch();
    readable = true;
  }
  if (_write_wants_read && readable) {
    _write_wants_read = false;
    rewatch();
    writable = _want_write;
  }
  if (writable && _want_write && !write_some()) return;
  if (readable) read_some();
}

/// TLS: the handshake goes as far as the socket lets it; the link is up once it is done.
void redis_link::handshake_step() noexcept {
  std::string why;
  const tls_client_stream::io r = _tls.handshake(why);
  switch (r) {
    case tls_client_stream::io::done:
      _handshaking = false;
      return connected_now();
    case tls_client_stream::io::want_read:
    case tls_client_stream::io::want_write:
      _handshake_reads = r == tls_client_stream::io::want_read;
      return rewatch();
    case tls_client_stream::io::closed:
      return close_now(true, "Redis closed the connection in the TLS handshake" + (why.empty() ? "" : " (" + why + ")") +
                                 ": does it speak TLS on this port?");
    case tls_client_stream::io::failed: return close_now(true, why);
  }
}

void redis_link::connected_now() noexcept {
  _up = true;
  _want_write = false;
  _last_sent_ns = monotonic_ns();
  rewatch();
  _owner.on_link_up(*this);
}

bool redis_link::write_some() noexcept {
  while (_out_at < _out.size()) {
    if (_tls.active()) {
      std::size_t put = 0;
      std::string why;
      switch (_tls.write(_out.data() + _out_at, _out.size() - _out_at, put, why)) {
        case tls_client_stream::io::done: _out_at += put; continue;
        case tls_client_stream::io::want_write: return true;
        case tls_client_stream::io::want_read:
          // Not writable that is awaited (it would wake the loop at once, again and again):
          // readable, and read_some writes again.
          _write_wants_read = true;
          rewatch();
          return true;
        case tls_client_stream::io::closed: close_now(true, "Redis closed the connection"); return false;
        case tls_client_stream::io::failed: close_now(true, why); return false;
      }
    }
    const ssize_t n = ::send(_fd, _out.data() + _out_at, _out.size() - _out_at, MSG_NOSIGNAL);
    if (n > 0) {
      _out_at += std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_now(true, n < 0 ? std::strerror(errno) : "the connection took no bytes");
    return false;
  }
  if (_out.capacity() > keep_out) std::string().swap(_out);
  else _out.clear();
  _out_at = 0;
  _want_write = false;
  rewatch();
  return true;
}

/// Reads what Redis sent and hands each whole reply on; a parse error drops the link.
void redis_link::read_some() noexcept {
  const std::uint64_t gen = _gen;
  for (int k = 0; k < reads_per_wake; ++k) {
    ssize_t n = 0;
    if (_tls.active()) {
      // A record at a time; what is left of the socket's bytes wakes the loop again.
      std::size_t got = 0;
      std::string why;
      switch (_tls.read(_in.get(), in_size, got, why)) {
        case tls_client_stream::io::done: n = ssize_t(got); break;
        case tls_client_stream::io::want_read: return;
        case tls_client_stream::io::want_write:
          _read_wants_write = true;  // on_ready reads again once writable
          rewatch();
          return;
        case tls_client_stream::io::closed: return close_now(true, "Redis closed the connection");
        case tls_client_stream::io::failed: return close_now(true, why);
      }
    } else {
      n = ::recv(_fd, _in.get(), in_size, 0);
    }
    if (n == 0) return close_now(true, "Redis closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return close_now(true, std::strerror(errno));
    }
    std::string_view data(_in.get(), std::size_t(n));
    while (!data.empty()) {
      const resp::result r = _parser.parse(data);
      if (r.st == resp::status::error) return broke(_parser.error().data());
      if (r.st == resp::status::need_more) break;
      data.remove_prefix(r.consumed);
      _dispatching = true;
      const bool go_on = dispatch(_parser.root()) && gen == _gen;
      _dispatching = false;
      if (!go_on) {
        if (_fd < 0) _parser.reset();  // now that nobody reads the reply any more
        return;
      }
    }
    if (!_tls.active() && std::size_t(n) < in_size) return;
  }
}

/// One whole reply: the answer to the oldest command, or (subscriber link) a push.
bool redis_link::dispatch(const resp::reply& r) noexcept {
  const bool in_order = !_pending.empty() && _pending.front().pushes == 0;
  if (_o.subscriber && !in_order) return dispatch_push(r);
  if (_pending.empty()) {
    // An error nobody asked for is Redis's own farewell (max clients reached, say): it closes.
    if (r.type == resp::reply_type::error) close_now(true, std::string(text(r)));
    else broke("a reply came with no command waiting for it", describe(r));
    return false;
  }
  const pending p = _pending.front();
  _pending.pop_front();
  const std::uint64_t gen = _gen;
  if (p.fn) p.fn(&r, p.priv);
  if (gen != _gen) return false;
  answered();
  return gen == _gen;
}

/// A subscriber link's push: its shape is checked before the bus reads it.
bool redis_link::dispatch_push(const resp::reply& r) noexcept {
  if (r.type == resp::reply_type::error) {
    // Redis refused a (UN)SUBSCRIBE (NOAUTH, say): the subscriber link cannot go on.
    close_now(true, std::string(text(r)));
    return false;
  }
  const auto is = [&r](std::size_t k, resp::reply_type t) { return r.element[k]->type == t; };
  const bool framed = r.type == resp::reply_type::array && (r.elements == 2 || r.elements == 3) &&
                      is(0, resp::reply_type::string);
  if (!framed) {
    broke("a push that is not an array of 2 or 3 elements led by a bulk string", describe(r));
    return false;
  }
  const std::string_view kind = text(*r.element[0]);
  bool answers = true;
  bool ok = false;
  if (kind == "message" || kind == "smessage") {
    answers = false;
    ok = r.elements == 3 && is(1, resp::reply_type::string) && is(2, resp::reply_type::string);
  } else if (kind == "subscribe" || kind == "unsubscribe" || kind == "ssubscribe" || kind == "sunsubscribe") {
    ok = r.elements == 3 && (is(1, resp::reply_type::string) || is(1, resp::reply_type::nil)) &&
         is(2, resp::reply_type::integer);
    // Redis Cluster unsubscribes a shard channel by itself when its slot leaves the node: such a
    // push answers nothing, unless an (S)UNSUBSCRIBE awaits pushes (then it is counted, and a
    // count gone wrong so ends the link, which subscribes everything again).
    answers = kind != "sunsubscribe" || (!_pending.empty() && _pending.front().pushes > 0 && _pending.front().unsubscribe);
  } else if (kind == "pong") {
    ok = r.elements == 2 && is(1, resp::reply_type::string);
  }
  if (!ok) {
    broke("a push of a kind or shape the node does not expect", std::string(kind.substr(0, 40)));
    return false;
  }
  if (answers) {
    if (_pending.empty()) {
      broke("a push came with no command waiting for it", std::string(kind));
      return false;
    }
    if (--_pending.front().pushes == 0) _pending.pop_front();
  }
  const std::uint64_t gen = _gen;
  _owner.on_push(*this, r);
  if (gen != _gen) return false;
  if (answers) answered();
  return gen == _gen;
}

/// After an answer: a link asked to disconnect goes once nothing waits.
void redis_link::answered() noexcept {
  if (_closing && _pending.empty()) close_now(true, "disconnected");
}

/// What Redis sent broke RESP, a bound, or the order of replies: counted, logged, link dropped.
void redis_link::broke(const char* what, std::string_view detail) noexcept {
  if (_o.protocol_errors) _o.protocol_errors->add();
  std::string why;
  try {
    why = std::string("Redis broke the protocol: ") + what;
    if (!detail.empty()) why.append(" (").append(detail).append(")");
  } catch (...) {
  }
  log_ratelimited(log_level::warn, "bus: %s, on the %s connection; dropping it", why.c_str(),
                  _o.subscriber ? "subscriber" : "command");
  close_now(true, why);
}

void redis_link::close_now(bool tell, const std::string& why) noexcept {
  if (_fd < 0) return;
  _loop.unwatch(_fd);
  _tls.reset();
  ::close(_fd);
  _fd = -1;
  _up = _closing = _subscribed = _want_write = _handshaking = _write_wants_read = _read_wants_write = false;
  ++_gen;
  if (_out.capacity() > keep_out) std::string().swap(_out);
  else _out.clear();
  _out_at = 0;
  _in.reset();
  if (!_dispatching) _parser.reset();  // else read_some does, once the reply is no longer read
  // Not connected any more: these callbacks cannot queue anything on this link.
  while (!_pending.empty()) {
    const pending p = _pending.front();
    _pending.pop_front();
    if (p.fn) p.fn(nullptr, p.priv);
  }
  if (tell) _owner.on_link_down(*this, why);
}

void redis_link::rewatch() noexcept {
  if (_fd < 0) return;
  if (_handshaking) _loop.watch(_fd, _key, _handshake_reads, !_handshake_reads);
  else _loop.watch(_fd, _key, _up, !_up || _read_wants_write || (_want_write && !_write_wants_read));
}

std::uint64_t redis_link::waiting_ns(std::uint64_t now_ns) const noexcept {
  if (_fd < 0 || _pending.empty()) return 0;
  const std::uint64_t sent = _pending.front().sent_ns;
  return now_ns > sent ? now_ns - sent : 0;
}

void redis_link::keepalive(std::uint64_t now_ns, std::uint64_t quiet_ns) noexcept {
  if (!connected() || !_pending.empty() || now_ns - _last_sent_ns < quiet_ns) return;
  const char* argv[] = {"PING"};
  const std::size_t lens[] = {4};
  command(1, argv, lens, nullptr, nullptr);
}

}  // namespace wspush::server::bus
