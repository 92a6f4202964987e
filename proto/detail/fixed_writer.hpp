#pragma once
/// \file fixed_writer.hpp
/// Appends text to a caller's fixed buffer (internal to proto: the HTTP responses and the JSON
/// server messages). It remembers an overflow instead of making every call site check: size()
/// is 0 when anything did not fit, and then the buffer holds garbage.

#include <charconv>
#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>

namespace wspush::proto::detail {

class fixed_writer {
 public:
  explicit fixed_writer(std::span<char> out) noexcept : _out(out) {}

  fixed_writer& operator<<(std::string_view s) noexcept {
    if (s.size() > _out.size() - _len) {
      _overflow = true;
    } else if (!s.empty()) {  // an empty view may have a null data(): not for memcpy
      std::memcpy(_out.data() + _len, s.data(), s.size());
      _len += s.size();
    }
    return *this;
  }

  fixed_writer& operator<<(std::size_t n) noexcept {
    char digits[24];
    const auto r = std::to_chars(digits, digits + sizeof digits, n);
    return *this << std::string_view(digits, static_cast<std::size_t>(r.ptr - digits));
  }

  /// Bytes written, or 0 after an overflow.
  std::size_t size() const noexcept { return _overflow ? 0 : _len; }

 private:
  std::span<char> _out;
  std::size_t _len = 0;
  bool _overflow = false;
};

}  // namespace wspush::proto::detail
