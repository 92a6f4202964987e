#include "proto/ws_deflate.hpp"

#include <libdeflate.h>

#include <cstddef>
#include <cstring>

#include "proto/detail/http_grammar.hpp"

namespace wspush::proto {

namespace {

using detail::iequals;
using detail::is_ows;
using detail::k_tchar;

/// Reads one Sec-WebSocket-Extensions list (RFC 6455 §9.1, with RFC 9110's list rules: OWS
/// around the separators, empty elements ignored) offer by offer, and the parameters of each.
class extension_list {
 public:
  explicit extension_list(std::string_view s) noexcept : _s(s) {}

  bool failed() const noexcept { return _failed; }

  /// The next offer's name, after any empty elements; false at the end (or on a syntax error).
  bool next_offer(std::string_view& name) noexcept {
    if (_failed) return false;
    for (;;) {
      skip_ows();
      if (_i == _s.size()) return false;
      if (_s[_i] != ',') break;
      ++_i;
    }
    name = token();
    return !name.empty() || fail();
  }

  /// The next parameter of the current offer; false once the offer ends (at a comma or the end).
  /// `value` is empty for a parameter without one; `has_value` tells an empty quoted value from
  /// none. A quoted value is given as it stands between its quotes, `escaped` if it holds a
  /// quoted-pair (unescape() reads it).
  bool next_param(std::string_view& param, std::string_view& value, bool& has_value, bool& escaped) noexcept {
    skip_ows();
    if (_i == _s.size() || _s[_i] == ',') return false;
    if (_s[_i] != ';') return fail();
    ++_i;
    skip_ows();
    param = token();
    if (param.empty()) return fail();
    skip_ows();
    value = {};
    has_value = false;
    escaped = false;
    if (_i == _s.size() || _s[_i] != '=') return true;
    ++_i;
    skip_ows();
    has_value = true;
    if (_i < _s.size() && _s[_i] == '"') return quoted(value, escaped);
    value = token();
    return !value.empty() || fail();
  }

 private:
  void skip_ows() noexcept {
    while (_i < _s.size() && is_ows(_s[_i])) ++_i;
  }

  std::string_view token() noexcept {
    const std::size_t from = _i;
    while (_i < _s.size() && k_tchar[static_cast<unsigned char>(_s[_i])]) ++_i;
    return _s.substr(from, _i - from);
  }

  /// quoted-string (RFC 9110 §5.6.4): DQUOTE *( qdtext / quoted-pair ) DQUOTE.
  bool quoted(std::string_view& value, bool& escaped) noexcept {
    const std::size_t from = ++_i;
    for (; _i < _s.size(); ++_i) {
      const auto c = static_cast<unsigned char>(_s[_i]);
      if (c == '"') {
        value = _s.substr(from, _i - from);
        ++_i;
        return true;
      }
      if (c == '\\') {
        escaped = true;
        if (++_i == _s.size()) break;
        const auto e = static_cast<unsigned char>(_s[_i]);
        if (e != '\t' && (e < 0x20 || e == 0x7f)) break;
        continue;
      }
      if (c != '\t' && (c < 0x20 || c == 0x7f)) break;
    }
    return fail();
  }

  bool fail() noexcept {
    _failed = true;
    return false;
  }

  std::string_view _s;
  std::size_t _i = 0;
  bool _failed = false;
};

/// A window-bits value (RFC 7692 §7.1.2.1): 8 to 15, decimal, no leading zero; 0 if invalid.
/// `escaped`: `v` holds quoted-pairs, read without their backslashes (RFC 6455 §9.1: the value
/// after unescaping is what counts).
unsigned window_bits(std::string_view v, bool escaped) noexcept {
  char plain[2];
  if (escaped) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (n == sizeof plain) return 0;
      plain[n++] = v[i] == '\\' ? v[++i] : v[i];  // a quoted-pair always has its second byte
    }
    v = std::string_view(plain, n);
  }
  if (v.size() == 1 && v[0] >= '8' && v[0] <= '9') return unsigned(v[0] - '0');
  if (v.size() == 2 && v[0] == '1' && v[1] >= '0' && v[1] <= '5') return 10 + unsigned(v[1] - '0');
  return 0;
}

/// Whether the parameters of one permessage-deflate offer are valid and honourable; reads them
/// all (so that the list goes on at the next offer) whatever it finds.
bool acceptable(extension_list& list, bool& server_bits) noexcept {
  bool ok = true;
  bool seen_server_nct = false, seen_client_nct = false, seen_server_bits = false, seen_client_bits = false;
  std::string_view param, value;
  bool has_value = false, escaped = false;
  while (list.next_param(param, value, has_value, escaped)) {
    if (iequals(param, "server_no_context_takeover")) {
      ok = ok && !seen_server_nct && !has_value;
      seen_server_nct = true;
    } else if (iequals(param, "client_no_context_takeover")) {
      ok = ok && !seen_client_nct && !has_value;
      seen_client_nct = true;
    } else if (iequals(param, "server_max_window_bits")) {
      // A limit on the server's window: one shared frame for every subscriber is made with the
      // full window, so only 15 (no limit) can be honoured.
      ok = ok && !seen_server_bits && has_value && window_bits(value, escaped) == 15;
      seen_server_bits = server_bits = true;
    } else if (iequals(param, "client_max_window_bits")) {
      // The client may limit its own window: its messages inflate with any.
      ok = ok && !seen_client_bits && (!has_value || window_bits(value, escaped) != 0);
      seen_client_bits = true;
    } else {
      ok = false;  // an unknown parameter declines the offer (§5)
    }
  }
  return ok;
}

}  // namespace

deflate_offer negotiate_deflate(std::span<const std::string_view> values, bool* server_window) noexcept {
  bool offered = false;
  for (const std::string_view v : values) {
    extension_list list(v);
    std::string_view name;
    while (list.next_offer(name)) {
      const bool ours = iequals(name, "permessage-deflate");
      bool bits = false;
      const bool ok = acceptable(list, bits);  // reads the offer's parameters, ours or not
      if (list.failed()) return deflate_offer::malformed;
      if (!ours) continue;
      if (ok) {
        if (server_window) *server_window = bits;
        return deflate_offer::accepted;
      }
      offered = true;
    }
    if (list.failed()) return deflate_offer::malformed;
  }
  return offered ? deflate_offer::declined : deflate_offer::none;
}

message_inflater::message_inflater() noexcept : _d(libdeflate_alloc_decompressor()) {}
message_inflater::~message_inflater() { libdeflate_free_decompressor(_d); }

inflate_status message_inflater::inflate(std::span<std::uint8_t> in, std::size_t in_len, std::span<std::uint8_t> out,
                                         std::size_t& out_len) noexcept {
  // The sync flush's empty stored block back (00 00 ff ff), then an empty final stored block:
  // libdeflate reads whole streams, which end with one.
  static constexpr std::uint8_t tail[inflate_tail_room] = {0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff};
  out_len = 0;
  if (_d == nullptr || in.size() < in_len + inflate_tail_room) return inflate_status::bad_data;
  std::memcpy(in.data() + in_len, tail, sizeof tail);
  std::size_t used = 0;
  switch (libdeflate_deflate_decompress_ex(_d, in.data(), in_len + sizeof tail, out.data(), out.size(), &used, &out_len)) {
    case LIBDEFLATE_SUCCESS: return inflate_status::ok;
    case LIBDEFLATE_INSUFFICIENT_SPACE: return inflate_status::too_big;
    default: return inflate_status::bad_data;
  }
}

message_deflater::message_deflater() noexcept : _c(libdeflate_alloc_compressor(1)) {}
message_deflater::~message_deflater() { libdeflate_free_compressor(_c); }

std::size_t message_deflater::bound(std::size_t n) const noexcept { return libdeflate_deflate_compress_bound(_c, n) + 1; }

std::size_t message_deflater::deflate(std::span<const std::uint8_t> in, std::span<std::uint8_t> out) noexcept {
  if (_c == nullptr || out.empty()) return 0;
  const std::size_t n = libdeflate_deflate_compress(_c, in.data(), in.size(), out.data(), out.size() - 1);
  if (n == 0) return 0;
  out[n] = 0x00;  // the empty stored block after the final one, less its last four bytes
  return n + 1;
}

}  // namespace wspush::proto
