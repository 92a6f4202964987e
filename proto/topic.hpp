#pragma once
/// \file topic.hpp
/// The topic name rule, used everywhere a topic enters the server (client messages, token
/// grants, the admin API), and the grant patterns of a token: an exact topic, or a prefix
/// followed by `*`.
///
/// A topic is 1-128 bytes of visible ASCII (0x21-0x7E) other than `*`, `"` and `\`. The
/// exclusions are on purpose: `*` is the grant wildcard; without `"` and `\` a topic never
/// needs escaping in JSON, so a topic read from a message is always a view of its raw bytes
/// and lands in logs, metrics labels and Redis keys as it is. No space, no control byte, no
/// UTF-8: `mailbox:42`, `user/7/inbox`, `room.lobby` are the intended shapes.

#include <cstddef>
#include <string_view>

namespace wspush::proto {

inline constexpr std::size_t max_topic_bytes = 128;
/// The longest grant pattern: a topic-length prefix and its `*`.
inline constexpr std::size_t max_pattern_bytes = max_topic_bytes + 1;

constexpr bool is_topic_byte(unsigned char c) noexcept {
  return c > 0x20 && c < 0x7F && c != '*' && c != '"' && c != '\\';
}

/// True when every byte of `s` is a topic byte (the empty view included).
constexpr bool all_topic_bytes(std::string_view s) noexcept {
  for (const char c : s)
    if (!is_topic_byte(static_cast<unsigned char>(c))) return false;
  return true;
}

constexpr bool is_valid_topic(std::string_view t) noexcept {
  return !t.empty() && t.size() <= max_topic_bytes && all_topic_bytes(t);
}

/// A grant pattern: a valid topic (exact grant), or 0-128 topic bytes followed by one `*`
/// (prefix grant; `*` alone grants every topic).
constexpr bool is_valid_pattern(std::string_view p) noexcept {
  if (!p.empty() && p.back() == '*') {
    p.remove_suffix(1);
    return p.size() <= max_topic_bytes && all_topic_bytes(p);
  }
  return is_valid_topic(p);
}

/// Whether a valid pattern grants `topic`: equal, or a prefix of it for a `*` pattern.
constexpr bool pattern_matches(std::string_view pattern, std::string_view topic) noexcept {
  if (!pattern.empty() && pattern.back() == '*') {
    pattern.remove_suffix(1);
    return topic.substr(0, pattern.size()) == pattern;
  }
  return pattern == topic;
}

}  // namespace wspush::proto
