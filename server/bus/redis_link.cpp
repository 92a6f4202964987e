#include "server/bus/redis_link.hpp"

#include <cstring>

namespace wspush::server::bus {

redis_link::~redis_link() { abort(); }

bool redis_link::connect(const std::string& host, int port, std::string& why) noexcept {
  if (_ac != nullptr) return true;
  redisAsyncContext* ac = redisAsyncConnect(host.c_str(), port);
  if (ac == nullptr) {
    why = "out of memory";
    return false;
  }
  if (ac->err) {
    why = ac->errstr;
    redisAsyncFree(ac);
    return false;
  }
  _ac = ac;
  _fd = ac->c.fd;
  _up = false;
  ac->data = this;
  ac->ev.data = this;
  ac->ev.addRead = add_read;
  ac->ev.delRead = del_read;
  ac->ev.addWrite = add_write;
  ac->ev.delWrite = del_write;
  ac->ev.cleanup = cleanup;
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  redisAsyncSetConnectCallback(ac, on_connect);  // after the hooks: it asks for writability
  return true;
}

void redis_link::disconnect() noexcept {
  if (_ac != nullptr) redisAsyncDisconnect(_ac);
}

void redis_link::abort() noexcept {
  if (_ac == nullptr) return;
  redisAsyncContext* ac = _ac;
  _ac = nullptr;
  _up = false;
  ac->data = nullptr;  // its disconnect callback says nothing
  redisAsyncFree(ac);  // callbacks pending get a null reply; cleanup stops the watch
}

bool redis_link::command(int argc, const char** argv, const std::size_t* lens, redisCallbackFn* fn, void* priv) noexcept {
  if (!connected()) return false;
  return redisAsyncCommandArgv(_ac, fn, priv, argc, argv, lens) == REDIS_OK;
}

void redis_link::on_ready(bool readable, bool writable) noexcept {
  if (_ac == nullptr) return;
  redisAsyncContext* ac = _ac;
  if (writable && _write) redisAsyncHandleWrite(ac);  // also completes a connect
  if (readable && _ac != nullptr && _read) redisAsyncHandleRead(_ac);
}

void redis_link::rewatch() noexcept {
  if (_fd < 0) return;
  if (!_read && !_write) _loop.unwatch(_fd);
  else _loop.watch(_fd, _key, _read, _write);
}

void redis_link::add_read(void* p) {
  auto* l = static_cast<redis_link*>(p);
  if (!l->_read) l->_read = true, l->rewatch();
}
void redis_link::del_read(void* p) {
  auto* l = static_cast<redis_link*>(p);
  if (l->_read) l->_read = false, l->rewatch();
}
void redis_link::add_write(void* p) {
  auto* l = static_cast<redis_link*>(p);
  if (!l->_write) l->_write = true, l->rewatch();
}
void redis_link::del_write(void* p) {
  auto* l = static_cast<redis_link*>(p);
  if (l->_write) l->_write = false, l->rewatch();
}
void redis_link::cleanup(void* p) {
  auto* l = static_cast<redis_link*>(p);
  l->_read = l->_write = false;
  if (l->_fd >= 0) l->_loop.unwatch(l->_fd);
  l->_fd = -1;
}

void redis_link::on_connect(const redisAsyncContext* ac, int status) {
  auto* l = static_cast<redis_link*>(ac->data);
  if (l == nullptr) return;
  if (status != REDIS_OK) {
    // hiredis frees the context after this callback returns.
    const std::string why = ac->errstr[0] ? ac->errstr : "connect failed";
    l->_ac = nullptr;
    l->_up = false;
    l->_owner.on_link_down(*l, why);
    return;
  }
  l->_up = true;
  l->_owner.on_link_up(*l);
}

void redis_link::on_disconnect(const redisAsyncContext* ac, int status) {
  auto* l = static_cast<redis_link*>(ac->data);
  if (l == nullptr) return;
  const std::string why = status == REDIS_OK ? "disconnected" : (ac->errstr[0] ? ac->errstr : "connection lost");
  l->_ac = nullptr;  // hiredis frees it after this callback
  l->_up = false;
  l->_owner.on_link_down(*l, why);
}

}  // namespace wspush::server::bus
