#pragma once
/// \file utf8.hpp
/// Incremental UTF-8 validation (RFC 3629): no overlong forms, no surrogates (U+D800..U+DFFF),
/// nothing above U+10FFFF. Fails as soon as the bytes fed so far cannot be the prefix of valid
/// UTF-8 (Autobahn 6.x "fail fast"), so a text message is rejected mid-stream, not at its end.

#include <cstdint>
#include <span>

namespace wspush::proto {

/// Validates a byte stream fed in arbitrary pieces. The whole state is one byte because a
/// validator lives in every connection's frame reader (see ws_reader's size budget).
class utf8_validator {
 public:
  /// Feeds the next bytes; false as soon as the bytes so far cannot be a prefix of valid UTF-8.
  /// Once false, it stays false until reset().
  bool feed(std::span<const std::uint8_t> bytes) noexcept;
  /// True when everything fed so far ends on a code-point boundary.
  bool complete() const noexcept { return _state == 0; }
  /// True when an invalid byte has been seen.
  bool failed() const noexcept;
  void reset() noexcept { _state = 0; }

 private:
  std::uint8_t _state = 0;  // DFA state: 0 = on a boundary, see utf8.cpp for the others
};
static_assert(sizeof(utf8_validator) == 1, "utf8_validator lives in every connection: one byte");

/// Whole-buffer helper: true if `bytes` is complete, valid UTF-8.
bool is_valid_utf8(std::span<const std::uint8_t> bytes) noexcept;

}  // namespace wspush::proto
