#pragma once
// Invariant checks for fuzz targets: abort() whatever NDEBUG says (RelWithDebInfo defines it).

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define WSPUSH_FUZZ_CHECK(cond)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace wspush::fuzz {

/// Small deterministic generator (xorshift) so a split pattern is reproducible from the input.
class splitter {
 public:
  explicit splitter(std::uint32_t seed) noexcept : _state(seed * 2654435761u + 1) {}
  /// Next chunk size in 1..max.
  std::size_t next(std::size_t max) noexcept {
    _state ^= _state << 13;
    _state ^= _state >> 17;
    _state ^= _state << 5;
    return 1 + _state % max;
  }

 private:
  std::uint32_t _state;
};

}  // namespace wspush::fuzz
