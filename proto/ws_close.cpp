#include "proto/ws_close.hpp"

#include <algorithm>
#include <cstring>

#include "proto/utf8.hpp"

namespace wspush::proto {
namespace {

/// Length of the longest prefix of `s`, at most `limit` bytes, that is complete valid UTF-8.
std::size_t valid_utf8_prefix(std::string_view s, std::size_t limit) noexcept {
  const std::size_t n = std::min(s.size(), limit);
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  std::size_t boundary = 0;
  utf8_validator v;
  for (std::size_t i = 0; i < n; ++i) {
    if (!v.feed({p + i, 1})) break;
    if (v.complete()) boundary = i + 1;
  }
  return boundary;
}

}  // namespace

close_parse parse_close_payload(std::span<const std::uint8_t> payload) noexcept {
  close_parse r{close_code{0}, true, close_info{false, 0, {}}};
  if (payload.empty()) return r;
  if (payload.size() == 1) return {close_code::protocol_error, false, r.info};
  const auto code = static_cast<std::uint16_t>(payload[0] << 8 | payload[1]);
  if (!is_valid_wire_close_code(code)) return {close_code::protocol_error, false, r.info};
  const auto reason = payload.subspan(2);
  if (!is_valid_utf8(reason)) return {close_code::invalid_payload, false, r.info};
  r.info = {true, code, {reinterpret_cast<const char*>(reason.data()), reason.size()}};
  return r;
}

std::size_t encode_close_payload(close_code code, std::string_view reason, std::span<std::uint8_t> out) noexcept {
  const auto value = static_cast<std::uint16_t>(code);
  if (!is_valid_wire_close_code(value) || out.size() < 2) return 0;
  out[0] = static_cast<std::uint8_t>(value >> 8);
  out[1] = static_cast<std::uint8_t>(value & 0xFF);
  const std::size_t n = valid_utf8_prefix(reason, std::min(max_close_reason_size, out.size() - 2));
  if (n != 0) std::memcpy(out.data() + 2, reason.data(), n);
  return 2 + n;
}

}  // namespace wspush::proto
