#pragma once
// --bus=redis://[:password@]host:port[/db]: where the Redis bus is.

#include <cstdint>
#include <string>
#include <string_view>

namespace wspush::server::bus {

struct redis_target {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string password;  // empty: no AUTH
  unsigned db = 0;
  /// "redis://127.0.0.1:6379/0" (the password never appears).
  std::string describe() const;
};

/// Parses a bus URL; throws std::invalid_argument with a message fit for the user.
redis_target parse_redis_url(std::string_view url);

}  // namespace wspush::server::bus
