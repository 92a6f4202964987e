#pragma once
// Helpers shared by the proto unit tests.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>
#include "tests/support/counting_alloc.hpp"  // allocation_count(): the binary links wspush_counting_alloc

namespace wspush::test {

/// The ways every parser input is fed (uWS `makeChunked`): whole, split in two at every byte,
/// and one byte at a time. Each scheme is the increasing list of chunk end offsets, ending at n.
inline std::vector<std::vector<std::size_t>> chunkings(std::size_t n) {
  std::vector<std::vector<std::size_t>> out;
  out.push_back({n});
  for (std::size_t k = 1; k < n; ++k) out.push_back({k, n});
  if (n > 1) {
    std::vector<std::size_t> bytewise;
    for (std::size_t k = 1; k <= n; ++k) bytewise.push_back(k);
    out.push_back(std::move(bytewise));
  }
  return out;
}

inline std::vector<std::uint8_t> to_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), reinterpret_cast<const std::uint8_t*>(s.data()) + s.size()};
}

inline std::string to_string(const std::vector<std::uint8_t>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace wspush::test
