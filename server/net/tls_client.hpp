#pragma once
// TLS as a client, for the node's own connections out (the Redis bus's links over rediss://):
// OpenSSL on a connected non-blocking socket, driven by the caller's loop. No thread, no
// blocking call: each step says whether it is done or waits for the socket to be readable or
// writable.
//
// The peer's certificate must chain to the CA given (or to the system's store) and name the host
// the caller connected to: a DNS name is checked against the certificate's names and sent as
// SNI, an IP address against its IP addresses. A failure is never worked around: the step fails
// with OpenSSL's reason ("certificate verify failed: self-signed certificate in certificate
// chain", "Hostname mismatch", ...), and the caller closes the socket.

#include <cstddef>
#include <cstdint>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace wspush::server {

struct tls_client_files {
  std::string ca;    ///< PEM: the CA that signed the server's certificate; empty: the system's store
  std::string cert;  ///< PEM: a client certificate (with its chain), for servers that ask for one
  std::string key;   ///< PEM: its private key
};

/// The settings every connection out shares: TLS 1.2 or newer, peer verification on.
class tls_client_context {
 public:
  /// Loads and checks the files; throws std::runtime_error with a message fit for the user.
  explicit tls_client_context(const tls_client_files& files);
  ~tls_client_context();
  tls_client_context(const tls_client_context&) = delete;
  tls_client_context& operator=(const tls_client_context&) = delete;
  SSL_CTX* get() const noexcept { return _ctx; }

 private:
  SSL_CTX* _ctx = nullptr;
};

/// One TLS session over a connected socket the caller owns (and closes after reset()).
class tls_client_stream {
 public:
  /// What a step did: done (all of it, or some bytes: see `got`/`put`), or wait for the socket
  /// to be readable / writable and call it again, or the peer closed (a close_notify or the
  /// TCP end), or it failed (`why` says how).
  enum class io : std::uint8_t { done, want_read, want_write, closed, failed };

  tls_client_stream() = default;
  ~tls_client_stream() { reset(); }
  tls_client_stream(const tls_client_stream&) = delete;
  tls_client_stream& operator=(const tls_client_stream&) = delete;

  /// Starts a session on `fd` with the certificate to be checked against `host`. False (with
  /// `why`) when OpenSSL could not even make one.
  bool start(const tls_client_context& ctx, int fd, const std::string& host, std::string& why) noexcept;
  io handshake(std::string& why) noexcept;
  /// Decrypted bytes into `buf` (at most `cap`).
  io read(char* buf, std::size_t cap, std::size_t& got, std::string& why) noexcept;
  /// Encrypts and sends from `buf`; `put` bytes were taken. A call that has to wait must be made
  /// again with the same bytes at its start (more may follow them; the buffer may have moved).
  io write(const char* buf, std::size_t len, std::size_t& put, std::string& why) noexcept;
  /// Ends the session (no close_notify: the socket is closed right after).
  void reset() noexcept;
  bool active() const noexcept { return _ssl != nullptr; }

 private:
  io outcome(int rc, std::string& why) noexcept;
  SSL* _ssl = nullptr;
};

}  // namespace wspush::server
