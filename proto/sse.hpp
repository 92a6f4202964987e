#pragma once
/// \file sse.hpp
/// Server-Sent Events (the WHATWG "server-sent events" format) for the pub/sub protocol: how a
/// stream's request names its topics and where it resumes, and how one server message becomes
/// an event on the stream. I/O-free, no allocation.
///
/// A stream of n topics has one position per topic, in the order the request named them; its
/// event id is those positions joined by `,` (`k3f9:18,k3f9:5`), so the `Last-Event-ID` a
/// browser sends back by itself resumes every topic. A position is empty (live from now) or a
/// history id: 1-64 bytes of visible ASCII other than `,`, `"` and `\`. A stream names at most
/// max_sse_topics topics, so an id is at most max_sse_id_bytes.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "proto/envelope.hpp"
#include "proto/topic.hpp"

namespace wspush::proto {

inline constexpr std::size_t max_sse_topics = 16;
inline constexpr std::size_t max_sse_id_bytes = max_sse_topics * (max_id_bytes + 1);

/// Whether `p` can be a position: empty, or 1..max_id_bytes bytes of visible ASCII but `,`,
/// `"` and `\` (the id's separator, and what a JSON string would need escaped).
constexpr bool is_position(std::string_view p) noexcept {
  if (p.size() > max_id_bytes) return false;
  for (char ch : p) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7F || c == ',' || c == '"' || c == '\\') return false;
  }
  return true;
}

/// Splits a stream id into exactly `out.size()` positions. False when the count differs or a
/// position is not one (is_position).
bool split_positions(std::string_view id, std::span<std::string_view> out) noexcept;

/// Percent-decodes a query value (`%3A` -> `:`; `+` is a space, as forms encode it) into
/// `out`. Returns the decoded size, or SIZE_MAX for a bad escape or too little room.
std::size_t percent_decode(std::string_view in, std::span<char> out) noexcept;

/// What a server message is on the stream.
struct sse_message {
  enum kind_t : std::uint8_t { event, reply, other } kind = other;  // reply: an `op` message
  std::string_view topic, id;  // event: `{"topic":"T","id":"I",...}`
  std::string_view op;         // op: `{"op":"NAME",...}`
};
/// Reads the head of a server message (the session's encoders write these shapes).
sse_message classify_message(std::string_view json) noexcept;

/// A `subbed` message's `lost` topics and `at` positions, called once per entry: f(topic, true,
/// {}) for a lost topic, f(topic, false, position) for a position. False when the message is
/// not in the shape encode_subbed writes.
template <class F>
bool for_each_subbed_entry(std::string_view json, F&& f) noexcept;

/// Room encode_sse needs for these fields.
std::size_t sse_bound(std::string_view event, std::string_view id, std::string_view data) noexcept;
/// One event: `event: E` (when given), `id: I` (when given), the data as `data:` lines (each
/// line break of the data, CR, LF or CRLF, starts another `data:` line: EventSource joins them
/// with LF), and the blank line that ends the event. Returns the bytes written, 0 if `out` is
/// too small.
std::size_t encode_sse(std::string_view event, std::string_view id, std::string_view data, std::span<char> out) noexcept;

// ---- template ---------------------------------------------------------------------------

namespace detail {
/// The string at the start of `s` (which must begin with `"`) up to the next `"`: topics and
/// positions need no escapes. Empty view with ok=false when there is no closing quote.
inline bool take_plain_string(std::string_view& s, std::string_view& out) noexcept {
  if (s.empty() || s.front() != '"') return false;
  const std::size_t end = s.find('"', 1);
  if (end == std::string_view::npos) return false;
  out = s.substr(1, end - 1);
  s.remove_prefix(end + 1);
  return true;
}
}  // namespace detail

template <class F>
bool for_each_subbed_entry(std::string_view json, F&& f) noexcept {
  const std::size_t lost_at = json.find("\"lost\":[");
  if (json.substr(0, 15) != R"({"op":"subbed",)" || lost_at == std::string_view::npos) return false;
  std::string_view s = json.substr(lost_at + 8);
  while (!s.empty() && s.front() != ']') {
    std::string_view t;
    if (!detail::take_plain_string(s, t)) return false;
    f(t, true, std::string_view{});
    if (!s.empty() && s.front() == ',') s.remove_prefix(1);
  }
  if (s.empty()) return false;
  s.remove_prefix(1);  // ]
  if (s.substr(0, 7) != R"(,"at":{)") return true;  // no positions
  s.remove_prefix(7);
  while (!s.empty() && s.front() != '}') {
    std::string_view t, p;
    if (!detail::take_plain_string(s, t) || s.empty() || s.front() != ':') return false;
    s.remove_prefix(1);
    if (!detail::take_plain_string(s, p)) return false;
    f(t, false, p);
    if (!s.empty() && s.front() == ',') s.remove_prefix(1);
  }
  return !s.empty();
}

}  // namespace wspush::proto
