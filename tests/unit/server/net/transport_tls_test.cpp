// server/net/transport_tls.cpp with kernel TLS: the handoff after the handshake, driven through
// the real transport with a backend that keeps what it is asked to send. The kernel itself is
// either the real one (this machine's refuses the "tls" ULP: the connection must stay in user
// space) or a stand-in that takes the handed state (ktls_sim.hpp plays the kernel's part).

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <unistd.h>

#include <openssl/ssl.h>

#include "pool/buffer_pool.hpp"
#include "server/net/ktls.hpp"
#include "server/net/tls_context.hpp"
#include "server/net/transport_tls.hpp"
#include "tests/unit/server/net/ktls_sim.hpp"
#include "tests/unit/server/net/tls_test_support.hpp"

using namespace wspush::server;
using namespace wspush::test;

namespace {

struct sink final : plaintext_sink {
  void on_plaintext(conn_token, std::span<std::uint8_t> bytes) noexcept override {
    got.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::string got;
};

// The stand-in kernel: keeps what it was handed.
ktls::tx_info handed;
int handoffs = 0;
bool take_handoff(int, const ktls::tx_info& info, int&, const char*&) noexcept {
  handed = info;
  ++handoffs;
  return true;
}

struct rig {
  rig(bool kernel_tx, tls_transport::kernel_handoff h)
      : server(cert.files, kernel_tx), tls(io, server, buffers, counters, h) {
    handoffs = 0;
  }
  test_cert cert;
  capture_backend io;
  wspush::pool::buffer_pool buffers;
  tls_counters counters;
  tls_server server;
  tls_transport tls;
};

constexpr conn_token token = (std::uint64_t(1) << 32) | 3;

bool feed(rig& r, const std::string& bytes, sink& up) {
  std::vector<std::uint8_t> b(bytes.begin(), bytes.end());
  return b.empty() || r.tls.on_received(token, b, up);
}

/// The client's handshake against the transport; the client has read all the server wrote.
bool handshake(rig& r, mem_client& c, sink& up) {
  for (int round = 0; round < 8; ++round) {
    const int cr = SSL_do_handshake(c.ssl);
    if (!feed(r, c.take_output(), up)) return false;
    c.give(r.io.take());
    if (cr == 1 && SSL_is_init_finished(c.ssl)) return c.read_error() == SSL_ERROR_WANT_READ;
  }
  return false;
}

send_result send_text(rig& r, int fd, const std::string& a, const std::string& b) {
  iovec v[2] = {{const_cast<char*>(a.data()), a.size()}, {const_cast<char*>(b.data()), b.size()}};
  return r.tls.send(fd, token, v, 2);
}

}  // namespace

TEST_CASE("transport_tls: a handoff the kernel refuses leaves the connection in user-space TLS", "[ktls]") {
  rig r(true, ktls::hand_off);
  auto [fd, peer] = tcp_pair();
  SSL_CTX* cctx = client_context("TLS_AES_128_GCM_SHA256", nullptr);
  {
    mem_client c(cctx);
    sink up;
    REQUIRE(r.tls.open(fd, token));
    REQUIRE(handshake(r, c, up));
    CHECK(r.counters.kernel_handed.get() + r.counters.kernel_fallback.get() == 1);
    std::string why;
    const std::string a = "GET /ws HTTP/1.1\r\n", b = "after the handoff";
    REQUIRE(send_text(r, fd, a, b).outcome == send_outcome::completed);
    const std::string wire = r.io.take();
    if (r.counters.kernel_fallback.get() == 1) {
      CHECK_FALSE(kernel_tls_available(why));  // only a kernel without "tls" refuses it
      CHECK(wire != a + b);                    // sealed here: records
      c.give(wire);
      CHECK(c.read(a.size() + b.size()) == a + b);
      // Receiving, as ever; and the connection still ends with our close_notify.
      REQUIRE(SSL_write(c.ssl, "ping", 4) == 4);
      CHECK(feed(r, c.take_output(), up));
      CHECK(up.got == "ping");
      r.tls.shutdown_write(fd, token);
      c.give(r.io.take());
      CHECK(c.read_error() == SSL_ERROR_ZERO_RETURN);
    } else {
      CHECK(r.counters.kernel_handed.get() == 1);
      CHECK(wire == a + b);  // the backend got plaintext: the kernel seals it
    }
    r.tls.close(fd, token, false);
  }
  ::close(peer);
  SSL_CTX_free(cctx);
}

TEST_CASE("transport_tls: after the handoff sends are plaintext, and the kernel's records continue the stream",
          "[ktls]") {
  struct version_case {
    const char* name;
    const char* suites;
    const char* ciphers;
  };
  for (const version_case& k : {version_case{"TLS 1.3", "TLS_AES_256_GCM_SHA384", nullptr},
                                version_case{"TLS 1.2 AES-GCM", nullptr, "ECDHE-ECDSA-AES128-GCM-SHA256"},
                                version_case{"TLS 1.2 CHACHA20", nullptr, "ECDHE-ECDSA-CHACHA20-POLY1305"}}) {
    INFO(k.name);
    rig r(true, take_handoff);
    SSL_CTX* cctx = client_context(k.suites, k.ciphers);
    mem_client c(cctx);
    sink up;
    REQUIRE(r.tls.open(-1, token));  // the stand-in kernel needs no socket
    // The handshake's last flight stays in flight (io_uring), and the upgrade's answer is sealed
    // by OpenSSL behind it: the handoff waits for both to leave.
    for (int round = 0; round < 8 && !SSL_is_init_finished(c.ssl); ++round) {
      SSL_do_handshake(c.ssl);
      r.io.hold = round >= 1;  // the server's last flight (TLS 1.3: the ticket) is not done yet
      REQUIRE(feed(r, c.take_output(), up));
      c.give(r.io.take());  // (the bytes reach the client in the order they were sent)
    }
    REQUIRE(SSL_is_init_finished(c.ssl));
    CHECK(c.read_error() == SSL_ERROR_WANT_READ);
    const std::size_t first = r.io.held;
    REQUIRE(first > 0);
    const std::string answer = "HTTP/1.1 101 Switching Protocols\r\n\r\n";
    REQUIRE(send_text(r, -1, answer, "").outcome == send_outcome::pending);
    CHECK(handoffs == 0);
    transport_event e = r.tls.on_sent(token, int(first));
    for (int k2 = 0; k2 < 4 && e.kind == transport_event::in_progress; ++k2) e = r.tls.on_sent(token, int(r.io.held));
    CHECK(e.kind == transport_event::sent);
    CHECK(e.plaintext == answer.size());
    CHECK(handoffs == 1);
    CHECK(r.counters.kernel_handed.get() == 1);
    c.give(r.io.take());
    CHECK(c.read(answer.size()) == answer);

    r.io.hold = false;
    const std::string f1 = "frame one", f2(3000, 'x');
    const send_result s = send_text(r, -1, f1, f2);
    REQUIRE(s.outcome == send_outcome::completed);
    CHECK(s.bytes == f1.size() + f2.size());
    const std::string plain = r.io.take();
    CHECK(plain == f1 + f2);  // as it is: the kernel would seal it
    kernel_tls_sim kernel(handed);
    c.give(kernel.seal(23, plain.substr(0, 100)));
    c.give(kernel.seal(23, plain.substr(100)));
    CHECK(c.read(plain.size()) == plain);

    // Receiving stays here; a KeyUpdate that asks for ours cannot be answered: closed.
    REQUIRE(SSL_write(c.ssl, "still reading", 13) == 13);
    REQUIRE(feed(r, c.take_output(), up));
    CHECK(up.got == "still reading");
    if (k.suites != nullptr) {
      REQUIRE(SSL_key_update(c.ssl, SSL_KEY_UPDATE_NOT_REQUESTED) == 1);  // only its own key
      REQUIRE(SSL_write(c.ssl, "1", 1) == 1);
      CHECK(feed(r, c.take_output(), up));
      REQUIRE(SSL_key_update(c.ssl, SSL_KEY_UPDATE_REQUESTED) == 1);
      REQUIRE(SSL_write(c.ssl, "2", 1) == 1);
      CHECK_FALSE(feed(r, c.take_output(), up));
      CHECK(r.io.wire.empty());  // nothing sealed with stale keys left
    } else {
      // A record that does not decrypt: counted and closed; OpenSSL's alert is not sent.
      REQUIRE(SSL_write(c.ssl, "tampered", 8) == 8);
      std::string rec = c.take_output();
      rec[rec.size() - 3] ^= 0x40;
      CHECK_FALSE(feed(r, rec, up));
      CHECK(r.counters.get(tls_result::bad_record) == 1);
      CHECK(r.io.wire.empty());
    }
    r.tls.close(-1, token, false);
    CHECK(r.tls.sessions() == 0);
    SSL_CTX_free(cctx);
  }
}

TEST_CASE("transport_tls: without kernel TLS nothing is handed over", "[ktls]") {
  rig r(false, take_handoff);
  SSL_CTX* cctx = client_context("TLS_AES_128_GCM_SHA256", nullptr);
  {
    mem_client c(cctx);
    sink up;
    REQUIRE(r.tls.open(-1, token));
    REQUIRE(handshake(r, c, up));
    REQUIRE(send_text(r, -1, "a", "b").outcome == send_outcome::completed);
    c.give(r.io.take());
    CHECK(c.read(2) == "ab");
    CHECK(handoffs == 0);
    CHECK(r.counters.kernel_handed.get() + r.counters.kernel_fallback.get() == 0);
    r.tls.close(-1, token, false);
  }
  SSL_CTX_free(cctx);
}
