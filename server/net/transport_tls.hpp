#pragma once
// TLS on the transport seam: OpenSSL does the handshake and the records on the shard's own
// thread, through a BIO of ours that reads the bytes the backend just received and writes
// ciphertext into leased pool buffers, which the backend then sends like any other output.
//
// Per connection, what stays while it is idle is OpenSSL's SSL object and nothing else: record
// buffers are released when empty (SSL_MODE_RELEASE_BUFFERS), ciphertext lives in a lease only
// from the encryption to the send's completion, and the plaintext of a publish is the shared
// frame itself (the encryption copies it once, into the subscriber's own records). Before a
// whole first record (the ClientHello) has arrived there is no SSL object either: a client that
// trickles its hello, or sends nothing, holds a lease and a timer slot.
//
// Kernel TLS (tls_server::kernel_tx()): once the handshake is done and every record OpenSSL wrote
// has been sent, the transmit side is handed to the kernel (ktls.hpp): from then on the
// connection's sends go to the socket as plaintext, as plain TCP's do (the kernel seals the
// records), and receiving stays with OpenSSL. A connection whose handoff fails stays in user
// space, counted (wspush_tls_kernel_tx_total{result}) and logged once per process.
//
// Counted per outcome (wspush_tls_handshakes_total{result}): each connection counts one of ok,
// resumed, plain_http, bad_hello, failed, incomplete, timeout; after an ok or resumed handshake
// it may also count renegotiation, truncated or bad_record (see docs/METRICS.md).

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/base/counter.hpp"
#include "server/net/ktls.hpp"
#include "server/net/tls_context.hpp"
#include "server/net/transport.hpp"
#include "server/reactor/io_backend.hpp"

typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace wspush::server {

enum class tls_result : std::uint8_t {
  ok,             ///< a full handshake
  resumed,        ///< a handshake that resumed a session (a ticket)
  plain_http,     ///< plain HTTP on the TLS port: answered 400 in plain text
  bad_hello,      ///< not TLS at all, or a ClientHello that cannot be answered
  failed,         ///< the handshake failed later (the client refused us, or its Finished was wrong)
  incomplete,     ///< the peer left (or the server drained) before the handshake finished
  timeout,        ///< the handshake was not finished within --upgrade-timeout
  renegotiation,  ///< the client tried to renegotiate: closed
  truncated,      ///< the peer vanished in the middle of a record
  bad_record,     ///< a record that does not decrypt, or an alert from the peer
  count_
};
const char* tls_result_name(tls_result r) noexcept;

struct tls_counters {
  std::array<relaxed_counter, std::size_t(tls_result::count_)> results;
  relaxed_counter kernel_handed;    ///< connections whose transmit side went to kernel TLS
  relaxed_counter kernel_fallback;  ///< connections whose handoff failed: user space goes on
  relaxed_counter& operator[](tls_result r) noexcept { return results[std::size_t(r)]; }
  std::uint64_t get(tls_result r) const noexcept { return results[std::size_t(r)].get(); }
};

class tls_transport final : public transport {
 public:
  /// The most plaintext one send encrypts (its ciphertext is held until the send completes).
  static constexpr std::size_t max_send = 256 * 1024;

  /// What installs the kernel's transmit keys on a socket (ktls::hand_off; tests substitute it).
  using kernel_handoff = bool (*)(int fd, const ktls::tx_info& info, int& err, const char*& step) noexcept;

  tls_transport(io_backend& io, const tls_server& server, pool::buffer_pool& buffers, tls_counters& counters,
                kernel_handoff handoff = ktls::hand_off);
  ~tls_transport() override;
  tls_transport(const tls_transport&) = delete;
  tls_transport& operator=(const tls_transport&) = delete;

  const char* name() const noexcept override { return "tls"; }
  bool open(int fd, conn_token t) noexcept override;
  bool on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept override;
  void on_read_end(conn_token t) noexcept override;
  void on_timeout(conn_token t) noexcept override;
  void pause_reading(int fd, conn_token t) noexcept override { _io.stop_reading(fd, t); }
  void resume_reading(int fd, conn_token t) noexcept override { _io.start_reading(fd, t); }
  send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept override;
  std::size_t max_send_bytes() const noexcept override { return max_send; }
  transport_event on_sent(conn_token t, int res) noexcept override;
  transport_event on_writable(int fd, conn_token t) noexcept override;
  void wait_writable(int fd, conn_token t) noexcept override;
  void shutdown_write(int fd, conn_token t) noexcept override;
  void close(int fd, conn_token t, bool abort) noexcept override;
  bool idle(conn_token t) const noexcept override;

  /// Connections with an SSL object right now (for tests and the memory figures).
  std::size_t sessions() const noexcept { return _sessions; }

  struct conn_tls;  // per connection (public for the BIO's callbacks)
  // The BIO's side (called by OpenSSL while this transport is inside an SSL call for `_cur`).
  int bio_read(char* out, std::size_t len, std::size_t& got) noexcept;
  bool bio_write(const char* in, std::size_t len) noexcept;
  void on_tls_message(SSL* ssl, int write_p, int content_type, const void* buf, std::size_t len) noexcept;

 private:
  conn_tls* find(conn_token t) const noexcept;
  conn_tls& slot_for(conn_token t);
  bool gather_hello(conn_tls& c, conn_token t, std::span<std::uint8_t>& feed) noexcept;
  bool start_ssl(conn_tls& c) noexcept;
  bool pump(conn_tls& c, conn_token t, plaintext_sink& up) noexcept;
  bool start_write(conn_tls& c, conn_token t) noexcept;
  transport_event progress(conn_tls& c, conn_token t) noexcept;
  void flush_best_effort(conn_tls& c) noexcept;
  void answer_plain_http(int fd) noexcept;
  void count(conn_tls& c, tls_result r) noexcept;
  void free_ssl(conn_tls& c) noexcept;
  void forget(conn_tls& c) noexcept;
  bool encrypt(conn_tls& c, const std::uint8_t* p, std::size_t n) noexcept;
  void hand_off(conn_tls& c) noexcept;

  io_backend& _io;
  const tls_server& _server;
  pool::buffer_pool& _buffers;
  tls_counters& _n;
  const bool _kernel_tx;  // hand the transmit side to kernel TLS after each handshake
  const kernel_handoff _handoff;
  std::vector<std::unique_ptr<conn_tls[]>> _chunks;  // by slot, 1024 per chunk
  conn_tls* _cur = nullptr;                          // the connection of the SSL call under way
  std::span<const std::uint8_t> _in;                 // what the BIO may read for it
  std::size_t _sessions = 0;
  std::unique_ptr<std::uint8_t[]> _rbuf;   // decrypted plaintext, handed up
  std::unique_ptr<std::uint8_t[]> _stage;  // small frames gathered into one record
};

}  // namespace wspush::server
