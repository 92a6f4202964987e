#pragma once
/// \file http_upgrade.hpp
/// Incremental, zero-copy parser for the HTTP/1.1 request that opens a WebSocket (RFC 6455 §4.2.1).
///
/// Views into the caller's bytes, no header map, no copies, no allocation. It keeps what the
/// server needs (target, key, token, a few headers for logs) and checks the rest on the way.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace wspush::proto {

/// Views into the bytes given to upgrade_parser::parse: valid as long as those bytes are.
/// Only the fields up to what the outcome covers are set (e.g. `key` only for websocket).
struct upgrade_request {
  static constexpr std::size_t max_extension_headers = 4;

  std::string_view method, target, path, query, host, key, version, origin, protocol;
  std::string_view if_none_match;  // a plain GET's conditional (the first one)
  std::string_view last_event_id;  // an event stream's resume point (the first one)
  std::string_view authorization;  // the first Authorization header's value
  std::string_view token;  // `token` query parameter, else the `wspush_token` cookie; empty if neither
  /// The Sec-WebSocket-Extensions values in order (OWS trimmed), the first
  /// max_extension_headers of them; `extension_headers` counts them all, so more than that
  /// many (a list the server does not read whole) shows as a count above the array's size.
  std::array<std::string_view, max_extension_headers> extensions{};
  std::uint8_t extension_headers = 0;
};

enum class upgrade_outcome : std::uint8_t { need_more, websocket, plain_http, error };

struct upgrade_result {
  upgrade_outcome outcome;
  std::uint16_t status;     // error: the HTTP status to answer (400, 405, 426, 431, 505); websocket: 101; else 0
  std::uint32_t consumed;   // complete request: bytes up to and including the blank line; frame bytes may follow
  std::string_view reason;  // short human text for logs / the error body (static storage)
};

/// Parses one request head. Rules, strict on purpose (a WebSocket client is a browser or a
/// library, never a hand-typed request):
/// - request line `METHOD SP origin-form-target SP HTTP/1.x CRLF`; every line ends in CRLF
///   (bare LF, obs-fold, header names that are not tokens → 400; a control character other
///   than HTAB, or DEL, anywhere in the head → 400, a bare CR or a NUL in a header the upgrade
///   does not use included: one more vector compare per 16 bytes, in the pass that finds the
///   lines. The values of headers the upgrade does not use are not otherwise read);
/// - no end of the header block within max_request_bytes → 431 as soon as that is known;
/// - major version other than 1 → 505;
/// - no `Upgrade` header → plain_http (the server answers it itself; Host rules still apply);
/// - `Upgrade` without the `websocket` token → 400; non-GET → 405; HTTP/1.0 → 400; `Connection`
///   without `upgrade` → 400; Host missing or repeated → 400; `Sec-WebSocket-Version` not 13 →
///   426; `Sec-WebSocket-Key` missing, repeated or not base64 of 16 bytes → 400.
/// The `token` query value and cookie value are returned as on the wire (not percent-decoded;
/// a JWT needs no decoding), a cookie value without its surrounding quotes.
/// The value of the first `name=value` item of a query string (`a=1&heartbeat=1`), as on the
/// wire; empty if there is none (or it is empty).
std::string_view query_value(std::string_view query, std::string_view name) noexcept;

class upgrade_parser {
 public:
  explicit upgrade_parser(std::uint32_t max_request_bytes = 8192) noexcept : _max(max_request_bytes) {}

  /// `bytes` holds the whole request received so far, contiguous, growing between calls (the
  /// caller appends). Resumable at any byte boundary: it remembers how far it scanned for the
  /// end of the header block, so feeding a request one byte at a time is linear, not quadratic.
  /// Views in `out` point into `bytes`.
  upgrade_result parse(std::string_view bytes, upgrade_request& out) noexcept;

  /// Forget the scan position: call before parsing a different request.
  void reset() noexcept { _scanned = 0; }

  /// How many bytes the search for the end of the header block has covered.
  std::uint32_t scanned() const noexcept { return _scanned; }

 private:
  struct scan_result;
  scan_result find_end(std::string_view bytes, std::size_t limit) noexcept;

  std::uint32_t _scanned = 0;  // bytes known to hold no end of the header block (each LF after a CR)
  std::uint32_t _max;
};

}  // namespace wspush::proto
