#pragma once
/// \file http_scan.hpp
/// Byte-level scanning for the upgrade parser (internal to proto): 16 bytes at a time with SSE2
/// where the target has it (every x86-64), 8 at a time (SWAR) or a plain loop elsewhere. The
/// parser's budget is ≤ 200 ns for a ~500-byte request: a byte-at-a-time loop or a memchr call
/// per line (each ~10 ns for a 40-byte line) cannot meet it.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace wspush::proto::detail {

/// Bit i set when byte i of the 16 readable bytes at `p` equals `c`.
inline std::uint32_t byte_mask16(const char* p, char c) noexcept {
#if defined(__SSE2__)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(c))));
#else
  std::uint32_t m = 0;
  for (int i = 0; i < 16; ++i) m |= std::uint32_t(p[i] == c) << i;
  return m;
#endif
}

/// Bit i set when byte i of the 64 readable bytes at `p` equals `c`.
inline std::uint64_t byte_mask64(const char* p, char c) noexcept {
  return std::uint64_t{byte_mask16(p, c)} | std::uint64_t{byte_mask16(p + 16, c)} << 16 |
         std::uint64_t{byte_mask16(p + 32, c)} << 32 | std::uint64_t{byte_mask16(p + 48, c)} << 48;
}

#if defined(__SSE2__)
/// 0xFF in each byte of `x` that is an ASCII letter or digit. Signed compares: bytes ≥ 0x80
/// are negative, so they fall outside every range.
inline __m128i alnum_bytes16(__m128i x) noexcept {
  const __m128i lower = _mm_or_si128(x, _mm_set1_epi8(0x20));
  const __m128i alpha = _mm_and_si128(_mm_cmpgt_epi8(lower, _mm_set1_epi8('a' - 1)),
                                      _mm_cmplt_epi8(lower, _mm_set1_epi8('z' + 1)));
  const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(x, _mm_set1_epi8('0' - 1)),
                                      _mm_cmplt_epi8(x, _mm_set1_epi8('9' + 1)));
  return _mm_or_si128(alpha, digit);
}
#endif

constexpr bool is_alnum_byte(unsigned char c) noexcept {
  const unsigned char lower = c | 0x20;
  return (lower >= 'a' && lower <= 'z') || (c >= '0' && c <= '9');
}

/// Bit i set when byte i of the 16 readable bytes at `p` is an ASCII letter, digit or '-': the
/// characters of nearly every header name (the other tchar are checked byte by byte).
inline std::uint32_t name_chars_mask16(const char* p) noexcept {
#if defined(__SSE2__)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i ok = _mm_or_si128(alnum_bytes16(x), _mm_cmpeq_epi8(x, _mm_set1_epi8('-')));
  return static_cast<std::uint16_t>(_mm_movemask_epi8(ok));
#else
  std::uint32_t m = 0;
  for (int i = 0; i < 16; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    m |= std::uint32_t(is_alnum_byte(c) || c == '-') << i;
  }
  return m;
#endif
}

/// Bit i set when byte i of the 16 readable bytes at `p` is in the base64 alphabet (RFC 4648
/// §4: letters, digits, '+', '/').
inline std::uint32_t base64_chars_mask16(const char* p) noexcept {
#if defined(__SSE2__)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i sym = _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('+')), _mm_cmpeq_epi8(x, _mm_set1_epi8('/')));
  return static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_or_si128(alnum_bytes16(x), sym)));
#else
  std::uint32_t m = 0;
  for (int i = 0; i < 16; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    m |= std::uint32_t(is_alnum_byte(c) || c == '+' || c == '/') << i;
  }
  return m;
#endif
}

/// LF, colon and control-byte positions in the 64-byte block at p[base], of which only bytes
/// before `limit` count (a short last block is copied and padded, never read past `limit`).
/// `ctl` marks the bytes a request head may hold only as line ends: below 0x20 but HTAB, and
/// DEL (CR and LF included).
struct line_masks {
  std::uint64_t lf;
  std::uint64_t colon;
  std::uint64_t ctl;
};

/// Adds the bits of the 16 bytes at block[at] to `m`: one load, a few compares.
inline void add_line_chunk(line_masks& m, const char* block, int at) noexcept {
#if defined(__SSE2__)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + at));
  m.lf |= std::uint64_t(std::uint16_t(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('\n'))))) << at;
  m.colon |= std::uint64_t(std::uint16_t(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(':'))))) << at;
  const __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1F)), x);  // unsigned x <= 0x1F
  const __m128i del = _mm_cmpeq_epi8(x, _mm_set1_epi8(0x7F));
  const __m128i tab = _mm_cmpeq_epi8(x, _mm_set1_epi8('\t'));
  m.ctl |= std::uint64_t(std::uint16_t(_mm_movemask_epi8(_mm_andnot_si128(tab, _mm_or_si128(low, del))))) << at;
#else
  m.lf |= std::uint64_t{byte_mask16(block + at, '\n')} << at;
  m.colon |= std::uint64_t{byte_mask16(block + at, ':')} << at;
  for (int i = 0; i < 16; ++i) {
    const auto c = static_cast<unsigned char>(block[at + i]);
    if ((c < 0x20 && c != '\t') || c == 0x7F) m.ctl |= std::uint64_t{1} << (at + i);
  }
#endif
}

inline line_masks classify_lines(const char* p, std::size_t base, std::size_t limit) noexcept {
  const char* block = p + base;
  char tail[64];
  if (base + 64 > limit) {
    std::memset(tail, 'x', sizeof tail);
    std::memcpy(tail, block, limit - base);
    block = tail;
  }
  line_masks m{0, 0, 0};
  add_line_chunk(m, block, 0);  // written out four times: GCC keeps a loop here otherwise
  add_line_chunk(m, block, 16);
  add_line_chunk(m, block, 32);
  add_line_chunk(m, block, 48);
  return m;
}

/// Index of the first `c` in [from, to), or `to`. Bytes up to `readable` may be read, so a
/// short line is searched with one 16-byte compare instead of a loop or a memchr call.
inline std::size_t find_byte(const char* p, std::size_t from, std::size_t to, std::size_t readable, char c) noexcept {
  std::size_t pos = from;
  for (; pos < to && pos + 16 <= readable; pos += 16) {
    if (const std::uint32_t m = byte_mask16(p + pos, c); m != 0) {
      const std::size_t at = pos + static_cast<std::size_t>(std::countr_zero(m));
      return at < to ? at : to;
    }
  }
  for (; pos < to; ++pos)
    if (p[pos] == c) return pos;
  return to;
}

// ---- SWAR helpers (8 bytes in a word) -------------------------------------------------------

inline constexpr std::uint64_t k_ones = 0x0101010101010101ull;
inline constexpr std::uint64_t k_highs = 0x8080808080808080ull;

/// True if some byte is ≤ 0x20 (a control character or a space) or is DEL. The classic
/// "has a byte less than n" and "has a zero byte" word tests, exact as any-tests.
constexpr bool any_ctl_or_space(std::uint64_t w) noexcept {
  const std::uint64_t del = w ^ (k_ones * 0x7F);
  return (((w - k_ones * 0x21) & ~w) | ((del - k_ones) & ~del)) & k_highs;
}

/// True if some byte is < 0x20 (a control character, HTAB included) or is DEL.
constexpr bool any_ctl_or_del(std::uint64_t w) noexcept {
  const std::uint64_t del = w ^ (k_ones * 0x7F);
  return (((w - k_ones * 0x20) & ~w) | ((del - k_ones) & ~del)) & k_highs;
}

inline std::uint64_t load64(const char* p) noexcept {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

inline std::uint32_t load32(const char* p) noexcept {
  std::uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

/// ASCII case-insensitive equality of `s` with `lower` (same size ≥ 4, lower case letters and
/// '-' only), by folding with |0x20 a word at a time, the last word overlapping. |0x20 maps
/// only 'A'-'Z' onto letters, but it maps CR onto '-': a caller matching a name with a '-'
/// must check those positions exactly.
inline bool iequals_folded(const char* s, std::string_view lower) noexcept {
  const std::size_t n = lower.size();
  if (n >= 8) {
    for (std::size_t i = 0; i + 8 <= n; i += 8)
      if ((load64(s + i) | k_ones * 0x20) != load64(lower.data() + i)) return false;
    return (load64(s + n - 8) | k_ones * 0x20) == load64(lower.data() + n - 8);
  }
  constexpr std::uint32_t fold = 0x20202020u;
  return (load32(s) | fold) == load32(lower.data()) && (load32(s + n - 4) | fold) == load32(lower.data() + n - 4);
}

}  // namespace wspush::proto::detail
