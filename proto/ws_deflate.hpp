#pragma once
/// \file ws_deflate.hpp
/// permessage-deflate negotiation (RFC 7692 §5 and §7.1): which of a client's offers the server
/// takes, and the header value it answers with. It reads the request's views in place: no
/// allocation, no copy.
///
/// The server compresses an event once and shares the frame among every connection that
/// negotiated the extension. So it keeps no compression context between messages and uses the
/// full 32 KiB window: it always answers `server_no_context_takeover`, cannot take an offer that
/// limits its window (`server_max_window_bits` below 15), and asks for
/// `client_no_context_takeover` (RFC 7692 §7.1.1.2 lets it ask unasked), so that what a client
/// sends inflates with no state kept per connection. An offer it cannot take is passed over for
/// the next one; when none is taken the connection has no extension, and the upgrade goes on.

#include <cstdint>
#include <span>
#include <string_view>

namespace wspush::proto {

enum class deflate_offer : std::uint8_t {
  none,       // no permessage-deflate offer
  accepted,   // one was taken: answer with deflate_response
  declined,   // offered, but with parameters this server cannot honour or that are invalid
  malformed,  // the header does not parse as an extension list: no extension is taken
};

/// The offers in `values`, each the value of one Sec-WebSocket-Extensions header of the request
/// (the header may be repeated; its values are read as one list, in order). Takes the first
/// permessage-deflate offer whose parameters are valid (§7: each known at most once, window
/// bits 8 to 15 without a leading zero, a value as token or quoted-string) and honourable.
deflate_offer negotiate_deflate(std::span<const std::string_view> values) noexcept;

/// The Sec-WebSocket-Extensions value that accepts an offer (deflate_offer::accepted).
inline constexpr std::string_view deflate_response =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

}  // namespace wspush::proto
