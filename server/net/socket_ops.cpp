#include "server/net/socket_ops.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>

#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace wspush::server {

endpoint parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("'" + text + "' is not ADDR:PORT");
  std::string host = text.substr(0, colon), port_s = text.substr(colon + 1);
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (ec != std::errc{} || p != port_s.data() + port_s.size() || port > 65535)
    throw std::runtime_error("'" + text + "': bad port");
  endpoint ep;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ep.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ep.addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(std::uint16_t(port));
    ep.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(std::uint16_t(port));
    ep.len = sizeof(sockaddr_in6);
  } else {
    throw std::runtime_error("'" + text + "': '" + host + "' is not an IP address");
  }
  return ep;
}

namespace {
std::string local_name_of(const endpoint& ep) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ep.addr.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&ep.addr);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  auto* v6 = reinterpret_cast<const sockaddr_in6*>(&ep.addr);
  inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
  return "[" + std::string(host) + "]:" + std::to_string(ntohs(v6->sin6_port));
}
}  // namespace

int make_listener(const endpoint& ep, int backlog, bool reuseport) {
  int fd = socket(ep.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuseport) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) < 0 || listen(fd, backlog) < 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot listen on " + local_name_of(ep) + ": " + std::strerror(e));
  }
  return fd;
}

std::string local_name(int fd) {
  endpoint ep;
  ep.len = sizeof ep.addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ep.addr), &ep.len);
  return local_name_of(ep);
}

nofile_limits raise_nofile_limit() noexcept {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  nofile_limits out{r.rlim_cur, r.rlim_cur, r.rlim_max};
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &r) == 0) out.soft_after = r.rlim_cur;
  }
  return out;
}

}  // namespace wspush::server
