#include "server/net/tls_client.hpp"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "server/net/tls_context.hpp"

namespace wspush::server {

namespace {

bool is_ip(const std::string& host) {
  unsigned char b[16];
  return ::inet_pton(AF_INET, host.c_str(), b) == 1 || ::inet_pton(AF_INET6, host.c_str(), b) == 1;
}

}  // namespace

tls_client_context::tls_client_context(const tls_client_files& files) {
  ERR_clear_error();
  _ctx = SSL_CTX_new(TLS_client_method());
  if (_ctx == nullptr) throw std::runtime_error("TLS to Redis: " + openssl_errors());
  auto fail = [&](const std::string& what) {
    std::string msg = what + ": " + openssl_errors();
    SSL_CTX_free(_ctx);
    _ctx = nullptr;
    throw std::runtime_error(msg);
  };
  SSL_CTX_set_min_proto_version(_ctx, TLS1_2_VERSION);
  // A peer that closes without close_notify reads as closed: RESP frames its own replies, and a
  // reply cut short is never handed on.
  SSL_CTX_set_options(_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Writes are retried from a buffer that may have grown (and moved) meanwhile; a write may
  // take part of what it is given.
  SSL_CTX_set_mode(_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(_ctx, SSL_VERIFY_PEER, nullptr);
  if (!files.ca.empty()) {
    if (SSL_CTX_load_verify_locations(_ctx, files.ca.c_str(), nullptr) != 1) fail("--redis-tls-ca " + files.ca);
  } else if (SSL_CTX_set_default_verify_paths(_ctx) != 1) {
    fail("TLS to Redis: the system's certificate store");
  }
  if (!files.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(_ctx, files.cert.c_str()) != 1) fail("--redis-tls-cert " + files.cert);
    if (SSL_CTX_use_PrivateKey_file(_ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) fail("--redis-tls-key " + files.key);
    if (SSL_CTX_check_private_key(_ctx) != 1) fail("--redis-tls-key " + files.key + " does not match --redis-tls-cert");
  }
}

tls_client_context::~tls_client_context() {
  if (_ctx != nullptr) SSL_CTX_free(_ctx);
}

bool tls_client_stream::start(const tls_client_context& ctx, int fd, const std::string& host, std::string& why) noexcept {
  reset();
  ERR_clear_error();
  _ssl = SSL_new(ctx.get());
  if (_ssl == nullptr || SSL_set_fd(_ssl, fd) != 1) {
    why = "TLS: " + openssl_errors();
    reset();
    return false;
  }
  // The certificate must name the host the URL gave: an address by its IP, a name by DNS (and SNI).
  X509_VERIFY_PARAM* param = SSL_get0_param(_ssl);
  const bool named = is_ip(host) ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1
                                 : SSL_set1_host(_ssl, host.c_str()) == 1 && SSL_set_tlsext_host_name(_ssl, host.c_str()) == 1;
  if (!named) {
    why = "TLS: cannot check the certificate against " + host + ": " + openssl_errors();
    reset();
    return false;
  }
  SSL_set_connect_state(_ssl);
  return true;
}

tls_client_stream::io tls_client_stream::handshake(std::string& why) noexcept {
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_do_handshake(_ssl);
  return rc == 1 ? io::done : outcome(rc, why);
}

tls_client_stream::io tls_client_stream::read(char* buf, std::size_t cap, std::size_t& got, std::string& why) noexcept {
  ERR_clear_error();
  errno = 0;
  got = 0;
  if (SSL_read_ex(_ssl, buf, cap, &got) == 1) return io::done;
  return outcome(0, why);
}

tls_client_stream::io tls_client_stream::write(const char* buf, std::size_t len, std::size_t& put, std::string& why) noexcept {
  ERR_clear_error();
  errno = 0;
  put = 0;
  if (SSL_write_ex(_ssl, buf, len, &put) == 1) return io::done;
  return outcome(0, why);
}

/// What a call that did not succeed means (OpenSSL's error for it, taken at once).
tls_client_stream::io tls_client_stream::outcome(int rc, std::string& why) noexcept {
  const int err = SSL_get_error(_ssl, rc);
  switch (err) {
    case SSL_ERROR_WANT_READ: return io::want_read;
    case SSL_ERROR_WANT_WRITE: return io::want_write;
    case SSL_ERROR_ZERO_RETURN: return io::closed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (errno == 0 || errno == ECONNRESET || errno == EPIPE) {
          why = errno == 0 ? "the peer closed the connection" : std::strerror(errno);
          return io::closed;
        }
        why = std::string("TLS: ") + std::strerror(errno);
        return io::failed;
      }
      break;
    default: break;
  }
  try {
    why = "TLS: " + openssl_errors();
    const long verify = SSL_get_verify_result(_ssl);
    if (verify != X509_V_OK) why += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
  } catch (...) {
  }
  return io::failed;
}

void tls_client_stream::reset() noexcept {
  if (_ssl != nullptr) SSL_free(_ssl);
  _ssl = nullptr;
}

}  // namespace wspush::server
