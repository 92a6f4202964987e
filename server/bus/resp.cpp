#include "server/bus/resp.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <new>

namespace wspush::server::bus::resp {

namespace {

// What the parser keeps between replies; a bigger reply's storage goes back when the next starts.
constexpr std::size_t keep_bytes = 64 << 10;
constexpr std::size_t keep_nodes = 1024;

template <class V>
void clear_or_release(V& v, std::size_t keep) noexcept {
  if (v.capacity() > keep) V().swap(v);
  else v.clear();
}

}  // namespace

result parser::parse(std::string_view in) noexcept {
  const std::size_t size = in.size();
  if (*_error) return {status::error, 0};
  if (!_in_reply) {
    if (in.empty()) return {status::need_more, 0};
    begin_reply();
    if (*_error) return {status::error, 0};
  }
  while (!in.empty()) {
    bool ok = true;
    switch (_state) {
      case state::type: {
        const char c = in.front();
        in.remove_prefix(1);
        ok = begin_element(c);
        break;
      }
      case state::header:
      case state::line: ok = take_line(in); break;
      case state::bulk:
      case state::bulk_end: ok = take_bulk(in); break;
    }
    if (!ok) return {status::error, size - in.size()};
    if (!_in_reply) return {status::done, size - in.size()};
  }
  return {status::need_more, size};
}

void parser::reset() noexcept {
  _error = "";
  _in_reply = false;
  _state = state::type;
  _cr = false;
  _stack.clear();
  clear_or_release(_bytes, keep_bytes);
  clear_or_release(_nodes, keep_nodes);
  clear_or_release(_at, keep_nodes);
}

void parser::begin_reply() noexcept {
  reset();
  try {
    _nodes.emplace_back();
    _at.push_back(0);
  } catch (...) {
    fail("out of memory");
    return;
  }
  _in_reply = true;
  _cur = 0;
  _total = sizeof(reply);
}

bool parser::fail(const char* why) noexcept {
  _error = why;
  return false;
}

bool parser::begin_element(char c) noexcept {
  reply& r = _nodes[_cur];
  _head_len = 0;
  _cr = false;
  switch (c) {
    case '+': r.type = reply_type::status; break;
    case '-': r.type = reply_type::error; break;
    case ':': r.type = reply_type::integer; break;
    case '$': r.type = reply_type::string; break;
    case '*': r.type = reply_type::array; break;
    default: return fail("a reply starts with a byte that is no RESP type");
  }
  const bool line = c == '+' || c == '-';
  _state = line ? state::line : state::header;
  _at[_cur] = std::uint32_t(_bytes.size());
  return true;
}

/// A header's number, or a status or error line: up to "\r\n" (neither may hold '\r' or '\n').
bool parser::take_line(std::string_view& in) noexcept {
  if (!_cr) {
    std::size_t n = 0;
    while (n < in.size() && in[n] != '\r' && in[n] != '\n') ++n;
    if (_state == state::header) {
      if (_head_len + n > sizeof _head) return fail("a header's number is too long");
      std::memcpy(_head + _head_len, in.data(), n);
      _head_len = std::uint8_t(_head_len + n);
    } else {
      if (_bytes.size() - _at[_cur] + n > _lim.max_bulk) return fail("a status or error line is longer than the bound");
      if (!reserve_bytes(n)) return false;
      _bytes.insert(_bytes.end(), in.data(), in.data() + n);
    }
    in.remove_prefix(n);
    if (in.empty()) return true;
    if (in.front() == '\n') return fail("a line ends in \\n without \\r");
    in.remove_prefix(1);
    _cr = true;
  }
  if (in.empty()) return true;
  if (in.front() != '\n') return fail("a \\r in a line is not followed by \\n");
  in.remove_prefix(1);
  _cr = false;
  if (_state == state::header) return end_header();
  _nodes[_cur].len = _bytes.size() - _at[_cur];
  return complete();
}

bool parser::end_header() noexcept {
  long long v = 0;
  const char* end = _head + _head_len;
  // Digits with an optional '-' only (from_chars would also take nothing at all, or a '+').
  if (_head_len == 0 || (_head[0] == '-' && _head_len == 1)) return fail("a header has no number");
  auto [p, ec] = std::from_chars(_head, end, v);
  if (ec != std::errc() || p != end) return fail("a header's number is not a 64-bit decimal");
  switch (_nodes[_cur].type) {
    case reply_type::integer:
      _nodes[_cur].integer = v;
      return complete();
    case reply_type::string: return start_bulk(v);
    default: return start_array(v);
  }
}

bool parser::start_bulk(long long n) noexcept {
  if (n == -1) {
    _nodes[_cur].type = reply_type::nil;
    return complete();
  }
  if (n < 0) return fail("a bulk string has a negative length");
  if (std::uint64_t(n) > _lim.max_bulk) return fail("a bulk string is larger than the bound");
  if (!reserve_bytes(std::size_t(n))) return false;
  _left = std::size_t(n);
  _state = state::bulk;
  return true;
}

bool parser::start_array(long long n) noexcept {
  reply& r = _nodes[_cur];
  if (n == -1) {
    r.type = reply_type::nil;
    return complete();
  }
  if (n < 0) return fail("an array has a negative length");
  if (std::uint64_t(n) > _lim.max_elements) return fail("an array has more elements than the bound");
  if (_stack.size() + 1 > _lim.max_depth) return fail("arrays nest deeper than the bound");
  if (n == 0) return complete();
  const std::size_t cost = std::size_t(n) * sizeof(reply);
  if (_total + cost > _lim.max_total) return fail("a reply holds more than the bound (elements)");
  const std::size_t first = _nodes.size();
  r.elements = std::size_t(n);
  _at[_cur] = std::uint32_t(first);
  try {
    _nodes.resize(first + std::size_t(n));
    _at.resize(first + std::size_t(n));
    _stack.push_back({std::uint32_t(first), std::uint32_t(n), 0});
  } catch (...) {
    return fail("out of memory");
  }
  _total += cost;
  _cur = std::uint32_t(first);
  _state = state::type;
  return true;
}

/// A bulk string's bytes (their room is reserved), then its "\r\n".
bool parser::take_bulk(std::string_view& in) noexcept {
  if (_state == state::bulk) {
    const std::size_t k = std::min(_left, in.size());
    _bytes.insert(_bytes.end(), in.data(), in.data() + k);
    in.remove_prefix(k);
    _left -= k;
    if (_left > 0) return true;
    _state = state::bulk_end;
  }
  while (!in.empty()) {
    const char want = _cr ? '\n' : '\r';
    if (in.front() != want) return fail("a bulk string is not followed by \\r\\n");
    in.remove_prefix(1);
    if (!_cr) {
      _cr = true;
      continue;
    }
    _cr = false;
    _nodes[_cur].len = _bytes.size() - _at[_cur];
    return complete();
  }
  return true;
}

/// Room for `n` more string bytes within max_total, grown geometrically but never past what the
/// bound still allows (so the capacity itself stays within it).
bool parser::reserve_bytes(std::size_t n) noexcept {
  if (_total + n > _lim.max_total) return fail("a reply holds more than the bound (bytes)");
  _total += n;
  const std::size_t need = _bytes.size() + n;
  if (need > _bytes.capacity()) {
    const std::size_t most = _bytes.size() + (_lim.max_total - _total) + n;
    try {
      _bytes.reserve(std::max(need, std::min(2 * _bytes.capacity(), most)));
    } catch (...) {
      return fail("out of memory");
    }
  }
  return true;
}

/// The element at _cur is whole: the next one of its array, or up to the arrays it ends.
bool parser::complete() noexcept {
  _state = state::type;
  while (!_stack.empty()) {
    frame& f = _stack.back();
    if (++f.next < f.count) {
      _cur = f.first + f.next;
      return true;
    }
    _stack.pop_back();
  }
  finish();
  return true;
}

/// The reply is whole: the storage no longer moves, so the pointers can be set.
void parser::finish() noexcept {
  for (std::size_t k = 0; k < _nodes.size(); ++k) {
    reply& r = _nodes[k];
    switch (r.type) {
      case reply_type::string:
      case reply_type::status:
      case reply_type::error: r.str = _bytes.data() + _at[k]; break;
      case reply_type::array: r.element.first = r.elements ? _nodes.data() + _at[k] : nullptr; break;
      default: break;
    }
  }
  _in_reply = false;
}

}  // namespace wspush::server::bus::resp
