#pragma once
/// \file ws_close.hpp
/// RFC 6455 close codes (§7.4) and the close frame payload: a 2-byte big-endian code and an
/// optional UTF-8 reason, 125 bytes at most in all.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace wspush::proto {

/// The codes wspush sends or has to recognise. 1005 and 1006 are never sent on the wire: they
/// name "no code in the close frame" and "closed without a close frame" in logs and APIs.
enum class close_code : std::uint16_t {
  normal = 1000,
  going_away = 1001,
  protocol_error = 1002,
  unsupported_data = 1003,
  no_status = 1005,
  abnormal = 1006,
  invalid_payload = 1007,
  policy_violation = 1008,
  too_big = 1009,
  mandatory_extension = 1010,
  internal_error = 1011,
  try_again_later = 1013,
  /// wspush's own (the application range): the user was revoked (POST /disconnect), sent with
  /// the reason "revoked". The client must not reconnect with the same token.
  revoked = 4403,
};

/// The reason wspush sends with `code` (empty for most).
constexpr std::string_view close_reason(close_code code) noexcept {
  return code == close_code::revoked ? std::string_view("revoked") : std::string_view{};
}

/// Longest close reason that fits in a control frame (125 - 2 bytes of code).
inline constexpr std::size_t max_close_reason_size = 123;

/// Codes a peer may put on the wire: 1000-1003, 1007-1014 (IANA registered, except 1015),
/// 3000-4999 (libraries and applications). 1004-1006 and 1015 are reserved, the rest unassigned.
constexpr bool is_valid_wire_close_code(std::uint16_t code) noexcept {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999);
}

/// A received close payload. `reason` points into the payload: valid as long as it is.
struct close_info {
  bool has_code;
  std::uint16_t code;
  std::string_view reason;
};

/// Result of parse_close_payload: `ok == false` → `error` is the code to close the connection with.
/// On success `error` is close_code{0}.
struct close_parse {
  close_code error;
  bool ok;
  close_info info;
};

/// Validates a received close payload: empty is fine (has_code=false); length 1 → protocol_error;
/// a code not valid on the wire → protocol_error; a reason that is not valid UTF-8 → invalid_payload.
close_parse parse_close_payload(std::span<const std::uint8_t> payload) noexcept;

/// Writes code (big endian) + reason into `out`; returns bytes written. The reason is cut to the
/// longest valid-UTF-8 prefix that fits both 123 bytes and `out` (so a multi-byte character is
/// never split, and invalid bytes never reach the wire). A code that may not appear on the wire
/// (1005, 1006, ...) writes an empty payload (0), which is how "no status" is sent. 0 as well
/// when `out` is shorter than 2 bytes.
std::size_t encode_close_payload(close_code code, std::string_view reason, std::span<std::uint8_t> out) noexcept;

}  // namespace wspush::proto
