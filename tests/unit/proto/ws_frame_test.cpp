#include "proto/ws_frame.hpp"

#include <catch2/catch.hpp>

#include <random>

#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::to_bytes;

namespace {

using bytes = std::vector<std::uint8_t>;

/// Byte-at-a-time reference for masking (RFC 6455 §5.3).
bytes reference_mask(bytes data, std::array<std::uint8_t, 4> mask, std::size_t offset) {
  for (std::size_t i = 0; i < data.size(); ++i) data[i] ^= mask[(offset + i) % 4];
  return data;
}

}  // namespace

TEST_CASE("frame: RFC 6455 §5.7 examples", "[frame]") {
  SECTION("unmasked Hello") {
    const bytes wire = {0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    const header_result r = parse_frame_header(wire);
    REQUIRE(r.status == parse_status::done);
    CHECK(r.header.fin);
    CHECK(r.header.raw_opcode == 1);
    CHECK_FALSE(r.header.masked);
    CHECK(r.header.payload_len == 5);
    CHECK(r.header.size == 2);
  }
  SECTION("masked Hello") {
    bytes wire = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    const header_result r = parse_frame_header(wire);
    REQUIRE(r.status == parse_status::done);
    CHECK(r.header.masked);
    CHECK(r.header.size == 6);
    CHECK(r.header.mask == std::array<std::uint8_t, 4>{0x37, 0xfa, 0x21, 0x3d});
    std::span<std::uint8_t> payload(wire.data() + 6, 5);
    CHECK(apply_mask(payload, r.header.mask, 0) == 1);
    CHECK(std::string(payload.begin(), payload.end()) == "Hello");
  }
  SECTION("fragmented Hel / lo") {
    const bytes first = {0x01, 0x03, 0x48, 0x65, 0x6c};
    const bytes second = {0x80, 0x02, 0x6c, 0x6f};
    CHECK_FALSE(parse_frame_header(first).header.fin);
    CHECK(parse_frame_header(first).header.raw_opcode == 1);
    CHECK(parse_frame_header(second).header.fin);
    CHECK(parse_frame_header(second).header.raw_opcode == 0);
  }
  SECTION("256 bytes and 64 KiB binary headers") {
    const bytes h256 = {0x82, 0x7E, 0x01, 0x00};
    const bytes h64k = {0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0};
    CHECK(parse_frame_header(h256).header.payload_len == 256);
    CHECK(parse_frame_header(h256).header.size == 4);
    CHECK(parse_frame_header(h64k).header.payload_len == 65536);
    CHECK(parse_frame_header(h64k).header.size == 10);
  }
}

TEST_CASE("frame: every bit of the first byte", "[frame]") {
  for (int b0 = 0; b0 < 256; ++b0) {
    const bytes wire = {static_cast<std::uint8_t>(b0), 0x00};
    const header_result r = parse_frame_header(wire);
    REQUIRE(r.status == parse_status::done);
    CHECK(r.header.fin == ((b0 & 0x80) != 0));
    CHECK(r.header.rsv == ((b0 >> 4) & 7));
    CHECK(r.header.raw_opcode == (b0 & 0xF));
  }
}

TEST_CASE("frame: all three length forms, encode → parse roundtrip", "[frame]") {
  const std::uint64_t lengths[] = {0,      1,       124,          125,           126,          127,
                                   65535,  65536,   65537,        1ull << 32,    (1ull << 63) - 1};
  const opcode ops[] = {opcode::continuation, opcode::text, opcode::binary, opcode::close, opcode::ping, opcode::pong};
  for (std::uint64_t len : lengths) {
    for (opcode op : ops) {
      for (bool fin : {false, true}) {
        std::array<std::uint8_t, max_server_header_size> out{};
        const std::size_t n = encode_frame_header(out, op, fin, len);
        CHECK(n == (len <= 125 ? 2u : len <= 65535 ? 4u : 10u));
        CHECK(n == frame_header_size(len));
        const header_result r = parse_frame_header({out.data(), n});
        REQUIRE(r.status == parse_status::done);
        CHECK(r.header.payload_len == len);
        CHECK(r.header.raw_opcode == static_cast<std::uint8_t>(op));
        CHECK(r.header.fin == fin);
        CHECK(r.header.rsv == 0);
        CHECK_FALSE(r.header.masked);
        CHECK(r.header.size == n);
        // every prefix is need_more
        for (std::size_t k = 0; k < n; ++k) CHECK(parse_frame_header({out.data(), k}).status == parse_status::need_more);

        const std::array<std::uint8_t, 4> mask = {0xA1, 0x00, 0x7F, 0xFE};
        std::array<std::uint8_t, max_frame_header_size> mout{};
        const std::size_t m = encode_masked_frame_header(mout, op, fin, len, mask);
        CHECK(m == n + 4);
        const header_result mr = parse_frame_header({mout.data(), m});
        REQUIRE(mr.status == parse_status::done);
        CHECK(mr.header.masked);
        CHECK(mr.header.mask == mask);
        CHECK(mr.header.payload_len == len);
        CHECK(mr.header.size == m);
        for (std::size_t k = 0; k < m; ++k) CHECK(parse_frame_header({mout.data(), k}).status == parse_status::need_more);
      }
    }
  }
}

TEST_CASE("frame: 64-bit length with the top bit set is an error", "[frame]") {
  const bytes wire = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
  CHECK(parse_frame_header(wire).status == parse_status::error);
  const bytes unmasked = {0x82, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(parse_frame_header(unmasked).status == parse_status::error);
  // the largest legal length is fine, and a short prefix still asks for more
  const bytes max_ok = {0x82, 0x7F, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(parse_frame_header(max_ok).status == parse_status::done);
  CHECK(parse_frame_header({wire.data(), 9}).status == parse_status::need_more);
}

TEST_CASE("frame: non-minimal lengths parse structurally", "[frame]") {
  // 5 in the 16-bit form: the structural parser reports it; the reader decides.
  const bytes wire = {0x89, 0xFE, 0x00, 0x05, 1, 2, 3, 4};
  const header_result r = parse_frame_header(wire);
  REQUIRE(r.status == parse_status::done);
  CHECK(r.header.payload_len == 5);
  CHECK(r.header.size == 8);
}

TEST_CASE("frame: masking matches the byte-at-a-time reference", "[frame]") {
  std::mt19937 rng(7);
  for (std::size_t len = 0; len <= 100; ++len) {
    bytes data(len);
    for (auto& x : data) x = static_cast<std::uint8_t>(rng());
    const std::array<std::uint8_t, 4> mask = {static_cast<std::uint8_t>(rng()), static_cast<std::uint8_t>(rng()),
                                              static_cast<std::uint8_t>(rng()), static_cast<std::uint8_t>(rng())};
    for (std::uint8_t offset = 0; offset < 4; ++offset) {
      bytes copy = data;
      CHECK(apply_mask(copy, mask, offset) == (offset + len) % 4);
      CHECK(copy == reference_mask(data, mask, offset));
      CHECK(apply_mask(copy, mask, offset) == (offset + len) % 4);
      CHECK(copy == data);  // masking is its own inverse
    }
    // in two pieces at every split, carrying the offset, equals masking whole
    const bytes whole = reference_mask(data, mask, 0);
    for (std::size_t cut = 0; cut <= len; ++cut) {
      bytes copy = data;
      const std::uint8_t mid = apply_mask({copy.data(), cut}, mask, 0);
      CHECK(mid == cut % 4);
      apply_mask({copy.data() + cut, len - cut}, mask, mid);
      CHECK(copy == whole);
    }
  }
}

TEST_CASE("frame: masking an unaligned large buffer", "[frame]") {
  bytes data(4096 + 3);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31);
  const std::array<std::uint8_t, 4> mask = {1, 2, 3, 4};
  for (std::size_t start = 0; start < 3; ++start) {
    bytes copy = data;
    std::span<std::uint8_t> view(copy.data() + start, 4096);
    apply_mask(view, mask, 2);
    const bytes expected = reference_mask(bytes(data.begin() + static_cast<std::ptrdiff_t>(start),
                                                data.begin() + static_cast<std::ptrdiff_t>(start) + 4096),
                                          mask, 2);
    CHECK(bytes(view.begin(), view.end()) == expected);
    CHECK(copy.back() == data.back());  // nothing outside the span changes
  }
}

TEST_CASE("frame: opcode classification", "[frame]") {
  for (std::uint8_t op = 0; op < 16; ++op) {
    CHECK(is_control(op) == (op >= 8));
    CHECK(is_known_opcode(op) == (op <= 2 || (op >= 8 && op <= 10)));
  }
}
