#include "server/net/tls_context.hpp"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "server/net/ktls.hpp"

namespace wspush::server {

namespace {

// Mozilla's "intermediate" TLS 1.2 suites (forward secret, AEAD only); TLS 1.3 keeps OpenSSL's
// defaults (all three are AEAD).
constexpr const char* tls12_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
constexpr const char* groups = "X25519:P-256:P-384";

int ctx_keys_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

int on_ticket_key(SSL* ssl, unsigned char key_name[16], unsigned char* iv, EVP_CIPHER_CTX* cipher,
                  EVP_MAC_CTX* mac, int enc) {
  auto* keys = static_cast<ticket_keys*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ctx_keys_index()));
  if (keys == nullptr) return -1;
  ticket_keys::key k;
  bool newest = true;
  if (enc == 1) {
    k = keys->sealing_key();
    if (RAND_bytes(iv, EVP_CIPHER_get_iv_length(EVP_aes_256_cbc())) <= 0) return -1;
    std::memcpy(key_name, k.name.data(), k.name.size());
  } else if (!keys->opening_key(key_name, k, newest)) {
    return 0;  // an unknown (or retired) key: a full handshake
  }
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.hmac.data(), k.hmac.size()),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end(),
  };
  if (!EVP_MAC_CTX_set_params(mac, params)) return -1;
  const int ok = enc == 1 ? EVP_EncryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv)
                          : EVP_DecryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv);
  if (!ok) return -1;
  return newest ? 1 : 2;  // 2: resume, and seal a new ticket with the newest key
}

int on_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned inlen, void*) {
  // Only HTTP/1.1 carries a WebSocket upgrade here: choose it if offered, else no ALPN at all
  // (a client that offers only h2 learns it from the missing answer).
  for (unsigned k = 0; k < inlen;) {
    const unsigned n = in[k];
    if (k + 1 + n > inlen) break;
    if (n == 8 && std::memcmp(in + k + 1, "http/1.1", 8) == 0) {
      *out = in + k + 1;
      *outlen = 8;
      return SSL_TLSEXT_ERR_OK;
    }
    k += 1 + n;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

std::string describe(SSL_CTX* ctx) {
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (cert == nullptr) return "no certificate";
  std::string out;
  char name[256];
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name, sizeof name) > 0)
    out = std::string("CN=") + name;
  else
    out = "no CN";
  BIO* mem = BIO_new(BIO_s_mem());
  if (mem != nullptr && ASN1_TIME_print(mem, X509_get0_notAfter(cert)) == 1) {
    char* p = nullptr;
    long n = BIO_get_mem_data(mem, &p);
    out += ", expires " + std::string(p, std::size_t(n));
  }
  BIO_free(mem);
  return out;
}

}  // namespace

std::string openssl_errors() {
  std::string out;
  char buf[256];
  while (unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

// ---- ticket keys --------------------------------------------------------------------------

ticket_keys::ticket_keys(std::chrono::seconds rotate_every, std::size_t keep)
    : _every(rotate_every), _keep(keep < 1 ? 1 : keep) {
  rotate();
}

void ticket_keys::rotate() {
  std::lock_guard lock(_m);
  rotate_locked();
}

void ticket_keys::rotate_locked() {
  key k;
  if (RAND_bytes(k.name.data(), int(k.name.size())) != 1 || RAND_bytes(k.aes.data(), int(k.aes.size())) != 1 ||
      RAND_bytes(k.hmac.data(), int(k.hmac.size())) != 1)
    throw std::runtime_error("no randomness for session-ticket keys");
  _keys.insert(_keys.begin(), k);
  if (_keys.size() > _keep) _keys.resize(_keep);
  _made = std::chrono::steady_clock::now();
}

ticket_keys::key ticket_keys::sealing_key() {
  std::lock_guard lock(_m);
  if (std::chrono::steady_clock::now() - _made >= _every) {
    try {
      rotate_locked();
    } catch (const std::exception&) {
      // keep sealing with the current key; the next ticket tries again
    }
  }
  return _keys.front();
}

bool ticket_keys::opening_key(const std::uint8_t* name, key& out, bool& newest) {
  std::lock_guard lock(_m);
  for (std::size_t k = 0; k < _keys.size(); ++k) {
    if (std::memcmp(_keys[k].name.data(), name, 16) == 0) {
      out = _keys[k];
      newest = k == 0;
      return true;
    }
  }
  return false;
}

// ---- context ------------------------------------------------------------------------------

tls_context::tls_context(const tls_files& files, std::shared_ptr<ticket_keys> keys, bool kernel_tx)
    : _keys(std::move(keys)) {
  ERR_clear_error();
  _ctx = SSL_CTX_new(TLS_server_method());
  if (_ctx == nullptr) throw std::runtime_error("TLS: " + openssl_errors());
  auto fail = [&](const std::string& what) {
    std::string msg = what + ": " + openssl_errors();
    SSL_CTX_free(_ctx);
    _ctx = nullptr;
    throw std::runtime_error(msg);
  };
  SSL_CTX_set_min_proto_version(_ctx, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(_ctx, TLS1_3_VERSION);
  if (SSL_CTX_set_cipher_list(_ctx, tls12_ciphers) != 1) fail("TLS cipher suites");
  if (SSL_CTX_set1_groups_list(_ctx, groups) != 1) fail("TLS groups");
  SSL_CTX_set_options(_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  // Idle connections hold no record buffers: OpenSSL frees them whenever they are empty.
  SSL_CTX_set_mode(_ctx, SSL_MODE_RELEASE_BUFFERS);
  // Resumption by tickets only (stateless; nothing per session kept here), one per handshake.
  SSL_CTX_set_session_cache_mode(_ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(_ctx, 1);
  SSL_CTX_set_ex_data(_ctx, ctx_keys_index(), _keys.get());
  SSL_CTX_set_tlsext_ticket_key_evp_cb(_ctx, on_ticket_key);
  SSL_CTX_set_alpn_select_cb(_ctx, on_alpn, nullptr);
  if (kernel_tx) ktls::capture_secrets(_ctx);

  if (SSL_CTX_use_certificate_chain_file(_ctx, files.cert.c_str()) != 1) fail("TLS certificate " + files.cert);
  if (SSL_CTX_use_PrivateKey_file(_ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) fail("TLS key " + files.key);
  if (SSL_CTX_check_private_key(_ctx) != 1) fail("TLS key " + files.key + " does not match " + files.cert);
  _description = describe(_ctx);
}

tls_context::~tls_context() { SSL_CTX_free(_ctx); }

// ---- the current context ------------------------------------------------------------------

tls_server::tls_server(tls_files files, bool kernel_tx)
    : _files(std::move(files)), _kernel_tx(kernel_tx), _keys(std::make_shared<ticket_keys>()),
      _current(std::make_shared<tls_context>(_files, _keys, _kernel_tx)) {}

std::shared_ptr<const tls_context> tls_server::current() const {
  std::lock_guard lock(_m);
  return _current;
}

bool tls_server::reload(std::string& why) {
  try {
    auto next = std::make_shared<tls_context>(_files, _keys, _kernel_tx);
    std::lock_guard lock(_m);
    _current = std::move(next);
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

bool kernel_tls_available(std::string& why) {
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_ulp");
  if (!in) {
    why = "/proc/sys/net/ipv4/tcp_available_ulp is missing";
    return false;
  }
  std::string word, all;
  while (in >> word) {
    if (word == "tls") return true;
    all += (all.empty() ? "" : " ") + word;
  }
  why = "the kernel's upper layer protocols are \"" + all + "\", without tls";
  return false;
}

}  // namespace wspush::server
