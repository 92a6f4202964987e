#include "proto/ws_deflate.hpp"

#include <zlib.h>

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

using namespace wspush::proto;

namespace {

deflate_offer offer(std::initializer_list<std::string_view> headers) {
  const std::vector<std::string_view> v(headers);
  return negotiate_deflate(v);
}

using bytes = std::vector<std::uint8_t>;

bytes of(std::string_view s) { return {s.begin(), s.end()}; }
std::string text(const bytes& b) { return {b.begin(), b.end()}; }

/// What a browser sends: raw deflate, sync-flushed, its trailing 00 00 ff ff taken off. A new
/// stream per message (client_no_context_takeover).
bytes browser_compress(std::string_view msg) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  bytes out(msg.size() + 64);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(msg.data()));
  z.avail_in = uInt(msg.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  REQUIRE(deflate(&z, Z_SYNC_FLUSH) == Z_OK);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  REQUIRE(out.size() >= 4);
  REQUIRE(bytes(out.end() - 4, out.end()) == bytes{0x00, 0x00, 0xff, 0xff});
  out.resize(out.size() - 4);
  return out;
}

/// Reads messages as Chromium's inflater does: one zlib stream kept across messages, fed each
/// payload and then 00 00 ff ff with Z_SYNC_FLUSH, reset whenever a final block ends the stream.
struct browser_inflater {
  z_stream z{};
  browser_inflater() { REQUIRE(inflateInit2(&z, -15) == Z_OK); }
  ~browser_inflater() { inflateEnd(&z); }
  std::string read(bytes payload) {
    payload.insert(payload.end(), {0x00, 0x00, 0xff, 0xff});
    std::string out;
    z.next_in = payload.data();
    z.avail_in = uInt(payload.size());
    while (z.avail_in > 0) {
      unsigned char buf[256];
      z.next_out = buf;
      z.avail_out = sizeof buf;
      const int r = inflate(&z, Z_SYNC_FLUSH);
      out.append(reinterpret_cast<char*>(buf), sizeof buf - z.avail_out);
      if (r == Z_STREAM_END) REQUIRE(inflateReset(&z) == Z_OK);
      else if (r == Z_BUF_ERROR && z.avail_out != 0) break;  // wants more input than there is
      else REQUIRE(r == Z_OK);
    }
    return out;
  }
};

struct inflated {
  inflate_status status;
  std::string message;
};

inflated server_inflate(const bytes& payload, std::size_t limit) {
  static message_inflater inflater;
  REQUIRE(inflater);
  bytes in = payload;
  in.resize(payload.size() + inflate_tail_room);
  bytes out(limit);
  std::size_t n = 99;
  const inflate_status st = inflater.inflate(in, payload.size(), out, n);
  out.resize(n);
  return {st, text(out)};
}

bytes server_deflate(std::string_view msg) {
  static message_deflater deflater;
  REQUIRE(deflater);
  bytes out(deflater.bound(msg.size()));
  const std::size_t n = deflater.deflate(of(msg), out);
  REQUIRE(n > 0);
  out.resize(n);
  return out;
}

}  // namespace

TEST_CASE("deflate: what browsers and libraries offer is accepted", "[deflate]") {
  CHECK(offer({"permessage-deflate; client_max_window_bits"}) == deflate_offer::accepted);  // Chromium, websockets, ws
  CHECK(offer({"permessage-deflate"}) == deflate_offer::accepted);                          // Firefox
  CHECK(offer({"permessage-deflate; client_no_context_takeover; server_no_context_takeover"}) ==
        deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=15; client_max_window_bits=15"}) ==
        deflate_offer::accepted);
  CHECK(offer({"PerMessage-Deflate; Client_Max_Window_Bits"}) == deflate_offer::accepted);
  CHECK(offer({"  permessage-deflate ;\tclient_max_window_bits = 12 , "}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=\"15\""}) == deflate_offer::accepted);
}

TEST_CASE("deflate: no offer of it", "[deflate]") {
  CHECK(offer({}) == deflate_offer::none);
  CHECK(offer({""}) == deflate_offer::none);
  CHECK(offer({" , ,"}) == deflate_offer::none);
  CHECK(offer({"x-webkit-deflate-frame"}) == deflate_offer::none);
  CHECK(offer({"foo; bar=baz; qux=\"a b\""}) == deflate_offer::none);
  CHECK(offer({"permessage-deflatex"}) == deflate_offer::none);
}

TEST_CASE("deflate: window bits", "[deflate]") {
  for (int bits = 8; bits <= 15; ++bits) {
    const std::string client = "permessage-deflate; client_max_window_bits=" + std::to_string(bits);
    CHECK(offer({client}) == deflate_offer::accepted);
    const std::string server = "permessage-deflate; server_max_window_bits=" + std::to_string(bits);
    // The shared frames are made with the full window: a smaller one cannot be honoured.
    CHECK(offer({server}) == (bits == 15 ? deflate_offer::accepted : deflate_offer::declined));
  }
  for (std::string_view bad : {"0", "7", "16", "015", "08", "1", "150", "-9", "9a", "\"1\\6\"", "\"\\1\\5\\ \""}) {
    const std::string client = "permessage-deflate; client_max_window_bits=" + std::string(bad);
    CHECK(offer({client}) == deflate_offer::declined);
    const std::string server = "permessage-deflate; server_max_window_bits=" + std::string(bad);
    CHECK(offer({server}) == deflate_offer::declined);
  }
  CHECK(offer({"permessage-deflate; server_max_window_bits"}) == deflate_offer::declined);  // a value is required
  // A quoted value counts as it reads unescaped (RFC 6455 §9.1).
  CHECK(offer({"permessage-deflate; server_max_window_bits=\"1\\5\""}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; client_max_window_bits=\"\\9\""}) == deflate_offer::accepted);
}

TEST_CASE("deflate: invalid parameters decline the offer", "[deflate]") {
  CHECK(offer({"permessage-deflate; server_no_context_takeover; server_no_context_takeover"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_no_context_takeover; client_no_context_takeover"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_max_window_bits; client_max_window_bits=10"}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; server_max_window_bits=15; server_max_window_bits=15"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; server_no_context_takeover=1"}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_no_context_takeover=\"\""}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; mystery"}) == deflate_offer::declined);
}

TEST_CASE("deflate: the first offer that can be taken is", "[deflate]") {
  CHECK(offer({"permessage-deflate; server_max_window_bits=10, permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"foo; bar, permessage-deflate; client_max_window_bits"}) == deflate_offer::accepted);
  CHECK(offer({"foo; a=\"x, permessage-deflate; y\""}) == deflate_offer::none);  // a comma inside a quoted value
  CHECK(offer({"foo; a=\"x, y\", permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=10, permessage-deflate; server_max_window_bits=9"}) ==
        deflate_offer::declined);
  // The header repeated: its values are one list.
  CHECK(offer({"foo", "permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=9", "permessage-deflate; client_no_context_takeover"}) ==
        deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; mystery", ""}) == deflate_offer::declined);
}

TEST_CASE("deflate: a list that does not parse takes nothing", "[deflate]") {
  for (std::string_view bad : {"permessage-deflate;", "permessage-deflate; =1", "permessage-deflate; a=",
                               "permessage-deflate; a=\"unterminated", "permessage-deflate x",
                               "; permessage-deflate", "permessage-deflate; a=\"x\\", "permessage-deflate; a=b c",
                               "permessage-deflate; a=\"\x01\"", "per message-deflate", "foo, ; bar",
                               "foo; a=\"x\", permessage-deflate;;"}) {
    INFO(bad);
    CHECK(offer({bad}) == deflate_offer::malformed);
  }
  // Up to the offer taken only: what follows it is not read.
  CHECK(offer({"permessage-deflate, foo;"}) == deflate_offer::accepted);
  CHECK(offer({"foo;", "permessage-deflate"}) == deflate_offer::malformed);
}

TEST_CASE("deflate: the answer names what the server keeps to", "[deflate]") {
  CHECK(deflate_response == "permessage-deflate; server_no_context_takeover; client_no_context_takeover");
}

TEST_CASE("deflate: a client's message inflates as RFC 7692 writes it", "[deflate][inflate]") {
  const std::string hello = "Hello";
  SECTION("the RFC's examples (§7.2.3.1, .3, .4)") {
    CHECK(server_inflate({0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00}, 100).message == hello);
    CHECK(server_inflate({0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00}, 100).message == hello);
    CHECK(server_inflate({0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00}, 100).message == hello);  // BFINAL, then a byte
  }
  SECTION("what a browser sends, short and long, and an empty message") {
    std::string json = R"({"op":"pub","topic":"mailbox:42","data":{"kind":"mail","from":"a@example.com"}})";
    std::string big;
    for (int k = 0; k < 2000; ++k) big += json;
    for (const std::string& m : {hello, json, big, std::string()}) {
      const inflated r = server_inflate(browser_compress(m), 1 << 20);
      CHECK(r.status == inflate_status::ok);
      CHECK(r.message == m);
    }
  }
  SECTION("exactly the limit is in, a byte more is too big") {
    const std::string m(5000, 'a');
    CHECK(server_inflate(browser_compress(m), 5000).status == inflate_status::ok);
    CHECK(server_inflate(browser_compress(m), 4999).status == inflate_status::too_big);
  }
  SECTION("a bomb: 16 MiB of zeros in a few KiB stops at the limit") {
    const bytes bomb = browser_compress(std::string(16u << 20, '\0'));
    CHECK(bomb.size() < 32 * 1024);
    const inflated r = server_inflate(bomb, 64 * 1024);
    CHECK(r.status == inflate_status::too_big);
    CHECK(r.message.size() <= 64 * 1024);
  }
  SECTION("data that is not deflate") {
    CHECK(server_inflate({0xff, 0xff, 0xff}, 100).status == inflate_status::bad_data);  // reserved block type
    CHECK(server_inflate({0x00, 0x05, 0x00, 0x00, 0x00, 'H'}, 100).status == inflate_status::bad_data);  // LEN, NLEN disagree
    CHECK(server_inflate({0xf2, 0x48}, 100).status == inflate_status::bad_data);  // cut short
  }
  SECTION("no room for the tail is refused, not overrun") {
    message_inflater inflater;
    bytes in = {0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00};
    bytes out(100);
    std::size_t n = 0;
    CHECK(inflater.inflate(in, in.size(), out, n) == inflate_status::bad_data);
  }
}

TEST_CASE("deflate: the server's compressed messages read back the way browsers read them", "[deflate][inflate]") {
  const std::vector<std::string> messages = {
      R"({"topic":"mailbox:42","id":"1700000000000-0","data":{"kind":"mail","from":"a@example.com","subject":"hi"}})",
      std::string(3000, 'x'), "", "Hello"};
  SECTION("one stream kept across messages, reset at each final block, as Chromium does") {
    browser_inflater chromium;
    for (int round = 0; round < 2; ++round)
      for (const std::string& m : messages) CHECK(chromium.read(server_deflate(m)) == m);
  }
  SECTION("and by the server's own inflater") {
    for (const std::string& m : messages) CHECK(server_inflate(server_deflate(m), 1 << 20).message == m);
  }
  SECTION("the last byte is the empty stored block's first (RFC 7692 §7.2.3.4)") {
    CHECK(server_deflate("Hello").back() == 0x00);
  }
  SECTION("too little room: 0, nothing claimed") {
    message_deflater d;
    bytes out(3);
    CHECK(d.deflate(of(messages[1]), out) == 0);
    CHECK(d.deflate(of("x"), {}) == 0);
  }
}

TEST_CASE("deflate: an offer taken with server_max_window_bits is answered with it (RFC 7692 §7.1.2.1)", "[deflate]") {
  auto window = [](std::initializer_list<std::string_view> headers) {
    const std::vector<std::string_view> v(headers);
    bool w = false;
    REQUIRE(negotiate_deflate(v, &w) == deflate_offer::accepted);
    return w;
  };
  CHECK(window({"permessage-deflate; server_max_window_bits=15"}));
  CHECK(window({"permessage-deflate; client_max_window_bits; server_max_window_bits=\"15\""}));
  CHECK_FALSE(window({"permessage-deflate; client_max_window_bits=9"}));
  CHECK_FALSE(window({"permessage-deflate"}));
  // The flag is the taken offer's, not a declined one's before it.
  CHECK_FALSE(window({"permessage-deflate; server_max_window_bits=10, permessage-deflate"}));
  CHECK(window({"permessage-deflate; server_max_window_bits=9", "permessage-deflate; server_max_window_bits=15"}));
  CHECK(deflate_response_window == std::string(deflate_response) + "; server_max_window_bits=15");
}
