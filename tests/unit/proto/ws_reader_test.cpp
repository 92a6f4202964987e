#include "proto/ws_reader.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::chunkings;

namespace {

using bytes = std::vector<std::uint8_t>;
constexpr std::uint8_t op_text = 1, op_binary = 2, op_cont = 0, op_close = 8, op_ping = 9, op_pong = 10;

struct frame_opts {
  bool fin = true;
  std::uint8_t rsv = 0;
  bool masked = true;
  std::array<std::uint8_t, 4> mask = {0x12, 0x9A, 0xFF, 0x03};
};

/// A client frame as a browser sends it (masked), or bent by `o`.
bytes client_frame(std::uint8_t raw_op, std::string_view payload, frame_opts o = {}) {
  bytes out(max_frame_header_size + payload.size());
  std::size_t n;
  if (o.masked) {
    n = encode_masked_frame_header(std::span<std::uint8_t, max_frame_header_size>(out.data(), max_frame_header_size),
                                   static_cast<opcode>(raw_op), o.fin, payload.size(), o.mask);
  } else {
    n = encode_frame_header(std::span<std::uint8_t, max_server_header_size>(out.data(), max_server_header_size),
                            static_cast<opcode>(raw_op), o.fin, payload.size());
  }
  out[0] = static_cast<std::uint8_t>(out[0] | (o.rsv << 4));
  std::copy(payload.begin(), payload.end(), out.begin() + static_cast<std::ptrdiff_t>(n));
  out.resize(n + payload.size());
  if (o.masked) apply_mask({out.data() + n, payload.size()}, o.mask, 0);
  return out;
}

bytes cat(std::initializer_list<bytes> parts) {
  bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string close_payload(std::uint16_t code, std::string_view reason = {}) {
  std::string s = {static_cast<char>(code >> 8), static_cast<char>(code & 0xFF)};
  return s.append(reason);
}

/// Records events as strings: "text:<message>", "binary:<message>", "ping:<payload>", ...
/// Data pieces are joined per message; `sequence_ok` checks first/last bracket each message.
struct recorder {
  std::vector<std::string> events;
  std::string message;
  bool in_message = false;
  bool sequence_ok = true;
  std::size_t calls = 0;
  std::size_t stop_at = 0;  // return false from this call (1-based); 0 = never

  bool on_data(opcode op, std::span<std::uint8_t> piece, bool first, bool last) noexcept {
    if (first == in_message || (op != opcode::text && op != opcode::binary)) sequence_ok = false;
    if (first) message = op == opcode::text ? "text:" : "binary:";
    in_message = !last;
    message.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    if (last) events.push_back(message);
    return ++calls != stop_at;
  }
  bool on_control(opcode op, std::span<std::uint8_t> payload) noexcept {
    const char* name = op == opcode::ping ? "ping:" : op == opcode::pong ? "pong:" : op == opcode::close ? "close:" : "?";
    events.push_back(name + std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    return ++calls != stop_at;
  }
};

struct run_result {
  parse_status status;
  close_code error;
  std::vector<std::string> events;
  bool sequence_ok;
  std::size_t leftover;  // unconsumed tail the caller still holds
};

/// Feeds `wire` in chunks ending at `cuts`, keeping the unconsumed tail like a real caller.
run_result run(const bytes& wire, const std::vector<std::size_t>& cuts, const ws_limits& limits) {
  ws_reader reader;
  recorder rec;
  bytes buf;
  std::size_t prev = 0;
  read_result last{parse_status::done, 0, close_code{}};
  for (std::size_t cut : cuts) {
    buf.insert(buf.end(), wire.begin() + static_cast<std::ptrdiff_t>(prev), wire.begin() + static_cast<std::ptrdiff_t>(cut));
    prev = cut;
    last = reader.consume(buf, limits, rec);
    if (last.status == parse_status::error) break;
    REQUIRE(last.consumed <= buf.size());
    if (last.status == parse_status::done) REQUIRE(last.consumed == buf.size());
    if (last.status == parse_status::need_more) {
      REQUIRE(last.consumed < buf.size());
      REQUIRE(buf.size() - last.consumed <= 131);  // a header or a whole control frame, never more
    }
    buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(last.consumed));
  }
  return {last.status, last.error, rec.events, rec.sequence_ok, buf.size()};
}

/// Runs every chunking (whole, every split, byte by byte; fewer for big inputs) and checks they
/// all agree. Returns the result of feeding it whole.
run_result run_all(const bytes& wire, const ws_limits& limits = {}) {
  std::vector<std::vector<std::size_t>> schemes;
  if (wire.size() <= 600) {
    schemes = chunkings(wire.size());
  } else {
    schemes.push_back({wire.size()});
    for (std::size_t step : {1000u, 4093u, 65536u}) {
      std::vector<std::size_t> cuts;
      for (std::size_t c = step; c < wire.size(); c += step) cuts.push_back(c);
      cuts.push_back(wire.size());
      schemes.push_back(cuts);
    }
  }
  const run_result whole = run(wire, schemes.front(), limits);
  CHECK(whole.sequence_ok);
  for (const auto& cuts : schemes) {
    const run_result r = run(wire, cuts, limits);
    // one summary per disagreeing scheme, not an expansion of (possibly 16 MiB) event lists
    if (r.status != whole.status || r.error != whole.error || r.events != whole.events || !r.sequence_ok)
      FAIL("feeding in " << cuts.size() << " pieces (first ends at " << cuts.front() << ") disagrees with whole: status "
                         << int(r.status) << " vs " << int(whole.status) << ", error " << int(r.error) << " vs "
                         << int(whole.error) << ", " << r.events.size() << " vs " << whole.events.size()
                         << " events, sequence_ok " << r.sequence_ok);
  }
  return whole;
}

using events = std::vector<std::string>;

void expect_events(const bytes& wire, const events& expected) {
  const run_result r = run_all(wire);
  CHECK(r.status == parse_status::done);
  CHECK(r.leftover == 0);
  const bool same = r.events == expected;  // no expansion of big payloads
  CHECK(same);
  if (!same && r.events.size() == expected.size())
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (r.events[i] != expected[i]) FAIL("event " << i << " differs: " << r.events[i].substr(0, 80));
}

void expect_error(const bytes& wire, close_code code, const ws_limits& limits = {}) {
  const run_result r = run_all(wire, limits);
  CHECK(r.status == parse_status::error);
  CHECK(r.error == code);
}

}  // namespace

TEST_CASE("reader: single frames", "[reader]") {
  expect_events(client_frame(op_text, "Hello"), {"text:Hello"});
  expect_events(client_frame(op_binary, std::string("\0\1\2\xFF", 4)), {std::string("binary:\0\1\2\xFF", 11)});
  expect_events(client_frame(op_text, ""), {"text:"});
  expect_events(client_frame(op_binary, ""), {"binary:"});
  expect_events(client_frame(op_ping, "are you there"), {"ping:are you there"});
  expect_events(client_frame(op_pong, ""), {"pong:"});
  expect_events(client_frame(op_close, ""), {"close:"});
  expect_events(client_frame(op_close, close_payload(1000, "bye")), {"close:" + close_payload(1000, "bye")});
  expect_events(client_frame(op_ping, std::string(125, 'p')), {"ping:" + std::string(125, 'p')});
}

TEST_CASE("reader: length forms around 125/126 and 65535/65536", "[reader]") {
  for (std::size_t len : {125u, 126u, 127u, 65535u, 65536u, 70001u}) {
    std::string payload(len, 'x');
    for (std::size_t i = 0; i < len; ++i) payload[i] = static_cast<char>('a' + i % 26);
    expect_events(client_frame(op_binary, payload), {"binary:" + payload});
  }
}

TEST_CASE("reader: several messages back to back in one buffer", "[reader]") {
  expect_events(cat({client_frame(op_text, "one"), client_frame(op_binary, "two"), client_frame(op_ping, "3"),
                     client_frame(op_text, "")}),
                {"text:one", "binary:two", "ping:3", "text:"});
}

TEST_CASE("reader: fragmentation", "[reader]") {
  SECTION("two fragments") {
    expect_events(cat({client_frame(op_text, "Hel", {.fin = false}), client_frame(op_cont, "lo")}), {"text:Hello"});
  }
  SECTION("many fragments, empty ones included, each with its own mask") {
    expect_events(cat({client_frame(op_binary, "", {.fin = false}), client_frame(op_cont, "ab", {.fin = false, .mask = {1, 2, 3, 4}}),
                       client_frame(op_cont, "", {.fin = false}), client_frame(op_cont, "cde", {.fin = false, .mask = {9, 8, 7, 6}}),
                       client_frame(op_cont, "")}),
                  {"binary:abcde"});
  }
  SECTION("control frames between fragments") {
    expect_events(cat({client_frame(op_text, "a", {.fin = false}), client_frame(op_ping, "p"),
                       client_frame(op_cont, "b", {.fin = false}), client_frame(op_pong, ""),
                       client_frame(op_close, close_payload(1001)), client_frame(op_cont, "c")}),
                  {"ping:p", "pong:", "close:" + close_payload(1001), "text:abc"});
  }
  SECTION("UTF-8 split across fragments") {
    expect_events(cat({client_frame(op_text, "\xE2", {.fin = false}), client_frame(op_cont, "\x82", {.fin = false}),
                       client_frame(op_cont, "\xAC!")}),
                  {"text:\xE2\x82\xAC!"});
  }
  SECTION("a new message after a fragmented one") {
    expect_events(cat({client_frame(op_text, "x", {.fin = false}), client_frame(op_cont, "y"), client_frame(op_binary, "z")}),
                  {"text:xy", "binary:z"});
  }
}

TEST_CASE("reader: state between calls", "[reader]") {
  ws_reader reader;
  recorder rec;
  const ws_limits limits;
  bytes wire = client_frame(op_text, "abcdef", {.fin = false});
  CHECK_FALSE(reader.in_message());
  // the header and two payload bytes: mid frame, in a message
  auto r = reader.consume({wire.data(), 8}, limits, rec);
  CHECK(r.status == parse_status::done);
  CHECK(r.consumed == 8);
  CHECK(reader.mid_frame());
  CHECK(reader.in_message());
  r = reader.consume({wire.data() + 8, wire.size() - 8}, limits, rec);
  CHECK(r.consumed == wire.size() - 8);
  CHECK_FALSE(reader.mid_frame());
  CHECK(reader.in_message());
  bytes last = client_frame(op_cont, "g");
  r = reader.consume(last, limits, rec);
  CHECK_FALSE(reader.in_message());
  CHECK(rec.events == events{"text:abcdefg"});
  // a partial header is left for the caller: consumed stops at its start
  bytes two = cat({client_frame(op_ping, "x"), client_frame(op_text, "hi")});
  r = reader.consume({two.data(), 7 + 3}, limits, rec);
  CHECK(r.status == parse_status::need_more);
  CHECK(r.consumed == 7);
  // a partial control frame too, even with its header complete
  r = reader.consume({two.data(), 5}, limits, rec);
  CHECK(r.status == parse_status::need_more);
  CHECK(r.consumed == 0);
  reader.reset();
  CHECK_FALSE(reader.in_message());
  CHECK_FALSE(reader.mid_frame());
}

TEST_CASE("reader: payload is unmasked in place", "[reader]") {
  struct where {
    const std::uint8_t* first = nullptr;
    bool on_data(opcode, std::span<std::uint8_t> piece, bool, bool) noexcept {
      first = piece.data();
      return true;
    }
    bool on_control(opcode, std::span<std::uint8_t>) noexcept { return true; }
  } handler;
  bytes wire = client_frame(op_binary, "payload");
  ws_reader reader;
  reader.consume(wire, {}, handler);
  CHECK(handler.first == wire.data() + 6);
  CHECK(std::string(wire.begin() + 6, wire.end()) == "payload");
}

TEST_CASE("reader: protocol errors close with 1002", "[reader]") {
  const close_code e = close_code::protocol_error;
  SECTION("unmasked client frame") { expect_error(client_frame(op_text, "hi", {.masked = false}), e); }
  SECTION("RSV bits without an extension") {
    for (std::uint8_t rsv : {1, 2, 3, 4, 7}) expect_error(client_frame(op_text, "hi", {.rsv = rsv}), e);
    expect_error(client_frame(op_ping, "", {.rsv = 4}), e);
  }
  SECTION("reserved opcodes") {
    for (std::uint8_t op : {3, 4, 5, 6, 7, 11, 12, 13, 14, 15}) expect_error(client_frame(op, "x"), e);
  }
  SECTION("control frame with fin=0") {
    for (std::uint8_t op : {op_ping, op_pong, op_close}) expect_error(client_frame(op, "", {.fin = false}), e);
  }
  SECTION("control frame over 125 bytes, known from the header alone") {
    const bytes wire = client_frame(op_ping, std::string(126, 'p'));
    expect_error(wire, e);
    expect_error(bytes(wire.begin(), wire.begin() + 8), e);
  }
  SECTION("control frame with a non-minimal length") {
    const bytes wire = {0x89, 0xFE, 0x00, 0x01, 0, 0, 0, 0, 'x'};
    expect_error(wire, e);
  }
  SECTION("continuation with no message in progress") {
    expect_error(client_frame(op_cont, "x"), e);
    expect_error(cat({client_frame(op_text, "done"), client_frame(op_cont, "x")}), e);
  }
  SECTION("new data message while a fragmented one is in progress") {
    expect_error(cat({client_frame(op_text, "a", {.fin = false}), client_frame(op_text, "b")}), e);
    expect_error(cat({client_frame(op_binary, "a", {.fin = false}), client_frame(op_binary, "b")}), e);
    expect_error(cat({client_frame(op_text, "a", {.fin = false}), client_frame(op_binary, "b")}), e);
  }
  SECTION("close payloads") {
    expect_error(client_frame(op_close, "x"), e);
    for (std::uint16_t code : {0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535})
      expect_error(client_frame(op_close, close_payload(code)), e);
  }
  SECTION("64-bit length with the top bit set") {
    const bytes wire = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    expect_error(wire, e);
  }
}

TEST_CASE("reader: invalid UTF-8 closes with 1007", "[reader]") {
  const close_code e = close_code::invalid_payload;
  SECTION("in a single frame") { expect_error(client_frame(op_text, "ok \xC0\xAF"), e); }
  SECTION("surrogate split across fragments") {
    expect_error(cat({client_frame(op_text, "\xED", {.fin = false}), client_frame(op_cont, "\xA0\x80")}), e);
  }
  SECTION("fail fast: before the message, even the frame, is complete") {
    const bytes wire = client_frame(op_text, std::string("ab\xFF") + std::string(200, 'c'), {.fin = false});
    expect_error(bytes(wire.begin(), wire.begin() + 8 + 4), e);  // header + "ab\xFF" + 1
    expect_error(cat({client_frame(op_text, "\xCE", {.fin = false}), client_frame(op_cont, "\xFF", {.fin = false})}), e);
  }
  SECTION("incomplete sequence at the end of the message") {
    expect_error(client_frame(op_text, "euro \xE2\x82"), e);
    expect_error(cat({client_frame(op_text, "\xF0\x9F", {.fin = false}), client_frame(op_cont, "")}), e);
  }
  SECTION("close reason") { expect_error(client_frame(op_close, close_payload(1000, "\xFF")), e); }
  SECTION("binary messages are not checked") {
    expect_events(client_frame(op_binary, "\xFF\xC0"), {"binary:\xFF\xC0"});
  }
}

TEST_CASE("reader: size limits close with 1009", "[reader]") {
  const ws_limits small{100, 150};
  SECTION("frame limit: exactly max is fine, max+1 fails at the header") {
    const run_result ok = run_all(client_frame(op_binary, std::string(100, 'a')), small);
    CHECK(ok.status == parse_status::done);
    CHECK(ok.events.size() == 1);
    const bytes big = client_frame(op_binary, std::string(101, 'a'));
    expect_error(big, close_code::too_big, small);
    expect_error(bytes(big.begin(), big.begin() + 6), close_code::too_big, small);  // header only
  }
  SECTION("message limit over fragments") {
    const run_result ok = run_all(cat({client_frame(op_text, std::string(100, 'a'), {.fin = false}),
                                       client_frame(op_ping, "control frames do not count"),
                                       client_frame(op_cont, std::string(50, 'b'))}),
                                  small);
    CHECK(ok.status == parse_status::done);
    CHECK(ok.events.size() == 2);
    expect_error(cat({client_frame(op_text, std::string(100, 'a'), {.fin = false}),
                      client_frame(op_cont, std::string(51, 'b'))}),
                 close_code::too_big, small);
    // the next message starts from zero again
    const run_result again = run_all(cat({client_frame(op_binary, std::string(100, 'a')),
                                          client_frame(op_binary, std::string(100, 'b'))}),
                                     small);
    CHECK(again.status == parse_status::done);
  }
  SECTION("the default 16 MiB accepts exactly 16 MiB, not one byte more") {
    const std::size_t mib16 = 16u << 20;
    const run_result ok = run_all(client_frame(op_binary, std::string(mib16, 'z')));
    CHECK(ok.status == parse_status::done);
    REQUIRE(ok.events.size() == 1);
    CHECK(ok.events[0].size() == 7 + mib16);
    CHECK(ok.events[0].find_first_not_of('z', 7) == std::string::npos);
    const run_result frag = run_all(cat({client_frame(op_text, std::string(mib16 / 2, 'a'), {.fin = false}),
                                         client_frame(op_cont, std::string(mib16 / 2, 'b'))}));
    CHECK(frag.status == parse_status::done);
    const bytes over = client_frame(op_binary, std::string(mib16 + 1, 'z'));
    expect_error(bytes(over.begin(), over.begin() + 14), close_code::too_big);
    expect_error(cat({client_frame(op_text, std::string(mib16 / 2, 'a'), {.fin = false}),
                      client_frame(op_cont, std::string(mib16 / 2 + 1, 'b'))}),
                 close_code::too_big);
  }
}

TEST_CASE("reader: a handler returning false stops right after its event", "[reader]") {
  const bytes wire = cat({client_frame(op_text, "ab", {.fin = false}), client_frame(op_ping, "p"),
                          client_frame(op_cont, "cd"), client_frame(op_binary, ""), client_frame(op_close, "")});
  const events all = {"ping:p", "text:abcd", "binary:", "close:"};
  // events in order: data "ab", ping, data "cd", data "", close
  const std::size_t boundaries[] = {8, 15, 23, 29, 35};
  for (std::size_t stop_at = 1; stop_at <= 5; ++stop_at) {
    ws_reader reader;
    recorder rec;
    rec.stop_at = stop_at;
    bytes buf = wire;
    read_result r = reader.consume(buf, {}, rec);
    CHECK(r.status == parse_status::done);
    CHECK(r.consumed == boundaries[stop_at - 1]);
    CHECK(rec.calls == stop_at);
    // the caller presents the rest again; everything arrives once, in order
    buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r.consumed));
    if (!buf.empty()) r = reader.consume(buf, {}, rec);
    CHECK(r.status == parse_status::done);
    CHECK(rec.events == all);
    CHECK(rec.sequence_ok);
  }
}

TEST_CASE("reader: frames after a close are still read unless the handler stops", "[reader]") {
  expect_events(cat({client_frame(op_close, ""), client_frame(op_text, "late")}), {"close:", "text:late"});
}

TEST_CASE("reader: with permessage-deflate, RSV1 marks a message's first frame as compressed and nothing else",
          "[reader][deflate]") {
  const ws_limits deflate{.deflate = true};
  const close_code e = close_code::protocol_error;
  /// Records each message as "<c|p><text|binary>:<bytes>" (c: compressed) from the five-argument call.
  struct told {
    std::vector<std::string> messages;
    std::string cur;
    bool on_data(opcode op, std::span<std::uint8_t> piece, bool first, bool last, bool compressed) noexcept {
      if (first) cur = std::string(compressed ? "c" : "p") + (op == opcode::text ? "text:" : "binary:");
      cur.append(reinterpret_cast<const char*>(piece.data()), piece.size());
      if (last) messages.push_back(cur);
      return true;
    }
    bool on_control(opcode, std::span<std::uint8_t>) noexcept { return true; }
  };
  auto read = [&](const bytes& wire) {
    bytes copy = wire;
    ws_reader reader;
    told h;
    const read_result r = reader.consume(copy, deflate, h);
    REQUIRE(r.status == parse_status::done);
    return h.messages;
  };

  SECTION("a compressed text message is not UTF-8 checked (its bytes are deflate data)") {
    const std::string not_utf8 = "\xf2\x48\xcd\xc9\xc9\x07\x00";
    CHECK(read(client_frame(op_text, not_utf8, {.rsv = 4})) == std::vector<std::string>{"ctext:" + not_utf8});
    CHECK(run_all(client_frame(op_text, not_utf8, {.rsv = 4}), deflate).status == parse_status::done);
    expect_error(client_frame(op_text, not_utf8), close_code::invalid_payload, deflate);  // a plain one still is
  }
  SECTION("fragmented: RSV1 on the first frame only, the flag holds for the whole message, then clears") {
    const bytes wire = cat({client_frame(op_binary, "ab", {.fin = false, .rsv = 4}), client_frame(op_cont, "cd", {.fin = false}),
                            client_frame(op_ping, "p"), client_frame(op_cont, "ef"), client_frame(op_text, "plain")});
    CHECK(read(wire) == std::vector<std::string>{"cbinary:abcdef", "ptext:plain"});
  }
  SECTION("a handler of four arguments reads compressed messages as their bytes") {
    const run_result r = run_all(client_frame(op_binary, "xyz", {.rsv = 4}), deflate);
    CHECK(r.status == parse_status::done);
    CHECK(r.events == std::vector<std::string>{"binary:xyz"});
  }
  SECTION("RSV1 on a continuation frame is a protocol error") {
    expect_error(cat({client_frame(op_text, "a", {.fin = false, .rsv = 4}), client_frame(op_cont, "b", {.rsv = 4})}), e, deflate);
    expect_error(cat({client_frame(op_text, "a", {.fin = false}), client_frame(op_cont, "b", {.rsv = 4})}), e, deflate);
  }
  SECTION("RSV1 on a control frame is a protocol error") {
    for (std::uint8_t op : {op_ping, op_pong, op_close}) expect_error(client_frame(op, "", {.rsv = 4}), e, deflate);
  }
  SECTION("RSV2 and RSV3 are never negotiated") {
    for (std::uint8_t rsv : {1, 2, 3, 5, 6, 7}) expect_error(client_frame(op_text, "hi", {.rsv = rsv}), e, deflate);
  }
  SECTION("without the extension RSV1 is a protocol error") {
    expect_error(client_frame(op_text, "hi", {.rsv = 4}), e);
  }
  SECTION("a compressed message may come over the limits by deflate's worst growth, no more") {
    const ws_limits small{.max_frame_bytes = 2048, .max_message_bytes = 2048, .deflate = true};
    const std::size_t slack = deflate_slack(2048);
    CHECK(slack == 192);
    CHECK(run_all(client_frame(op_binary, std::string(2048 + slack, 'z'), {.rsv = 4}), small).status == parse_status::done);
    expect_error(client_frame(op_binary, std::string(2048 + slack + 1, 'z'), {.rsv = 4}), close_code::too_big, small);
    expect_error(client_frame(op_binary, std::string(2049, 'z')), close_code::too_big, small);  // plain: none
    const bytes split = cat({client_frame(op_binary, std::string(2000, 'z'), {.fin = false, .rsv = 4}),
                             client_frame(op_cont, std::string(slack + 48, 'z'))});
    CHECK(run_all(split, small).status == parse_status::done);
    expect_error(cat({client_frame(op_binary, std::string(2000, 'z'), {.fin = false, .rsv = 4}),
                      client_frame(op_cont, std::string(slack + 49, 'z'))}),
                 close_code::too_big, small);
  }
  SECTION("a frame's slack is its own limit's, not the message's") {
    const ws_limits frames{.max_frame_bytes = 125, .max_message_bytes = 1 << 20, .deflate = true};
    CHECK(run_all(client_frame(op_binary, std::string(125 + deflate_slack(125), 'z'), {.rsv = 4}), frames).status ==
          parse_status::done);
    expect_error(client_frame(op_binary, std::string(126 + deflate_slack(125), 'z'), {.rsv = 4}), close_code::too_big,
                 frames);
  }
}
