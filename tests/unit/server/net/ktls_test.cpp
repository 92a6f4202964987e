// server/net/ktls.cpp: the transmit state handed to kernel TLS, proved without the kernel. A
// real OpenSSL client handshakes with our server side in memory; then records are sealed from
// nothing but the extracted tls_crypto_info, the way the kernel seals them (ktls_sim.hpp), and
// the client must read them. A wrong key, IV, salt or sequence number fails its record check.

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "server/net/ktls.hpp"
#include "server/net/tls_context.hpp"
#include "tests/unit/server/net/ktls_sim.hpp"
#include "tests/unit/server/net/tls_test_support.hpp"

using namespace wspush::server;
using namespace wspush::test;

namespace {

/// Our server side over memory BIOs, wired to ktls as the transport wires it: the message
/// callback, and every byte written.
struct mem_server {
  explicit mem_server(const tls_context& ctx) : ssl(SSL_new(ctx.get())), in(BIO_new(BIO_s_mem())), out(BIO_new(BIO_s_mem())) {
    SSL_set_bio(ssl, in, out);
    SSL_set_accept_state(ssl);
    SSL_set_msg_callback(ssl, on_message);
    SSL_set_msg_callback_arg(ssl, this);
  }
  ~mem_server() { SSL_free(ssl); }
  mem_server(const mem_server&) = delete;
  mem_server& operator=(const mem_server&) = delete;

  static void on_message(int write_p, int, int type, const void* buf, std::size_t len, SSL* ssl, void* arg) {
    ktls::on_message(ssl, write_p, type, buf, len);
    if (ktls::asks_key_update(write_p, type, buf, len)) static_cast<mem_server*>(arg)->key_update_asked = true;
  }
  std::string take_output() {
    std::string s;
    char buf[16384];
    int n;
    while ((n = BIO_read(out, buf, sizeof buf)) > 0) s.append(buf, std::size_t(n));
    if (!s.empty()) ktls::on_ciphertext(ssl, s.data(), s.size());
    stream += s;
    return s;
  }
  void give(const std::string& bytes) { BIO_write(in, bytes.data(), int(bytes.size())); }

  SSL* ssl;
  BIO* in;
  BIO* out;
  std::string stream;  // everything it wrote
  bool key_update_asked = false;
};

bool handshake(mem_server& s, mem_client& c) {
  for (int round = 0; round < 10; ++round) {
    const int cr = SSL_do_handshake(c.ssl);
    s.give(c.take_output());
    const int sr = SSL_do_handshake(s.ssl);
    c.give(s.take_output());
    if (cr == 1 && sr == 1) return true;
  }
  return false;
}

struct record {
  std::uint8_t type;
  std::string body;
};

std::vector<record> records_of(const std::string& stream) {
  std::vector<record> out;
  for (std::size_t at = 0; at + 5 <= stream.size();) {
    const std::size_t len = std::size_t(std::uint8_t(stream[at + 3])) << 8 | std::uint8_t(stream[at + 4]);
    out.push_back({std::uint8_t(stream[at]), stream.substr(at + 5, len)});
    at += 5 + len;
  }
  return out;
}

std::uint64_t be64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v = v << 8 | p[k];
  return v;
}

const unsigned char* rec_seq_of(const ktls::tx_info& info) {
  switch (info.base.cipher_type) {
    case TLS_CIPHER_AES_GCM_128: return info.aes128.rec_seq;
    case TLS_CIPHER_AES_GCM_256: return info.aes256.rec_seq;
    default: return info.chacha.rec_seq;
  }
}

unsigned char* key_of(ktls::tx_info& info) {
  switch (info.base.cipher_type) {
    case TLS_CIPHER_AES_GCM_128: return info.aes128.key;
    case TLS_CIPHER_AES_GCM_256: return info.aes256.key;
    default: return info.chacha.key;
  }
}

struct suite_case {
  const char* name;
  const char* tls13_suites;  // or
  const char* tls12_ciphers;
  std::uint16_t cipher_type;
  std::size_t info_size;
};

const suite_case suites[] = {
    {"TLS 1.3 AES-128-GCM", "TLS_AES_128_GCM_SHA256", nullptr, TLS_CIPHER_AES_GCM_128,
     sizeof(tls12_crypto_info_aes_gcm_128)},
    {"TLS 1.3 AES-256-GCM", "TLS_AES_256_GCM_SHA384", nullptr, TLS_CIPHER_AES_GCM_256,
     sizeof(tls12_crypto_info_aes_gcm_256)},
    {"TLS 1.3 CHACHA20-POLY1305", "TLS_CHACHA20_POLY1305_SHA256", nullptr, TLS_CIPHER_CHACHA20_POLY1305,
     sizeof(tls12_crypto_info_chacha20_poly1305)},
    {"TLS 1.2 AES-128-GCM", nullptr, "ECDHE-ECDSA-AES128-GCM-SHA256", TLS_CIPHER_AES_GCM_128,
     sizeof(tls12_crypto_info_aes_gcm_128)},
    {"TLS 1.2 AES-256-GCM", nullptr, "ECDHE-ECDSA-AES256-GCM-SHA384", TLS_CIPHER_AES_GCM_256,
     sizeof(tls12_crypto_info_aes_gcm_256)},
    {"TLS 1.2 CHACHA20-POLY1305", nullptr, "ECDHE-ECDSA-CHACHA20-POLY1305", TLS_CIPHER_CHACHA20_POLY1305,
     sizeof(tls12_crypto_info_chacha20_poly1305)},
};

struct world {
  world() : ctx(cert.files, std::make_shared<ticket_keys>(), true) {}
  test_cert cert;
  tls_context ctx;
};

/// A connection of `k` (resuming `resume` if given) after which OpenSSL wrote `before` records
/// of application data the client read. Leaves the extracted info in `info`.
struct connection {
  connection(world& w, SSL_CTX* cctx, SSL_SESSION* resume, int before) : server(w.ctx), client(cctx, resume) {
    REQUIRE(handshake(server, client));
    CHECK(client.read_error() == SSL_ERROR_WANT_READ);  // the tickets (TLS 1.3) are read
    for (int k = 0; k < before; ++k) {
      // (the second one long: one write, three records)
      const std::string m = "sealed by OpenSSL #" + std::to_string(k) + std::string(k == 1 ? 40000 : 0, 'o');
      REQUIRE(SSL_write(server.ssl, m.data(), int(m.size())) == int(m.size()));
      const std::string sealed = server.take_output();
      app_records += records_of(sealed).size();
      client.give(sealed);
      CHECK(client.read(m.size()) == m);
    }
    const char* why = "";
    const bool ok = ktls::extract_tx(server.ssl, info, why);
    INFO(why);
    REQUIRE(ok);
  }
  mem_server server;
  mem_client client;
  std::size_t app_records = 0;  // what OpenSSL sealed of the application data
  ktls::tx_info info;
};

/// What only the stream shows of TLS 1.2: records under the new key (after the last
/// ChangeCipherSpec) and, for AES-GCM, the explicit nonce the next one must carry.
void check_tls12_stream(const connection& c, const suite_case& k) {
  const std::vector<record> recs = records_of(c.server.stream);
  std::size_t after_ccs = 0;
  for (const record& r : recs) after_ccs = r.type == 20 ? 0 : after_ccs + 1;
  CHECK(be64(rec_seq_of(c.info)) == after_ccs);
  if (k.cipher_type == TLS_CIPHER_CHACHA20_POLY1305) return;
  REQUIRE(recs.back().body.size() >= 8);
  unsigned char next[8];
  std::memcpy(next, recs.back().body.data(), 8);
  for (int b = 7; b >= 0; --b)
    if (++next[b] != 0) break;
  const unsigned char* iv = k.cipher_type == TLS_CIPHER_AES_GCM_128 ? c.info.aes128.iv : c.info.aes256.iv;
  CHECK(std::memcmp(iv, next, 8) == 0);
}

/// Records sealed from the info alone, several in a row, then a close_notify as a control record.
void check_kernel_records(connection& c) {
  kernel_tls_sim kernel(c.info);
  const std::string one = "sealed by the kernel", two(100, 'b'), three(16384, 'c');
  std::string records = kernel.seal(23, one);  // in this order: each takes the next sequence number
  records += kernel.seal(23, two);
  records += kernel.seal(23, three);
  c.client.give(records);
  CHECK(c.client.read(one.size()) == one);
  CHECK(c.client.read(two.size()) == two);
  CHECK(c.client.read(three.size()) == three);
  c.client.give(kernel.seal(21, std::string("\x01\x00", 2)));  // TLS_SET_RECORD_TYPE 21: close_notify
  CHECK(c.client.read_error() == SSL_ERROR_ZERO_RETURN);
}

}  // namespace

TEST_CASE("ktls: records sealed from the extracted state are read by the client", "[ktls]") {
  world w;
  for (const suite_case& k : suites) {
    SSL_CTX* cctx = client_context(k.tls13_suites, k.tls12_ciphers);
    SSL_SESSION* session = nullptr;
    for (int resumed = 0; resumed < 2; ++resumed) {
      for (int before : {0, 3}) {
        INFO(k.name << (resumed ? ", resumed" : ", full") << ", " << before << " records by OpenSSL first");
        SSL_SESSION* use = resumed ? SSL_SESSION_dup(session) : nullptr;  // each use spends its copy (above)
        connection c(w, cctx, use, before);
        SSL_SESSION_free(use);  // the client holds its own reference
        CHECK(bool(SSL_session_reused(c.server.ssl)) == bool(resumed));
        CHECK(c.info.base.version == (k.tls13_suites ? TLS_1_3_VERSION : TLS_1_2_VERSION));
        CHECK(c.info.base.cipher_type == k.cipher_type);
        CHECK(c.info.size == k.info_size);
        if (k.tls12_ciphers) check_tls12_stream(c, k);
        else  // one ticket after a full handshake (none when resumed with the newest key), then ours
          CHECK(be64(rec_seq_of(c.info)) == c.app_records + (resumed ? 0 : 1));
        check_kernel_records(c);
        // A copy: freeing a client that sent no close_notify marks its own session not resumable.
        if (!resumed && before == 0) session = SSL_SESSION_dup(SSL_get_session(c.client.ssl));
      }
    }
    SSL_SESSION_free(session);
    SSL_CTX_free(cctx);
  }
}

TEST_CASE("ktls: a sequence number one off, or another key, fails at the client", "[ktls]") {
  world w;
  for (const suite_case& k : {suites[0], suites[3], suites[5]}) {
    SSL_CTX* cctx = client_context(k.tls13_suites, k.tls12_ciphers);
    for (int wrong = 0; wrong < 2; ++wrong) {
      INFO(k.name << (wrong == 0 ? ": sequence number" : ": key"));
      connection c(w, cctx, nullptr, 1);
      if (wrong == 0) const_cast<unsigned char*>(rec_seq_of(c.info))[7] ^= 1;
      else key_of(c.info)[0] ^= 1;
      kernel_tls_sim kernel(c.info);
      c.client.give(kernel.seal(23, "should not be read"));
      CHECK(c.client.read_error() == SSL_ERROR_SSL);
    }
    SSL_CTX_free(cctx);
  }
}

TEST_CASE("ktls: a KeyUpdate the peer asks for is seen, and one of ours before the handoff stops it", "[ktls]") {
  world w;
  SSL_CTX* cctx = client_context("TLS_AES_128_GCM_SHA256", nullptr);
  {
    connection c(w, cctx, nullptr, 0);
    REQUIRE(SSL_key_update(c.client.ssl, SSL_KEY_UPDATE_REQUESTED) == 1);
    REQUIRE(SSL_write(c.client.ssl, "x", 1) == 1);
    c.server.give(c.client.take_output());
    char b;
    CHECK(SSL_read(c.server.ssl, &b, 1) == 1);
    CHECK(c.server.key_update_asked);  // after a handoff the transport closes here
    // Answered by OpenSSL (with its next write): its key is no longer the one captured.
    REQUIRE(SSL_write(c.server.ssl, "y", 1) == 1);
    c.client.give(c.server.take_output());
    CHECK(c.client.read(1) == "y");
    ktls::tx_info again;
    const char* why = "";
    CHECK_FALSE(ktls::extract_tx(c.server.ssl, again, why));
    CHECK(std::string(why).find("KeyUpdate") != std::string::npos);
  }
  SSL_CTX_free(cctx);
}

TEST_CASE("ktls: without capture_secrets there is nothing to hand over, and it says why", "[ktls]") {
  test_cert cert;
  tls_context plain(cert.files, std::make_shared<ticket_keys>(), false);
  SSL_CTX* cctx = client_context("TLS_AES_128_GCM_SHA256", nullptr);
  {
    mem_server server(plain);
    mem_client client(cctx);
    REQUIRE(handshake(server, client));
    ktls::tx_info info;
    const char* why = "";
    CHECK_FALSE(ktls::extract_tx(server.ssl, info, why));  // the watch counted, but no secret was logged
    CHECK(std::string(why) != "");
    ktls::forget(server.ssl);
    CHECK_FALSE(ktls::extract_tx(server.ssl, info, why));
  }
  SSL_CTX_free(cctx);
}

TEST_CASE("ktls: hand_off on this kernel: installed where offered, else refused with the socket unchanged", "[ktls]") {
  world w;
  SSL_CTX* cctx = client_context("TLS_AES_128_GCM_SHA256", nullptr);
  connection c(w, cctx, nullptr, 0);
  auto [s, peer] = tcp_pair();
  int err = 0;
  const char* step = "";
  std::string why;
  const bool offered = kernel_tls_available(why);
  const bool handed = ktls::hand_off(s, c.info, err, step);
  INFO("offered: " << offered << " (" << why << "), step " << step << ": " << std::strerror(err));
  if (handed) {
    // The kernel seals what we send: the peer gets a record, not the plaintext.
    REQUIRE(::send(s, "hello", 5, 0) == 5);
    char buf[64];
    const ssize_t n = ::recv(peer, buf, sizeof buf, 0);
    REQUIRE(n > 5);
    CHECK(buf[0] == 23);
  } else {
    CHECK_FALSE(offered);  // where the kernel lists "tls", the handoff must work
    CHECK(std::string(step).find("TCP_ULP") != std::string::npos);
    CHECK(err != 0);
    // The socket is a plain TCP socket still: bytes go through as they are.
    REQUIRE(::send(s, "hello", 5, 0) == 5);
    char buf[8];
    REQUIRE(::recv(peer, buf, sizeof buf, 0) == 5);
    CHECK(std::string(buf, 5) == "hello");
  }
  ::close(s);
  ::close(peer);
  SSL_CTX_free(cctx);
}
