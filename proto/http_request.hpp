#pragma once
/// \file http_request.hpp
/// Incremental, zero-copy parser for an HTTP/1.1 request with a body: the admin API's requests
/// (`POST /publish`, `GET /metrics`...). Views into the caller's bytes, a fixed header array
/// (picohttpparser's shape), no allocation.
///
/// Unlike upgrade_parser it keeps every header (the admin API is small and generic) and reads a
/// Content-Length body. It is not on a hot path: clarity over vector tricks.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proto/result.hpp"

namespace wspush::proto {

/// One header line: the name as sent (any case) and the value without its surrounding OWS.
struct http_header {
  std::string_view name, value;
};

/// Views into the bytes given to http_request_parser::parse: valid as long as those bytes are.
struct http_request {
  static constexpr std::size_t max_headers = 32;

  std::string_view method, target, path, query, version;
  std::string_view body;                // exactly Content-Length bytes (empty without one)
  std::array<http_header, max_headers> headers{};
  std::uint8_t header_count = 0;
  std::uint8_t minor_version = 1;       // HTTP/1.x
  bool keep_alive = true;               // 1.1 unless `Connection: close`; 1.0 only with `keep-alive`
  bool has_content_length = false;
  bool expect_continue = false;         // `Expect: 100-continue`
  std::uint64_t content_length = 0;

  /// The first header named `name` (ASCII case-insensitive), or an empty view.
  std::string_view header(std::string_view name) const noexcept;
};

/// The result of one parse call: `{status, consumed}` as every proto parser returns it.
struct http_request_result {
  parse_status status;
  std::uint16_t http_status;  // error: the status to answer (400, 413, 431, 501, 505); done: 0
  std::uint32_t consumed;     // done: head plus body; the next pipelined request starts here
  std::string_view reason;    // error: short human text for logs / the error body (static storage)
};

struct http_request_limits {
  std::uint32_t max_head_bytes = 8192;      // request line and headers, blank line included
  std::uint32_t max_body_bytes = 1u << 20;  // Content-Length above it → 413
};

/// Parses one request. Rules (strict: the admin API's clients are curl, scripts and libraries):
/// - optional empty lines (CRLF) before the request line are skipped (RFC 9112 §2.2);
/// - `METHOD SP origin-form-target SP HTTP/1.x CRLF`; every line ends in CRLF. Bare LF, obs-fold,
///   a header name that is not a token, a control character in a value (HTAB aside) → 400;
/// - no blank line within max_head_bytes, or more than http_request::max_headers headers → 431;
/// - major version other than 1 → 505; HTTP/1.1 without exactly one Host → 400;
/// - any `Transfer-Encoding` → 501: chunked bodies are not implemented, and a request with
///   both Transfer-Encoding and Content-Length is the classic smuggling vector. Clients send a
///   Content-Length (curl, requests, fetch all do for a known body). A request with neither has
///   no body (RFC 9112 §6.3): `has_content_length` lets the router answer 411 where it wants one;
/// - Content-Length not all digits, or repeated with different values → 400; above
///   max_body_bytes → 413, reported as soon as the head is complete, before any body byte.
/// After an error the connection cannot be resynchronised: answer and close.
class http_request_parser {
 public:
  explicit http_request_parser(http_request_limits limits = {}) noexcept : _limits(limits) {}

  /// `bytes` holds everything received so far for this request, contiguous, growing between
  /// calls (the caller appends; the buffer may move). Resumable at any byte boundary: the search
  /// for the end of the head resumes where it stopped; once the head is complete it is parsed
  /// again on each call (cheap, and it keeps every view pointing into the current `bytes`).
  /// Bytes past `consumed` belong to the next request.
  http_request_result parse(std::string_view bytes, http_request& out) noexcept;

  /// True once the head is complete and valid (the body may still be missing): the moment to
  /// answer `Expect: 100-continue`.
  bool head_complete() const noexcept { return _head_size != 0; }

  /// Forget everything: call before parsing the next request.
  void reset() noexcept {
    _scanned = 0;
    _head_size = 0;
  }

 private:
  http_request_limits _limits;
  std::uint32_t _scanned = 0;    // bytes known to hold no end of the head
  std::uint32_t _head_size = 0;  // head bytes (leading CRLFs and blank line included) once found
};

}  // namespace wspush::proto
