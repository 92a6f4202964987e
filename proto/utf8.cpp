#include "proto/utf8.hpp"

#include <array>
#include <bit>
#include <cstring>

namespace wspush::proto {
namespace {

// A byte-wise DFA over byte classes. States are what the bytes so far still owe:
enum : std::uint8_t {
  s_accept = 0,  // on a code-point boundary
  s_tail1,       // one continuation byte (80..BF) to go
  s_tail2,       // two to go
  s_tail3,       // three to go
  s_e0,          // after E0: A0..BF (rules out overlong 3-byte forms), then one more
  s_ed,          // after ED: 80..9F (rules out surrogates D800..DFFF), then one more
  s_f0,          // after F0: 90..BF (rules out overlong 4-byte forms), then two more
  s_f4,          // after F4: 80..8F (nothing above U+10FFFF), then two more
  s_reject,      // sticky
  state_count
};

// Byte classes: the lead bytes with special second-byte ranges get their own class.
enum : std::uint8_t {
  c_ascii = 0, c_80_8f, c_90_9f, c_a0_bf, c_bad, c_lead2, c_e0, c_lead3, c_ed, c_f0, c_lead4, c_f4,
  class_count
};

constexpr std::uint8_t class_of(unsigned b) noexcept {
  if (b < 0x80) return c_ascii;
  if (b < 0x90) return c_80_8f;
  if (b < 0xA0) return c_90_9f;
  if (b < 0xC0) return c_a0_bf;
  if (b < 0xC2) return c_bad;  // C0, C1: always overlong
  if (b < 0xE0) return c_lead2;
  if (b == 0xE0) return c_e0;
  if (b == 0xED) return c_ed;
  if (b < 0xF0) return c_lead3;
  if (b == 0xF0) return c_f0;
  if (b < 0xF4) return c_lead4;
  if (b == 0xF4) return c_f4;
  return c_bad;  // F5..FF
}

constexpr std::uint8_t next_state(std::uint8_t s, std::uint8_t c) noexcept {
  const bool cont = c == c_80_8f || c == c_90_9f || c == c_a0_bf;
  switch (s) {
    case s_accept:
      switch (c) {
        case c_ascii: return s_accept;
        case c_lead2: return s_tail1;
        case c_e0: return s_e0;
        case c_lead3: return s_tail2;
        case c_ed: return s_ed;
        case c_f0: return s_f0;
        case c_lead4: return s_tail3;
        case c_f4: return s_f4;
        default: return s_reject;
      }
    case s_tail1: return cont ? s_accept : s_reject;
    case s_tail2: return cont ? s_tail1 : s_reject;
    case s_tail3: return cont ? s_tail2 : s_reject;
    case s_e0: return c == c_a0_bf ? s_tail1 : s_reject;
    case s_ed: return c == c_80_8f || c == c_90_9f ? s_tail1 : s_reject;
    case s_f0: return c == c_90_9f || c == c_a0_bf ? s_tail2 : s_reject;
    case s_f4: return c == c_80_8f ? s_tail2 : s_reject;
    default: return s_reject;
  }
}

struct tables {
  std::array<std::uint8_t, 256> byte_class{};
  std::array<std::uint8_t, state_count * 16> transition{};  // [state * 16 + class]
};

constexpr tables make_tables() noexcept {
  tables t{};
  for (unsigned b = 0; b < 256; ++b) t.byte_class[b] = class_of(b);
  for (std::uint8_t s = 0; s < state_count; ++s)
    for (std::uint8_t c = 0; c < class_count; ++c) t.transition[s * 16 + c] = next_state(s, c);
  return t;
}

constexpr tables k_tables = make_tables();
constexpr std::uint64_t k_high_bits = 0x8080808080808080ull;

/// Index of the first byte with its high bit set among the set bits of `high`.
inline std::size_t first_high_byte(std::uint64_t high) noexcept {
  if constexpr (std::endian::native == std::endian::little) return std::countr_zero(high) / 8;
  else return std::countl_zero(high) / 8;
}

/// Skips ASCII from `i`, 16 then 8 bytes at a time; returns the index of the first non-ASCII
/// byte (or `n`). Only called on a code-point boundary, where ASCII cannot change the state.
inline std::size_t skip_ascii(const std::uint8_t* p, std::size_t i, std::size_t n) noexcept {
  while (i + 16 <= n) {
    std::uint64_t a, b;
    std::memcpy(&a, p + i, 8);
    std::memcpy(&b, p + i + 8, 8);
    if (((a | b) & k_high_bits) != 0) break;
    i += 16;
  }
  while (i + 8 <= n) {
    std::uint64_t a;
    std::memcpy(&a, p + i, 8);
    if (const auto high = a & k_high_bits; high != 0) return i + first_high_byte(high);
    i += 8;
  }
  while (i < n && p[i] < 0x80) ++i;
  return i;
}

constexpr bool is_cont(std::uint8_t b) noexcept { return (b & 0xC0) == 0x80; }

/// Length of the complete, valid multi-byte sequence at p (4 bytes readable), or 0: whole
/// characters without the DFA's chain of dependent table lookups. Anything invalid or cut
/// short returns 0 and goes to the DFA, which finds the exact byte where it fails.
inline std::size_t whole_sequence(const std::uint8_t* p) noexcept {
  const std::uint8_t b0 = p[0], b1 = p[1];
  if (b0 >= 0xC2 && b0 <= 0xDF) return is_cont(b1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!is_cont(b1) || !is_cont(p[2])) return 0;
    if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F)) return 0;  // overlong, surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!is_cont(b1) || !is_cont(p[2]) || !is_cont(p[3])) return 0;
    if ((b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F)) return 0;  // overlong, > U+10FFFF
    return 4;
  }
  return 0;
}

/// Runs the DFA from `state` over `bytes`; returns the final state (s_reject as soon as one
/// byte is invalid: the rest is not looked at).
inline std::uint8_t run(std::uint8_t state, std::span<const std::uint8_t> bytes) noexcept {
  const std::uint8_t* p = bytes.data();
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  for (;;) {
    if (state == s_accept) {
      i = skip_ascii(p, i, n);
      while (i + 4 <= n) {  // whole characters, then ASCII again
        const std::size_t len = whole_sequence(p + i);
        if (len == 0) break;
        i = skip_ascii(p, i + len, n);
      }
    }
    if (i == n) return state;
    state = k_tables.transition[state * 16 + k_tables.byte_class[p[i++]]];
    if (state == s_reject) return state;
  }
}

}  // namespace

bool utf8_validator::feed(std::span<const std::uint8_t> bytes) noexcept {
  if (_state == s_reject) return false;
  _state = run(_state, bytes);
  return _state != s_reject;
}

bool utf8_validator::failed() const noexcept { return _state == s_reject; }

bool is_valid_utf8(std::span<const std::uint8_t> bytes) noexcept { return run(s_accept, bytes) == s_accept; }

}  // namespace wspush::proto
