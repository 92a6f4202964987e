#pragma once
// Jitter for what a fleet of clients must not do at once (reconnect, retry): a xorshift64
// generator per owner, seeded once. Not for anything secret.

#include <cstdint>

namespace wspush::server {

/// The next value of a xorshift64 state (which must not be 0).
inline std::uint64_t next_random(std::uint64_t& state) noexcept {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return state;
}

}  // namespace wspush::server
