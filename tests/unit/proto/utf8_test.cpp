#include "proto/utf8.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <optional>
#include <random>

#include "test_support.hpp"

using wspush::proto::is_valid_utf8;
using wspush::proto::utf8_validator;
using wspush::test::chunkings;
using wspush::test::to_bytes;

namespace {

using bytes = std::vector<std::uint8_t>;

// A reference written differently from the DFA: decode each sequence arithmetically, then
// check the code point's range.
struct ref_result {
  bool valid;      // complete and valid
  bool prefix_ok;  // could still be extended to valid UTF-8
};

constexpr bool allowed(std::uint32_t cp, int len) {
  const std::uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

/// A truncated sequence whose known bits are `cp`, `missing` continuation bytes short: can any
/// continuation make it an allowed code point? The completions are the range [lo, hi].
constexpr bool completable(std::uint32_t cp, int missing, int len) {
  const std::uint32_t lo = cp << (6 * missing), hi = lo | ((1u << (6 * missing)) - 1);
  const std::uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  const std::uint32_t a = lo > min ? lo : min, c = hi < 0x10FFFF ? hi : 0x10FFFF;
  return a <= c && !(a >= 0xD800 && c <= 0xDFFF);
}

ref_result reference(std::span<const std::uint8_t> s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::uint8_t b = s[i];
    if (b < 0x80) { ++i; continue; }
    const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || b >= 0xF8) return {false, false};
    std::uint32_t cp = b & (0x7F >> len);
    int j = 1;
    for (; j < len && i + j < s.size(); ++j) {
      if ((s[i + j] & 0xC0) != 0x80) return {false, false};
      cp = cp << 6 | (s[i + j] & 0x3F);
    }
    if (j < len) return {false, completable(cp, len - j, len)};
    if (!allowed(cp, len)) return {false, false};
    i += static_cast<std::size_t>(len);
  }
  return {true, true};
}

/// Index of the byte at which a byte-at-a-time feed first fails, or nullopt.
std::optional<std::size_t> fail_index(const bytes& s) {
  utf8_validator v;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!v.feed({&s[i], 1})) return i;
  return std::nullopt;
}

bytes b(std::initializer_list<int> v) {
  bytes out;
  for (int x : v) out.push_back(static_cast<std::uint8_t>(x));
  return out;
}

}  // namespace

TEST_CASE("utf8: valid sequences at every boundary of each length", "[utf8]") {
  const std::vector<bytes> valid = {
      {},
      to_bytes("plain ascii"),
      to_bytes("h\xC3\xA9llo w\xC3\xB6rld"),
      b({0xC2, 0x80}),                    // U+0080, smallest 2-byte
      b({0xDF, 0xBF}),                    // U+07FF
      b({0xE0, 0xA0, 0x80}),              // U+0800, smallest 3-byte
      b({0xED, 0x9F, 0xBF}),              // U+D7FF, just below the surrogates
      b({0xEE, 0x80, 0x80}),              // U+E000, just above
      b({0xEF, 0xBF, 0xBF}),              // U+FFFF
      b({0xF0, 0x90, 0x80, 0x80}),        // U+10000, smallest 4-byte
      b({0xF4, 0x8F, 0xBF, 0xBF}),        // U+10FFFF, the last code point
      to_bytes("\xE2\x82\xAC \xF0\x9D\x84\x9E \xCE\xBA\xE1\xBD\xB9\xCF\x83\xCE\xBC\xCE\xB5"),
  };
  for (const auto& s : valid) {
    INFO("case " << wspush::test::to_string(s));
    CHECK(is_valid_utf8(s));
    CHECK(reference(s).valid);
    for (const auto& cuts : chunkings(s.size())) {
      utf8_validator v;
      std::size_t prev = 0;
      for (std::size_t cut : cuts) {
        CHECK(v.feed({s.data() + prev, cut - prev}));
        prev = cut;
      }
      CHECK(v.complete());
    }
  }
}

TEST_CASE("utf8: invalid sequences fail fast at the first impossible byte", "[utf8]") {
  struct bad_case {
    bytes input;
    std::size_t fails_at;
  };
  const std::vector<bad_case> cases = {
      {b({0x80}), 0},                          // lone continuation
      {b({'a', 0xBF}), 1},
      {b({0xC0, 0x80}), 0},                    // overlong NUL: C0 is never valid
      {b({0xC1, 0xBF}), 0},                    // overlong 2-byte
      {b({0xE0, 0x80, 0x80}), 1},              // overlong 3-byte: known at the second byte
      {b({0xE0, 0x9F, 0xBF}), 1},
      {b({0xF0, 0x80, 0x80, 0x80}), 1},        // overlong 4-byte
      {b({0xF0, 0x8F, 0xBF, 0xBF}), 1},
      {b({0xED, 0xA0, 0x80}), 1},              // U+D800 surrogate
      {b({0xED, 0xBF, 0xBF}), 1},              // U+DFFF
      {b({0xF4, 0x90, 0x80, 0x80}), 1},        // U+110000
      {b({0xF5, 0x80, 0x80, 0x80}), 0},
      {b({0xFE}), 0},
      {b({0xFF}), 0},
      {b({0xC2, 'a'}), 1},                     // sequence cut short by ASCII
      {b({0xE1, 0x80, 0xC2, 0x80}), 2},
      {b({0xF1, 0x80, 0x80, 0x7F}), 3},
      {b({'o', 'k', ' ', 0xCE, 0xBA, 0xED, 0xA0, 0x80, 'x'}), 6},
  };
  for (const auto& c : cases) {
    INFO("case " << wspush::test::to_string(c.input));
    CHECK_FALSE(is_valid_utf8(c.input));
    CHECK(fail_index(c.input) == c.fails_at);
    const ref_result ref = reference(c.input);
    CHECK_FALSE(ref.valid);
    CHECK_FALSE(ref.prefix_ok);
    for (const auto& cuts : chunkings(c.input.size())) {
      utf8_validator v;
      std::size_t prev = 0;
      bool ok = true;
      for (std::size_t cut : cuts) {
        ok = v.feed({c.input.data() + prev, cut - prev});
        // fail fast: the feed containing the bad byte already says so
        CHECK(ok == (cut <= c.fails_at));
        if (!ok) break;
        prev = cut;
      }
      CHECK_FALSE(ok);
      CHECK(v.failed());
      CHECK_FALSE(v.feed(to_bytes("a")));  // sticky until reset
      v.reset();
      CHECK(v.feed(to_bytes("a")));
      CHECK(v.complete());
    }
  }
}

TEST_CASE("utf8: truncated sequences are valid prefixes but not complete", "[utf8]") {
  for (const bytes& s : {b({0xC2}), b({0xE0}), b({0xE0, 0xA0}), b({0xED, 0x9F}), b({0xF0}), b({0xF0, 0x90}),
                         b({0xF4, 0x8F, 0xBF}), b({'a', 'b', 0xE2, 0x82})}) {
    utf8_validator v;
    CHECK(v.feed(s));
    CHECK_FALSE(v.complete());
    CHECK_FALSE(v.failed());
    CHECK_FALSE(is_valid_utf8(s));
    CHECK(reference(s).prefix_ok);
  }
}

TEST_CASE("utf8: the ASCII fast path finds bad bytes at every offset", "[utf8]") {
  for (std::size_t len = 1; len < 70; ++len) {
    for (std::size_t at = 0; at < len; ++at) {
      bytes s(len, 'a');
      s[at] = 0xFF;
      CHECK(fail_index(s) == at);
      CHECK_FALSE(is_valid_utf8(s));
      utf8_validator v;
      CHECK_FALSE(v.feed(s));
      // and a good 3-byte character at the same place passes
      bytes g(len, 'a');
      const bytes euro = b({0xE2, 0x82, 0xAC});
      g.insert(g.begin() + static_cast<std::ptrdiff_t>(at), euro.begin(), euro.end());
      CHECK(is_valid_utf8(g));
      g.resize(at + 2);  // ends inside the character
      utf8_validator w;
      CHECK(w.feed(g));
      CHECK_FALSE(w.complete());
    }
  }
}

TEST_CASE("utf8: matches the reference on every 1 and 2 byte input", "[utf8]") {
  for (int x = 0; x < 256; ++x) {
    const bytes one = b({x});
    CHECK(is_valid_utf8(one) == reference(one).valid);
    for (int y = 0; y < 256; ++y) {
      const std::array<std::uint8_t, 2> two = {static_cast<std::uint8_t>(x), static_cast<std::uint8_t>(y)};
      const ref_result ref = reference(two);
      utf8_validator v;
      const bool fed = v.feed(two);
      if (fed != ref.prefix_ok || v.complete() != ref.valid || is_valid_utf8(two) != ref.valid)
        FAIL("mismatch at " << x << "," << y);
    }
  }
}

TEST_CASE("utf8: matches the reference on 3 and 4 byte sequences", "[utf8]") {
  const int edges[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xF0, 0xFF};
  std::size_t checked = 0;
  for (int lead = 0xC0; lead < 0x100; ++lead)
    for (int second = 0; second < 256; ++second)
      for (int third : edges)
        for (int fourth : edges) {
          const std::array<std::uint8_t, 4> s = {static_cast<std::uint8_t>(lead), static_cast<std::uint8_t>(second),
                                                 static_cast<std::uint8_t>(third), static_cast<std::uint8_t>(fourth)};
          const ref_result ref = reference(s);
          utf8_validator v;
          const bool fed = v.feed(s);
          if (fed != ref.prefix_ok || v.complete() != ref.valid || is_valid_utf8(s) != ref.valid)
            FAIL("mismatch at " << lead << "," << second << "," << third << "," << fourth);
          ++checked;
        }
  CHECK(checked == 64u * 256 * 13 * 13);
}

TEST_CASE("utf8: random mixed text agrees with the reference, fed in random pieces", "[utf8]") {
  std::mt19937 rng(12345);
  const bytes alphabet = b({'a', ' ', 0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF3,
                            0xF4, 0xF5});
  for (int round = 0; round < 20000; ++round) {
    bytes s(rng() % 24);
    for (auto& x : s) x = alphabet[rng() % alphabet.size()];
    const auto where = fail_index(s);
    if (where) {
      CHECK(reference(bytes(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(*where))).prefix_ok);
      CHECK_FALSE(reference(bytes(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(*where) + 1)).prefix_ok);
    } else {
      CHECK(reference(s).prefix_ok);
    }
    CHECK(is_valid_utf8(s) == reference(s).valid);
  }
}
