#include "proto/sse.hpp"

#include <cstring>

namespace wspush::proto {

bool split_positions(std::string_view id, std::span<std::string_view> out) noexcept {
  if (out.empty()) return false;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::size_t comma = id.find(',');
    const bool last = k + 1 == out.size();
    if (last != (comma == std::string_view::npos)) return false;  // too few, or too many
    out[k] = last ? id : id.substr(0, comma);
    if (!is_position(out[k])) return false;
    if (!last) id.remove_prefix(comma + 1);
  }
  return true;
}

namespace {
int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::size_t percent_decode(std::string_view in, std::span<char> out) noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (n == out.size()) return SIZE_MAX;
    char c = in[i];
    if (c == '+') {
      c = ' ';
    } else if (c == '%') {
      const int hi = i + 2 < in.size() ? hex_value(in[i + 1]) : -1, lo = hi < 0 ? -1 : hex_value(in[i + 2]);
      if (lo < 0) return SIZE_MAX;
      c = char(hi * 16 + lo);
      i += 2;
    }
    out[n++] = c;
  }
  return n;
}

sse_message classify_message(std::string_view json) noexcept {
  sse_message m;
  std::string_view s = json;
  if (s.substr(0, 9) == R"({"topic":)") {
    s.remove_prefix(9);
    if (!detail::take_plain_string(s, m.topic) || s.substr(0, 6) != R"(,"id":)") return m;
    s.remove_prefix(6);
    if (!detail::take_plain_string(s, m.id)) return m;
    m.kind = sse_message::event;
  } else if (s.substr(0, 6) == R"({"op":)") {
    s.remove_prefix(6);
    if (!detail::take_plain_string(s, m.op) || m.op.empty()) return m;
    for (char c : m.op)
      if (c < 'a' || c > 'z') return m;  // an op name is a lowercase word
    m.kind = sse_message::reply;
  }
  return m;
}

namespace {
/// Line breaks of the data (CRLF counts once).
std::size_t line_breaks(std::string_view data) noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\r') {
      ++n;
      if (i + 1 < data.size() && data[i + 1] == '\n') ++i;
    } else if (data[i] == '\n') {
      ++n;
    }
  }
  return n;
}
}  // namespace

std::size_t sse_bound(std::string_view event, std::string_view id, std::string_view data) noexcept {
  return (event.empty() ? 0 : 8 + event.size()) + (id.empty() ? 0 : 5 + id.size()) +
         (line_breaks(data) + 1) * 7 + data.size() + 1;
}

std::size_t encode_sse(std::string_view event, std::string_view id, std::string_view data, std::span<char> out) noexcept {
  if (out.size() < sse_bound(event, id, data)) return 0;
  char* p = out.data();
  auto put = [&p](std::string_view s) {
    if (!s.empty()) std::memcpy(p, s.data(), s.size());  // an empty view may hold no pointer
    p += s.size();
  };
  if (!event.empty()) put("event: "), put(event), put("\n");
  if (!id.empty()) put("id: "), put(id), put("\n");
  std::size_t from = 0;
  for (std::size_t i = 0; i <= data.size(); ++i) {
    if (i < data.size() && data[i] != '\r' && data[i] != '\n') continue;
    put("data: "), put(data.substr(from, i - from)), put("\n");
    if (i + 1 < data.size() && data[i] == '\r' && data[i + 1] == '\n') ++i;
    from = i + 1;
  }
  put("\n");
  return std::size_t(p - out.data());
}

}  // namespace wspush::proto
