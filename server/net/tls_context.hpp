#pragma once
// The listener's TLS settings: an OpenSSL server context built from a certificate chain and a
// key, the session-ticket keys that outlive it, and the reload that swaps it on SIGHUP. One per
// process; every shard's TLS transport takes the current context for each new connection, and a
// connection keeps the context it started with (OpenSSL counts the references).

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

typedef struct ssl_ctx_st SSL_CTX;

namespace wspush::server {

/// OpenSSL's queued errors, joined for the user ("unknown OpenSSL error" when none is queued);
/// the queue is left empty.
std::string openssl_errors();

struct tls_files {
  std::string cert;  ///< PEM: the certificate, then its chain
  std::string key;   ///< PEM: the private key
};

/// Session-ticket keys, rotated: tickets are sealed with the newest key and opened with any key
/// still kept (the newest `keep` of them); a ticket sealed with an older key than the newest is
/// renewed when it is used. Shared by the contexts a reload makes, so a reload does not cost the
/// clients their resumption. Thread-safe (the shards' handshakes call into it).
class ticket_keys {
 public:
  struct key {
    std::array<std::uint8_t, 16> name;
    std::array<std::uint8_t, 32> aes;   // AES-256-CBC
    std::array<std::uint8_t, 32> hmac;  // HMAC-SHA256
  };

  explicit ticket_keys(std::chrono::seconds rotate_every = std::chrono::hours(12), std::size_t keep = 2);

  /// The key to seal a new ticket with (rotating first if the newest is due).
  key sealing_key();
  /// The key named `name`, if still kept; `newest` says whether it is the one new tickets use.
  bool opening_key(const std::uint8_t* name, key& out, bool& newest);
  /// Makes a new key the newest now (tests; the schedule calls it too).
  void rotate();

 private:
  void rotate_locked();

  std::mutex _m;
  std::vector<key> _keys;  // newest first
  std::chrono::steady_clock::time_point _made;
  std::chrono::seconds _every;
  std::size_t _keep;
};

/// One loaded certificate and the settings around it.
class tls_context {
 public:
  /// Loads and checks the files; throws std::runtime_error with a message fit for the user.
  /// `kernel_tx`: handshakes keep what handing the transmit side to kernel TLS needs (ktls.hpp).
  tls_context(const tls_files& files, std::shared_ptr<ticket_keys> keys, bool kernel_tx = false);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  SSL_CTX* get() const noexcept { return _ctx; }
  /// "CN=example.com, expires 2027-01-01" for the log.
  const std::string& description() const noexcept { return _description; }

 private:
  SSL_CTX* _ctx = nullptr;
  std::shared_ptr<ticket_keys> _keys;
  std::string _description;
};

/// The current context, swapped by reload().
class tls_server {
 public:
  /// Loads the files (throws like tls_context). `kernel_tx`: the transports hand each
  /// connection's transmit side to kernel TLS after its handshake (where the kernel takes it).
  explicit tls_server(tls_files files, bool kernel_tx = false);

  std::shared_ptr<const tls_context> current() const;
  /// Loads the files again. On success new handshakes use the new certificate; on failure the
  /// old one stays and `why` says what was wrong.
  bool reload(std::string& why);
  ticket_keys& keys() noexcept { return *_keys; }
  bool kernel_tx() const noexcept { return _kernel_tx; }

 private:
  tls_files _files;
  bool _kernel_tx;
  std::shared_ptr<ticket_keys> _keys;
  mutable std::mutex _m;
  std::shared_ptr<const tls_context> _current;
};

/// Whether the kernel offers kernel TLS (the "tls" upper layer protocol is available), and why
/// not when it does not.
bool kernel_tls_available(std::string& why);

}  // namespace wspush::server
