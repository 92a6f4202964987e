#pragma once
// For the TLS unit tests and the TLS record fuzz target: a throwaway certificate, a backend that
// captures what the transport sends, and an OpenSSL client over memory BIOs.

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/net/tls_context.hpp"
#include "server/reactor/io_backend.hpp"

namespace wspush::test {

/// A P-256 certificate for localhost in tls_files; the files go with the object.
struct test_cert {
  test_cert() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509_sign(x, key, EVP_sha256());
    char tmpl[] = "/tmp/wspush-ktls-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
    dir = tmpl;
    files = {dir + "/cert.pem", dir + "/key.pem"};
    FILE* f = std::fopen(files.cert.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(files.key.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
  }
  ~test_cert() {
    std::remove(files.cert.c_str());
    std::remove(files.key.c_str());
    ::rmdir(dir.c_str());
  }
  std::string dir;
  server::tls_files files;
};

/// Takes every send whole, at once or (hold) as a send in flight the test completes later.
class capture_backend final : public server::io_backend {
 public:
  const char* name() const noexcept override { return "capture"; }
  bool add_listener(int, int) noexcept override { return true; }
  void pause_accept(int) noexcept override {}
  void resume_accept(int) noexcept override {}
  bool start_reading(int, server::conn_token) noexcept override { return true; }
  void stop_reading(int, server::conn_token) noexcept override {}
  server::send_result send(int, server::conn_token, const iovec* iov, int n) noexcept override {
    std::size_t total = 0;
    for (int k = 0; k < n; ++k) {
      wire.append(static_cast<const char*>(iov[k].iov_base), iov[k].iov_len);
      total += iov[k].iov_len;
    }
    if (!hold) return {server::send_outcome::completed, 0, total};
    held = total;
    return {server::send_outcome::pending, 0, 0};
  }
  void wait_writable(int, server::conn_token) noexcept override {}
  void close(int, server::conn_token) noexcept override {}
  void poll(server::io_handler&, int) noexcept override {}
  void wake() noexcept override {}

  std::string take() { return std::exchange(wire, {}); }

  std::string wire;  // what the transport wrote, not yet given to the client
  bool hold = false;
  std::size_t held = 0;
};

/// A client context: TLS 1.3 with `suites`, or TLS 1.2 with `ciphers` (the other left empty).
inline SSL_CTX* client_context(const char* suites, const char* ciphers) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  if (suites != nullptr) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, suites);
  } else {
    SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(ctx, ciphers);
  }
  return ctx;
}

/// An OpenSSL client over memory BIOs: `in` is what the server sent, `out` what it sends.
struct mem_client {
  explicit mem_client(SSL_CTX* ctx, SSL_SESSION* resume = nullptr)
      : ssl(SSL_new(ctx)), in(BIO_new(BIO_s_mem())), out(BIO_new(BIO_s_mem())) {
    SSL_set_bio(ssl, in, out);
    SSL_set_connect_state(ssl);
    SSL_set_tlsext_host_name(ssl, "localhost");
    if (resume != nullptr) SSL_set_session(ssl, resume);
  }
  ~mem_client() { SSL_free(ssl); }
  mem_client(const mem_client&) = delete;
  mem_client& operator=(const mem_client&) = delete;

  std::string take_output() {
    std::string s;
    char buf[16384];
    int n;
    while ((n = BIO_read(out, buf, sizeof buf)) > 0) s.append(buf, std::size_t(n));
    return s;
  }
  void give(const std::string& bytes) { BIO_write(in, bytes.data(), int(bytes.size())); }
  /// Reads exactly `n` bytes of plaintext, or what came before a failure.
  std::string read(std::size_t n) {
    std::string s(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const int r = SSL_read(ssl, s.data() + got, int(n - got));
      if (r <= 0) break;
      got += std::size_t(r);
    }
    s.resize(got);
    return s;
  }
  /// SSL_read's error once the data is used up (SSL_ERROR_WANT_READ: nothing wrong).
  int read_error() {
    char c;
    const int r = SSL_read(ssl, &c, 1);
    return r > 0 ? -1 : SSL_get_error(ssl, r);
  }

  SSL* ssl;
  BIO* in;
  BIO* out;
};

/// A connected loopback TCP pair: {the accepted end, the connecting end}.
inline std::pair<int, int> tcp_pair() {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 1) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    throw std::runtime_error("no loopback listener");
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  const int s = ::accept(l, nullptr, nullptr);
  ::close(l);
  if (s < 0) throw std::runtime_error("accept");
  return {s, c};
}

}  // namespace wspush::test
