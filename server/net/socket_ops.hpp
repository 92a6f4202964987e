#pragma once
// Socket set-up done once at start: addresses, listeners, the open-files limit.

#include <cstdint>
#include <string>

#include <netinet/in.h>

namespace wspush::server {

struct endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

/// Parses "ADDR:PORT" ("0.0.0.0:8080", "127.0.0.1:0", "[::1]:8080"). Throws std::runtime_error with a message fit for the user.
endpoint parse_endpoint(const std::string& text);
/// A non-blocking listening socket with SO_REUSEADDR (and SO_REUSEPORT if asked: then
/// other sockets that ask too may bind the same port). Throws on failure.
int make_listener(const endpoint& ep, int backlog, bool reuseport = false);
/// "127.0.0.1:41235" for a bound socket.
std::string local_name(int fd);

struct nofile_limits {
  std::uint64_t soft_before, soft_after, hard;
};
/// Raises the soft open-files limit to the hard limit.
nofile_limits raise_nofile_limit() noexcept;

}  // namespace wspush::server
