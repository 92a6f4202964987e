#include "proto/http_upgrade.hpp"

#include <array>
#include <cstring>

namespace wspush::proto {
namespace {

// ---- character classes ----------------------------------------------------------------------

constexpr std::array<bool, 256> make_tchar() noexcept {
  std::array<bool, 256> t{};
  for (unsigned c = '0'; c <= '9'; ++c) t[c] = true;
  for (unsigned c = 'a'; c <= 'z'; ++c) t[c] = true;
  for (unsigned c = 'A'; c <= 'Z'; ++c) t[c] = true;
  for (unsigned char c : std::string_view("!#$%&'*+-.^_`|~")) t[c] = true;
  return t;
}
constexpr std::array<bool, 256> k_tchar = make_tchar();

constexpr std::array<bool, 256> make_base64() noexcept {
  std::array<bool, 256> t{};
  for (unsigned char c : std::string_view("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"))
    t[c] = true;
  return t;
}
constexpr std::array<bool, 256> k_base64 = make_base64();

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!k_tchar[c]) return false;
  return true;
}

constexpr std::uint64_t k_ones = 0x0101010101010101ull;
constexpr std::uint64_t k_highs = 0x8080808080808080ull;

/// True if no byte is a control character other than HTAB (field-content, RFC 9110 §5.5).
/// Eight bytes at a time: "some byte < 0x20" and "some byte == 0x7F" are exact word tests.
bool is_field_content(std::string_view s) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    const std::uint64_t del = w ^ (k_ones * 0x7F);
    const std::uint64_t suspect = ((w - k_ones * 0x20) & ~w) | ((del - k_ones) & ~del);
    if ((suspect & k_highs) == 0) continue;
    for (std::size_t j = i; j < i + 8; ++j) {
      const auto c = static_cast<unsigned char>(s[j]);
      if ((c < 0x20 && c != '\t') || c == 0x7F) return false;
    }
  }
  for (; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7F) return false;
  }
  return true;
}

/// ASCII case-insensitive equality; `lower` is already lower case.
bool iequals(std::string_view s, std::string_view lower) noexcept {
  if (s.size() != lower.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
    if (c != static_cast<unsigned char>(lower[i])) return false;
  }
  return true;
}

/// Header names are validated tokens by now, so folding with |0x20 maps only letters.
bool iequals_name(std::string_view name, std::string_view lower) noexcept {
  for (std::size_t i = 0; i < name.size(); ++i)
    if ((static_cast<unsigned char>(name[i]) | 0x20) != static_cast<unsigned char>(lower[i])) return false;
  return true;
}

constexpr bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

/// Splits `s` at the first `sep`: returns the part before, leaves the part after in `s`.
std::string_view next_item(std::string_view& s, char sep) noexcept {
  const std::size_t at = s.find(sep);
  const std::string_view item = s.substr(0, at);
  s = at == std::string_view::npos ? std::string_view{} : s.substr(at + 1);
  return item;
}

/// True if the comma-separated list `value` holds `token` (case-insensitive, OWS around items).
bool list_has_token(std::string_view value, std::string_view token) noexcept {
  while (!value.empty())
    if (iequals(trim_ows(next_item(value, ',')), token)) return true;
  return false;
}

/// Exactly base64 of 16 bytes, as an encoder writes it: 22 characters, the last carrying 2 bits
/// of data and 4 zero bits (so one of A, Q, g, w), then "==".
bool is_valid_key(std::string_view key) noexcept {
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') return false;
  for (std::size_t i = 0; i < 22; ++i)
    if (!k_base64[static_cast<unsigned char>(key[i])]) return false;
  const char last = key[21];
  return last == 'A' || last == 'Q' || last == 'g' || last == 'w';
}

// ---- token ----------------------------------------------------------------------------------

std::string_view query_token(std::string_view query) noexcept {
  while (!query.empty()) {
    std::string_view value = next_item(query, '&');
    const std::string_view key = next_item(value, '=');
    if (key == "token" && !value.empty()) return value;
  }
  return {};
}

std::string_view cookie_token(std::string_view cookies) noexcept {
  while (!cookies.empty()) {
    std::string_view value = trim_ows(next_item(cookies, ';'));
    if (trim_ows(next_item(value, '=')) != "wspush_token") continue;
    value = trim_ows(value);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    if (!value.empty()) return value;
  }
  return {};
}

// ---- request head ---------------------------------------------------------------------------

/// What the header lines told us beyond the views in upgrade_request.
struct header_facts {
  std::uint8_t host_count = 0;
  std::uint8_t key_count = 0;
  bool has_upgrade = false;
  bool upgrade_websocket = false;
  bool connection_upgrade = false;
  bool version_seen = false;
  bool version_bad = false;
  std::string_view cookie_token;
};

upgrade_result fail(std::uint16_t status, std::string_view reason) noexcept {
  return {upgrade_outcome::error, status, 0, reason};
}

constexpr upgrade_result k_ok{upgrade_outcome::need_more, 0, 0, {}};

/// `METHOD SP target SP HTTP/x.y` (CRLF already cut off).
upgrade_result parse_request_line(std::string_view line, upgrade_request& out) noexcept {
  std::string_view rest = line;
  out.method = next_item(rest, ' ');
  out.target = next_item(rest, ' ');
  out.version = rest;
  if (!is_token(out.method)) return fail(400, "malformed request line");
  if (out.target.empty() || out.target.front() != '/' || !is_field_content(out.target))
    return fail(400, "request target is not origin-form");
  const std::string_view v = out.version;
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' ||
      v[7] > '9')
    return fail(400, "malformed HTTP version");
  if (v[5] != '1') return fail(505, "HTTP version not supported");
  std::string_view query = out.target;
  out.path = next_item(query, '?');
  out.query = query;
  return k_ok;
}

/// Records one header the upgrade cares about; names are matched by length first.
void note_header(std::string_view name, std::string_view value, upgrade_request& out, header_facts& f) noexcept {
  switch (name.size()) {
    case 4:
      if (iequals_name(name, "host")) out.host = value, ++f.host_count;
      break;
    case 6:
      if (iequals_name(name, "origin")) {
        if (out.origin.empty()) out.origin = value;
      } else if (iequals_name(name, "cookie") && f.cookie_token.empty()) {
        f.cookie_token = cookie_token(value);
      }
      break;
    case 7:
      if (iequals_name(name, "upgrade"))
        f.has_upgrade = true, f.upgrade_websocket |= list_has_token(value, "websocket");
      break;
    case 10:
      if (iequals_name(name, "connection")) f.connection_upgrade |= list_has_token(value, "upgrade");
      break;
    case 17:
      if (iequals_name(name, "sec-websocket-key")) out.key = value, ++f.key_count;
      break;
    case 21:
      if (iequals_name(name, "sec-websocket-version")) f.version_seen = true, f.version_bad |= value != "13";
      break;
    case 22:
      if (iequals_name(name, "sec-websocket-protocol") && out.protocol.empty()) out.protocol = value;
      break;
  }
  // Counters saturate rather than wrap: 256 Host headers must still read as "repeated".
  if (f.host_count > 2) f.host_count = 2;
  if (f.key_count > 2) f.key_count = 2;
}

/// `name: OWS value OWS` (CRLF already cut off).
upgrade_result parse_header_line(std::string_view line, upgrade_request& out, header_facts& f) noexcept {
  if (is_ows(line.front())) return fail(400, "obsolete line folding");
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return fail(400, "header line without colon");
  const std::string_view name = line.substr(0, colon);
  if (!is_token(name)) return fail(400, "malformed header name");
  const std::string_view value = trim_ows(line.substr(colon + 1));
  if (!is_field_content(value)) return fail(400, "control character in header value");
  note_header(name, value, out, f);
  return k_ok;
}

/// The decision once every line is read. Order: what makes the request unusable as HTTP,
/// then what makes it unusable as an upgrade, the version check before the key (RFC 6455 §4.4).
upgrade_result decide(const upgrade_request& out, const header_facts& f, std::uint32_t consumed) noexcept {
  const bool http11 = out.version == "HTTP/1.1";
  if (f.host_count > 1) return fail(400, "repeated Host header");
  if (!f.has_upgrade) {
    if (http11 && f.host_count == 0) return fail(400, "missing Host header");
    return {upgrade_outcome::plain_http, 0, consumed, "plain HTTP request"};
  }
  if (!f.upgrade_websocket) return fail(400, "Upgrade is not websocket");
  if (out.method != "GET") return fail(405, "WebSocket upgrade needs GET");
  if (!http11) return fail(400, "WebSocket upgrade needs HTTP/1.1");
  if (!f.connection_upgrade) return fail(400, "Connection header lacks upgrade");
  if (f.host_count == 0) return fail(400, "missing Host header");
  if (!f.version_seen || f.version_bad) return fail(426, "Sec-WebSocket-Version must be 13");
  if (f.key_count == 0) return fail(400, "missing Sec-WebSocket-Key");
  if (f.key_count > 1) return fail(400, "repeated Sec-WebSocket-Key");
  if (!is_valid_key(out.key)) return fail(400, "malformed Sec-WebSocket-Key");
  return {upgrade_outcome::websocket, 101, consumed, "websocket upgrade"};
}

/// Line `[pos, lf)` without its CR; the block is known to be CRLF-terminated lines.
std::string_view line_at(std::string_view block, std::size_t pos, std::size_t& next) noexcept {
  const auto* lf = static_cast<const char*>(std::memchr(block.data() + pos, '\n', block.size() - pos));
  const auto end = static_cast<std::size_t>(lf - block.data());
  next = end + 1;
  return block.substr(pos, end - 1 - pos);
}

/// One pass over a complete head `block` (request line .. blank line).
upgrade_result parse_head(std::string_view block, upgrade_request& out) noexcept {
  std::size_t pos = 0;
  if (auto r = parse_request_line(line_at(block, 0, pos), out); r.outcome == upgrade_outcome::error) return r;
  header_facts facts;
  for (;;) {
    const std::string_view line = line_at(block, pos, pos);
    if (line.empty()) break;
    if (auto r = parse_header_line(line, out, facts); r.outcome == upgrade_outcome::error) return r;
  }
  upgrade_result r = decide(out, facts, static_cast<std::uint32_t>(block.size()));
  if (r.outcome == upgrade_outcome::error) return r;
  out.token = query_token(out.query);
  if (out.token.empty()) out.token = facts.cookie_token;
  return r;
}

/// Cheap early verdict on garbage (a TLS hello on the plain port, binary noise): the request
/// must start with a short token followed by a space.
bool plausible_method_prefix(std::string_view bytes) noexcept {
  constexpr std::size_t max_method = 24;
  const std::size_t n = bytes.size() < max_method ? bytes.size() : max_method;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == ' ') return i != 0;
    if (!k_tchar[c]) return false;
  }
  return n < max_method;
}

}  // namespace

struct upgrade_parser::scan_result {
  upgrade_result result;  // need_more or error when not found
  std::uint32_t end;      // found: bytes up to and including the blank line
  bool found;
};

upgrade_parser::scan_result upgrade_parser::find_end(std::string_view bytes) noexcept {
  if (_scanned == 0 && !plausible_method_prefix(bytes)) return {fail(400, "malformed request line"), 0, false};
  const char* p = bytes.data();
  const std::size_t limit = bytes.size() < _max ? bytes.size() : _max;
  std::size_t line = _scanned;
  while (line < limit) {
    const auto* lf = static_cast<const char*>(std::memchr(p + line, '\n', limit - line));
    if (lf == nullptr) break;
    const auto at = static_cast<std::size_t>(lf - p);
    if (at == 0 || p[at - 1] != '\r') return {fail(400, "bare LF in request"), 0, false};
    if (at == line + 1) {
      if (line == 0) return {fail(400, "empty request line"), 0, false};
      return {k_ok, static_cast<std::uint32_t>(at + 1), true};
    }
    line = at + 1;
  }
  _scanned = static_cast<std::uint32_t>(line);
  if (bytes.size() >= _max) return {fail(431, "request header fields too large"), 0, false};
  return {k_ok, 0, false};
}

upgrade_result upgrade_parser::parse(std::string_view bytes, upgrade_request& out) noexcept {
  const scan_result s = find_end(bytes);
  if (!s.found) return s.result;
  out = upgrade_request{};
  return parse_head(bytes.substr(0, s.end), out);
}

}  // namespace wspush::proto
