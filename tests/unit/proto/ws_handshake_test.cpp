#include "proto/ws_handshake.hpp"

#include "proto/ws_deflate.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace wspush::proto;

namespace {

std::string accept_of(std::string_view key) {
  char out[accept_key_size];
  compute_accept_key(key, out);
  return {out, accept_key_size};
}

}  // namespace

TEST_CASE("handshake: accept key", "[handshake]") {
  CHECK(accept_of("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");  // RFC 6455 §1.3
  CHECK(accept_of("x3JJHMbDL1EzLkh9GBhXDw==") == "HSmrc0sMlYUkAGmm5OPpG2HaGWk=");
  CHECK(accept_of("AAAAAAAAAAAAAAAAAAAAAA==") == "ICX+Yqv66kxgM0FcWaLWlFLwTAI=");
  CHECK(accept_of("dGhlIHNhbXBsZSBub25jZA==") != accept_of("dGhlIHNhbXBsZSBub25jZQ=="));
}

TEST_CASE("handshake: 101 response", "[handshake]") {
  std::vector<char> out(512);
  const std::size_t n = encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", out);
  const std::string expected =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
  CHECK(std::string(out.data(), n) == expected);
  CHECK(n == switching_protocols_size);
  // exactly big enough works, one byte less writes nothing
  std::vector<char> exact(switching_protocols_size);
  CHECK(encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", exact) == switching_protocols_size);
  for (std::size_t size = 0; size < switching_protocols_size; ++size)
    CHECK(encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", std::span<char>(out.data(), size)) == 0);
}

TEST_CASE("handshake: 101 response with permessage-deflate fits the upgrade job's 288 bytes", "[handshake][deflate]") {
  std::vector<char> out(288);
  const std::size_t n = encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", out, deflate_response);
  const std::string expected =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
      "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n\r\n";
  CHECK(std::string(out.data(), n) == expected);
  CHECK(n == 231);
  CHECK(encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", std::span<char>(out.data(), n - 1), deflate_response) == 0);
  std::vector<char> job(288);  // upgrade_job::response
  CHECK(encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", job, deflate_response_window) == 258);
}

TEST_CASE("handshake: small HTTP responses", "[handshake]") {
  std::vector<char> out(512);
  SECTION("error with body") {
    const std::size_t n = encode_http_response(400, out, "bad request\n");
    CHECK(std::string(out.data(), n) ==
          "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\n"
          "bad request\n");
  }
  SECTION("426 names the version") {
    const std::size_t n = encode_http_response(426, out);
    CHECK(std::string(out.data(), n) ==
          "HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n"
          "Sec-WebSocket-Version: 13\r\n\r\n");
  }
  SECTION("extra headers verbatim") {
    const std::size_t n = encode_http_response(503, out, "busy", "Retry-After: 5\r\n");
    CHECK(std::string(out.data(), n) ==
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: close\r\n"
          "Retry-After: 5\r\n\r\nbusy");
  }
  SECTION("another content type") {
    const std::size_t n = encode_http_response_typed(200, "application/javascript", out, "x");
    CHECK(std::string(out.data(), n) ==
          "HTTP/1.1 200 OK\r\nContent-Type: application/javascript\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx");
  }
  SECTION("too small writes nothing, at every size") {
    const std::size_t full = encode_http_response(431, out, "too large", "X: y\r\n");
    REQUIRE(full > 0);
    for (std::size_t size = 0; size < full; ++size)
      CHECK(encode_http_response(431, std::span<char>(out.data(), size), "too large", "X: y\r\n") == 0);
    CHECK(encode_http_response(431, std::span<char>(out.data(), full), "too large", "X: y\r\n") == full);
  }
}

TEST_CASE("handshake: status reasons", "[handshake]") {
  CHECK(status_reason(400) == "Bad Request");
  CHECK(status_reason(401) == "Unauthorized");
  CHECK(status_reason(405) == "Method Not Allowed");
  CHECK(status_reason(426) == "Upgrade Required");
  CHECK(status_reason(431) == "Request Header Fields Too Large");
  CHECK(status_reason(503) == "Service Unavailable");
  CHECK(status_reason(505) == "HTTP Version Not Supported");
  CHECK(status_reason(299) == "Unknown");
}
