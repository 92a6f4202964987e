// The fallback backend: epoll readiness turned into the completion events the loop expects.
// Level-triggered: one recv per readiness event keeps a chatty connection from starving the
// rest; the kernel reports it again on the next wait if more is buffered.

#include <atomic>
#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/reactor/io_backend.hpp"

namespace wspush::server {
namespace {

// epoll data.u64 = tag in the top byte, fd or listener index below. The connection token of
// an fd is kept in _owner: an event that is stale because the fd was closed and reused in
// the same batch then acts on the new connection, where it is at worst a spurious wake-up
// (recv says EAGAIN), never data delivered to the wrong connection.
constexpr std::uint64_t tag_shift = 56;
constexpr std::uint64_t tag_conn = 1, tag_listener = 2, tag_wake = 3, tag_watch = 4;
constexpr std::uint64_t low_mask = (std::uint64_t{1} << tag_shift) - 1;
constexpr int max_events = 512;
constexpr int accepts_per_event = 64;
constexpr std::size_t read_buffer_size = 64 * 1024;

class epoll_backend final : public io_backend {
 public:
  bool init(std::string& why) noexcept {
    _epfd = epoll_create1(EPOLL_CLOEXEC);
    _wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (_epfd < 0 || _wakefd < 0) {
      why = std::string("epoll setup failed: ") + std::strerror(errno);
      return false;
    }
    return ctl(EPOLL_CTL_ADD, _wakefd, EPOLLIN, tag_wake << tag_shift);
  }
  ~epoll_backend() override {
    if (_wakefd >= 0) ::close(_wakefd);
    if (_epfd >= 0) ::close(_epfd);
  }
  const char* name() const noexcept override { return "epoll"; }

  bool add_listener(int fd, int listener) noexcept override {
    if (static_cast<std::size_t>(listener) >= _listeners.size()) _listeners.resize(listener + 1, {-1, false});
    _listeners[listener] = {fd, false};
    return ctl(EPOLL_CTL_ADD, fd, EPOLLIN, (tag_listener << tag_shift) | unsigned(listener));
  }
  void pause_accept(int listener) noexcept override {
    auto& l = _listeners[listener];
    if (!l.paused) ctl(EPOLL_CTL_DEL, l.fd, 0, 0);
    l.paused = true;
  }
  void resume_accept(int listener) noexcept override {
    auto& l = _listeners[listener];
    if (l.paused) ctl(EPOLL_CTL_ADD, l.fd, EPOLLIN, (tag_listener << tag_shift) | unsigned(listener));
    l.paused = false;
  }

  bool start_reading(int fd, conn_token t) noexcept override {
    if (static_cast<std::size_t>(fd) >= _owner.size()) _owner.resize(std::max<std::size_t>(fd + 1, _owner.size() * 2), 0);
    _owner[fd] = t;
    return ctl(EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, (tag_conn << tag_shift) | unsigned(fd));
  }

  void stop_reading(int fd, conn_token t) noexcept override {
    if (owns(fd, t)) ctl(EPOLL_CTL_DEL, fd, 0, 0);  // start_reading adds it again
  }

  send_result send(int fd, conn_token, const iovec* iov, int iovcnt) noexcept override {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = iovcnt;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return {send_outcome::completed, 0, std::size_t(n)};
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {send_outcome::completed, 0, 0};
    return {send_outcome::failed, -errno, 0};
  }

  void wait_writable(int fd, conn_token t) noexcept override {
    if (owns(fd, t)) ctl(EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLRDHUP | EPOLLOUT, (tag_conn << tag_shift) | unsigned(fd));
  }

  void close(int fd, conn_token) noexcept override {
    // Closing removes the fd from the epoll set; events for it already returned by this
    // epoll_wait find no owner and are skipped.
    if (static_cast<std::size_t>(fd) < _owner.size()) _owner[fd] = 0;
    ::close(fd);
  }

  bool watch(int fd, std::uint64_t key, bool read, bool write) noexcept override {
    if (fd < 0 || (key & ~low_mask)) return false;
    if (static_cast<std::size_t>(fd) >= _watched.size()) _watched.resize(std::size_t(fd) + 1, 0);
    std::uint32_t events = (read ? EPOLLIN | EPOLLRDHUP : 0u) | (write ? EPOLLOUT : 0u);
    const bool ok = ctl(_watched[fd] ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, events, (tag_watch << tag_shift) | key);
    if (ok) _watched[fd] = 1;
    return ok;
  }
  void unwatch(int fd) noexcept override {
    if (fd < 0 || static_cast<std::size_t>(fd) >= _watched.size() || !_watched[fd]) return;
    ctl(EPOLL_CTL_DEL, fd, 0, 0);
    _watched[fd] = 0;
  }

  void poll(io_handler& h, int timeout_ms) noexcept override {
    epoll_event events[max_events];
    int n = epoll_wait(_epfd, events, max_events, timeout_ms);
    h.on_poll_woke();
    for (int i = 0; i < n; ++i) dispatch(h, events[i]);
  }

  void wake() noexcept override {
    // One write until the loop has taken it: the wakers between two loop turns (a burst of
    // publishes, shards' replies) cost one system call, not one each.
    if (_wake_pending.exchange(true)) return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(_wakefd, &one, sizeof one);
  }

 private:
  struct listener_state {
    int fd;
    bool paused;
  };

  bool ctl(int op, int fd, std::uint32_t events, std::uint64_t data) noexcept {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    return epoll_ctl(_epfd, op, fd, &ev) == 0;
  }

  void dispatch(io_handler& h, const epoll_event& ev) noexcept {
    std::uint64_t tag = ev.data.u64 >> tag_shift;
    std::uint64_t low = ev.data.u64 & low_mask;
    if (tag == tag_wake) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(_wakefd, &v, sizeof v);
      // Cleared after the read, which may have taken a later waker's write too (a waker that
      // set the flag before it is cleared wrote nothing, and its work is seen below), and
      // before the loop looks at its queues: whoever queues after this wakes it again. An
      // exchange, so that what such a waker queued is visible here.
      _wake_pending.exchange(false);
      h.on_wake();
    } else if (tag == tag_listener) {
      accept_some(h, int(low));
    } else if (tag == tag_watch) {
      const bool err = ev.events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP);
      h.on_ready(low, (ev.events & EPOLLIN) || err, (ev.events & EPOLLOUT) || err);
    } else {
      on_conn_event(h, int(low), ev.events);
    }
  }

  void accept_some(io_handler& h, int listener) noexcept {
    for (int i = 0; i < accepts_per_event && !_listeners[listener].paused; ++i) {
      int fd = accept4(_listeners[listener].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) h.on_accept(listener, -errno);
        return;
      }
      h.on_accept(listener, fd);
    }
  }

  bool owns(int fd, conn_token t) const noexcept {
    return static_cast<std::size_t>(fd) < _owner.size() && _owner[fd] == t;
  }

  void on_conn_event(io_handler& h, int fd, std::uint32_t events) noexcept;

  int _epfd = -1;
  int _wakefd = -1;
  std::atomic<bool> _wake_pending{false};  // a wake-up is written and not taken yet
  std::vector<listener_state> _listeners;
  std::vector<conn_token> _owner;  // fd -> token of its current registration
  std::vector<std::uint8_t> _watched;  // fd -> registered through watch()
  alignas(64) std::uint8_t _buf[read_buffer_size];
};

void epoll_backend::on_conn_event(io_handler& h, int fd, std::uint32_t events) noexcept {
  if (static_cast<std::size_t>(fd) >= _owner.size() || _owner[fd] == 0) return;
  conn_token t = _owner[fd];
  if (events & EPOLLOUT) {
    ctl(EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLRDHUP, (tag_conn << tag_shift) | unsigned(fd));
    h.on_writable(t);
    if (_owner[fd] != t) return;  // the handler closed it
  }
  if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return;
  ssize_t n = ::recv(fd, _buf, sizeof _buf, MSG_DONTWAIT);
  if (n > 0) {
    h.on_data(t, {_buf, std::size_t(n)});
  } else if (n == 0) {
    h.on_read_end(t, 0);
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    h.on_read_end(t, -errno);
  }
}

}  // namespace

std::unique_ptr<io_backend> make_epoll_backend(const backend_options&, std::string& why) noexcept {
  auto b = std::make_unique<epoll_backend>();
  if (!b->init(why)) return nullptr;
  return b;
}

}  // namespace wspush::server
