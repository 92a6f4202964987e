#include "proto/ws_close.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <string>

#include "proto/utf8.hpp"
#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::to_bytes;

namespace {

std::vector<std::uint8_t> payload(std::uint16_t code, std::string_view reason = {}) {
  std::vector<std::uint8_t> p(2 + reason.size());
  p[0] = static_cast<std::uint8_t>(code >> 8);
  p[1] = static_cast<std::uint8_t>(code);
  std::copy(reason.begin(), reason.end(), p.begin() + 2);
  return p;
}

}  // namespace

TEST_CASE("close: wire code ranges", "[close]") {
  struct range {
    unsigned first, last;
    bool valid;
  };
  // RFC 6455 §7.4 and the IANA registry: the whole 16-bit space, range by range.
  const range ranges[] = {
      {0, 999, false},     {1000, 1003, true},  {1004, 1006, false}, {1007, 1014, true},
      {1015, 1015, false}, {1016, 2999, false}, {3000, 4999, true},  {5000, 65535, false},
  };
  std::size_t covered = 0;
  for (const range& r : ranges) {
    for (unsigned c = r.first; c <= r.last; ++c) {
      if (is_valid_wire_close_code(static_cast<std::uint16_t>(c)) != r.valid) FAIL("code " << c);
      const auto p = payload(static_cast<std::uint16_t>(c));
      const close_parse cp = parse_close_payload(p);
      if (cp.ok != r.valid) FAIL("parse of code " << c);
      if (!r.valid && cp.error != close_code::protocol_error) FAIL("error for code " << c);
      if (r.valid && (!cp.info.has_code || cp.info.code != c)) FAIL("info for code " << c);
      ++covered;
    }
  }
  CHECK(covered == 65536);
  static_assert(is_valid_wire_close_code(1000) && !is_valid_wire_close_code(1005));
}

TEST_CASE("close: payload shapes", "[close]") {
  SECTION("empty payload: no code, fine") {
    const close_parse cp = parse_close_payload({});
    CHECK(cp.ok);
    CHECK(cp.error == close_code{0});
    CHECK_FALSE(cp.info.has_code);
  }
  SECTION("one byte is a protocol error") {
    // the byte after the span would complete code 1000: it must not be read
    const std::uint8_t two[] = {0x03, 0xE8};
    const close_parse cp = parse_close_payload(std::span<const std::uint8_t>(two, 1));
    CHECK_FALSE(cp.ok);
    CHECK(cp.error == close_code::protocol_error);
  }
  SECTION("code and reason") {
    const auto p = payload(1000, "bye \xE2\x82\xAC");
    const close_parse cp = parse_close_payload(p);
    REQUIRE(cp.ok);
    CHECK(cp.info.has_code);
    CHECK(cp.info.code == 1000);
    CHECK(cp.info.reason == "bye \xE2\x82\xAC");
    CHECK(static_cast<const void*>(cp.info.reason.data()) == static_cast<const void*>(p.data() + 2));
  }
  SECTION("reason that is not UTF-8 → 1007") {
    for (std::string_view bad : {"\xFF", "ok\xC0\x80", "\xED\xA0\x80", "cut \xE2\x82"}) {
      const close_parse cp = parse_close_payload(payload(1001, bad));
      CHECK_FALSE(cp.ok);
      CHECK(cp.error == close_code::invalid_payload);
    }
  }
  SECTION("bad code with bad reason reports the code first") {
    const close_parse cp = parse_close_payload(payload(999, "\xFF"));
    CHECK(cp.error == close_code::protocol_error);
  }
}

TEST_CASE("close: encode", "[close]") {
  std::array<std::uint8_t, 125> out{};
  SECTION("code big endian, then the reason") {
    const std::size_t n = encode_close_payload(close_code::going_away, "restart", out);
    REQUIRE(n == 9);
    CHECK(out[0] == 0x03);
    CHECK(out[1] == 0xE9);
    CHECK(std::string(out.begin() + 2, out.begin() + 9) == "restart");
    const close_parse cp = parse_close_payload({out.data(), n});
    CHECK(cp.ok);
    CHECK(cp.info.code == 1001);
    CHECK(cp.info.reason == "restart");
  }
  SECTION("a long reason is cut to 123 bytes") {
    const std::string reason(300, 'r');
    CHECK(encode_close_payload(close_code::normal, reason, out) == 125);
  }
  SECTION("the cut never splits a character") {
    for (std::size_t pad = 115; pad <= 123; ++pad) {
      const std::string reason = std::string(pad, 'a') + "\xF0\x9F\x98\x80" "tail";
      const std::size_t n = encode_close_payload(close_code::policy_violation, reason, out);
      REQUIRE(n <= 125);
      CHECK(is_valid_utf8({out.data() + 2, n - 2}));
      CHECK(parse_close_payload({out.data(), n}).ok);
      // the emoji fits whole (then as much ASCII as fits) or not at all
      const std::size_t expected = pad + 4 <= 123 ? std::min<std::size_t>(pad + 8, 123) : pad;
      CHECK(n - 2 == expected);
    }
  }
  SECTION("invalid bytes in the reason are not sent") {
    const std::size_t n = encode_close_payload(close_code::internal_error, "oops\xFFmore", out);
    CHECK(n == 6);
    CHECK(parse_close_payload({out.data(), n}).ok);
  }
  SECTION("a small buffer cuts the reason; too small writes nothing") {
    std::array<std::uint8_t, 5> small{};
    CHECK(encode_close_payload(close_code::normal, "abcdef", small) == 5);
    CHECK(encode_close_payload(close_code::normal, "ab", std::span<std::uint8_t>(small.data(), 1)) == 0);
    CHECK(encode_close_payload(close_code::normal, "ab", std::span<std::uint8_t>(small.data(), 2)) == 2);
  }
  SECTION("codes that never go on the wire encode as an empty payload") {
    CHECK(encode_close_payload(close_code::no_status, "x", out) == 0);
    CHECK(encode_close_payload(close_code::abnormal, "x", out) == 0);
  }
}
