/// \file sys.cpp
#include "loadgen/sys.hpp"

#include "proto/jwt.hpp"

#include <netinet/tcp.h>
#include <sys/socket.h>

#include <array>
#include <ctime>

namespace wspush::loadgen {

std::string mint_token(const std::string& secret, const std::string& topic, bool publisher, double ttl_s,
                       const std::string& sub) {
  if (secret.empty()) return {};
  const auto exp = static_cast<long long>(std::time(nullptr)) + static_cast<long long>(ttl_s);
  const std::string user = !sub.empty() ? sub : publisher ? "loadgen-publisher" : "loadgen";
  std::string claims = R"({"sub":")" + user +
                       R"(","exp":)" + std::to_string(exp) + R"(,"topics":[")" + (publisher ? "*" : topic) + "\"]";
  if (publisher) claims += R"(,"pub":["*"])";
  claims += "}";
  std::array<char, 2048> out{};
  const std::size_t n = proto::mint_hs256(secret, claims, out);
  return std::string(out.data(), n);
}

int start_connect(const sockaddr_in& server, const in_addr* source) noexcept {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (source != nullptr) {
    // The port is picked at connect() time, per 4-tuple, so ports never run out per address.
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr = *source;
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&src), sizeof(src)) != 0) {
      const int e = errno;
      ::close(fd);
      return -e;
    }
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&server), sizeof(server)) != 0 && errno != EINPROGRESS) {
    const int e = errno;
    ::close(fd);
    return -e;
  }
  return fd;
}

}  // namespace wspush::loadgen
