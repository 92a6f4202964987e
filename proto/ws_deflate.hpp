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

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

struct libdeflate_compressor;
struct libdeflate_decompressor;

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
/// With `server_window`, tells whether the offer taken named server_max_window_bits (=15): the
/// answer must then repeat it (§7.1.2.1), deflate_response_window.
deflate_offer negotiate_deflate(std::span<const std::string_view> values, bool* server_window = nullptr) noexcept;

/// The Sec-WebSocket-Extensions value that accepts an offer (deflate_offer::accepted).
inline constexpr std::string_view deflate_response =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
/// The same for an offer that named server_max_window_bits (only 15 is ever taken).
inline constexpr std::string_view deflate_response_window =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15";

/// Room a compressed message needs behind its bytes for message_inflater::inflate.
inline constexpr std::size_t inflate_tail_room = 9;

enum class inflate_status : std::uint8_t {
  ok,
  too_big,   // it inflates past the room given: the message is over the size limit (1009)
  bad_data,  // not a valid deflate stream (1007: the payload is not what its type says)
};

/// Inflates the messages of a client that takes no context over (client_no_context_takeover,
/// which the server always asks for): each message on its own, so one inflater serves every
/// connection of a thread. Not thread-safe; it keeps libdeflate's tables (about 11 KB).
class message_inflater {
 public:
  message_inflater() noexcept;
  ~message_inflater();
  message_inflater(const message_inflater&) = delete;
  message_inflater& operator=(const message_inflater&) = delete;
  explicit operator bool() const noexcept { return _d != nullptr; }  // false: out of memory

  /// `in` holds the message's payload (in_len bytes, as received, the sync flush's 00 00 ff ff
  /// taken off by the sender) followed by inflate_tail_room bytes this call writes over. Writes
  /// at most out.size() bytes: a message that inflates past that stops there (too_big), having
  /// cost no more work than that much output. A stream may end with a final block and bytes
  /// after it (RFC 7692 §7.2.3.4); those are ignored.
  inflate_status inflate(std::span<std::uint8_t> in, std::size_t in_len, std::span<std::uint8_t> out,
                         std::size_t& out_len) noexcept;

 private:
  libdeflate_decompressor* _d;
};

/// Compresses whole messages for permessage-deflate without context takeover (level 1: the
/// measured choice, docs/PERFORMANCE.md). Not thread-safe.
class message_deflater {
 public:
  message_deflater() noexcept;
  ~message_deflater();
  message_deflater(const message_deflater&) = delete;
  message_deflater& operator=(const message_deflater&) = delete;
  explicit operator bool() const noexcept { return _c != nullptr; }

  /// Most bytes deflate() writes for `n` bytes of input.
  std::size_t bound(std::size_t n) const noexcept;
  /// `in` as one message's compressed payload: the deflate stream ends with a final block, and
  /// an empty stored block is appended and its last four bytes taken off (RFC 7692 §7.2.1 and
  /// §7.2.3.4), which leaves one 0x00. Bytes written, 0 when `out` is too small.
  std::size_t deflate(std::span<const std::uint8_t> in, std::span<std::uint8_t> out) noexcept;

 private:
  libdeflate_compressor* _c;
};

}  // namespace wspush::proto
