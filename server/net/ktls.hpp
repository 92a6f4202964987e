#pragma once
// Kernel TLS, transmit side: what the kernel needs to go on writing a connection's records after
// OpenSSL has done its handshake (setsockopt(SOL_TLS, TLS_TX)), worked out from OpenSSL's state,
// and the handoff itself.
//
// The kernel takes the key, the IV (split into salt and explicit part the way each cipher wants)
// and the sequence number of the next record. OpenSSL 3.0 gives none of them out directly:
// - TLS 1.3: the server's application traffic secret comes from the key-log callback (the only
//   place 3.0 shows it); key and IV are HKDF-Expand-Label of it (RFC 8446 7.3).
// - TLS 1.2: key and IV are the server's part of the key block, the TLS PRF of the session's
//   master secret and both randoms (RFC 5246 6.3).
// - The sequence number is the count of records OpenSSL wrote under those keys, counted from
//   its message callback (one call per record header written): after its ChangeCipherSpec
//   (TLS 1.2) or its Finished (TLS 1.3) the count restarts.
// - TLS 1.2 AES-GCM also carries an explicit nonce in each record, which OpenSSL starts at a
//   random value and increments per record; the kernel must continue from the last one, read
//   from the ciphertext itself (on_ciphertext), or a nonce could repeat under the same key.
//
// What is kept per connection lives in the SSL object's ex_data from the first callback to the
// handoff (forget()), and only when capture_secrets() was called on its context: an idle
// connection carries none of it.

#include <cstddef>
#include <cstdint>

#include <linux/tls.h>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace wspush::server::ktls {

/// What setsockopt(SOL_TLS, TLS_TX) takes: one of the kernel's crypto_info structs.
struct tx_info {
  union {
    tls_crypto_info base;
    tls12_crypto_info_aes_gcm_128 aes128;
    tls12_crypto_info_aes_gcm_256 aes256;
    tls12_crypto_info_chacha20_poly1305 chacha;
  };
  std::size_t size;  ///< of the member in use (extract_tx() sets it; 0: none)
};

/// Makes the handshakes of `ctx` keep what extract_tx() needs (the key-log callback: OpenSSL
/// formats each secret of each handshake for it, a few hundred nanoseconds).
void capture_secrets(SSL_CTX* ctx) noexcept;

/// From the SSL's message callback: counts the records it writes (and notes a KeyUpdate of its
/// own, after which the captured secret is stale).
void on_message(SSL* ssl, int write_p, int content_type, const void* buf, std::size_t len) noexcept;
/// Every byte the SSL writes to its transport, in order (the TLS 1.2 explicit nonces).
void on_ciphertext(SSL* ssl, const void* bytes, std::size_t len) noexcept;

/// After the handshake, once every record OpenSSL wrote has been counted: the kernel's
/// transmit state. False with `why` (a static string) when it cannot be had (an unsupported
/// cipher, nothing captured: out of memory).
bool extract_tx(SSL* ssl, tx_info& out, const char*& why) noexcept;
/// Whether a message callback's arguments are a KeyUpdate from the peer that asks for ours
/// (TLS 1.3): after a handoff OpenSSL cannot answer it with keys the kernel does not have.
bool asks_key_update(int write_p, int content_type, const void* buf, std::size_t len) noexcept;
/// Drops (and wipes) what was kept for `ssl`; freeing the SSL does it too.
void forget(SSL* ssl) noexcept;

/// Hands the transmit direction of the connected TCP socket `fd` to the kernel: the "tls" upper
/// layer protocol, then the keys. False with `step` (static) and errno in `err`; then the socket
/// still sends plain bytes as before (a "tls" ULP without keys passes them through).
bool hand_off(int fd, const tx_info& info, int& err, const char*& step) noexcept;
/// Writes a close_notify alert through a socket handed off (a control record, content type 21),
/// if the socket takes it now. Best effort: false when it did not.
bool send_close_notify(int fd) noexcept;

}  // namespace wspush::server::ktls
