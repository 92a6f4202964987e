// Fuzz target for the TLS transport's record path (server/net/transport_tls.cpp), with a
// backend that keeps what the transport sends. Input: a control byte, then data.
//
//   mode 0: the data, cut at pseudo-random points, is what a client sends first: the hello
//           gathering, the first-byte checks, OpenSSL's ClientHello parsing.
//   mode 1: a real client (OpenSSL, memory BIOs) finishes a handshake; then the data arrives as
//           raw bytes where records belong.
//   mode 2: after a handshake the client encrypts the data; its records arrive cut at
//           pseudo-random points. The plaintext handed up must be the data, byte for byte. Then
//           the transport encrypts the data back, in pieces, and the client must read it back.
// A control bit lets the plaintext receiver close the connection in the middle of a callback.
// Every path must end with the connection closed and nothing held (LeakSanitizer checks).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include "fuzz_check.hpp"
#include "pool/buffer_pool.hpp"
#include "server/net/tls_context.hpp"
#include "server/net/transport_tls.hpp"
#include "tests/unit/server/net/tls_test_support.hpp"

using namespace wspush::server;
using namespace wspush::test;

namespace {

struct sink final : plaintext_sink {
  void on_plaintext(conn_token t, std::span<std::uint8_t> bytes) noexcept override {
    got.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (close_after && got.size() >= close_after && !closed) {
      closed = true;
      tls->close(-1, t, true);  // the connection layer closing it from inside the callback
    }
  }
  tls_transport* tls = nullptr;
  std::string got;
  std::size_t close_after = 0;
  bool closed = false;
};

struct world {
  world() : cert(std::in_place), server(cert->files), tls(io, server, buffers, counters) {
    cert.reset();  // loaded: the files go
    client_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_NONE, nullptr);
  }
  std::optional<test_cert> cert;
  capture_backend io;
  wspush::pool::buffer_pool buffers;
  tls_counters counters;
  tls_server server;
  tls_transport tls;
  SSL_CTX* client_ctx = nullptr;
  std::uint32_t generation = 0;
};

/// Hands `bytes` to the transport in pieces; false once the transport says close.
bool feed(world& w, conn_token t, std::string bytes, wspush::fuzz::splitter& cut, sink& up) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    std::size_t n = std::min(bytes.size() - at, cut.next(4096));
    std::vector<std::uint8_t> piece(bytes.begin() + long(at), bytes.begin() + long(at + n));  // exact, for ASan
    at += n;
    if (!w.tls.on_received(t, piece, up)) return false;
    if (up.closed) return false;
  }
  return true;
}

/// Drives the client's handshake against the transport; true when both ends finished.
bool handshake(world& w, conn_token t, mem_client& c, wspush::fuzz::splitter& cut, sink& up) {
  for (int round = 0; round < 8; ++round) {
    const int r = SSL_do_handshake(c.ssl);
    if (!feed(w, t, c.take_output(), cut, up)) return false;
    if (r == 1 && SSL_is_init_finished(c.ssl)) return true;
    BIO_write(c.in, w.io.wire.data(), int(w.io.wire.size()));
    w.io.wire.clear();
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static world w;
  if (size < 1 || size > 65536) return 0;
  const std::uint8_t control = data[0];
  const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  const int mode = control % 3;
  wspush::fuzz::splitter cut(control >> 2);
  sink up;
  up.tls = &w.tls;
  if (control & 0x80) up.close_after = 1 + payload.size() / 2;

  const conn_token t = (std::uint64_t(++w.generation) << 32) | 7;  // slot 7, a new generation
  w.io.wire.clear();
  WSPUSH_FUZZ_CHECK(w.tls.open(100, t));
  bool open = true;

  if (mode == 0) {
    open = feed(w, t, payload, cut, up);
  } else {
    mem_client c(w.client_ctx);
    open = handshake(w, t, c, cut, up);
    if (open && mode == 1) {
      open = feed(w, t, payload, cut, up);
    } else if (open && mode == 2 && !payload.empty()) {
      WSPUSH_FUZZ_CHECK(SSL_write(c.ssl, payload.data(), int(payload.size())) == int(payload.size()));
      open = feed(w, t, c.take_output(), cut, up);
      if (!up.closed) WSPUSH_FUZZ_CHECK(up.got == payload);
      if (open) {
        // And back: the payload as a few iovecs, encrypted by the transport, read by the client.
        const std::size_t half = payload.size() / 2;
        iovec v[2] = {{const_cast<char*>(payload.data()), half},
                      {const_cast<char*>(payload.data() + half), payload.size() - half}};
        send_result r = w.tls.send(100, t, v, 2);
        WSPUSH_FUZZ_CHECK(r.outcome == send_outcome::completed && r.bytes == payload.size());
        BIO_write(c.in, w.io.wire.data(), int(w.io.wire.size()));
        w.io.wire.clear();
        std::string back(payload.size(), '\0');
        std::size_t read = 0;
        while (read < back.size()) {
          const int n = SSL_read(c.ssl, back.data() + read, int(back.size() - read));
          if (n <= 0) break;
          read += std::size_t(n);
        }
        WSPUSH_FUZZ_CHECK(back == payload);
      }
    }
  }
  if (!up.closed) w.tls.close(100, t, false);
  WSPUSH_FUZZ_CHECK(w.tls.idle(t));
  WSPUSH_FUZZ_CHECK(w.tls.sessions() == 0);
  return 0;
}
