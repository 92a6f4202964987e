#pragma once
/// \file http_grammar.hpp
/// RFC 9110 character classes and small string helpers shared by the HTTP parsers of proto
/// (the upgrade parser and the admin request parser), a word at a time where it pays.

#include <array>
#include <cstddef>
#include <string_view>

#include "proto/detail/http_scan.hpp"

namespace wspush::proto::detail {

/// s.substr(pos, len) for positions known to be in range: no check, no throw path.
inline std::string_view slice(std::string_view s, std::size_t pos, std::size_t len) noexcept {
  return {s.data() + pos, len};
}

constexpr std::array<bool, 256> make_table(std::string_view extra, bool alnum) noexcept {
  std::array<bool, 256> t{};
  for (unsigned c = 0; alnum && c < 256; ++c)
    t[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  for (unsigned char c : extra) t[c] = true;
  return t;
}
/// tchar (RFC 9110 §5.6.2): what header names and methods are made of.
inline constexpr std::array<bool, 256> k_tchar = make_table("!#$%&'*+-.^_`|~", true);

/// Every byte a tchar (true for an empty string).
inline bool all_tchar(std::string_view s) noexcept {
  for (unsigned char c : s)
    if (!k_tchar[c]) return false;
  return true;
}

/// token: non-empty, tchar only.
inline bool is_token(std::string_view s) noexcept { return !s.empty() && all_tchar(s); }

/// No byte ≤ 0x20 (control characters and spaces) and no DEL: a request target's characters.
inline bool is_target_chars(std::string_view s) noexcept {
  const std::size_t n = s.size();
  if (n >= 8) {
    for (std::size_t i = 0; i + 8 < n; i += 8)
      if (any_ctl_or_space(load64(s.data() + i))) return false;
    return !any_ctl_or_space(load64(s.data() + n - 8));
  }
  for (unsigned char c : s)
    if (c <= 0x20 || c == 0x7F) return false;
  return true;
}

/// origin-form: starts with '/', then target characters.
inline bool is_origin_form(std::string_view s) noexcept { return !s.empty() && s.front() == '/' && is_target_chars(s); }

inline bool is_field_value_slow(std::string_view s) noexcept {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\t') || c == 0x7F) return false;
  return true;
}

/// field-content: no control character but HTAB, no DEL (RFC 9110 §5.5). A word at a time;
/// a word with a suspect byte (a tab, or a real fault) is looked at byte by byte.
inline bool is_field_value(std::string_view s) noexcept {
  const std::size_t n = s.size();
  if (n < 8) return is_field_value_slow(s);
  const auto word_ok = [&](std::size_t i) {
    return !any_ctl_or_del(load64(s.data() + i)) || is_field_value_slow(s.substr(i, 8));
  };
  for (std::size_t i = 0; i + 8 < n; i += 8)
    if (!word_ok(i)) return false;
  return word_ok(n - 8);
}

/// ASCII case-insensitive equality; `lower` is already lower case.
inline bool iequals(std::string_view s, std::string_view lower) noexcept {
  if (s.size() != lower.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
    if (c != static_cast<unsigned char>(lower[i])) return false;
  }
  return true;
}

constexpr char to_lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + ('a' - 'A')) : c; }

/// ASCII case-insensitive equality of two arbitrary strings.
inline bool iequals_any(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (to_lower(a[i]) != to_lower(b[i])) return false;
  return true;
}

/// Cheap early verdict on garbage (a TLS hello on the plain port, binary noise): a request
/// must start with a short token followed by a space.
inline bool plausible_request_start(std::string_view bytes) noexcept {
  constexpr std::size_t max_method = 24;
  const std::size_t n = bytes.size() < max_method ? bytes.size() : max_method;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == ' ') return i != 0;
    if (!k_tchar[c]) return false;
  }
  return n < max_method;
}

constexpr bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

/// Optional whitespace trimmed off both ends (the usual single leading space first).
inline std::string_view trim_ows(std::string_view s) noexcept {
  if (s.size() >= 2 && s[0] == ' ' && !is_ows(s[1]) && !is_ows(s.back())) return slice(s, 1, s.size() - 1);
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace wspush::proto::detail
