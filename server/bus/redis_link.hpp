#pragma once
// One hiredis asynchronous connection driven by a wspush loop: hiredis reads and writes its
// socket itself; the loop tells it when (io_backend::watch, epoll). No thread of its own.

#include <cstdint>
#include <string>

#include <hiredis/async.h>

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
  };

  /// `key`: what the loop's on_ready carries for this link's socket.
  redis_link(loop& l, std::uint64_t key, listener& owner) noexcept : _loop(l), _key(key), _owner(owner) {}
  ~redis_link();
  redis_link(const redis_link&) = delete;
  redis_link& operator=(const redis_link&) = delete;

  /// Starts connecting (non-blocking). False (with `why`) when it could not even start; else
  /// on_link_up or on_link_down follows.
  bool connect(const std::string& host, int port, std::string& why) noexcept;
  /// Ends the connection: on_link_down follows (pending callbacks get a null reply).
  void disconnect() noexcept;
  /// Drops the connection at once, without on_link_down (pending callbacks get a null reply).
  /// Not from inside one of this link's own callbacks.
  void abort() noexcept;
  bool connected() const noexcept { return _ac != nullptr && _up; }
  bool idle() const noexcept { return _ac == nullptr; }

  /// Queues a command; `fn(ac, reply, priv)` runs when it is answered (reply null: the
  /// connection ended first). False when not connected.
  bool command(int argc, const char** argv, const std::size_t* lens, redisCallbackFn* fn, void* priv) noexcept;

  /// The loop says the socket is ready.
  void on_ready(bool readable, bool writable) noexcept;
  std::uint64_t key() const noexcept { return _key; }

 private:
  static void add_read(void* p);
  static void del_read(void* p);
  static void add_write(void* p);
  static void del_write(void* p);
  static void cleanup(void* p);
  static void on_connect(const redisAsyncContext* ac, int status);
  static void on_disconnect(const redisAsyncContext* ac, int status);
  void rewatch() noexcept;

  loop& _loop;
  const std::uint64_t _key;
  listener& _owner;
  redisAsyncContext* _ac = nullptr;
  int _fd = -1;
  bool _read = false, _write = false, _up = false;
};

}  // namespace wspush::server::bus
