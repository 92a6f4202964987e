#include "proto/http_upgrade.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "proto/ws_handshake.hpp"
#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::chunkings;

namespace {

const std::string chrome_request =
    "GET /ws?token=abc.def.ghi HTTP/1.1\r\n"
    "Host: localhost:8080\r\n"
    "Connection: Upgrade\r\n"
    "Pragma: no-cache\r\n"
    "Cache-Control: no-cache\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 "
    "Safari/537.36\r\n"
    "Upgrade: websocket\r\n"
    "Origin: http://localhost:8080\r\n"
    "Sec-WebSocket-Version: 13\r\n"
    "Accept-Encoding: gzip, deflate, br\r\n"
    "Accept-Language: en-US,en;q=0.9\r\n"
    "Cookie: theme=dark; wspush_token=cookie.tok.en\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    "\r\n";

const std::string firefox_request =
    "GET /ws HTTP/1.1\r\n"
    "Host: example.com\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0\r\n"
    "Accept: */*\r\n"
    "Accept-Language: en-US,en;q=0.5\r\n"
    "Accept-Encoding: gzip, deflate, br\r\n"
    "Sec-WebSocket-Version: 13\r\n"
    "Origin: https://example.com\r\n"
    "Sec-WebSocket-Protocol: wspush.v1\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate\r\n"
    "Sec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n"
    "DNT: 1\r\n"
    "Connection: keep-alive, Upgrade\r\n"
    "Cookie: a=b; wspush_token=\"quoted.tok\"\r\n"
    "Sec-Fetch-Dest: empty\r\n"
    "Sec-Fetch-Mode: websocket\r\n"
    "Sec-Fetch-Site: same-origin\r\n"
    "Pragma: no-cache\r\n"
    "Cache-Control: no-cache\r\n"
    "Upgrade: websocket\r\n"
    "\r\n";

struct parsed {
  upgrade_result result;
  upgrade_request req;
};

/// Feeds growing prefixes of `text` ending at `cuts` until the parser decides.
parsed parse_with(std::string_view text, const std::vector<std::size_t>& cuts, std::uint32_t max) {
  upgrade_parser parser(max);
  parsed p{};
  for (std::size_t cut : cuts) {
    p.result = parser.parse(text.substr(0, cut), p.req);
    if (p.result.outcome != upgrade_outcome::need_more) break;
  }
  return p;
}

bool same_fields(const upgrade_request& a, const upgrade_request& b) {
  return a.method == b.method && a.target == b.target && a.path == b.path && a.query == b.query &&
         a.host == b.host && a.key == b.key && a.version == b.version && a.origin == b.origin &&
         a.protocol == b.protocol && a.token == b.token && a.last_event_id == b.last_event_id &&
         a.authorization == b.authorization;
}

/// Whole, split at every byte, one byte at a time: all must agree. Returns the whole result.
parsed parse_all(std::string_view text, std::uint32_t max = 8192) {
  const auto schemes = chunkings(text.size());
  const parsed whole = parse_with(text, schemes.front(), max);
  for (const auto& cuts : schemes) {
    const parsed p = parse_with(text, cuts, max);
    if (p.result.outcome != whole.result.outcome || p.result.status != whole.result.status ||
        p.result.consumed != whole.result.consumed)
      FAIL("chunking with " << cuts.size() << " pieces, first at " << cuts.front() << " disagrees: "
                            << int(p.result.outcome) << "/" << p.result.status << " vs "
                            << int(whole.result.outcome) << "/" << whole.result.status);
    if (p.result.outcome == upgrade_outcome::websocket || p.result.outcome == upgrade_outcome::plain_http)
      CHECK(same_fields(p.req, whole.req));
  }
  return whole;
}

/// A minimal valid upgrade with `headers` in place of the defaults named in `drop`.
std::string upgrade_with(std::string_view extra, std::string_view drop = "") {
  std::string r = "GET /ws HTTP/1.1\r\n";
  const std::pair<std::string_view, std::string_view> defaults[] = {
      {"host", "Host: h\r\n"},
      {"upgrade", "Upgrade: websocket\r\n"},
      {"connection", "Connection: Upgrade\r\n"},
      {"key", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
      {"version", "Sec-WebSocket-Version: 13\r\n"},
  };
  for (const auto& [name, line] : defaults)
    if (drop.find(name) == std::string_view::npos) r += line;
  r += extra;
  return r + "\r\n";
}

void expect_error(std::string_view text, std::uint16_t status, std::uint32_t max = 8192) {
  INFO(text);
  const parsed p = parse_all(text, max);
  CHECK(p.result.outcome == upgrade_outcome::error);
  CHECK(p.result.status == status);
  CHECK_FALSE(p.result.reason.empty());
}

upgrade_request expect_websocket(std::string_view text) {
  INFO(text);
  const parsed p = parse_all(text);
  CHECK(p.result.outcome == upgrade_outcome::websocket);
  CHECK(p.result.status == 101);
  CHECK(p.result.consumed == text.size());
  return p.req;
}

/// A plain GET (an event stream's, say) of `target` with `headers`, parsed; `req` views `text`.
struct plain_get {
  std::string text;
  upgrade_request req;
  plain_get(std::string_view target, std::string_view headers)
      : text("GET " + std::string(target) + " HTTP/1.1\r\nHost: h\r\n" + std::string(headers) + "\r\n") {
    INFO(text);
    const parsed p = parse_all(text);
    CHECK(p.result.outcome == upgrade_outcome::plain_http);
    CHECK(p.result.consumed == text.size());
    req = p.req;
  }
  plain_get(const plain_get&) = delete;
};

}  // namespace

TEST_CASE("upgrade: Chrome-like request", "[upgrade]") {
  const upgrade_request r = expect_websocket(chrome_request);
  CHECK(r.method == "GET");
  CHECK(r.target == "/ws?token=abc.def.ghi");
  CHECK(r.path == "/ws");
  CHECK(r.query == "token=abc.def.ghi");
  CHECK(r.host == "localhost:8080");
  CHECK(r.key == "dGhlIHNhbXBsZSBub25jZQ==");
  CHECK(r.version == "HTTP/1.1");
  CHECK(r.origin == "http://localhost:8080");
  CHECK(r.protocol.empty());
  CHECK(r.token == "abc.def.ghi");  // the query wins over the cookie
  CHECK(r.extension_headers == 1);
  CHECK(r.extensions[0] == "permessage-deflate; client_max_window_bits");
  // views point into the input, nothing was copied
  CHECK(r.key.data() >= chrome_request.data());
  CHECK(r.key.data() + r.key.size() <= chrome_request.data() + chrome_request.size());
}

TEST_CASE("upgrade: Firefox-like request", "[upgrade]") {
  const upgrade_request r = expect_websocket(firefox_request);
  CHECK(r.path == "/ws");
  CHECK(r.query.empty());
  CHECK(r.host == "example.com");
  CHECK(r.key == "x3JJHMbDL1EzLkh9GBhXDw==");
  CHECK(r.origin == "https://example.com");
  CHECK(r.protocol == "wspush.v1");
  CHECK(r.token == "quoted.tok");  // from the cookie, without its quotes
  CHECK(r.extension_headers == 1);
  CHECK(r.extensions[0] == "permessage-deflate");
}

TEST_CASE("upgrade: Sec-WebSocket-Extensions kept in order, repeated or not", "[upgrade]") {
  const std::string head =
      "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  // The request's views point into the text parsed: each text lives as long as its views.
  const std::string bare = head + "\r\n";
  const upgrade_request none = expect_websocket(bare);
  CHECK(none.extension_headers == 0);
  const std::string with_two = head + "sec-websocket-extensions:  foo; a=1 \r\n"
                                      "SEC-WEBSOCKET-EXTENSIONS:permessage-deflate\r\n\r\n";
  const upgrade_request two = expect_websocket(with_two);
  CHECK(two.extension_headers == 2);
  CHECK(two.extensions[0] == "foo; a=1");
  CHECK(two.extensions[1] == "permessage-deflate");
  std::string many = head;
  for (int k = 0; k < 6; ++k) many += "Sec-WebSocket-Extensions: x" + std::to_string(k) + "\r\n";
  many += "\r\n";
  const upgrade_request more = expect_websocket(many);
  // More than it keeps: the count says so (one past the array), the first ones are kept.
  CHECK(more.extension_headers == upgrade_request::max_extension_headers + 1);
  CHECK(more.extensions[0] == "x0");
  CHECK(more.extensions[3] == "x3");
}

TEST_CASE("upgrade: RFC 6455 example request and its accept key", "[upgrade]") {
  const std::string rfc =
      "GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://example.com\r\n"
      "Sec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Version: 13\r\n\r\n";
  const upgrade_request r = expect_websocket(rfc);
  CHECK(r.protocol == "chat, superchat");
  char accept[accept_key_size];
  compute_accept_key(r.key, accept);
  CHECK(std::string_view(accept, accept_key_size) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

TEST_CASE("upgrade: header names in any case, values as comma lists", "[upgrade]") {
  expect_websocket("GET /ws HTTP/1.1\r\nHOST: h\r\nupgrade: WebSocket\r\nCONNECTION: UPGRADE\r\n"
                   "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nSEC-WEBSOCKET-VERSION: 13\r\n\r\n");
  for (std::string_view conn : {"keep-alive, Upgrade", "Upgrade,keep-alive", "  keep-alive ,\tupgrade  ",
                                "close, foo, UpGrAdE"}) {
    expect_websocket(upgrade_with("Connection: " + std::string(conn) + "\r\n", "connection"));
  }
  expect_websocket(upgrade_with("Upgrade: h2c, websocket\r\n", "upgrade"));
  expect_websocket(upgrade_with("Connection: keep-alive\r\nConnection: Upgrade\r\n", "connection"));
  expect_websocket(upgrade_with("Host:h\r\n", "host"));               // no OWS at all
  expect_websocket(upgrade_with("Host: \t h \t\r\n", "host"));        // OWS on both sides
  for (std::string_view conn : {"keep-alive", "upgraded", "up grade", ""})
    expect_error(upgrade_with("Connection: " + std::string(conn) + "\r\n", "connection"), 400);
  expect_error(upgrade_with("Upgrade: websockets\r\n", "upgrade"), 400);
  expect_error(upgrade_with("Upgrade: h2c\r\n", "upgrade"), 400);
}

TEST_CASE("upgrade: Sec-WebSocket-Key validation", "[upgrade]") {
  for (std::string_view key : {"AAAAAAAAAAAAAAAAAAAAAA==", "/////////////////////w==", "x3JJHMbDL1EzLkh9GBhXDw=="})
    CHECK(expect_websocket(upgrade_with("Sec-WebSocket-Key: " + std::string(key) + "\r\n", "key")).key == key);
  for (std::string_view key : {"", "dGhlIHNhbXBsZSBub25jZQ=", "dGhlIHNhbXBsZSBub25jZQ===", "dGhlIHNhbXBsZSBub25jZQ",
                               "dGhlIHNhbXBsZSBub25jZ*==", "dGhlIHNhbXBsZSBub25jZB==", "dGhlIHNhbXBsZSBub25j=Q==",
                               "ZGhlIHNhbXBsZSBub25jZQ", "the sample nonce 16bytes", "dGhlIHNhbXBsZSBub25j{Q==",
                               "dGhl[HNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25@ZQ==", "`GhlIHNhbXBsZSBub25jZQ==",
                               "dGhlIHNhbXBsZSBub25j:Q==", "dGhlIHNhbXBsZSBub-5jZQ=="}) {
    expect_error(upgrade_with("Sec-WebSocket-Key: " + std::string(key) + "\r\n", "key"), 400);
  }
  expect_error(upgrade_with("", "key"), 400);
  expect_error(upgrade_with("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"), 400);  // repeated
}

TEST_CASE("upgrade: version other than 13 → 426", "[upgrade]") {
  expect_error(upgrade_with("", "version"), 426);
  for (std::string_view v : {"8", "12", "13, 8", "14", "013", ""})
    expect_error(upgrade_with("Sec-WebSocket-Version: " + std::string(v) + "\r\n", "version"), 426);
  expect_error(upgrade_with("Sec-WebSocket-Version: 8\r\n"), 426);  // 13 and 8
  // the version is checked before the key: an old-draft client learns which version to speak
  expect_error(upgrade_with("Sec-WebSocket-Version: 8\r\n", "version key"), 426);
}

TEST_CASE("upgrade: Host, method and HTTP version", "[upgrade]") {
  expect_error(upgrade_with("", "host"), 400);
  expect_error(upgrade_with("Host: other\r\n"), 400);
  expect_error("POST /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
               405);
  expect_error("get /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n", 405);  // methods are case-sensitive
  expect_error("GET /ws HTTP/1.0\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
               400);
  expect_error("GET /ws HTTP/2.0\r\nHost: h\r\n\r\n", 505);
  expect_error("GET /ws HTTP/3.0\r\nHost: h\r\nUpgrade: websocket\r\n\r\n", 505);
}

TEST_CASE("upgrade: plain HTTP requests", "[upgrade]") {
  const std::string get = "GET /wspush.js?v=3 HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n";
  const parsed p = parse_all(get);
  CHECK(p.result.outcome == upgrade_outcome::plain_http);
  CHECK(p.result.status == 0);
  CHECK(p.result.consumed == get.size());
  CHECK(p.req.path == "/wspush.js");
  CHECK(p.req.query == "v=3");
  CHECK(p.req.host == "h");
  const std::string post_text = "POST /publish HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}";
  const parsed post = parse_all(post_text);
  CHECK(post.result.outcome == upgrade_outcome::plain_http);
  CHECK(post.req.method == "POST");
  CHECK(post.result.consumed == post_text.size() - 2);  // the body is the caller's
  CHECK(parse_all("GET / HTTP/1.0\r\n\r\n").result.outcome == upgrade_outcome::plain_http);  // 1.0 needs no Host
  expect_error("GET / HTTP/1.1\r\n\r\n", 400);                                               // 1.1 does
  expect_error("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
}

TEST_CASE("upgrade: frame bytes pipelined behind the request", "[upgrade]") {
  const std::string frame = "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58";
  const std::string text = chrome_request + frame;
  const parsed p = parse_all(text);
  CHECK(p.result.outcome == upgrade_outcome::websocket);
  CHECK(p.result.consumed == chrome_request.size());
  CHECK(text.substr(p.result.consumed) == frame);
  // a pipelined frame that happens to contain CRLFCRLF changes nothing
  const std::string tricky = firefox_request + "\r\n\r\nGET / HTTP/1.1\r\n\r\n";
  CHECK(parse_all(tricky).result.consumed == firefox_request.size());
}

TEST_CASE("upgrade: token from the query or the cookie", "[upgrade]") {
  auto token_of = [](std::string_view target, std::string_view cookie) {
    std::string r = "GET " + std::string(target) + " HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    if (!cookie.empty()) r += "Cookie: " + std::string(cookie) + "\r\n";
    r += "\r\n";
    return std::string(expect_websocket(r).token);
  };
  CHECK(token_of("/ws?token=q1", "") == "q1");
  CHECK(token_of("/ws?a=1&token=q2&b=2", "") == "q2");
  CHECK(token_of("/ws?a=1&token=q3", "wspush_token=c") == "q3");
  CHECK(token_of("/ws?xtoken=1&tokens=2", "") == "");
  CHECK(token_of("/ws?token=", "wspush_token=c4") == "c4");
  CHECK(token_of("/ws", "wspush_token=c5") == "c5");
  CHECK(token_of("/ws", "a=b; wspush_token=c6") == "c6");
  CHECK(token_of("/ws", "a=b;wspush_token=c7;z=1") == "c7");
  CHECK(token_of("/ws", "wspush_token_x=1; xwspush_token=2; wspush_token=c8") == "c8");
  CHECK(token_of("/ws", "wspush_token=\"c9\"") == "c9");
  CHECK(token_of("/ws", "other=1") == "");
  CHECK(token_of("/ws?", "") == "");
}

TEST_CASE("upgrade: malformed requests → 400", "[upgrade]") {
  const char* const bad[] = {
      "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  // a TLS ClientHello on the plain port
      "hello world\r\n\r\n",
      "GET\r\n\r\n",
      "GET /\r\n\r\n",
      " GET / HTTP/1.1\r\n\r\n",
      "GET  /ws HTTP/1.1\r\nHost: h\r\n\r\n",
      "GET /ws  HTTP/1.1\r\nHost: h\r\n\r\n",
      "GET /ws HTTP/1.1 \r\nHost: h\r\n\r\n",
      "GET /ws HTTP/1.1 extra\r\nHost: h\r\n\r\n",
      "GET /ws HTTP/1\r\nHost: h\r\n\r\n",
      "GET /ws HTTP/1.x\r\nHost: h\r\n\r\n",
      "GET /ws http/1.1\r\nHost: h\r\n\r\n",
      "GET http://h/ws HTTP/1.1\r\nHost: h\r\n\r\n",
      "GET * HTTP/1.1\r\nHost: h\r\n\r\n",
      "\r\n\r\n",
      "\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
      "GET / HTTP/1.1\n\n",
      "GET / HTTP/1.1\r\nHost: h\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n\n",
      "GET / HTTP/1.1\r\nHost h\r\n\r\n",
      "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
      "GET / HTTP/1.1\r\n: h\r\n\r\n",
      "GET / HTTP/1.1\r\nHo(st: h\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n\tfolded\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\rx\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\x01x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: 0123456789ab\x7f\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: ab\x7f" "cdefghijklmnop\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: abcdefghijklmnop\x1f" "abcdefgh\r\n\r\n",
      "GET /a\x01 HTTP/1.1\r\nHost: h\r\n\r\n",
      "VERYVERYVERYLONGMETHODNAME / HTTP/1.1\r\n\r\n",
  };
  for (const char* text : bad) expect_error(text, 400);
  // NUL bytes are not characters either
  expect_error(std::string("GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n", 29), 400);
  expect_error(std::string("GET /\0 HTTP/1.1\r\nHost: h\r\n\r\n", 28), 400);
}

TEST_CASE("upgrade: what is read strictly and what is skipped", "[upgrade]") {
  // Values the upgrade uses are checked for control characters...
  for (std::string_view header : {"Host: a\x01" "b\r\n", "Origin: http://a\x1b\r\n", "Sec-WebSocket-Protocol: p\x7f\r\n"}) {
    std::string text = upgrade_with(std::string(header), header.substr(0, 4) == "Host" ? "host" : "");
    expect_error(text, 400);
  }
  expect_error(upgrade_with("Cookie: wspush_token=a\x02" "b\r\n"), 400);
  // ...names always are, even when folding would make them look known (|0x20 maps CR to '-')
  expect_error(upgrade_with("Sec\rWebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "key"), 400);
  expect_error(upgrade_with("Sec-WebSocket\rVersion: 13\r\n", "version"), 400);
  expect_error(upgrade_with("X-Na me: v\r\n"), 400);
  expect_error(upgrade_with("X-\x80: v\r\n"), 400);
  // (and with the bad header first, so that the name is checked 16 bytes at a time)
  for (std::string_view bad : {"X-Na me: v\r\n", "X-\x80: v\r\n", "Bad@Name: v\r\n", "Host\t: h\r\n",
                               "A-Long-Header-Name-With,Comma: v\r\n", "X{Y: v\r\n", "X[Y: v\r\n", "X@Y: v\r\n",
                               "X/Y: v\r\n", "0123456789abcdef}: v\r\n"})
    expect_error(std::string(upgrade_with("")).insert(18, bad), 400);  // right after the request line
  // HTAB inside a used value is field-content, also in a long one
  CHECK(expect_websocket(upgrade_with("Origin: http://a.example\tcom\r\n")).origin == "http://a.example\tcom");
  // ...and so are the values of every other header, unread otherwise: a NUL, a bare CR, any
  // control byte but HTAB, or DEL anywhere in the head is a 400 (found in the pass that finds lines)
  for (std::string header : {std::string("X-Trace: a\x01" "b\r\n"), std::string("X-Trace: a\0b\r\n", 14),
                             std::string("X-Trace: a\rb\r\n"), std::string("X-Trace: \x7f\r\n"),
                             std::string("X-Trace: a\r\r\n"), std::string("X-Long: ") + std::string(100, 'v') + "\x1b\r\n"})
    for (bool first : {false, true})  // last header, and first (right after the request line)
      expect_error(first ? std::string(upgrade_with("")).insert(18, header) : upgrade_with(header), 400);
  // HTAB and bytes over 0x7F (obs-text) are field content
  CHECK(expect_websocket(upgrade_with("X-Trace: a\tb\xc3\xa9" "c\r\n")).host == "h");
  // unusual but valid token characters in names go through the slow path
  expect_websocket(upgrade_with("X_Odd.Name!#$%&'*+^`|~: v\r\nA-Very-Long-Header-Name-Beyond-Sixteen: v\r\n"));
}

TEST_CASE("upgrade: the header block limit → 431", "[upgrade]") {
  const std::uint32_t max = 200;
  std::string exact = upgrade_with("X-Pad: \r\n");
  exact.insert(exact.size() - 4, std::string(max - exact.size(), 'p'));
  REQUIRE(exact.size() == max);
  CHECK(parse_all(exact, max).result.outcome == upgrade_outcome::websocket);
  std::string over = exact;
  over.insert(over.size() - 4, "p");
  expect_error(over, 431, max);
  // known as soon as max bytes without the end have arrived, not only at the end
  std::string endless = "GET /ws HTTP/1.1\r\nX-Pad: " + std::string(1000, 'p');
  upgrade_parser parser(max);
  upgrade_request req{};
  CHECK(parser.parse(std::string_view(endless).substr(0, max - 1), req).outcome == upgrade_outcome::need_more);
  const upgrade_result r = parser.parse(std::string_view(endless).substr(0, max), req);
  CHECK(r.outcome == upgrade_outcome::error);
  CHECK(r.status == 431);
  // the default limit is 8 KiB
  std::string big = upgrade_with("X-Pad: " + std::string(8200, 'p') + "\r\n");
  upgrade_parser def;
  CHECK(def.parse(big, req).status == 431);
}

TEST_CASE("upgrade: resumable scan, reset", "[upgrade]") {
  upgrade_parser parser;
  upgrade_request req{};
  const std::string_view text = chrome_request;
  // cut in the middle of the third line: what was scanned is not scanned again
  const std::size_t line3 = text.find("Connection");
  CHECK(parser.parse(text.substr(0, line3 + 5), req).outcome == upgrade_outcome::need_more);
  CHECK(parser.scanned() == line3 + 5);
  CHECK(parser.parse(text.substr(0, line3 + 9), req).outcome == upgrade_outcome::need_more);
  CHECK(parser.scanned() == line3 + 9);
  CHECK(parser.parse(text, req).outcome == upgrade_outcome::websocket);
  parser.reset();
  CHECK(parser.scanned() == 0);
  CHECK(parser.parse(firefox_request, req).outcome == upgrade_outcome::websocket);
  CHECK(req.host == "example.com");
}

TEST_CASE("upgrade: Last-Event-ID and Authorization, the first of each", "[upgrade]") {
  const plain_get both("/sse?topics=a,b", "Last-Event-ID: k3f9:18,k3f9:5\r\nAuthorization: Bearer abc.def.ghi\r\n");
  CHECK(both.req.last_event_id == "k3f9:18,k3f9:5");
  CHECK(both.req.authorization == "Bearer abc.def.ghi");
  const plain_get neither("/sse", "Accept: text/event-stream\r\n");
  CHECK(neither.req.last_event_id.empty());
  CHECK(neither.req.authorization.empty());
  // names in any case
  for (std::string_view name : {"last-event-id", "LAST-EVENT-ID", "Last-Event-Id", "lAST-eVENT-iD"})
    CHECK(plain_get("/sse", std::string(name) + ": k3f9:18\r\n").req.last_event_id == "k3f9:18");
  for (std::string_view name : {"authorization", "AUTHORIZATION", "Authorization", "aUTHORIZATION"})
    CHECK(plain_get("/sse", std::string(name) + ": Bearer t\r\n").req.authorization == "Bearer t");
  // OWS around the value trimmed, inside it kept
  const plain_get ows("/sse", "Last-Event-ID: \t k3f9:18 \t\r\nAuthorization:Bearer \t t  \r\n");
  CHECK(ows.req.last_event_id == "k3f9:18");
  CHECK(ows.req.authorization == "Bearer \t t");
  CHECK(plain_get("/sse", "Last-Event-ID:k3f9:18\r\n").req.last_event_id == "k3f9:18");
  // the first one wins
  const plain_get twice("/sse", "Last-Event-ID: first\r\nAuthorization: Bearer one\r\nlast-event-id: second\r\n"
                                "authorization: Bearer two\r\n");
  CHECK(twice.req.last_event_id == "first");
  CHECK(twice.req.authorization == "Bearer one");
  // neither is mistaken for another name of 13 letters
  const plain_get etag("/sse", "If-None-Match: \"v1\"\r\nLast-Event-ID: k3f9:18\r\n");
  CHECK(etag.req.if_none_match == "\"v1\"");
  CHECK(etag.req.last_event_id == "k3f9:18");
  CHECK(etag.req.authorization.empty());
  const plain_get misspelt("/sse", "Last-Event-IX: k3f9:18\r\nAuthorisation: Bearer t\r\n");
  CHECK(misspelt.req.last_event_id.empty());
  CHECK(misspelt.req.authorization.empty());
  // an upgrade takes them too
  const std::string upgrade = upgrade_with("Authorization: Bearer t\r\nLast-Event-ID: 7\r\n");
  const upgrade_request ws = expect_websocket(upgrade);
  CHECK(ws.authorization == "Bearer t");
  CHECK(ws.last_event_id == "7");
  // used values: control characters refused
  expect_error("GET /sse HTTP/1.1\r\nHost: h\r\nLast-Event-ID: a\x01" "b\r\n\r\n", 400);
  expect_error("GET /sse HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer \x7f\r\n\r\n", 400);
}

TEST_CASE("upgrade: a plain GET gets its token from the query or the cookie", "[upgrade]") {
  CHECK(plain_get("/sse?topics=a&token=q1", "").req.token == "q1");
  CHECK(plain_get("/sse?token=q2&topics=a", "Cookie: wspush_token=c\r\n").req.token == "q2");
  CHECK(plain_get("/sse?topics=a", "Cookie: theme=dark; wspush_token=c3\r\n").req.token == "c3");
  CHECK(plain_get("/sse?token=", "Cookie: wspush_token=\"c4\"\r\n").req.token == "c4");
  CHECK(plain_get("/sse?topics=a", "").req.token.empty());
  CHECK(plain_get("/sse?topics=a", "Cookie: other=1\r\n").req.token.empty());
  // the Authorization header is left to the server (its scheme is read there)
  CHECK(plain_get("/sse?topics=a", "Authorization: Bearer b5\r\n").req.token.empty());
  // HTTP/1.0, without Host, alike
  const std::string http10 = "GET /sse?token=q6 HTTP/1.0\r\n\r\n";
  const parsed p = parse_all(http10);
  CHECK(p.result.outcome == upgrade_outcome::plain_http);
  CHECK(p.req.token == "q6");
}
