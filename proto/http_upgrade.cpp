#include "proto/http_upgrade.hpp"

#include <array>
#include <bit>
#include <cstring>

#include "proto/detail/http_grammar.hpp"
#include "proto/detail/http_scan.hpp"

// Shape: a resumable LF scan (find_end) for requests that arrive in pieces, and one walk over
// the head (walk_head) that parses each line as its LF is found, 64 bytes at a time. Line-level
// code reports a one-byte `fault`; only the top level builds an upgrade_result.

namespace wspush::proto {
namespace {

// ---- faults ---------------------------------------------------------------------------------

enum class fault : std::uint8_t {
  none,
  bare_lf,
  empty_request_line,
  request_line,
  target,
  version,
  version_unsupported,
  obs_fold,
  no_colon,
  header_name,
  control_char,
  repeated_host,
  missing_host,
  upgrade_not_websocket,
  not_get,
  not_http11,
  connection,
  ws_version,
  missing_key,
  repeated_key,
  bad_key,
  too_large,
};

struct fault_info {
  std::uint16_t status;
  std::string_view reason;
};

constexpr fault_info k_faults[] = {
    {0, ""},
    {400, "bare LF in request"},
    {400, "empty request line"},
    {400, "malformed request line"},
    {400, "request target is not origin-form"},
    {400, "malformed HTTP version"},
    {505, "HTTP version not supported"},
    {400, "obsolete line folding"},
    {400, "header line without colon"},
    {400, "malformed header name"},
    {400, "control character in header value"},
    {400, "repeated Host header"},
    {400, "missing Host header"},
    {400, "Upgrade is not websocket"},
    {405, "WebSocket upgrade needs GET"},
    {400, "WebSocket upgrade needs HTTP/1.1"},
    {400, "Connection header lacks upgrade"},
    {426, "Sec-WebSocket-Version must be 13"},
    {400, "missing Sec-WebSocket-Key"},
    {400, "repeated Sec-WebSocket-Key"},
    {400, "malformed Sec-WebSocket-Key"},
    {431, "request header fields too large"},
};
static_assert(std::size(k_faults) == static_cast<std::size_t>(fault::too_large) + 1);

upgrade_result fail(fault f) noexcept {
  const fault_info& i = k_faults[static_cast<std::size_t>(f)];
  return {upgrade_outcome::error, i.status, 0, i.reason};
}

constexpr upgrade_result k_need_more{upgrade_outcome::need_more, 0, 0, {}};

using detail::iequals;
using detail::is_ows;
using detail::is_target_chars;
using detail::slice;
using detail::trim_ows;

// ---- character classes (shared ones: detail/http_grammar.hpp) -------------------------------

inline bool is_token_slow(std::string_view s) noexcept { return detail::all_tchar(s); }

/// Non-empty and only tchar. `readable` bytes from s.data() may be read: with 16 of them, a
/// name of letters, digits and '-' (nearly every one) is checked with one vector compare.
bool is_token(std::string_view s, std::size_t readable) noexcept {
  if (s.empty()) return false;
  if (s.size() <= 16 && readable >= 16) {  // the usual case, in one step
    const std::uint32_t want = (std::uint32_t{1} << s.size()) - 1;
    return (detail::name_chars_mask16(s.data()) & want) == want || is_token_slow(s);
  }
  for (std::size_t i = 0; i < s.size(); i += 16) {
    const std::size_t len = s.size() - i < 16 ? s.size() - i : 16;
    if (i + 16 > readable) return is_token_slow(s.substr(i));
    const std::uint32_t want = len == 16 ? 0xFFFFu : (1u << len) - 1;
    if ((detail::name_chars_mask16(s.data() + i) & want) != want && !is_token_slow(s.substr(i, len))) return false;
  }
  return true;
}

/// `name` has lower's size (the caller switched on it). A name that matches is a token.
inline bool iequals_name(std::string_view name, std::string_view lower) noexcept {
  return detail::iequals_folded(name.data(), lower);
}

/// The same for "sec-websocket-*", whose dashes must be real ones (folding maps CR to '-').
inline bool iequals_sec_name(std::string_view name, std::string_view lower) noexcept {
  return detail::iequals_folded(name.data(), lower) && name[3] == '-' && name[13] == '-';
}

/// Index of the first `c` in `s`, or s.size() (16 bytes at a time: no memchr call per item).
inline std::size_t find_char(std::string_view s, char c) noexcept {
  return detail::find_byte(s.data(), 0, s.size(), s.size(), c);
}

/// Splits `s` at the first `sep`: returns the part before, leaves the part after in `s`.
std::string_view next_item(std::string_view& s, char sep) noexcept {
  const std::size_t at = find_char(s, sep);
  const std::string_view item = slice(s, 0, at);
  s = at == s.size() ? std::string_view{} : slice(s, at + 1, s.size() - at - 1);
  return item;
}

/// True if the comma-separated list `value` holds `token` (letters only, ≥ 4 of them; case-
/// insensitive, OWS around items).
bool list_has_token(std::string_view value, std::string_view token) noexcept {
  value = trim_ows(value);
  // The usual single item. Folding with |0x20 is exact against letters (see iequals_folded).
  if (value.size() == token.size()) return detail::iequals_folded(value.data(), token);
  while (!value.empty())
    if (iequals(trim_ows(next_item(value, ',')), token)) return true;
  return false;
}

/// Exactly base64 of 16 bytes, as an encoder writes it: 22 characters, the last carrying 2 bits
/// of data and 4 zero bits (so one of A, Q, g, w), then "==".
bool is_valid_key(std::string_view key) noexcept {
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') return false;
  // bytes 0-15 and 6-21, overlapping
  if ((detail::base64_chars_mask16(key.data()) & detail::base64_chars_mask16(key.data() + 6)) != 0xFFFF) return false;
  const char last = key[21];
  return last == 'A' || last == 'Q' || last == 'g' || last == 'w';
}

// ---- token ----------------------------------------------------------------------------------

std::string_view query_token(std::string_view query) noexcept { return query_value(query, "token"); }

/// `a=b; wspush_token=XYZ; c=d` → XYZ (without surrounding quotes). Items are compared in
/// place, not split: a browser's Cookie header can be long and hold many of them.
std::string_view cookie_token(std::string_view cookies) noexcept {
  constexpr std::string_view key = "wspush_token";
  while (!cookies.empty()) {
    cookies = trim_ows(cookies);
    const bool match = cookies.substr(0, key.size()) == key;
    std::string_view item = next_item(cookies, ';');
    if (!match) continue;
    item = trim_ows(item.substr(key.size()));
    if (item.empty() || item.front() != '=') continue;  // e.g. "wspush_token_old=1"
    item = trim_ows(item.substr(1));
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') item = item.substr(1, item.size() - 2);
    if (!item.empty()) return item;
  }
  return {};
}

// ---- request head ---------------------------------------------------------------------------

/// What the header lines told us beyond the views in upgrade_request.
struct header_facts {
  std::uint8_t host_count = 0;  // saturates at 2: "repeated" is all that matters
  std::uint8_t key_count = 0;   // likewise
  bool has_upgrade = false;
  bool upgrade_websocket = false;
  bool connection_upgrade = false;
  bool version_seen = false;
  bool version_bad = false;
  std::string_view cookie_token;
};

/// `METHOD SP target SP HTTP/x.y`: the request line is head[0, end) (CRLF cut off).
fault parse_request_line(std::string_view head, std::size_t end, upgrade_request& out) noexcept {
  const std::size_t sp = detail::find_byte(head.data(), 0, end, head.size(), ' ');
  // the shortest line left after the method: " / HTTP/1.1"
  if (sp + 11 > end || head[end - 9] != ' ') return fault::request_line;
  out.method = slice(head, 0, sp);
  out.target = slice(head, sp + 1, end - 9 - (sp + 1));
  out.version = slice(head, end - 8, 8);
  if (!is_token(out.method, head.size())) return fault::request_line;
  if (out.target.front() != '/' || !is_target_chars(out.target)) return fault::target;
  const std::string_view v = out.version;
  if (slice(v, 0, 5) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9')
    return fault::version;
  if (v[5] != '1') return fault::version_unsupported;
  const std::size_t q = find_char(out.target, '?');
  out.path = slice(out.target, 0, q);
  out.query = q == out.target.size() ? std::string_view{} : slice(out.target, q + 1, out.target.size() - q - 1);
  return fault::none;
}

/// Records one header the upgrade cares about; names are matched by length first. `raw` is the
/// value with its OWS: trimmed and checked only for the headers used. Returns false for a name
/// it does not know, which then still has to be checked to be a token.
bool note_header(std::string_view name, std::string_view raw, upgrade_request& out, header_facts& f) noexcept {
  switch (name.size()) {
    case 4:
      if (!iequals_name(name, "host")) return false;
      out.host = trim_ows(raw);
      f.host_count = f.host_count ? 2 : 1;
      return true;
    case 6:
      if (iequals_name(name, "origin")) {
        if (out.origin.empty()) out.origin = trim_ows(raw);
        return true;
      }
      if (!iequals_name(name, "cookie")) return false;
      if (f.cookie_token.empty()) f.cookie_token = trim_ows(cookie_token(raw));
      return true;
    case 7:
      if (!iequals_name(name, "upgrade")) return false;
      f.has_upgrade = true;
      f.upgrade_websocket |= list_has_token(raw, "websocket");
      return true;
    case 10:
      if (!iequals_name(name, "connection")) return false;
      f.connection_upgrade |= list_has_token(raw, "upgrade");
      return true;
    case 13:
      if (iequals_name(name, "if-none-match")) {
        if (out.if_none_match.empty()) out.if_none_match = trim_ows(raw);
        return true;
      }
      if (iequals_name(name, "last-event-id")) {
        if (out.last_event_id.empty()) out.last_event_id = trim_ows(raw);
        return true;
      }
      if (!iequals_name(name, "authorization")) return false;
      if (out.authorization.empty()) out.authorization = trim_ows(raw);
      return true;
    case 17:
      if (!iequals_sec_name(name, "sec-websocket-key")) return false;
      out.key = trim_ows(raw);  // checked to be base64 later
      f.key_count = f.key_count ? 2 : 1;
      return true;
    case 21:
      if (!iequals_sec_name(name, "sec-websocket-version")) return false;
      f.version_seen = true;
      f.version_bad |= trim_ows(raw) != "13";
      return true;
    case 22:
      if (!iequals_sec_name(name, "sec-websocket-protocol")) return false;
      if (out.protocol.empty()) out.protocol = trim_ows(raw);
      return true;
    case 24:
      if (!iequals_sec_name(name, "sec-websocket-extensions")) return false;
      if (out.extension_headers < out.extensions.size()) out.extensions[out.extension_headers] = trim_ows(raw);
      if (out.extension_headers <= out.extensions.size()) ++out.extension_headers;
      return true;
    default:
      return false;
  }
}

/// `name: OWS value OWS`: head[start, end) without its CRLF, `colon` its first colon (or end).
fault parse_header_line(std::string_view head, std::size_t start, std::size_t colon, std::size_t end,
                        upgrade_request& out, header_facts& f) noexcept {
  if (is_ows(head[start])) return fault::obs_fold;
  if (colon == end) return fault::no_colon;
  const std::string_view name = slice(head, start, colon - start);
  // A known name is a token by construction; any other one is checked. The values of headers
  // the upgrade does not use are not read at all (see the class comment).
  if (!note_header(name, slice(head, colon + 1, end - colon - 1), out, f) &&
      !is_token(name, head.size() - start))
    return fault::header_name;
  return fault::none;
}

/// The verdict once every line is read. Order: what makes the request unusable as HTTP, then
/// what makes it unusable as an upgrade, the version before the key (RFC 6455 §4.4).
fault decide(const upgrade_request& out, const header_facts& f) noexcept {
  const bool http11 = out.version == "HTTP/1.1";
  if (f.host_count > 1) return fault::repeated_host;
  if (!f.has_upgrade) return http11 && f.host_count == 0 ? fault::missing_host : fault::none;
  if (!f.upgrade_websocket) return fault::upgrade_not_websocket;
  if (out.method != "GET") return fault::not_get;
  if (!http11) return fault::not_http11;
  if (!f.connection_upgrade) return fault::connection;
  if (f.host_count == 0) return fault::missing_host;
  if (!f.version_seen || f.version_bad) return fault::ws_version;
  if (f.key_count == 0) return fault::missing_key;
  if (f.key_count > 1) return fault::repeated_key;
  if (!is_valid_key(out.key)) return fault::bad_key;
  return fault::none;
}

/// Result of walking the head: `found` once the blank line was reached.
struct walk_result {
  upgrade_result result;
  bool found;
};

/// What follows the blank line ending at `end`: the verdict, then the token.
upgrade_result finish_head(fault first, const header_facts& facts, std::size_t end, upgrade_request& out) noexcept {
  if (first == fault::none) first = decide(out, facts);
  if (first != fault::none) return fail(first);
  const auto consumed = static_cast<std::uint32_t>(end);
  out.token = query_token(out.query);
  if (out.token.empty()) out.token = facts.cookie_token;
  if (!facts.has_upgrade) return {upgrade_outcome::plain_http, 0, consumed, "plain HTTP request"};
  return {upgrade_outcome::websocket, 101, consumed, "websocket upgrade"};
}

/// One pass over bytes[0, limit), 64 bytes at a time: each line is parsed as soon as its LF
/// is found, up to the blank line. Structural faults (a LF without CR, an empty request line)
/// end the walk at once, as find_end reports them; the first fault inside a line is kept and
/// reported once the head is complete, so that the verdict never depends on how the request
/// was split between reads.
walk_result walk_head(std::string_view bytes, std::size_t limit, upgrade_request& out) noexcept {
  constexpr std::size_t npos = ~std::size_t{0};
  const char* p = bytes.data();
  header_facts facts;
  fault first = fault::none;
  std::size_t line = 0, colon = npos;  // start of the current line, its first colon once seen
  int line_ctl = 0;  // control bytes of the current line so far: a valid one ends with its CR LF and has no other
  for (std::size_t base = 0; base < limit; base += 64) {
    auto [lfs, colons, ctls] = detail::classify_lines(p, base, limit);
    for (; lfs != 0; lfs &= lfs - 1) {
      const int bit = std::countr_zero(lfs);
      const std::size_t at = base + static_cast<std::size_t>(bit);
      const std::uint64_t upto = lfs ^ (lfs - 1);  // bits up to and including this LF
      if (colon == npos && (colons & upto) != 0) colon = base + static_cast<std::size_t>(std::countr_zero(colons));
      colons &= ~upto;
      line_ctl += std::popcount(ctls & upto);
      ctls &= ~upto;
      if (at == 0 || p[at - 1] != '\r') return {fail(fault::bare_lf), false};
      // Every header is checked here, those the upgrade does not use too: a NUL or a bare CR
      // anywhere in the head is a 400, at the cost of one more compare per 16 bytes.
      if (line_ctl != 2 && first == fault::none) first = fault::control_char;
      line_ctl = 0;
      const std::size_t end = at - 1;  // the line is [line, end)
      if (end == line && line == 0) return {fail(fault::empty_request_line), false};
      if (end == line) return {finish_head(first, facts, at + 1, out), true};
      if (first == fault::none)
        first = line == 0 ? parse_request_line(bytes, end, out)
                          : parse_header_line(bytes, line, colon < end ? colon : end, end, out, facts);
      line = at + 1;
      colon = npos;
    }
    if (colon == npos && colons != 0) colon = base + static_cast<std::size_t>(std::countr_zero(colons));
    line_ctl += std::popcount(ctls);  // the start of a line the next block ends
  }
  return {k_need_more, false};
}


}  // namespace

std::string_view query_value(std::string_view query, std::string_view name) noexcept {
  while (!query.empty()) {
    const bool match = query.size() > name.size() && query.substr(0, name.size()) == name && query[name.size()] == '=';
    if (match) query.remove_prefix(name.size() + 1);
    const std::string_view item = next_item(query, '&');
    if (match && !item.empty()) return item;
  }
  return {};
}

struct upgrade_parser::scan_result {
  upgrade_result result;  // need_more or error when not found
  bool found;
};

upgrade_parser::scan_result upgrade_parser::find_end(std::string_view bytes, std::size_t limit) noexcept {
  const char* p = bytes.data();
  for (std::size_t pos = _scanned; pos < limit; pos += 64) {
    std::uint64_t lfs;
    if (pos + 64 <= limit) {
      lfs = detail::byte_mask64(p + pos, '\n');
    } else {
      char tail[64] = {};
      std::memcpy(tail, p + pos, limit - pos);
      lfs = detail::byte_mask64(tail, '\n');
    }
    for (; lfs != 0; lfs &= lfs - 1) {
      // Bytes before `at` may come from earlier calls: they are still in `bytes`.
      const std::size_t at = pos + static_cast<std::size_t>(std::countr_zero(lfs));
      if (at == 0 || p[at - 1] != '\r') return {fail(fault::bare_lf), false};
      if (at == 1) return {fail(fault::empty_request_line), false};
      if (at >= 3 && p[at - 2] == '\n') return {k_need_more, true};
    }
  }
  return {k_need_more, false};
}

upgrade_result upgrade_parser::parse(std::string_view bytes, upgrade_request& out) noexcept {
  // The method check looks at the first 24 bytes only, so it is done once they were seen.
  if (_scanned < 24 && !detail::plausible_request_start(bytes)) return fail(fault::request_line);
  const std::size_t limit = bytes.size() < _max ? bytes.size() : _max;
  // Resumed: an earlier walk found no blank line in bytes[0, _scanned). A plain LF scan of the
  // new bytes decides whether walking the whole head again is worth it (once, at the end). On
  // a first call there is nothing to skip: walk straight away.
  const scan_result s = _scanned != 0 ? find_end(bytes, limit) : scan_result{k_need_more, true};
  if (s.result.outcome == upgrade_outcome::error) return s.result;
  if (s.found) {
    out = upgrade_request{};
    const walk_result w = walk_head(bytes, limit, out);
    if (w.found || w.result.outcome == upgrade_outcome::error) return w.result;
  }
  _scanned = static_cast<std::uint32_t>(limit);
  if (bytes.size() >= _max) return fail(fault::too_large);
  return k_need_more;
}

}  // namespace wspush::proto
