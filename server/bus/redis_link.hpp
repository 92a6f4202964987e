#pragma once
// One connection to Redis driven by a wspush loop (io_backend::watch, epoll): the link owns its
// non-blocking socket, its output buffer, a bounded input buffer and a bounded RESP parser
// (resp.hpp), and matches replies to the commands it sent, in order. No thread of its own.
//
// Why not hiredis's asynchronous context: it aborts the process (assert) on a reply nobody
// waits for, or on a push of a shape it does not expect, and its reader reserves whatever a
// header claims. Whatever Redis (or anything between) sends, a link never crashes the node and
// never holds more than its bounds: a reply it cannot match, a push that is not a push, a
// protocol error or a bound exceeded is counted, logged, and drops the link (on_link_down with
// what was wrong); its owner reconnects.
//
// A subscriber link (pub/sub mode): SUBSCRIBE and UNSUBSCRIBE are answered by one push per
// channel, and once subscribed a PING by a `pong` push; these pushes, and every `message`, go
// to listener::on_push. Commands sent before subscribing (AUTH) are answered in order as usual.
//
// TLS (rediss://): with options::tls the socket carries TLS once connected (tls_client.hpp):
// the handshake runs on the same loop, the certificate checked against the host connected to,
// and the link is up only after it; a handshake that fails ends the link with OpenSSL's reason.
//
// Stalls: a link knows when its oldest unanswered command was sent (waiting_ns), and keepalive()
// sends a PING on a link that has been quiet, so a Redis that stops answering shows.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "server/base/counter.hpp"
#include "server/bus/resp.hpp"
#include "server/net/tls_client.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server::bus {

class redis_link {
 public:
  /// What the link tells its owner. Called on the loop's thread.
  class listener {
   public:
    virtual ~listener() = default;
    virtual void on_link_up(redis_link& l) noexcept = 0;
    /// The connection failed or ended (`why` for the log); the link is idle again. Callbacks
    /// of commands still pending have been called with a null reply before this.
    virtual void on_link_down(redis_link& l, const std::string& why) noexcept = 0;
    /// A subscriber link's push (`message`, `subscribe`, `unsubscribe`, their sharded twins
    /// `smessage`, `ssubscribe`, `sunsubscribe`, and `pong`), its shape checked: an array of 2
    /// (pong) or 3 elements, the first a bulk string. Valid for the call.
    virtual void on_push(redis_link&, const resp::reply&) noexcept {}
  };

  /// A command's answer: `r` null when the connection ended first. `r` is valid for the call.
  using reply_fn = void (*)(const resp::reply* r, void* priv) noexcept;

  struct options {
    bool subscriber = false;      ///< pub/sub mode: pushes (see above)
    resp::limits limits;          ///< what one reply may hold
    relaxed_counter* protocol_errors = nullptr;  ///< counts replies that broke the protocol or a bound
    const tls_client_context* tls = nullptr;     ///< TLS over the socket (rediss://); null: plain TCP
  };

  /// `key`: what the loop's on_ready carries for this link's socket.
  redis_link(loop& l, std::uint64_t key, listener& owner, options o) noexcept
      : _loop(l), _key(key), _owner(owner), _o(o), _parser(o.limits) {}
  ~redis_link();
  redis_link(const redis_link&) = delete;
  redis_link& operator=(const redis_link&) = delete;

  /// Starts connecting (non-blocking). False (with `why`) when it could not even start; else
  /// on_link_up or on_link_down follows.
  bool connect(const std::string& host, int port, std::string& why) noexcept;
  /// Ends the connection once every command sent has its answer (none is accepted meanwhile):
  /// on_link_down("disconnected") follows.
  void disconnect() noexcept;
  /// Drops the connection at once, without on_link_down (pending callbacks get a null reply).
  void abort() noexcept;
  bool connected() const noexcept { return _up && !_closing; }
  bool idle() const noexcept { return _fd < 0; }

  /// Queues a command; `fn(reply, priv)` runs when it is answered (or with null when the
  /// connection ends first). `fn` may be null. On a subscriber link a command answered by
  /// pushes never calls `fn` with a reply. False when not connected.
  bool command(int argc, const char** argv, const std::size_t* lens, reply_fn fn, void* priv) noexcept;

  /// The loop says the socket is ready.
  void on_ready(bool readable, bool writable) noexcept;
  std::uint64_t key() const noexcept { return _key; }

  /// How long the oldest unanswered command has waited (0: none waits).
  std::uint64_t waiting_ns(std::uint64_t now_ns) const noexcept;
  /// Sends a PING when the link is up, nothing waits and nothing was sent for `quiet_ns`.
  void keepalive(std::uint64_t now_ns, std::uint64_t quiet_ns) noexcept;

 private:
  struct pending {
    reply_fn fn;
    void* priv;
    std::uint64_t sent_ns;
    std::uint32_t pushes;  // subscriber link: pushes that answer it (0: one reply, in order)
    bool unsubscribe;      // an (S)UNSUBSCRIBE: what an `sunsubscribe` push may answer
  };

  void connected_now() noexcept;
  void handshake_step() noexcept;
  void read_some() noexcept;
  bool write_some() noexcept;
  bool dispatch(const resp::reply& r) noexcept;
  bool dispatch_push(const resp::reply& r) noexcept;
  void answered() noexcept;
  void broke(const char* what, std::string_view detail = {}) noexcept;
  void close_now(bool tell, const std::string& why) noexcept;
  void rewatch() noexcept;

  loop& _loop;
  const std::uint64_t _key;
  listener& _owner;
  const options _o;
  int _fd = -1;
  bool _up = false, _closing = false, _subscribed = false, _want_write = false;
  bool _dispatching = false;     // a reply of the parser's is being read: its reset waits
  bool _handshaking = false;     // TLS: connected, the handshake under way
  bool _handshake_reads = false; // ... and it waits for the socket to be readable (else writable)
  bool _write_wants_read = false; // TLS: a write waits for the socket to be readable
  bool _read_wants_write = false; // TLS: a read waits for the socket to be writable
  std::string _host;             // TLS: what the certificate must name
  tls_client_stream _tls;
  std::uint64_t _gen = 0;        // changes whenever the connection ends: callbacks may end it
  std::uint64_t _last_sent_ns = 0;
  std::string _out;              // encoded commands not yet written, from _out_at
  std::size_t _out_at = 0;
  std::unique_ptr<char[]> _in;   // one read's bytes (in_size): the parser keeps what it needs
  std::deque<pending> _pending;
  resp::parser _parser;
};

}  // namespace wspush::server::bus
