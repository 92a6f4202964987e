#pragma once
// What the kernel's TLS transmit path does with a tls_crypto_info (net/tls in Linux), done here
// with OpenSSL's EVP AEAD from nothing but that struct, so the tests can check what
// ktls::extract_tx() hands over without a kernel that offers kernel TLS:
// - TLS 1.3 (RFC 8446 5.2-5.3): the record's plaintext is the data and its real content type;
//   nonce = (salt || iv) XOR the sequence number; AAD = the record header (type 23).
// - TLS 1.2 AES-GCM (RFC 5288): nonce = salt || explicit nonce, the explicit nonce (`iv`, then
//   +1 per record) written before the ciphertext; AAD = seq || type || version || length.
// - TLS 1.2 ChaCha20-Poly1305 (RFC 7905): nonce = iv XOR seq, no explicit nonce; AAD as above.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include <openssl/evp.h>

#include "server/net/ktls.hpp"

namespace wspush::test {

class kernel_tls_sim {
 public:
  explicit kernel_tls_sim(const server::ktls::tx_info& info) {
    _tls13 = info.base.version == TLS_1_3_VERSION;
    switch (info.base.cipher_type) {
      case TLS_CIPHER_AES_GCM_128: take_gcm(info.aes128, EVP_aes_128_gcm()); break;
      case TLS_CIPHER_AES_GCM_256: take_gcm(info.aes256, EVP_aes_256_gcm()); break;
      case TLS_CIPHER_CHACHA20_POLY1305:
        _cipher = EVP_chacha20_poly1305();
        _key.assign(reinterpret_cast<const char*>(info.chacha.key), sizeof info.chacha.key);
        std::memcpy(_base, info.chacha.iv, 12);
        _seq = be64(info.chacha.rec_seq);
        _explicit_nonce = false;
        break;
      default: throw std::runtime_error("a cipher type the simulation does not know");
    }
    if (_tls13) _explicit_nonce = false;
  }

  /// One record of content type `type` carrying `data`, as the kernel would write it.
  std::string seal(std::uint8_t type, std::string_view data) {
    std::uint8_t nonce[12];
    std::memcpy(nonce, _base, 12);
    if (!_explicit_nonce) xor_seq(nonce);
    std::string plain(data);
    if (_tls13) plain.push_back(char(type));
    const std::size_t body = plain.size() + 16 + (_explicit_nonce ? 8 : 0);
    std::string header = {char(_tls13 ? 23 : type), 3, 3, char(body >> 8), char(body & 0xff)};
    std::string aad = header;
    if (!_tls13) {
      aad = std::string(8, '\0');
      put_be64(reinterpret_cast<std::uint8_t*>(aad.data()), _seq);
      aad += std::string{char(type), 3, 3, char(data.size() >> 8), char(data.size() & 0xff)};
    }
    std::string out = header;
    if (_explicit_nonce) out.append(reinterpret_cast<const char*>(nonce + 4), 8);
    out += encrypt(nonce, aad, plain);
    ++_seq;
    if (_explicit_nonce) increment(_base + 4);
    return out;
  }

  std::uint64_t seq() const noexcept { return _seq; }

 private:
  template <class Info>
  void take_gcm(const Info& info, const EVP_CIPHER* cipher) {
    _cipher = cipher;
    _key.assign(reinterpret_cast<const char*>(info.key), sizeof info.key);
    std::memcpy(_base, info.salt, 4);
    std::memcpy(_base + 4, info.iv, 8);
    _seq = be64(info.rec_seq);
    _explicit_nonce = true;
  }

  std::string encrypt(const std::uint8_t* nonce, const std::string& aad, const std::string& plain) {
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    std::string out(plain.size() + 16, '\0');
    int n = 0, m = 0;
    auto* o = reinterpret_cast<unsigned char*>(out.data());
    const bool ok =
        EVP_EncryptInit_ex(ctx, _cipher, nullptr, nullptr, nullptr) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, nullptr) == 1 &&
        EVP_EncryptInit_ex(ctx, nullptr, nullptr, reinterpret_cast<const unsigned char*>(_key.data()), nonce) == 1 &&
        EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(aad.data()), int(aad.size())) == 1 &&
        EVP_EncryptUpdate(ctx, o, &n, reinterpret_cast<const unsigned char*>(plain.data()), int(plain.size())) == 1 &&
        EVP_EncryptFinal_ex(ctx, o + n, &m) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, o + plain.size()) == 1;
    EVP_CIPHER_CTX_free(ctx);
    if (!ok) throw std::runtime_error("EVP AEAD failed");
    return out;
  }

  void xor_seq(std::uint8_t* nonce) const noexcept {
    std::uint8_t s[8];
    put_be64(s, _seq);
    for (int k = 0; k < 8; ++k) nonce[4 + k] ^= s[k];
  }
  static void increment(std::uint8_t* p) noexcept {
    for (int k = 7; k >= 0; --k)
      if (++p[k] != 0) break;
  }
  static std::uint64_t be64(const unsigned char* p) noexcept {
    std::uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = v << 8 | p[k];
    return v;
  }
  static void put_be64(std::uint8_t* p, std::uint64_t v) noexcept {
    for (int k = 7; k >= 0; --k, v >>= 8) p[k] = std::uint8_t(v);
  }

  const EVP_CIPHER* _cipher = nullptr;
  std::string _key;
  std::uint8_t _base[12] = {};  // salt || iv (AES-GCM), iv (ChaCha20-Poly1305)
  std::uint64_t _seq = 0;
  bool _tls13 = false;
  bool _explicit_nonce = false;  // TLS 1.2 AES-GCM
};

}  // namespace wspush::test
