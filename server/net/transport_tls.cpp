#include "server/net/transport_tls.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "server/base/log.hpp"
#include "server/net/ktls.hpp"

namespace wspush::server {

namespace {

constexpr std::size_t chunk_slots = 1024;
constexpr std::size_t record_header = 5;
constexpr std::size_t read_chunk = 16384;        // plaintext handed up per call
constexpr std::size_t stage_bytes = 16384;       // one full record of small frames

enum : std::uint16_t {
  f_open = 1 << 0,          // the slot belongs to a connection
  f_done = 1 << 1,          // the handshake finished
  f_counted = 1 << 2,       // its handshake result was counted
  f_answered = 1 << 3,      // the first flight was answered (a later failure is not the hello's)
  f_conn_pending = 1 << 4,  // the connection's send waits for its ciphertext to leave
  f_backend = 1 << 5,       // a send of ours is in the backend (io_uring): a completion follows
  f_wait = 1 << 6,          // a short synchronous send: waiting for room (epoll)
  f_closed = 1 << 7,        // closed by the connection; only an in-flight send holds the slot
  f_busy = 1 << 8,          // inside pump(): the SSL object must outlive the plaintext callback
  f_shut_after = 1 << 9,    // half-close once the ciphertext (the close_notify) has left
  f_reneg = 1 << 10,        // a ClientHello arrived after the handshake
  f_after_counted = 1 << 11,// a post-handshake problem was counted
  f_kernel_decided = 1 << 12,  // the handoff to kernel TLS happened, failed, or will not be tried
  f_kernel = 1 << 13,          // the kernel seals what the connection sends
  f_stale = 1 << 14            // OpenSSL wrote after the handoff: the connection must close
};

BIO_METHOD* bio_method();

}  // namespace

struct tls_transport::conn_tls {
  SSL* ssl = nullptr;
  pool::lease hello;   // before the SSL object: the first record, gathered
  pool::lease flight;  // ciphertext being written: [flight_off, flight.size())
  pool::lease pend;    // ciphertext made since
  conn_token token = 0;
  std::size_t owed = 0;  // plaintext of the connection's pending send
  std::uint32_t flight_off = 0;
  int fd = -1;
  std::uint16_t flags = 0;
};

const char* tls_result_name(tls_result r) noexcept {
  switch (r) {
    case tls_result::ok: return "ok";
    case tls_result::resumed: return "resumed";
    case tls_result::plain_http: return "plain_http";
    case tls_result::bad_hello: return "bad_hello";
    case tls_result::failed: return "failed";
    case tls_result::incomplete: return "incomplete";
    case tls_result::timeout: return "timeout";
    case tls_result::renegotiation: return "renegotiation";
    case tls_result::truncated: return "truncated";
    case tls_result::bad_record: return "bad_record";
    case tls_result::count_: break;
  }
  return "?";
}

// ---- the BIO --------------------------------------------------------------------------------

namespace {

int bio_read_ex(BIO* b, char* out, std::size_t len, std::size_t* got) {
  BIO_clear_retry_flags(b);
  auto* t = static_cast<tls_transport*>(BIO_get_data(b));
  int r = t->bio_read(out, len, *got);
  if (r == 0) BIO_set_retry_read(b);
  return r;
}

int bio_write_ex(BIO* b, const char* in, std::size_t len, std::size_t* put) {
  BIO_clear_retry_flags(b);
  auto* t = static_cast<tls_transport*>(BIO_get_data(b));
  if (!t->bio_write(in, len)) return 0;  // out of pool memory: the SSL call fails
  *put = len;
  return 1;
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int bio_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

BIO_METHOD* bio_method() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* bm = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "wspush");
    BIO_meth_set_read_ex(bm, bio_read_ex);
    BIO_meth_set_write_ex(bm, bio_write_ex);
    BIO_meth_set_ctrl(bm, bio_ctrl);
    BIO_meth_set_create(bm, bio_create);
    return bm;
  }();
  return m;
}

void on_message(int write_p, int, int content_type, const void* buf, std::size_t len, SSL* ssl, void* arg) {
  static_cast<tls_transport*>(arg)->on_tls_message(ssl, write_p, content_type, buf, len);
}

/// Once per process: the first connection whose handoff failed says why (the others only count).
void log_fallback_once(const char* why, int err) noexcept {
  static std::atomic<bool> logged{false};
  if (logged.exchange(true, std::memory_order_relaxed)) return;
  char buf[128];
  log(log_level::warn,
      "kernel TLS: a handoff failed (%s%s%s): such connections stay in user-space TLS, counted in "
      "wspush_tls_kernel_tx_total{result=\"fallback\"} (logged once)",
      why, err != 0 ? ": " : "", err != 0 ? strerror_r(err, buf, sizeof buf) : "");
}

}  // namespace

int tls_transport::bio_read(char* out, std::size_t len, std::size_t& got) noexcept {
  if (_in.empty()) return 0;
  got = std::min(len, _in.size());
  std::memcpy(out, _in.data(), got);
  _in = _in.subspan(got);
  return 1;
}

bool tls_transport::bio_write(const char* in, std::size_t len) noexcept {
  conn_tls& c = *_cur;
  if (c.flags & f_kernel) {
    // After the handoff the kernel holds the write keys and the sequence: a record OpenSSL seals
    // now (an alert, as it fails a record) would be out of step. It is dropped, and the
    // connection closes.
    c.flags |= f_stale;
    return true;
  }
  if (_kernel_tx && !(c.flags & f_kernel_decided)) ktls::on_ciphertext(c.ssl, in, len);
  if (!c.pend) {
    c.pend = _buffers.acquire(std::max(len, std::size_t(4096)));
    if (!c.pend) return false;
  }
  std::size_t have = c.pend.size();
  if (have + len > c.pend.capacity() && !c.pend.reserve(have + len)) return false;
  std::memcpy(c.pend.data() + have, in, len);
  c.pend.set_size(have + len);
  return true;
}

/// OpenSSL's message callback, inside an SSL call for `_cur`: kernel TLS counts the records
/// written. After the handoff a KeyUpdate the peer asks for closes the connection: OpenSSL would
/// answer it with its next write, which never comes (the kernel writes), and the kernel is not
/// re-keyed here; sending on under the old key would break RFC 8446 4.6.3. A ClientHello after
/// the handshake is a renegotiation attempt (OpenSSL itself refuses it, with
/// SSL_OP_NO_RENEGOTIATION; the connection is closed for it).
void tls_transport::on_tls_message(SSL* ssl, int write_p, int content_type, const void* buf,
                                   std::size_t len) noexcept {
  if (_cur == nullptr) return;
  conn_tls& c = *_cur;
  if (_kernel_tx && !(c.flags & f_kernel_decided)) ktls::on_message(ssl, write_p, content_type, buf, len);
  if ((c.flags & f_kernel) && ktls::asks_key_update(write_p, content_type, buf, len)) c.flags |= f_stale;
  if (write_p || content_type != SSL3_RT_HANDSHAKE || len < 1) return;
  if (static_cast<const std::uint8_t*>(buf)[0] == SSL3_MT_CLIENT_HELLO && (c.flags & f_done)) c.flags |= f_reneg;
}

// ---- set-up ---------------------------------------------------------------------------------

tls_transport::tls_transport(io_backend& io, const tls_server& server, pool::buffer_pool& buffers,
                             tls_counters& counters, kernel_handoff handoff)
    : _io(io), _server(server), _buffers(buffers), _n(counters), _kernel_tx(server.kernel_tx()), _handoff(handoff),
      _rbuf(new std::uint8_t[read_chunk]), _stage(new std::uint8_t[stage_bytes]) {}

tls_transport::~tls_transport() {
  for (auto& chunk : _chunks)
    for (std::size_t k = 0; k < chunk_slots; ++k)
      if (chunk[k].ssl != nullptr) SSL_free(chunk[k].ssl);
}

tls_transport::conn_tls* tls_transport::find(conn_token t) const noexcept {
  const std::uint32_t slot = std::uint32_t(t);
  if (slot / chunk_slots >= _chunks.size()) return nullptr;
  conn_tls& c = _chunks[slot / chunk_slots][slot % chunk_slots];
  return (c.flags & f_open) && c.token == t ? &c : nullptr;
}

tls_transport::conn_tls& tls_transport::slot_for(conn_token t) {
  const std::uint32_t slot = std::uint32_t(t);
  while (slot / chunk_slots >= _chunks.size()) _chunks.push_back(std::make_unique<conn_tls[]>(chunk_slots));
  return _chunks[slot / chunk_slots][slot % chunk_slots];
}

bool tls_transport::open(int fd, conn_token t) noexcept {
  conn_tls* c = nullptr;
  try {
    c = &slot_for(t);
  } catch (const std::bad_alloc&) {
    return false;
  }
  if (c->flags & f_open) return false;  // the connection layer reuses a slot only once idle()
  c->token = t;
  c->fd = fd;
  c->flags = f_open;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return _io.start_reading(fd, t);
}

void tls_transport::count(conn_tls& c, tls_result r) noexcept {
  const bool after = r == tls_result::renegotiation || r == tls_result::truncated || r == tls_result::bad_record;
  const std::uint16_t flag = after ? f_after_counted : f_counted;
  if (c.flags & flag) return;
  c.flags |= flag;
  _n[r].add();
}

// ---- receiving ------------------------------------------------------------------------------

/// Before the SSL object: gathers the first record. True with `feed` set once it is whole (then
/// the SSL object exists); true with `feed` empty while more is needed; false for what is not
/// a TLS handshake (answered and counted).
bool tls_transport::gather_hello(conn_tls& c, conn_token, std::span<std::uint8_t>& feed) noexcept {
  std::span<const std::uint8_t> all = feed;
  const auto whole_record = [](std::span<const std::uint8_t> b) {
    return b.size() >= record_header && b.size() >= record_header + ((std::size_t(b[3]) << 8) | b[4]);
  };
  if (c.hello || !whole_record(all)) {
    // Not all here (or already gathering): keep it in a lease until the record is whole.
    const std::size_t have = c.hello.size();
    if (!c.hello) c.hello = _buffers.acquire(std::max<std::size_t>(feed.size(), 512));
    if (!c.hello || (have + feed.size() > c.hello.capacity() && !c.hello.reserve(have + feed.size()))) {
      c.hello.reset();
      return false;
    }
    std::memcpy(c.hello.data() + have, feed.data(), feed.size());
    c.hello.set_size(have + feed.size());
    all = c.hello.bytes();
  }
  feed = {};
  if (all.empty()) return true;
  // The first byte decides what this is: 22 is a TLS handshake record; an ASCII capital is an
  // HTTP method (someone spoke http:// or ws:// to the TLS port); anything else is noise.
  if (all[0] != 22) {
    if (all[0] >= 'A' && all[0] <= 'Z') {
      count(c, tls_result::plain_http);
      answer_plain_http(c.fd);
    } else {
      count(c, tls_result::bad_hello);
    }
    c.hello.reset();
    return false;
  }
  if (all.size() < record_header) return true;
  const std::size_t len = (std::size_t(all[3]) << 8) | all[4];
  if (all[1] != 3 || len == 0 || len > 16384) {
    count(c, tls_result::bad_hello);
    c.hello.reset();
    return false;
  }
  if (!whole_record(all)) return true;  // a trickle: the lease holds it meanwhile
  if (!start_ssl(c)) {
    c.hello.reset();
    return false;
  }
  feed = {const_cast<std::uint8_t*>(all.data()), all.size()};
  return true;
}

bool tls_transport::start_ssl(conn_tls& c) noexcept {
  auto ctx = _server.current();
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx->get());
  if (ssl == nullptr) {
    log_ratelimited(log_level::warn, "TLS: no memory for a connection");
    return false;
  }
  BIO* bio = BIO_new(bio_method());
  if (bio == nullptr) {
    SSL_free(ssl);
    return false;
  }
  BIO_set_data(bio, this);
  SSL_set_bio(ssl, bio, bio);
  SSL_set_accept_state(ssl);
  SSL_set_msg_callback(ssl, on_message);  // from the first record: kernel TLS counts them
  SSL_set_msg_callback_arg(ssl, this);
  c.ssl = ssl;
  ++_sessions;
  return true;
}

bool tls_transport::on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr || (c->flags & f_closed)) return false;
  std::span<std::uint8_t> feed = bytes;
  if (c->ssl == nullptr) {
    if (!gather_hello(*c, t, feed)) return false;
    if (feed.empty()) return true;
  }
  _in = feed;
  bool ok = pump(*c, t, up);
  _in = {};
  c->hello.reset();  // fed (OpenSSL keeps what it has not used yet)
  return ok;
}

/// Runs the handshake, then hands up the plaintext of every whole record received.
bool tls_transport::pump(conn_tls& c, conn_token t, plaintext_sink& up) noexcept {
  c.flags |= f_busy;
  bool ok = true;
  if (!(c.flags & f_done)) {
    _cur = &c;
    ERR_clear_error();
    const int r = SSL_do_handshake(c.ssl);
    if (r == 1) {
      c.flags |= f_done;
      count(c, SSL_session_reused(c.ssl) ? tls_result::resumed : tls_result::ok);
    } else {
      const int e = SSL_get_error(c.ssl, r);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        c.flags |= f_answered;
      } else {
        count(c, (c.flags & f_answered) ? tls_result::failed : tls_result::bad_hello);
        ok = false;
      }
    }
  }
  while (ok && (c.flags & f_done) && !(c.flags & f_closed)) {
    _cur = &c;
    ERR_clear_error();
    std::size_t n = 0;
    const int r = SSL_read_ex(c.ssl, _rbuf.get(), read_chunk, &n);
    if (c.flags & f_reneg) {
      count(c, tls_result::renegotiation);
      ok = false;
      break;
    }
    if (r == 1) {
      up.on_plaintext(t, {_rbuf.get(), n});  // may close the connection (f_closed)
      continue;
    }
    const int e = SSL_get_error(c.ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) break;
    if (e != SSL_ERROR_ZERO_RETURN) count(c, tls_result::bad_record);  // close_notify is a clean end
    ok = false;
  }
  if (c.flags & f_stale) ok = false;  // OpenSSL had to write after the handoff (on_tls_message)
  _cur = nullptr;
  c.flags &= ~f_busy;
  if (c.flags & f_closed) {  // closed during the plaintext callback: finish what close() left
    free_ssl(c);
    if (!(c.flags & f_backend)) forget(c);
    return true;
  }
  if (!ok) {
    flush_best_effort(c);  // the alert OpenSSL wrote, if the socket takes it now
    return false;
  }
  return start_write(c, t);  // handshake records, tickets, alerts, key updates
}

void tls_transport::on_read_end(conn_token t) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr) return;
  if (!(c->flags & f_done)) count(*c, tls_result::incomplete);
  else if (c->ssl != nullptr && SSL_has_pending(c->ssl)) count(*c, tls_result::truncated);
}

void tls_transport::on_timeout(conn_token t) noexcept {
  conn_tls* c = find(t);
  if (c != nullptr && !(c->flags & f_done)) count(*c, tls_result::timeout);
}

/// Plain HTTP to the TLS port: a plain answer saying so (a fresh socket takes it at once).
void tls_transport::answer_plain_http(int fd) noexcept {
  static constexpr char answer[] =
      "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 52\r\nConnection: close\r\n\r\n"
      "this port speaks TLS: use https:// or wss:// instead\n";
  [[maybe_unused]] auto r = ::send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// ---- sending --------------------------------------------------------------------------------

bool tls_transport::encrypt(conn_tls& c, const std::uint8_t* p, std::size_t n) noexcept {
  _cur = &c;
  ERR_clear_error();
  std::size_t put = 0;
  const bool ok = SSL_write_ex(c.ssl, p, n, &put) == 1 && put == n;
  _cur = nullptr;
  return ok;
}

send_result tls_transport::send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr || c->ssl == nullptr || !(c->flags & f_done) || (c->flags & f_closed))
    return {send_outcome::failed, -EPIPE, 0};
  if (c->flags & f_kernel) return _io.send(fd, t, iov, iovcnt);  // as plain TCP: the kernel seals it
  // Small frames share records: gathered into one stage, encrypted a record at a time.
  std::size_t offered = 0, staged = 0;
  bool ok = true;
  for (int k = 0; ok && k < iovcnt; ++k) {
    auto* p = static_cast<const std::uint8_t*>(iov[k].iov_base);
    std::size_t n = iov[k].iov_len;
    offered += n;
    if (n >= stage_bytes) {
      if (staged) ok = encrypt(*c, _stage.get(), staged), staged = 0;
      if (ok) ok = encrypt(*c, p, n);
      continue;
    }
    while (ok && n > 0) {
      const std::size_t take = std::min(n, stage_bytes - staged);
      std::memcpy(_stage.get() + staged, p, take);
      staged += take, p += take, n -= take;
      if (staged == stage_bytes) ok = encrypt(*c, _stage.get(), staged), staged = 0;
    }
  }
  if (ok && staged) ok = encrypt(*c, _stage.get(), staged);
  if (!ok) return {send_outcome::failed, -EPROTO, 0};
  c->owed += offered;
  c->flags |= f_conn_pending;
  if (!start_write(*c, t)) return {send_outcome::failed, -EPIPE, 0};
  if (!(c->flags & (f_backend | f_wait))) {  // all written at once (epoll)
    c->flags &= ~f_conn_pending;
    c->owed = 0;
    return {send_outcome::completed, 0, offered};
  }
  return {send_outcome::pending, 0, 0};
}

/// Writes the ciphertext waiting, one send at a time. False: the socket failed.
bool tls_transport::start_write(conn_tls& c, conn_token t) noexcept {
  if (c.flags & (f_backend | f_wait)) return true;  // a completion, or room, continues it
  for (;;) {
    if (!c.flight || c.flight_off >= c.flight.size()) {
      c.flight.reset();
      c.flight_off = 0;
      if (!c.pend || c.pend.size() == 0) {
        c.pend.reset();
        if (c.flags & f_shut_after) {
          c.flags &= ~f_shut_after;
          ::shutdown(c.fd, SHUT_WR);
        }
        if (_kernel_tx && (c.flags & (f_done | f_kernel_decided)) == f_done) hand_off(c);
        return true;
      }
      c.flight = std::move(c.pend);
    }
    iovec v{c.flight.data() + c.flight_off, c.flight.size() - c.flight_off};
    send_result r = _io.send(c.fd, t, &v, 1);
    switch (r.outcome) {
      case send_outcome::pending: c.flags |= f_backend; return true;
      case send_outcome::failed: return false;
      case send_outcome::completed:
        c.flight_off += std::uint32_t(r.bytes);
        if (r.bytes < v.iov_len) {
          c.flags |= f_wait;
          _io.wait_writable(c.fd, t);
          return true;
        }
        break;
    }
  }
}

/// After a completion or room: what the connection is told.
transport_event tls_transport::progress(conn_tls& c, conn_token t) noexcept {
  if (!start_write(c, t)) {
    c.flight.reset(), c.pend.reset();
    return {transport_event::failed, 0, -EPIPE};
  }
  if (c.flags & (f_backend | f_wait)) return {transport_event::in_progress};
  if (!(c.flags & f_conn_pending)) return {transport_event::sent, 0};
  c.flags &= ~f_conn_pending;
  return {transport_event::sent, std::exchange(c.owed, 0)};
}

transport_event tls_transport::on_sent(conn_token t, int res) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr) return {transport_event::sent, 0};
  if (c->flags & f_kernel) {  // the connection's own plaintext send (ours are all done by then)
    if (res < 0) return {transport_event::failed, 0, res};
    return {transport_event::sent, std::size_t(res)};
  }
  c->flags &= ~f_backend;
  if (c->flags & f_closed) {  // the connection is gone; this send held its slot
    forget(*c);
    return {transport_event::sent, 0};
  }
  if (res < 0) {
    c->flight.reset(), c->pend.reset();
    return {transport_event::failed, 0, res};
  }
  c->flight_off += std::uint32_t(res);
  return progress(*c, t);
}

transport_event tls_transport::on_writable(int, conn_token t) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr || !(c->flags & f_wait)) return {transport_event::writable};
  c->flags &= ~f_wait;
  return progress(*c, t);
}

void tls_transport::wait_writable(int fd, conn_token t) noexcept { _io.wait_writable(fd, t); }

// ---- kernel TLS -----------------------------------------------------------------------------

/// Once per connection, when every record OpenSSL sealed has been handed to the socket (so no
/// user-space record can follow a kernel one): the transmit side goes to the kernel, or stays
/// here if the kernel refuses it (the socket then sends our ciphertext as before).
void tls_transport::hand_off(conn_tls& c) noexcept {
  c.flags |= f_kernel_decided;
  ktls::tx_info info;
  const char* why = "";
  int err = 0;
  const bool ok = ktls::extract_tx(c.ssl, info, why) && _handoff(c.fd, info, err, why);
  ktls::forget(c.ssl);
  OPENSSL_cleanse(&info, sizeof info);
  if (ok) {
    c.flags |= f_kernel;
    _n.kernel_handed.add();
    return;
  }
  _n.kernel_fallback.add();
  log_fallback_once(why, err);
}

/// Best effort, as the connection closes: the alert OpenSSL just wrote, if nothing else of
/// ours is in flight and the socket takes it now.
void tls_transport::flush_best_effort(conn_tls& c) noexcept {
  if ((c.flags & (f_backend | f_wait)) || c.flight || !c.pend || c.fd < 0) return;
  [[maybe_unused]] auto r = ::send(c.fd, c.pend.data(), c.pend.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  c.pend.reset();
}

// ---- closing --------------------------------------------------------------------------------

void tls_transport::shutdown_write(int fd, conn_token t) noexcept {
  conn_tls* c = find(t);
  if (c == nullptr || c->ssl == nullptr || !(c->flags & f_done)) {
    ::shutdown(fd, SHUT_WR);
    return;
  }
  if (c->flags & f_kernel) {
    // The connection calls this once its output has all been sent, so the alert comes last; if
    // the socket has no room for it now, the peer sees the end without it (after a WebSocket
    // close, which already said the stream is complete).
    ktls::send_close_notify(fd);
    ::shutdown(fd, SHUT_WR);
    return;
  }
  c->flags |= f_kernel_decided;  // no handoff after our close_notify
  _cur = c;
  ERR_clear_error();
  SSL_shutdown(c->ssl);  // our close_notify
  _cur = nullptr;
  c->flags |= f_shut_after;
  if (!start_write(*c, t)) ::shutdown(fd, SHUT_WR);
}

void tls_transport::close(int fd, conn_token t, bool abort) noexcept {
  conn_tls* c = find(t);
  if (c != nullptr && !(c->flags & f_done)) count(*c, tls_result::incomplete);
  if (abort) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  _io.close(fd, t);
  if (c == nullptr) return;
  c->flags |= f_closed;
  c->fd = -1;
  c->pend.reset();
  c->hello.reset();
  if (c->flags & f_busy) return;  // pump() finishes
  free_ssl(*c);
  if (!(c->flags & f_backend)) forget(*c);  // else its completion does
}

bool tls_transport::idle(conn_token t) const noexcept {
  const conn_tls* c = find(t);
  return c == nullptr || !(c->flags & f_backend);
}

void tls_transport::free_ssl(conn_tls& c) noexcept {
  if (c.ssl == nullptr) return;
  SSL_free(c.ssl);
  c.ssl = nullptr;
  --_sessions;
}

void tls_transport::forget(conn_tls& c) noexcept {
  free_ssl(c);
  c.flight.reset(), c.pend.reset(), c.hello.reset();
  c.token = 0;
  c.owed = 0;
  c.flight_off = 0;
  c.fd = -1;
  c.flags = 0;
}

}  // namespace wspush::server
