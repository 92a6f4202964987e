#pragma once
/// \file event_stream.hpp
/// A streaming reader for an event stream's body (Server-Sent Events, `--transport sse`):
/// several events per read, an event or a line split over any number of reads, lines ended by
/// CRLF, LF or CR, comments, several `data:` lines joined with LF. An event that lies whole in
/// the read with one `data:` line is handed over where it lies, with no copy; only an event cut
/// by the end of a read, or one of several data lines, leases a spill from the worker's pool
/// (the first bytes of its data, its id and its name, and the state of a cut line) until it is
/// complete. An idle stream holds 8 bytes of reader state and no buffer. Never touches a
/// socket; the request that opens a stream and the check of its answer are in wire.hpp.

#include "loadgen/wire.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace wspush::loadgen {

/// One event as the reader hands it over; the views are valid during the call only.
struct sse_event {
  std::string_view name;   ///< its `event:` (empty: a message)
  std::string_view data;   ///< its `data:` lines joined with LF: all of it, or its first keep_bytes
  std::string_view id;     ///< its `id:`, when it had one
  bool has_id = false;
};

template <class Handler>
concept event_handler = requires(Handler h, const sse_event& e, std::string_view v) {
  h.on_event(e);   // at the blank line that ends an event with data or an id
  h.on_comment();  // a comment line (`:...`): the server's keepalive
  h.on_retry(v);   // a `retry:` field's value
};

/// What a connection keeps of an event cut by the end of a read (or of one whose data lines are
/// joined): the first bytes of its data, its id and name, and how far a cut line has come.
struct sse_spill {
  static constexpr std::size_t keep_bytes = spill::keep_bytes;   ///< prefix of an event's data kept
  static constexpr std::size_t id_bytes = 128;     ///< a longer id is not kept (one topic's is at most 64)
  static constexpr std::size_t name_bytes = 16;    ///< event names: subbed, lost, error
  static constexpr std::size_t line_bytes = 16;    ///< a cut line's field name, or a retry: value
  enum class field : std::uint8_t { name, data, id, event, retry, comment, other };
  std::array<char, keep_bytes> data;
  std::array<char, id_bytes> id;
  std::array<char, name_bytes> name;
  std::array<char, line_bytes> line;
  std::uint8_t data_len, id_len, name_len, line_len;
  field cut;         ///< a cut line: the field its bytes go to (name: its field name is not complete)
  bool skip_space;   ///< a cut line: its value's first byte is still to come (a space there is dropped)
  bool has_data, has_id;
  bool id_long;      ///< the id did not fit
  void clear() noexcept {
    data_len = id_len = name_len = line_len = 0;
    cut = field::name;
    skip_space = has_data = has_id = id_long = false;
  }
};

using sse_spill_pool = slab_pool<sse_spill>;

namespace detail {

/// The first CR or LF at or after p; `end` when there is none.
inline const char* find_eol(const char* p, const char* end) noexcept {
  const void* lf = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
  const char* const stop = lf != nullptr ? static_cast<const char*>(lf) : end;
  const void* cr = std::memchr(p, '\r', static_cast<std::size_t>(stop - p));
  return cr != nullptr ? static_cast<const char*>(cr) : stop;
}

inline sse_spill::field field_named(std::string_view name) noexcept {
  using f = sse_spill::field;
  if (name == "data") return f::data;
  if (name == "id") return f::id;
  if (name == "event") return f::event;
  if (name == "retry") return f::retry;
  return f::other;
}

/// Appends what fits of `v` to buf[len..cap); false when some of it did not fit.
inline bool append_bounded(char* buf, std::uint8_t& len, std::size_t cap, std::string_view v) noexcept {
  const std::size_t n = std::min(cap - len, v.size());
  if (n > 0) std::memcpy(buf + len, v.data(), n);  // an empty view may hold no pointer at all
  len = static_cast<std::uint8_t>(len + n);
  return n == v.size();
}

}  // namespace detail

class sse_reader {
public:
  static constexpr std::size_t keep_bytes = sse_spill::keep_bytes;

  /// Feeds the stream's bytes. The stream has no framing to break: nothing is an error (a field
  /// it does not know is skipped, as EventSource skips it).
  template <event_handler Handler>
  void consume(std::span<const std::uint8_t> in, Handler& h, sse_spill_pool& pool) noexcept {
    const char* p = reinterpret_cast<const char*>(in.data());
    const char* const end = p + in.size();
    fields f;
    if (_cr && p != end) {   // the CR that ended the last read, and its LF here: one line end
      _cr = false;
      if (*p == '\n') ++p;
    }
    while (p != end) {
      const char* const eol = detail::find_eol(p, end);
      const std::string_view part(p, static_cast<std::size_t>(eol - p));
      if (_cut_line) {
        sse_spill& s = pool[_spill];
        continue_line(s, part);
        if (eol == end) return;
        _cut_line = false;
        end_cut_line(s, h);
      } else if (eol == end) {   // a line cut by the end of the read: the event goes to a spill
        spill_fields(f, pool);
        _cut_line = true;
        continue_line(pool[_spill], part);
        return;
      } else {
        whole_line(part, f, h, pool);
      }
      p = eol + 1;
      if (*eol == '\r') {
        if (p == end) _cr = true;
        else if (*p == '\n') ++p;
      }
    }
    if (!f.empty()) spill_fields(f, pool);   // an event still open: its fields point into this read
  }

  /// Forget everything (a reconnect starts a new stream); gives back a leased spill.
  void reset(sse_spill_pool& pool) noexcept {
    if (_spill != sse_spill_pool::none) pool.release(_spill);
    *this = sse_reader{};
  }

private:
  using field = sse_spill::field;

  /// An event's fields while they lie in the read (nothing spilled): views into it.
  struct fields {
    std::string_view data, id, name;
    bool has_data = false, has_id = false;
    [[nodiscard]] bool empty() const noexcept { return !has_data && !has_id && name.empty(); }
  };

  template <event_handler Handler>
  void whole_line(std::string_view line, fields& f, Handler& h, sse_spill_pool& pool) noexcept {
    if (line.empty()) return dispatch(f, h, pool);
    if (line.front() == ':') return h.on_comment();
    const std::size_t colon = line.find(':');
    std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    const field k = detail::field_named(line.substr(0, colon));
    if (k == field::retry) return h.on_retry(value);
    if (k == field::other) return;
    if (_spill == sse_spill_pool::none) {
      if (k != field::data || !f.has_data) {
        if (k == field::data) f.data = value, f.has_data = true;
        else if (k == field::id) f.id = value, f.has_id = true;
        else f.name = value;
        return;
      }
      spill_fields(f, pool);   // a second data line: joined in the spill
    }
    sse_spill& s = pool[_spill];
    open_value(s, k);
    add_value(s, k, value);
  }

  /// The blank line: the event, if it has data or an id, goes to the handler.
  template <event_handler Handler>
  void dispatch(fields& f, Handler& h, sse_spill_pool& pool) noexcept {
    if (_spill == sse_spill_pool::none) {
      if (f.has_data || f.has_id) h.on_event(sse_event{f.name, f.data, f.id, f.has_id});
      f = fields{};
      return;
    }
    const sse_spill& s = pool[_spill];
    if (s.has_data || s.has_id) {
      const bool id = s.has_id && !s.id_long;
      h.on_event(sse_event{std::string_view(s.name.data(), s.name_len), std::string_view(s.data.data(), s.data_len),
                           id ? std::string_view(s.id.data(), s.id_len) : std::string_view{}, id});
    }
    pool.release(_spill);   // no line is cut at a blank line
    _spill = sse_spill_pool::none;
  }

  /// Moves the fields that lie in the read into the spill (leased now if there is none).
  void spill_fields(fields& f, sse_spill_pool& pool) noexcept {
    if (_spill == sse_spill_pool::none) _spill = pool.lease();
    sse_spill& s = pool[_spill];
    if (f.has_data) open_value(s, field::data), add_value(s, field::data, f.data);
    if (f.has_id) open_value(s, field::id), add_value(s, field::id, f.id);
    if (!f.name.empty()) open_value(s, field::event), add_value(s, field::event, f.name);
    f = fields{};
  }

  /// A field's line begins: a second data line is joined with LF, an id or name replaces the last.
  static void open_value(sse_spill& s, field k) noexcept {
    switch (k) {
      case field::data:
        if (s.has_data) detail::append_bounded(s.data.data(), s.data_len, s.data.size(), "\n");
        s.has_data = true;
        return;
      case field::id: s.id_len = 0, s.id_long = false, s.has_id = true; return;
      case field::event: s.name_len = 0; return;
      case field::retry: s.line_len = 0; return;
      default: return;
    }
  }

  static void add_value(sse_spill& s, field k, std::string_view v) noexcept {
    switch (k) {
      case field::data: detail::append_bounded(s.data.data(), s.data_len, s.data.size(), v); return;
      case field::id:
        if (!detail::append_bounded(s.id.data(), s.id_len, s.id.size(), v)) s.id_long = true;
        return;
      case field::event: detail::append_bounded(s.name.data(), s.name_len, s.name.size(), v); return;
      case field::retry: detail::append_bounded(s.line.data(), s.line_len, s.line.size(), v); return;
      default: return;
    }
  }

  /// More bytes of a cut line (no line end among them).
  static void continue_line(sse_spill& s, std::string_view part) noexcept {
    while (!part.empty()) {
      if (s.cut == field::name) {
        const std::size_t colon = part.find(':');
        if (colon == 0 && s.line_len == 0) {
          s.cut = field::comment;
          return;
        }
        if (!detail::append_bounded(s.line.data(), s.line_len, s.line.size(), part.substr(0, colon))) {
          s.cut = field::other;   // a name this long is no field of ours; its value goes nowhere
          return;
        }
        if (colon == std::string_view::npos) return;
        s.cut = detail::field_named(std::string_view(s.line.data(), s.line_len));
        open_value(s, s.cut);
        s.skip_space = true;
        part.remove_prefix(colon + 1);
        continue;
      }
      if (s.skip_space) {
        s.skip_space = false;
        if (part.front() == ' ') part.remove_prefix(1);
      }
      add_value(s, s.cut, part);
      return;
    }
  }

  /// A cut line's end has come.
  template <event_handler Handler>
  static void end_cut_line(sse_spill& s, Handler& h) noexcept {
    if (s.cut == field::name) {   // no colon: the line is a field name, its value empty
      s.cut = detail::field_named(std::string_view(s.line.data(), s.line_len));
      open_value(s, s.cut);
    }
    if (s.cut == field::comment) h.on_comment();
    else if (s.cut == field::retry) h.on_retry(std::string_view(s.line.data(), s.line_len));
    s.cut = field::name;
    s.line_len = 0;
    s.skip_space = false;
  }

  std::uint32_t _spill = sse_spill_pool::none;   ///< leased while an event or a line is cut
  bool _cr = false;         ///< the last read ended with CR: an LF first in the next ends no line
  bool _cut_line = false;   ///< a line was cut by the end of a read (its state in the spill)
};

static_assert(sizeof(sse_reader) == 8, "an idle stream's reader stays small");

}  // namespace wspush::loadgen
