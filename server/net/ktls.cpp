#include "server/net/ktls.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

namespace wspush::server::ktls {

namespace {

constexpr std::size_t record_header = 5;
constexpr std::size_t nonce_len = 12;    // every AEAD here: the per-record nonce
constexpr std::size_t gcm_explicit = 8;  // TLS 1.2 AES-GCM: the part of it each record carries

/// Kept per SSL, from its first callback to the handoff (about 110 bytes).
struct watch {
  std::uint64_t records = 0;  // written under the current write key
  std::uint8_t secret[EVP_MAX_MD_SIZE];
  std::uint8_t secret_len = 0;  // TLS 1.3: the server application traffic secret, once logged
  bool key_updated = false;     // OpenSSL wrote a KeyUpdate: its write key is no longer the secret's
  // The ciphertext stream, parsed as it is written: the record under way and its first bytes.
  std::uint8_t head[record_header];
  std::uint8_t head_have = 0;
  std::uint8_t type = 0;  // of the last record begun
  std::uint16_t body_left = 0;
  std::uint8_t explicit_have = 0;
  std::uint8_t explicit_nonce[gcm_explicit];  // the last record's first body bytes
};

void free_watch(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  if (ptr == nullptr) return;
  OPENSSL_cleanse(ptr, sizeof(watch));
  delete static_cast<watch*>(ptr);
}

int watch_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_watch);
  return index;
}

/// The SSL's watch, made on first use when `make`; null without memory.
watch* watch_of(const SSL* ssl, bool make) noexcept {
  auto* w = static_cast<watch*>(SSL_get_ex_data(ssl, watch_index()));
  if (w != nullptr || !make) return w;
  w = new (std::nothrow) watch;
  if (w != nullptr && SSL_set_ex_data(const_cast<SSL*>(ssl), watch_index(), w) != 1) {
    delete w;
    w = nullptr;
  }
  return w;
}

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// "SERVER_TRAFFIC_SECRET_0 <client random> <secret>", in hex (NSS key-log format).
void on_keylog(const SSL* ssl, const char* line) {
  static constexpr char label[] = "SERVER_TRAFFIC_SECRET_0 ";
  if (std::strncmp(line, label, sizeof label - 1) != 0) return;
  const char* hex = std::strrchr(line, ' ') + 1;
  const std::size_t digits = std::strlen(hex);
  watch* w = watch_of(ssl, true);
  if (w == nullptr || digits % 2 != 0 || digits / 2 > sizeof w->secret) return;
  for (std::size_t k = 0; k < digits / 2; ++k) {
    const int hi = hex_digit(hex[2 * k]), lo = hex_digit(hex[2 * k + 1]);
    if (hi < 0 || lo < 0) return;
    w->secret[k] = std::uint8_t(hi << 4 | lo);
  }
  w->secret_len = std::uint8_t(digits / 2);
}

// ---- key schedule -------------------------------------------------------------------------

/// A cipher the kernel takes, and the sizes of its key and of the IV the key block holds for
/// TLS 1.2 (AES-GCM: the 4-byte salt; ChaCha20-Poly1305: the whole 12-byte IV, RFC 7905).
struct suite {
  int nid;
  std::uint16_t kernel_type;
  std::size_t key_len;
  std::size_t tls12_iv_len;
};

constexpr suite suites[] = {
    {NID_aes_128_gcm, TLS_CIPHER_AES_GCM_128, 16, 4},
    {NID_aes_256_gcm, TLS_CIPHER_AES_GCM_256, 32, 4},
    {NID_chacha20_poly1305, TLS_CIPHER_CHACHA20_POLY1305, 32, 12},
};

const suite* find_suite(int nid) noexcept {
  for (const suite& s : suites)
    if (s.nid == nid) return &s;
  return nullptr;
}

/// Runs an EVP_KDF (fetched once per process: "HKDF" or "TLS1-PRF").
bool derive(EVP_KDF* kdf, const OSSL_PARAM* params, std::uint8_t* out, std::size_t n) noexcept {
  EVP_KDF_CTX* ctx = kdf != nullptr ? EVP_KDF_CTX_new(kdf) : nullptr;
  const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, out, n, params) == 1;
  EVP_KDF_CTX_free(ctx);
  return ok;
}

/// HKDF-Expand-Label(secret, label, "", n) of RFC 8446 7.1.
bool expand_label(const EVP_MD* md, const watch& w, const char* label, std::uint8_t* out, std::size_t n) noexcept {
  static EVP_KDF* const hkdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  std::uint8_t info[32];
  const std::size_t label_len = std::strlen(label);
  std::size_t at = 0;
  info[at++] = std::uint8_t(n >> 8);
  info[at++] = std::uint8_t(n);
  info[at++] = std::uint8_t(6 + label_len);
  std::memcpy(info + at, "tls13 ", 6), at += 6;
  std::memcpy(info + at, label, label_len), at += label_len;
  info[at++] = 0;  // no context
  int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>(EVP_MD_get0_name(md)), 0),
      OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(w.secret), w.secret_len),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, at),
      OSSL_PARAM_construct_end(),
  };
  return derive(hkdf, params, out, n);
}

/// TLS 1.3: key and IV from the server application traffic secret.
bool keys_tls13(const watch& w, const EVP_MD* md, const suite& s, std::uint8_t* key, std::uint8_t* nonce,
                const char*& why) noexcept {
  if (w.secret_len == 0) return why = "no traffic secret was logged", false;
  if (!expand_label(md, w, "key", key, s.key_len) || !expand_label(md, w, "iv", nonce, nonce_len))
    return why = "HKDF-Expand-Label failed", false;
  return true;
}

/// TLS 1.2: the key block (RFC 5246 6.3). An AEAD suite has no MAC keys, so it is the client's
/// key, the server's key, the client's IV, the server's IV.
bool key_block(SSL* ssl, const EVP_MD* md, std::uint8_t* out, std::size_t n) noexcept {
  static EVP_KDF* const prf = EVP_KDF_fetch(nullptr, "TLS1-PRF", nullptr);
  std::uint8_t master[SSL_MAX_MASTER_KEY_LENGTH];
  const std::size_t master_len = SSL_SESSION_get_master_key(SSL_get_session(ssl), master, sizeof master);
  static constexpr char label[] = "key expansion";
  std::uint8_t seed[sizeof label - 1 + 2 * SSL3_RANDOM_SIZE];
  std::memcpy(seed, label, sizeof label - 1);
  std::size_t at = sizeof label - 1;
  at += SSL_get_server_random(ssl, seed + at, SSL3_RANDOM_SIZE);
  at += SSL_get_client_random(ssl, seed + at, SSL3_RANDOM_SIZE);
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>(EVP_MD_get0_name(md)), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SECRET, master, master_len),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SEED, seed, at),
      OSSL_PARAM_construct_end(),
  };
  const bool ok = master_len > 0 && at == sizeof seed && derive(prf, params, out, n);
  OPENSSL_cleanse(master, sizeof master);
  return ok;
}

/// The explicit nonce that follows the last record written (AES-GCM in TLS 1.2): the kernel
/// writes its `iv` into its first record and increments it per record, as OpenSSL did.
bool next_explicit_nonce(const watch& w, std::uint8_t* out) noexcept {
  if (w.head_have != 0 || w.body_left != 0 || w.explicit_have != gcm_explicit || w.type == SSL3_RT_CHANGE_CIPHER_SPEC)
    return false;  // not at a record boundary after a record under the new key
  std::memcpy(out, w.explicit_nonce, gcm_explicit);
  for (std::size_t k = gcm_explicit; k-- > 0;)
    if (++out[k] != 0) break;
  return true;
}

/// TLS 1.2: the server's key, and its 12-byte nonce base: the salt and the next explicit nonce
/// (AES-GCM), or the IV (ChaCha20-Poly1305).
bool keys_tls12(SSL* ssl, const watch& w, const EVP_MD* md, const suite& s, std::uint8_t* key,
                std::uint8_t* nonce, const char*& why) noexcept {
  std::uint8_t block[2 * 32 + 2 * 12];
  const std::size_t n = 2 * s.key_len + 2 * s.tls12_iv_len;
  bool ok = key_block(ssl, md, block, n);
  if (!ok) why = "the TLS 1.2 key block could not be derived";
  if (ok) {
    std::memcpy(key, block + s.key_len, s.key_len);
    std::memcpy(nonce, block + 2 * s.key_len + s.tls12_iv_len, s.tls12_iv_len);
    if (s.tls12_iv_len < nonce_len && !next_explicit_nonce(w, nonce + s.tls12_iv_len))
      ok = false, why = "the last explicit nonce was not seen";
  }
  OPENSSL_cleanse(block, sizeof block);
  return ok;
}

void put_u64(std::uint8_t* out, std::uint64_t v) noexcept {
  for (int k = 7; k >= 0; --k, v >>= 8) out[k] = std::uint8_t(v);
}

/// The kernel's struct for `s`: AES-GCM splits the nonce base into salt (4) and iv (8);
/// ChaCha20-Poly1305 takes all 12 as iv.
void fill(tx_info& out, int version, const suite& s, const std::uint8_t* key, const std::uint8_t* nonce,
          std::uint64_t seq) noexcept {
  std::memset(&out, 0, sizeof out);
  out.base.version = std::uint16_t(version == TLS1_3_VERSION ? TLS_1_3_VERSION : TLS_1_2_VERSION);
  out.base.cipher_type = s.kernel_type;
  const auto gcm = [&](auto& info) {
    std::memcpy(info.key, key, sizeof info.key);
    std::memcpy(info.salt, nonce, sizeof info.salt);
    std::memcpy(info.iv, nonce + sizeof info.salt, sizeof info.iv);
    put_u64(info.rec_seq, seq);
    out.size = sizeof info;
  };
  if (s.kernel_type == TLS_CIPHER_AES_GCM_128) gcm(out.aes128);
  else if (s.kernel_type == TLS_CIPHER_AES_GCM_256) gcm(out.aes256);
  else {
    std::memcpy(out.chacha.key, key, sizeof out.chacha.key);
    std::memcpy(out.chacha.iv, nonce, sizeof out.chacha.iv);
    put_u64(out.chacha.rec_seq, seq);
    out.size = sizeof out.chacha;
  }
}

}  // namespace

// ---- capture ------------------------------------------------------------------------------

void capture_secrets(SSL_CTX* ctx) noexcept {
  watch_index();  // made before any handshake thread could race to make it
  SSL_CTX_set_keylog_callback(ctx, on_keylog);
}

void on_message(SSL* ssl, int write_p, int content_type, const void* buf, std::size_t len) noexcept {
  if (!write_p) return;
  watch* w = watch_of(ssl, true);
  if (w == nullptr) return;
  const auto* b = static_cast<const std::uint8_t*>(buf);
  // One header call per record, made as the record is sealed; the message calls come after
  // their records' headers, and the key changes right after the message: so a record counted
  // before the reset below belongs to the old key.
  if (content_type == SSL3_RT_HEADER) ++w->records;
  else if (content_type == SSL3_RT_CHANGE_CIPHER_SPEC) w->records = 0;  // TLS 1.2: new key next
  else if (content_type == SSL3_RT_HANDSHAKE && len >= 1 && b[0] == SSL3_MT_KEY_UPDATE) w->key_updated = true;
  else if (content_type == SSL3_RT_HANDSHAKE && len >= 1 && b[0] == SSL3_MT_FINISHED &&
           SSL_version(ssl) == TLS1_3_VERSION)
    w->records = 0;  // TLS 1.3: the application key follows the server's Finished
}

void on_ciphertext(SSL* ssl, const void* bytes, std::size_t len) noexcept {
  watch* w = watch_of(ssl, true);
  if (w == nullptr) return;
  const auto* p = static_cast<const std::uint8_t*>(bytes);
  while (len > 0) {
    if (w->body_left == 0) {  // a header
      w->head[w->head_have++] = *p++, --len;
      if (w->head_have < record_header) continue;
      w->head_have = 0;
      w->type = w->head[0];
      w->body_left = std::uint16_t(w->head[3] << 8 | w->head[4]);
      w->explicit_have = 0;
      continue;
    }
    const std::size_t take = std::min<std::size_t>(len, w->body_left);
    const std::size_t keep = std::min<std::size_t>(take, gcm_explicit - w->explicit_have);
    std::memcpy(w->explicit_nonce + w->explicit_have, p, keep);
    w->explicit_have = std::uint8_t(w->explicit_have + keep);
    p += take, len -= take;
    w->body_left = std::uint16_t(w->body_left - take);
  }
}

bool asks_key_update(int write_p, int content_type, const void* buf, std::size_t len) noexcept {
  const auto* b = static_cast<const std::uint8_t*>(buf);
  // type, a 3-byte length, then request_update: 1 is update_requested (RFC 8446 4.6.3)
  return !write_p && content_type == SSL3_RT_HANDSHAKE && len >= 5 && b[0] == SSL3_MT_KEY_UPDATE && b[4] == 1;
}

void forget(SSL* ssl) noexcept {
  watch* w = watch_of(ssl, false);
  if (w == nullptr) return;
  SSL_set_ex_data(ssl, watch_index(), nullptr);
  free_watch(nullptr, w, nullptr, 0, 0, nullptr);
}

// ---- extraction ---------------------------------------------------------------------------

bool extract_tx(SSL* ssl, tx_info& out, const char*& why) noexcept {
  std::memset(&out, 0, sizeof out);
  const watch* w = watch_of(ssl, false);
  if (w == nullptr) return why = "nothing was captured (out of memory)", false;
  if (w->key_updated) return why = "the write key changed after the handshake (KeyUpdate)", false;
  const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl);
  const suite* s = cipher != nullptr ? find_suite(SSL_CIPHER_get_cipher_nid(cipher)) : nullptr;
  if (s == nullptr) return why = "a cipher the kernel does not take", false;
  const EVP_MD* md = SSL_CIPHER_get_handshake_digest(cipher);
  if (md == nullptr) return why = "no digest for the cipher suite", false;
  const int version = SSL_version(ssl);
  std::uint8_t key[32], nonce[nonce_len];
  bool ok = false;
  if (version == TLS1_3_VERSION) ok = keys_tls13(*w, md, *s, key, nonce, why);
  else if (version == TLS1_2_VERSION) ok = keys_tls12(ssl, *w, md, *s, key, nonce, why);
  else why = "neither TLS 1.2 nor 1.3";
  if (ok) fill(out, version, *s, key, nonce, w->records);
  OPENSSL_cleanse(key, sizeof key);
  OPENSSL_cleanse(nonce, sizeof nonce);
  return ok;
}

// ---- the socket ---------------------------------------------------------------------------

bool hand_off(int fd, const tx_info& info, int& err, const char*& step) noexcept {
  static constexpr char ulp[] = "tls";
  if (::setsockopt(fd, IPPROTO_TCP, TCP_ULP, ulp, sizeof ulp) != 0) {
    err = errno, step = "setsockopt(TCP_ULP, \"tls\")";
    return false;
  }
  if (::setsockopt(fd, SOL_TLS, TLS_TX, &info, socklen_t(info.size)) != 0) {
    err = errno, step = "setsockopt(SOL_TLS, TLS_TX)";
    return false;
  }
  return true;
}

bool send_close_notify(int fd) noexcept {
  std::uint8_t alert[2] = {1, 0};  // warning, close_notify
  iovec v{alert, sizeof alert};
  alignas(cmsghdr) char control[CMSG_SPACE(1)] = {};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_TLS;
  c->cmsg_type = TLS_SET_RECORD_TYPE;
  c->cmsg_len = CMSG_LEN(1);
  *CMSG_DATA(c) = SSL3_RT_ALERT;
  return ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(sizeof alert);
}

}  // namespace wspush::server::ktls
