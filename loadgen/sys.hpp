#pragma once
/// \file sys.hpp
/// Small system helpers shared by the parent, the workers and the publisher.

#include "loadgen/results.hpp"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <ctime>
#include <string>

namespace wspush::loadgen {

inline std::uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline std::uint64_t seconds_to_ns(double s) noexcept { return s <= 0 ? 0 : static_cast<std::uint64_t>(s * 1e9); }

/// Blocking write of every byte (pipes between processes); false when the other end is gone.
inline bool write_all(int fd, const void* data, std::size_t len) noexcept {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<std::size_t>(n);
  }
  return true;
}

/// The parent's one-letter commands to a worker or the publisher: 'g' go, 'r' report, 'q' quit.
struct commands {
  bool go = false, report = false, quit = false;
};

/// An epoll set watching the control pipe `ctrl` under `tag`; -1 on failure (errno set).
inline int epoll_with_control(int ctrl, std::uint64_t tag) noexcept {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  if (ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, ctrl, &ev) != 0) {
    ::close(ep);
    return -1;
  }
  return ep;
}

/// Reads what commands arrived on the control pipe `fd`. EOF or an error means the parent is
/// gone or done: quit, and `fd` leaves the epoll set `ep`.
inline void read_commands(int fd, int ep, commands& cmd) noexcept {
  char buf[16];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    cmd.quit = true;
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    return;
  }
  for (ssize_t k = 0; k < n; ++k) {
    if (buf[k] == 'g') cmd.go = true;
    if (buf[k] == 'r') cmd.report = true;
    if (buf[k] == 'q') cmd.quit = true;
  }
}

/// The counter a failed socket()/bind()/connect() errno belongs to.
inline ctr classify_errno(int e) noexcept {
  switch (e) {
    case ECONNREFUSED: return ctr::err_refused;
    case ETIMEDOUT: return ctr::err_timed_out;
    case EADDRNOTAVAIL:
    case EADDRINUSE: return ctr::err_addr_not_avail;
    case ECONNRESET:
    case EPIPE: return ctr::err_reset;
    case EMFILE:
    case ENFILE: return ctr::err_too_many_files;
    default: return ctr::err_other;
  }
}

/// The counter for an upgrade answered with `status` (not 101).
inline ctr classify_status(int status) noexcept {
  switch (status) {
    case 401: return ctr::http_401;
    case 403: return ctr::http_403;
    case 503: return ctr::http_503;
    default: return ctr::http_other;
  }
}

/// A JWT for one connection: may subscribe to `topic` (and publish to everything when `publisher`);
/// its user (`sub`) is `sub`, or one shared by all ("loadgen", "loadgen-publisher") when empty.
/// Empty when no secret is configured.
std::string mint_token(const std::string& secret, const std::string& topic, bool publisher, double ttl_s,
                       const std::string& sub = {});

/// Opens a non-blocking TCP socket bound to `source` (when non-null, port chosen at connect time)
/// and starts connecting. Returns the fd, or -errno.
int start_connect(const sockaddr_in& server, const in_addr* source) noexcept;

}  // namespace wspush::loadgen
