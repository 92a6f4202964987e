#include "proto/http_request.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::chunkings;

namespace {

struct parsed {
  http_request_result result;
  http_request req;
  bool head_complete_before_done = false;  // head_complete() seen while the body was missing
};

/// Feeds growing prefixes of `text` ending at `cuts` until the parser decides.
parsed parse_with(std::string_view text, const std::vector<std::size_t>& cuts, http_request_limits limits) {
  http_request_parser parser(limits);
  parsed p{};
  for (std::size_t cut : cuts) {
    p.result = parser.parse(text.substr(0, cut), p.req);
    if (p.result.status != parse_status::need_more) break;
    p.head_complete_before_done |= parser.head_complete();
  }
  return p;
}

bool same_fields(const http_request& a, const http_request& b) {
  if (a.method != b.method || a.target != b.target || a.path != b.path || a.query != b.query ||
      a.version != b.version || a.body != b.body || a.header_count != b.header_count || a.keep_alive != b.keep_alive ||
      a.content_length != b.content_length || a.expect_continue != b.expect_continue)
    return false;
  for (std::size_t i = 0; i < a.header_count; ++i)
    if (a.headers[i].name != b.headers[i].name || a.headers[i].value != b.headers[i].value) return false;
  return true;
}

/// Whole, split at every byte, one byte at a time: all must agree. Returns the whole result.
parsed parse_all(std::string_view text, http_request_limits limits = {}) {
  const auto schemes = chunkings(text.size());
  const parsed whole = parse_with(text, schemes.front(), limits);
  for (const auto& cuts : schemes) {
    const parsed p = parse_with(text, cuts, limits);
    if (p.result.status != whole.result.status || p.result.http_status != whole.result.http_status ||
        p.result.consumed != whole.result.consumed)
      FAIL("chunking with " << cuts.size() << " pieces, first at " << cuts.front() << " disagrees: "
                            << int(p.result.status) << "/" << p.result.http_status << " vs "
                            << int(whole.result.status) << "/" << whole.result.http_status);
    if (p.result.status == parse_status::done) CHECK(same_fields(p.req, whole.req));
  }
  return whole;
}

/// Expects a complete request of `consumed` bytes (npos: all of `text`).
http_request expect_done(std::string_view text, std::size_t consumed = std::string_view::npos,
                         http_request_limits limits = {}) {
  INFO(text);
  if (consumed == std::string_view::npos) consumed = text.size();
  const parsed p = parse_all(text, limits);
  REQUIRE(p.result.status == parse_status::done);
  CHECK(p.result.consumed == consumed);
  CHECK(p.result.http_status == 0);
  return p.req;
}

void expect_error(std::string_view text, std::uint16_t status, http_request_limits limits = {}) {
  INFO(text);
  const parsed p = parse_all(text, limits);
  CHECK(p.result.status == parse_status::error);
  CHECK(p.result.http_status == status);
  CHECK_FALSE(p.result.reason.empty());
}

void expect_need_more(std::string_view text, http_request_limits limits = {}) {
  INFO(text);
  CHECK(parse_all(text, limits).result.status == parse_status::need_more);
}

std::string post(std::string_view path, std::string_view body, std::string_view extra = "") {
  return "POST " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1:8081\r\n" + std::string(extra) +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

}  // namespace

TEST_CASE("http request: curl-like POST with a JSON body", "[http_request]") {
  const std::string body = R"({"topic":"mailbox:42","data":{"subject":"hi"}})";
  const std::string text = post("/publish?x=1", body,
                                "User-Agent: curl/7.88.1\r\nAccept: */*\r\nAuthorization: Bearer  s3cret \r\n"
                                "Content-Type: application/json\r\n");
  const http_request r = expect_done(text, text.size());
  CHECK(r.method == "POST");
  CHECK(r.target == "/publish?x=1");
  CHECK(r.path == "/publish");
  CHECK(r.query == "x=1");
  CHECK(r.version == "HTTP/1.1");
  CHECK(r.minor_version == 1);
  CHECK(r.body == body);
  CHECK(r.keep_alive);
  CHECK(r.has_content_length);
  CHECK(r.content_length == body.size());
  CHECK(r.header_count == 6);
  CHECK(r.header("authorization") == "Bearer  s3cret");  // OWS trimmed at the ends only
  CHECK(r.header("CONTENT-TYPE") == "application/json");
  CHECK(r.header("x-missing").empty());
  CHECK(r.headers[0].name == "Host");
  // views point into the input
  CHECK(r.body.data() >= text.data());
  CHECK(r.body.data() + r.body.size() == text.data() + text.size());
}

TEST_CASE("http request: GET without a body, keep-alive rules", "[http_request]") {
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n";
  http_request r = expect_done(get, get.size());
  CHECK(r.body.empty());
  CHECK_FALSE(r.has_content_length);
  CHECK(r.keep_alive);
  CHECK_FALSE(expect_done("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").keep_alive);
  CHECK_FALSE(expect_done("GET / HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").keep_alive);
  // HTTP/1.0: no Host needed, closed unless keep-alive is asked for
  CHECK_FALSE(expect_done("GET / HTTP/1.0\r\n\r\n").keep_alive);
  r = expect_done("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  CHECK(r.keep_alive);
  CHECK(r.minor_version == 0);
}

TEST_CASE("http request: pipelined requests, bytes past the body are left alone", "[http_request]") {
  const std::string first = post("/publish", "{}");
  const std::string second = "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n";
  const std::string both = first + second;
  const http_request r = expect_done(both, first.size());
  CHECK(r.body == "{}");
  http_request_parser p;
  http_request req;
  auto res = p.parse(both, req);
  REQUIRE(res.status == parse_status::done);
  p.reset();
  res = p.parse(std::string_view(both).substr(res.consumed), req);
  CHECK(res.status == parse_status::done);
  CHECK(req.path == "/healthz");
}

TEST_CASE("http request: empty lines before the request line are skipped", "[http_request]") {
  const std::string text = "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
  CHECK(expect_done(text, text.size()).path == "/");
  expect_need_more("\r\n\r");
  expect_error("\r\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
  expect_error("\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

TEST_CASE("http request: incomplete inputs ask for more", "[http_request]") {
  expect_need_more("");
  expect_need_more("POST /publish HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12345");
  expect_need_more("GET / HTTP/1.1\r\nHost: h\r\n");
  expect_need_more("GET / HTTP/1.1\r\nHost: h\r\n\r");
}

TEST_CASE("http request: head_complete and Expect: 100-continue", "[http_request]") {
  const std::string text = post("/publish", "0123456789", "Expect: 100-continue\r\n");
  const parsed p = parse_all(text);
  REQUIRE(p.result.status == parse_status::done);
  CHECK(p.req.expect_continue);
  // fed in pieces, the head is known complete before the body arrives
  const parsed split = parse_with(text, {text.size() - 10, text.size()}, {});
  CHECK(split.head_complete_before_done);
  http_request_parser parser;
  http_request req;
  CHECK(parser.parse(std::string_view(text).substr(0, 20), req).status == parse_status::need_more);
  CHECK_FALSE(parser.head_complete());
}

TEST_CASE("http request: malformed request lines", "[http_request]") {
  for (std::string_view bad : {"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", "GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
                               "GET /\r\nHost: h\r\n\r\n", "GET / HTTP/1.1\r\n\r\n" /* no Host */,
                               "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n",
                               "GET / HTTX/1.1\r\nHost: h\r\n\r\n", "GET / HTTP/1.x\r\nHost: h\r\n\r\n",
                               "GET /a\x01 HTTP/1.1\r\nHost: h\r\n\r\n", "GET / HTTP/1.1\nHost: h\r\n\r\n",
                               "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", " GET / HTTP/1.1\r\n\r\n"}) {
    expect_error(bad, 400);
  }
  expect_error("GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505);
  expect_error("GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505);
}

TEST_CASE("http request: malformed header lines", "[http_request]") {
  for (std::string_view bad : {"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", "GET / HTTP/1.1\r\nHost h\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\r\nBad Name: v\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\r\nX: a\x01z\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fz\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\nX: v\r\n\r\n",
                               "GET / HTTP/1.1\r\nHost: h\r\nHost: g\r\n\r\n"}) {
    expect_error(bad, 400);
  }
  // HTAB is allowed inside a value; a value may be empty
  const http_request r = expect_done("GET / HTTP/1.1\r\nHost: h\r\nX:\ta\tb\t\r\nY:\r\n\r\n");
  CHECK(r.header("x") == "a\tb");
  CHECK(r.header("y").empty());
  CHECK(r.header_count == 3);
}

TEST_CASE("http request: Content-Length and Transfer-Encoding", "[http_request]") {
  for (std::string_view bad : {"Content-Length: -1\r\n", "Content-Length: 1a\r\n", "Content-Length:\r\n",
                               "Content-Length: 2, 2\r\n", "Content-Length: 2\r\nContent-Length: 3\r\n",
                               "Content-Length: +2\r\n"}) {
    expect_error("POST /p HTTP/1.1\r\nHost: h\r\n" + std::string(bad) + "\r\nab", 400);
  }
  // the same length twice is harmless
  expect_done("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab");
  expect_error("POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 501);
  expect_error("POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nab", 501);
}

TEST_CASE("http request: limits give 413 and 431 without waiting for the rest", "[http_request]") {
  const http_request_limits limits{256, 100};
  // 413 as soon as the head is complete, with no body byte received
  expect_error("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\n\r\n", 413, limits);
  expect_error("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, limits);
  expect_done(post("/p", std::string(100, 'x')), std::string_view::npos, limits);
  // 431: a head that does not end within the limit, whole or fed a byte at a time
  const std::string big = "GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(300, 'a') + "\r\n\r\n";
  expect_error(big, 431, limits);
  expect_error(big.substr(0, 256), 431, limits);
  expect_need_more(big.substr(0, 255), limits);
  // too many header lines
  std::string many = "GET / HTTP/1.1\r\nHost: h\r\n";
  for (std::size_t i = 0; i < http_request::max_headers; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  expect_error(many + "\r\n", 431);
}

TEST_CASE("http request: every prefix of garbage is either need_more or 400", "[http_request]") {
  const std::string garbage[] = {std::string("\0\0\0\0", 4), "\xff\xfe\xfd", "GET\x01/ HTTP/1.1\r\n",
                                 std::string(40, 'A'), "POST /p HTTP/1.1\r\n\r\n\r\n\r\n"};
  for (const std::string& g : garbage) {
    INFO(g);
    const parsed p = parse_all(g);
    CHECK(p.result.status != parse_status::done);
    if (p.result.status == parse_status::error) CHECK(p.result.http_status == 400);
  }
}
