#include "proto/http_request.hpp"

#include "proto/detail/http_grammar.hpp"

// Shape: a resumable byte scan finds the end of the head (and rejects a bare LF or garbage at
// once, so a hostile client cannot keep us waiting for a blank line that never comes); the
// complete head is then parsed line by line in one go, and the body is a length check.

namespace wspush::proto {
namespace {

constexpr http_request_result k_need_more{parse_status::need_more, 0, 0, {}};

constexpr http_request_result fail(std::uint16_t status, std::string_view reason) noexcept {
  return {parse_status::error, status, 0, reason};
}

using detail::iequals;
using detail::is_field_value;
using detail::is_token;
using detail::slice;
using detail::trim_ows;

/// origin-form: starts with '/', no control character, space or DEL.
inline bool is_target(std::string_view s) noexcept { return detail::is_origin_form(s); }

/// True if the comma-separated list `value` holds `token` (case-insensitive, OWS around items).
bool list_has(std::string_view value, std::string_view token) noexcept {
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    if (iequals(trim_ows(value.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

/// Bytes of leading empty lines (CRLF pairs); `need_more` set when a lone CR ends the input.
/// A CR followed by anything but LF, or a bare LF, is left for the scan to reject.
std::size_t leading_empty_lines(std::string_view b, bool& need_more) noexcept {
  std::size_t at = 0;
  while (at < b.size() && b[at] == '\r') {
    if (at + 1 == b.size()) {
      need_more = true;
      return at;
    }
    if (b[at + 1] != '\n') return at;
    at += 2;
  }
  return at;
}


// ---- the head -------------------------------------------------------------------------------

/// What the header lines told us beyond the views.
struct head_facts {
  std::uint8_t host_count = 0;
  bool connection_close = false;
  bool connection_keep_alive = false;
  bool transfer_encoding = false;
  bool bad_length = false;
};

/// `METHOD SP target SP HTTP/x.y` without its CRLF.
http_request_result parse_request_line(std::string_view line, http_request& out) noexcept {
  const std::size_t sp = line.find(' ');
  // the shortest line left after the method: " / HTTP/1.1"
  if (sp == std::string_view::npos || sp + 11 > line.size() || line[line.size() - 9] != ' ')
    return fail(400, "malformed request line");
  out.method = slice(line, 0, sp);
  out.target = slice(line, sp + 1, line.size() - 9 - (sp + 1));
  out.version = slice(line, line.size() - 8, 8);
  if (!is_token(out.method)) return fail(400, "malformed request line");
  if (!is_target(out.target)) return fail(400, "request target is not origin-form");
  const std::string_view v = out.version;
  if (v.substr(0, 5) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9')
    return fail(400, "malformed HTTP version");
  if (v[5] != '1') return fail(505, "HTTP version not supported");
  out.minor_version = static_cast<std::uint8_t>(v[7] - '0');
  const std::size_t q = out.target.find('?');
  out.path = out.target.substr(0, q);
  out.query = q == std::string_view::npos ? std::string_view{} : out.target.substr(q + 1);
  return k_need_more;  // "no fault"
}

/// Content-Length: digits only; a value past 2^53 is as good as infinite (it is over any limit).
bool parse_length(std::string_view v, std::uint64_t& n) noexcept {
  if (v.empty()) return false;
  n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    if (n < (std::uint64_t{1} << 53)) n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return true;
}

/// Notes the headers the parser itself acts on. `name` is a token, `value` trimmed.
void note_header(std::string_view name, std::string_view value, http_request& out, head_facts& f) noexcept {
  // Only names of these lengths matter: 4, 6, 10, 14, 17. Most headers are rejected here.
  const std::size_t n = name.size();
  if (n != 4 && n != 6 && n != 10 && n != 14 && n != 17) return;
  if (iequals(name, "host")) {
    f.host_count = f.host_count ? 2 : 1;
  } else if (iequals(name, "content-length")) {
    std::uint64_t n = 0;
    if (!parse_length(value, n) || (out.has_content_length && n != out.content_length)) f.bad_length = true;
    out.content_length = n;
    out.has_content_length = true;
  } else if (iequals(name, "transfer-encoding")) {
    f.transfer_encoding = true;
  } else if (iequals(name, "connection")) {
    f.connection_close |= list_has(value, "close");
    f.connection_keep_alive |= list_has(value, "keep-alive");
  } else if (iequals(name, "expect")) {
    out.expect_continue |= iequals(value, "100-continue");
  }
}

/// `name: OWS value OWS` without its CRLF.
http_request_result parse_header_line(std::string_view line, http_request& out, head_facts& f) noexcept {
  if (detail::is_ows(line.front())) return fail(400, "obsolete line folding");
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return fail(400, "header line without colon");
  const std::string_view name = line.substr(0, colon);
  const std::string_view value = trim_ows(line.substr(colon + 1));
  if (!is_token(name)) return fail(400, "malformed header name");
  if (!is_field_value(value)) return fail(400, "control character in header value");
  if (out.header_count == http_request::max_headers) return fail(431, "too many header fields");
  out.headers[out.header_count++] = {name, value};
  note_header(name, value, out, f);
  return k_need_more;
}

/// The verdict on a complete, well-formed head.
http_request_result decide(http_request& out, const head_facts& f, const http_request_limits& limits) noexcept {
  if (out.minor_version >= 1 && f.host_count != 1)
    return fail(400, f.host_count ? "repeated Host header" : "missing Host header");
  if (f.transfer_encoding) return fail(501, "Transfer-Encoding is not supported; send Content-Length");
  if (f.bad_length) return fail(400, "malformed Content-Length");
  if (out.content_length > limits.max_body_bytes) return fail(413, "request body too large");
  out.keep_alive = out.minor_version >= 1 ? !f.connection_close : f.connection_keep_alive && !f.connection_close;
  return k_need_more;
}

/// Parses head = bytes[start, end), `end` just past the blank line. need_more means "valid".
http_request_result parse_head(std::string_view head, const http_request_limits& limits,
                               http_request& out) noexcept {
  out = http_request{};
  head_facts facts;
  bool first = true;
  while (true) {
    const std::size_t lf = head.find('\n');  // every LF has its CR: the scan checked
    const std::string_view line = slice(head, 0, lf - 1);
    head.remove_prefix(lf + 1);
    if (line.empty()) break;
    const http_request_result r = first ? parse_request_line(line, out) : parse_header_line(line, out, facts);
    if (r.status == parse_status::error) return r;
    first = false;
  }
  return decide(out, facts, limits);
}

}  // namespace

std::string_view http_request::header(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < header_count; ++i)
    if (detail::iequals_any(headers[i].name, name)) return headers[i].value;
  return {};
}

http_request_result http_request_parser::parse(std::string_view bytes, http_request& out) noexcept {
  bool lone_cr = false;
  const std::size_t start = leading_empty_lines(bytes, lone_cr);
  if (lone_cr) return start >= _limits.max_head_bytes ? fail(431, "request header fields too large") : k_need_more;
  const std::string_view rest = slice(bytes, start, bytes.size() - start);
  if (_head_size == 0) {
    if (!detail::plausible_request_start(rest)) return fail(400, "malformed request line");
    const std::size_t limit = bytes.size() < _limits.max_head_bytes ? bytes.size() : _limits.max_head_bytes;
    const std::string_view window = slice(bytes, 0, limit);
    for (std::size_t i = window.find('\n', _scanned > start ? _scanned : start); i != std::string_view::npos;
         i = window.find('\n', i + 1)) {  // memchr from one LF to the next
      if (i == start || bytes[i - 1] != '\r') return fail(400, "bare LF in request");
      if (i >= start + 3 && bytes[i - 2] == '\n') {
        _head_size = static_cast<std::uint32_t>(i + 1);
        break;
      }
    }
    if (_head_size == 0) {
      _scanned = static_cast<std::uint32_t>(limit);
      return bytes.size() >= _limits.max_head_bytes ? fail(431, "request header fields too large") : k_need_more;
    }
  }
  const http_request_result h = parse_head(slice(bytes, start, _head_size - start), _limits, out);
  if (h.status == parse_status::error) {
    _head_size = 0;
    return h;
  }
  const std::uint64_t total = _head_size + out.content_length;
  if (bytes.size() < total) return k_need_more;
  out.body = slice(bytes, _head_size, static_cast<std::size_t>(out.content_length));
  return {parse_status::done, 0, static_cast<std::uint32_t>(total), {}};
}

}  // namespace wspush::proto
