// Fuzz target for proto/sse. Input: a stream id (a Last-Event-ID, or a since query value
// percent-encoded), '\n', then a server message. Invariants: split_positions takes the id for
// exactly one topic count, its commas + 1, when every piece is a position (is_position agrees
// with its rule written out), and its positions join back to the id; percent_decode never
// grows its input nor writes past its room, agrees with a plain decoder, and refuses a byte
// less room than it needs; classify_message and for_each_subbed_entry give views into the
// message without `"`, an op is a lowercase word, and only a subbed reply has entries;
// encode_sse fits sse_bound (exactly without line breaks in the data), refuses one byte less,
// and reads back as EventSource reads a stream.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/sse.hpp"

using namespace wspush::proto;

namespace {

constexpr auto npos = std::string_view::npos;

bool inside(std::string_view part, std::string_view whole) {
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

/// is_position written out: up to 64 bytes of 0x21-0x7E but `,` `"` `\`.
bool plain_position(std::string_view p) {
  if (p.size() > 64) return false;
  for (const char c : p)
    if (c < 0x21 || c > 0x7E || c == ',' || c == '"' || c == '\\') return false;
  return true;
}

/// The positions of `id` for the topic count that takes it, none when no count does. Checks,
/// for every count up to max_sse_topics, that split_positions agrees with the commas and
/// is_position.
std::vector<std::string_view> check_split(std::string_view id) {
  std::vector<std::string_view> pieces;
  for (std::size_t from = 0;;) {
    const std::size_t comma = id.find(',', from);
    pieces.push_back(id.substr(from, comma == npos ? npos : comma - from));
    if (comma == npos) break;
    from = comma + 1;
  }
  bool all_positions = true;
  for (const std::string_view p : pieces) {
    WSPUSH_FUZZ_CHECK(is_position(p) == plain_position(p));
    all_positions &= is_position(p);
  }
  std::vector<std::string_view> taken;
  for (std::size_t n = 1; n <= max_sse_topics; ++n) {
    std::vector<std::string_view> out(n);
    const bool ok = split_positions(id, out);
    WSPUSH_FUZZ_CHECK(ok == (n == pieces.size() && all_positions));
    if (!ok) continue;
    std::string joined;
    for (std::size_t k = 0; k < n; ++k) {
      WSPUSH_FUZZ_CHECK(is_position(out[k]));
      WSPUSH_FUZZ_CHECK(inside(out[k], id));
      if (k) joined += ',';
      joined += out[k];
    }
    WSPUSH_FUZZ_CHECK(joined == id);
    taken = out;
  }
  return taken;
}

/// `%XX` and `+` the plain way; false for a bad escape.
bool reference_decode(std::string_view in, std::string& out) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] != '%') {
      out += in[i];
    } else {
      if (in.size() - i < 3 || hex(in[i + 1]) < 0 || hex(in[i + 2]) < 0) return false;
      out += char(hex(in[i + 1]) * 16 + hex(in[i + 2]));
      i += 2;
    }
  }
  return true;
}

/// Decodes `in` as the HTTP phase does (room: its own size), and into exactly the room the
/// result needs and one byte less, each an exactly sized heap buffer. False when it is refused;
/// otherwise `decoded` is the text.
bool check_decode(std::string_view in, std::string& decoded) {
  std::string expected;
  const bool valid = reference_decode(in, expected);
  std::vector<char> out(in.size());
  const std::size_t n = percent_decode(in, out);
  WSPUSH_FUZZ_CHECK((n == SIZE_MAX) == !valid);
  if (!valid) return false;
  WSPUSH_FUZZ_CHECK(n <= in.size());
  WSPUSH_FUZZ_CHECK(std::string_view(out.data(), n) == expected);
  std::vector<char> exact(n);
  WSPUSH_FUZZ_CHECK(percent_decode(in, exact) == n);
  WSPUSH_FUZZ_CHECK(std::string_view(exact.data(), n) == expected);
  if (n > 0) {
    std::vector<char> less(n - 1);
    WSPUSH_FUZZ_CHECK(percent_decode(in, less) == SIZE_MAX);
  }
  decoded = expected;
  return true;
}

/// What EventSource makes of a stream holding one event: lines end in CRLF, LF or CR, a field's
/// value loses one space after the colon, data lines join with LF, a blank line dispatches.
struct received {
  std::string event, id, data;
  std::size_t dispatched = 0;
  bool complete = false;
};
received read_stream(std::string_view s) {
  received r;
  std::string data;
  bool any_data = false;
  while (!s.empty()) {
    const std::size_t end = s.find_first_of("\r\n");
    if (end == npos) return r;
    const std::string_view line = s.substr(0, end);
    s.remove_prefix(end + (s[end] == '\r' && end + 1 < s.size() && s[end + 1] == '\n' ? 2 : 1));
    r.complete = line.empty();
    if (line.empty()) {
      if (any_data) r.data = data.substr(0, data.size() - 1), ++r.dispatched;
      data.clear();
      any_data = false;
      continue;
    }
    const std::size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    std::string_view value = colon == npos ? std::string_view{} : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (name == "event") r.event = value;
    if (name == "id") r.id = value;
    if (name == "data") data.append(value).push_back('\n'), any_data = true;
  }
  return r;
}

std::string as_lf(std::string_view data) {
  std::string out;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
    out += data[i] == '\r' ? '\n' : data[i];
  }
  return out;
}

void check_encode(std::string_view event, std::string_view id, std::string_view data) {
  const std::size_t bound = sse_bound(event, id, data);
  std::vector<char> out(bound);  // exactly: a write past the bound is a heap overflow
  const std::size_t n = encode_sse(event, id, data, out);
  WSPUSH_FUZZ_CHECK(n != 0 && n <= bound);
  if (data.find_first_of("\r\n") == npos) WSPUSH_FUZZ_CHECK(n == bound);
  std::vector<char> less(bound - 1);
  WSPUSH_FUZZ_CHECK(encode_sse(event, id, data, less) == 0);
  // A field's line break would end it early: the callers never give one (ops, positions).
  if (event.find_first_of("\r\n") != npos || id.find_first_of("\r\n") != npos) return;
  const received r = read_stream({out.data(), n});
  WSPUSH_FUZZ_CHECK(r.complete);
  WSPUSH_FUZZ_CHECK(r.dispatched == 1);
  WSPUSH_FUZZ_CHECK(r.event == event);
  WSPUSH_FUZZ_CHECK(r.id == id);
  WSPUSH_FUZZ_CHECK(r.data == as_lf(data));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nl = input.find('\n');
  const std::string_view id = input.substr(0, nl);
  const std::string_view message = nl == npos ? std::string_view{} : input.substr(nl + 1);

  // The id as a Last-Event-ID (taken as it is), and as a since value (decoded first).
  const std::vector<std::string_view> positions = check_split(id);
  std::string decoded;
  if (check_decode(id, decoded)) check_split(decoded);

  const sse_message m = classify_message(message);
  if (m.kind == sse_message::event) {
    WSPUSH_FUZZ_CHECK(message.substr(0, 10) == R"({"topic":")");
    WSPUSH_FUZZ_CHECK(inside(m.topic, message) && inside(m.id, message));
    WSPUSH_FUZZ_CHECK(m.topic.find('"') == npos && m.id.find('"') == npos);
    WSPUSH_FUZZ_CHECK(m.op.empty());
  } else if (m.kind == sse_message::reply) {
    WSPUSH_FUZZ_CHECK(message.substr(0, 7) == R"({"op":")");
    WSPUSH_FUZZ_CHECK(!m.op.empty() && inside(m.op, message));
    for (const char c : m.op) WSPUSH_FUZZ_CHECK(c >= 'a' && c <= 'z');
  }
  const bool subbed = for_each_subbed_entry(message, [&](std::string_view topic, bool lost, std::string_view pos) {
    WSPUSH_FUZZ_CHECK(inside(topic, message) && topic.find('"') == npos);
    WSPUSH_FUZZ_CHECK(pos.find('"') == npos);
    if (lost) WSPUSH_FUZZ_CHECK(pos.empty());
    if (!pos.empty()) WSPUSH_FUZZ_CHECK(inside(pos, message));
  });
  if (subbed) WSPUSH_FUZZ_CHECK(m.kind == sse_message::reply && m.op == "subbed");

  // As the stream writes it: an event under the stream's id, a reply as a named event.
  std::string joined;
  for (std::size_t k = 0; k < positions.size(); ++k) {
    if (k) joined += ',';
    joined += positions[k];
  }
  if (m.kind == sse_message::event) check_encode({}, positions.empty() ? m.id : std::string_view(joined), message);
  if (m.kind == sse_message::reply) check_encode(m.op, joined, message);
  // And any fields at all.
  check_encode({}, {}, message);
  check_encode(id.substr(0, id.size() / 2), id.substr(id.size() / 2), message);
  check_encode(message, id, id);
  return 0;
}
