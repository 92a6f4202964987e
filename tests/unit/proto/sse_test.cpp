// Tests for proto/sse: a stream's id split into its positions, query values percent-decoded,
// the server's messages read as the stream sees them (made by the envelope encoders, as the
// session writes them), and events read back as EventSource would.

#include "proto/sse.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/envelope.hpp"

using namespace wspush::proto;

namespace {

using strings = std::vector<std::string>;

/// The positions split_positions finds for `n` topics; none when it refuses.
strings split(std::string_view id, std::size_t n) {
  std::vector<std::string_view> out(n);
  if (!split_positions(id, out)) return {};
  return {out.begin(), out.end()};
}

std::string join(const strings& parts) {
  std::string s;
  for (std::size_t k = 0; k < parts.size(); ++k) s += (k ? "," : "") + parts[k];
  return s;
}

/// percent_decode into `room` bytes, with guard bytes behind them that must stay untouched.
struct decoded {
  std::size_t n;
  std::string text;  // empty when refused
};
decoded decode(std::string_view in, std::size_t room) {
  std::string buf(room + 16, '\xAA');
  const std::size_t n = percent_decode(in, {buf.data(), room});
  CHECK(buf.substr(room) == std::string(16, '\xAA'));
  return {n, n == SIZE_MAX ? std::string() : buf.substr(0, n)};
}
decoded decode(std::string_view in) { return decode(in, in.size()); }

/// One server message, as the session's encoders write it.
template <class Encode>
std::string encoded(Encode encode) {
  std::string out(4096, '\0');
  const std::size_t n = encode(std::span<char>(out.data(), out.size()));
  REQUIRE(n > 0);
  out.resize(n);
  return out;
}

bool inside(std::string_view part, std::string_view whole) {
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

/// What for_each_subbed_entry reports: `lost:T` and `at:T=P`, in order; "false" last when it
/// returns false.
strings subbed_entries(std::string_view json) {
  strings out;
  const bool ok = for_each_subbed_entry(json, [&](std::string_view topic, bool lost, std::string_view pos) {
    if (lost) {
      CHECK(pos.empty());
      out.push_back("lost:" + std::string(topic));
    } else {
      out.push_back("at:" + std::string(topic) + "=" + std::string(pos));
    }
  });
  if (!ok) out.push_back("false");
  return out;
}

/// encode_sse into exactly sse_bound bytes (guard bytes behind): the event as written.
std::string sse(std::string_view event, std::string_view id, std::string_view data) {
  const std::size_t bound = sse_bound(event, id, data);
  std::string buf(bound + 16, '\xAA');
  const std::size_t n = encode_sse(event, id, data, {buf.data(), bound});
  CHECK(n > 0);
  CHECK(n <= bound);
  CHECK(buf.substr(bound) == std::string(16, '\xAA'));
  return buf.substr(0, n);
}

/// One event read as EventSource reads a stream (WHATWG "Interpreting an event stream"): lines
/// end in CRLF, LF or CR; `field: value` loses one space after the colon; `data` lines join with
/// LF; a blank line dispatches. `complete` is false when the stream does not end with one.
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
    std::size_t end = 0;
    while (end < s.size() && s[end] != '\r' && s[end] != '\n') ++end;
    if (end == s.size()) return r;  // a line without its end
    const std::string_view line = s.substr(0, end);
    s.remove_prefix(end + (s[end] == '\r' && end + 1 < s.size() && s[end + 1] == '\n' ? 2 : 1));
    r.complete = line.empty();
    if (line.empty()) {
      if (any_data) {
        r.data = data.substr(0, data.size() - 1);
        ++r.dispatched;
      }
      data.clear();
      any_data = false;
      continue;
    }
    const std::size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (name == "event") r.event = value;
    if (name == "id") r.id = value;
    if (name == "data") data.append(value).push_back('\n'), any_data = true;
  }
  return r;
}

/// The data as EventSource hands it over: every CRLF, CR or LF a LF.
std::string as_lf(std::string_view data) {
  std::string out;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
    out.push_back(data[i] == '\r' ? '\n' : data[i]);
  }
  return out;
}

}  // namespace

TEST_CASE("sse: is_position", "[sse]") {
  CHECK(is_position(""));
  CHECK(is_position("k3f9:18"));
  CHECK(is_position("1700000000000-0"));
  CHECK(is_position("!~#$%&'()*+-./:;<=>?@[]^_`{|}"));
  CHECK(is_position(std::string(max_id_bytes, 'x')));
  CHECK_FALSE(is_position(std::string(max_id_bytes + 1, 'x')));
  for (std::string_view bad : {",", "\"", "\\", " ", "\t", "\n", "\r", "\x01", "\x1f", "\x7f", "\x80", "\xc3\xa9"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_position(bad));
    CHECK_FALSE(is_position("k3f9" + std::string(bad) + "18"));
  }
  CHECK_FALSE(is_position(std::string_view("a\0b", 3)));
}

TEST_CASE("sse: split_positions takes exactly one position per topic", "[sse]") {
  CHECK(split("k3f9:18", 1) == strings{"k3f9:18"});
  CHECK(split("k3f9:18,k3f9:5", 2) == strings{"k3f9:18", "k3f9:5"});
  CHECK(split("a,b,c", 3) == strings{"a", "b", "c"});
  // too few, too many
  CHECK(split("a,b", 3).empty());
  CHECK(split("a", 2).empty());
  CHECK(split("a,b,c", 2).empty());
  CHECK(split("a,b", 1).empty());
  CHECK(split("a,b,", 2).empty());  // a trailing comma is one more, empty, position
  CHECK(split(",a,b", 2).empty());
  // no topics: no id fits
  CHECK_FALSE(split_positions("", {}));
  CHECK_FALSE(split_positions("a", {}));
  // empty positions (live from now) anywhere
  CHECK(split("", 1) == strings{""});
  CHECK(split(",", 2) == strings{"", ""});
  CHECK(split(",b", 2) == strings{"", "b"});
  CHECK(split("a,", 2) == strings{"a", ""});
  CHECK(split("a,,c", 3) == strings{"a", "", "c"});
  CHECK(split(",,", 3) == strings{"", "", ""});
  CHECK(split("", 2).empty());
  // the views point into the id
  const std::string id = "k3f9:18,k3f9:5";
  std::array<std::string_view, 2> out;
  REQUIRE(split_positions(id, out));
  CHECK(out[0].data() == id.data());
  CHECK(out[1].data() == id.data() + 8);
}

TEST_CASE("sse: split_positions refuses what is not a position", "[sse]") {
  for (std::string_view bad : {"\"", "\\", " ", "\t", "\x01", "\x1f", "\x7f", "\x80"}) {
    const std::string p = "k3f9" + std::string(bad) + "18";
    CAPTURE(p);
    CHECK(split(p, 1).empty());
    CHECK(split(p + ",k3f9:5", 2).empty());     // first
    CHECK(split("k3f9:5," + p, 2).empty());     // last
    CHECK(split("a," + p + ",c", 3).empty());   // between
  }
  CHECK(split(std::string_view("a\0b", 3), 1).empty());
  CHECK(split(" k3f9:18", 1).empty());  // not trimmed: the header's OWS is gone already
  CHECK(split("k3f9:18 ", 1).empty());
  // 64 bytes a position, not 65, wherever it stands
  const std::string p64(max_id_bytes, 'x'), p65(max_id_bytes + 1, 'x');
  CHECK(split(p64, 1) == strings{p64});
  CHECK(split(p65, 1).empty());
  CHECK(split(p64 + "," + p64, 2) == strings{p64, p64});
  CHECK(split(p65 + ",a", 2).empty());
  CHECK(split("a," + p65, 2).empty());
  // the longest id: max_sse_topics positions of max_id_bytes
  const strings longest(max_sse_topics, p64);
  const std::string id = join(longest);
  CHECK(id.size() <= max_sse_id_bytes);
  CHECK(split(id, max_sse_topics) == longest);
  CHECK(split(id, max_sse_topics - 1).empty());
}

TEST_CASE("sse: percent_decode", "[sse]") {
  CHECK(decode("").n == 0);
  CHECK(decode("mailbox:42").text == "mailbox:42");
  CHECK(decode("mailbox%3A42").text == "mailbox:42");
  CHECK(decode("mailbox%3a42").text == "mailbox:42");
  CHECK(decode("%41%4a%4A%6f%6F").text == "AJJoo");
  CHECK(decode("k3f9%3A18%2Ck3f9%3A5").text == "k3f9:18,k3f9:5");
  CHECK(decode("a+b").text == "a b");
  CHECK(decode("+").text == " ");
  CHECK(decode("%2B").text == "+");  // an encoded plus stays one
  CHECK(decode("%25").text == "%");
  CHECK(decode("%25%32%35").text == "%25");  // decoded once
  CHECK(decode("%00").text == std::string(1, '\0'));
  CHECK(decode("%FF%ff").text == "\xff\xff");
  const decoded d = decode("a%3Ab");
  CHECK(d.n == 3);
  CHECK(d.text == "a:b");
  // bad escapes: truncated, not hex
  for (std::string_view bad : {"%", "%4", "a%4", "%%", "%%41", "%zz", "%4z", "%z4", "%g0", "%0g", "% 4", "%-1",
                               "%+1", "%x41", "100%", "a%3Ab%"}) {
    CAPTURE(bad);
    CHECK(decode(bad).n == SIZE_MAX);
    CHECK(decode(bad, 64).n == SIZE_MAX);
  }
  // a truncated escape is refused even with hex digits behind the view
  CHECK(decode(std::string_view("%41", 2)).n == SIZE_MAX);
  CHECK(decode(std::string_view("a%4F", 3), 8).n == SIZE_MAX);
  CHECK(decode(std::string_view("%4142", 1)).n == SIZE_MAX);
}

TEST_CASE("sse: percent_decode within its room", "[sse]") {
  CHECK(decode("a%3Ab", 3).text == "a:b");  // exactly the room
  CHECK(decode("a%3Ab", 2).n == SIZE_MAX);
  CHECK(decode("a%3A", 1).n == SIZE_MAX);
  CHECK(decode("%3A", 1).text == ":");
  CHECK(decode("%3A", 0).n == SIZE_MAX);
  CHECK(decode("a", 0).n == SIZE_MAX);
  CHECK(decode("", 0).n == 0);
  CHECK(decode("abcdef", 5).n == SIZE_MAX);
  CHECK(decode("abcdef", 6).text == "abcdef");
  CHECK(decode("a+b", 2).n == SIZE_MAX);
  // decoded is never longer than encoded
  for (std::string_view in : {"a", "%41", "+", "k3f9%3A18%2Ck3f9%3A5", "%41%42+c"}) {
    const decoded d = decode(in);
    CHECK(d.n <= in.size());
  }
}

TEST_CASE("sse: classify_message on what the server writes", "[sse]") {
  const std::string event =
      encoded([](std::span<char> b) { return encode_event("mailbox:42", "k3f9:18", R"({"text":"a \"b\"","n":[1,2]})", b); });
  sse_message m = classify_message(event);
  CHECK(m.kind == sse_message::event);
  CHECK(m.topic == "mailbox:42");
  CHECK(m.id == "k3f9:18");
  CHECK(m.op.empty());
  CHECK(inside(m.topic, event));
  CHECK(inside(m.id, event));
  for (std::string_view data : {"1", "\"s\"", "null", "[]", R"({"topic":"x","id":"y"})"}) {
    const std::string e = encoded([&](std::span<char> b) { return encode_event("news:sport", "1700000000000-0", data, b); });
    CAPTURE(e);
    m = classify_message(e);
    CHECK(m.kind == sse_message::event);
    CHECK(m.topic == "news:sport");
    CHECK(m.id == "1700000000000-0");
  }

  const std::array<std::string_view, 2> topics = {"mailbox:42", "news:sport"};
  const std::array<std::string_view, 1> lost = {"news:sport"};
  const std::array<std::string_view, 2> at = {"k3f9:17", ""};
  const std::string replies[] = {
      encoded([&](std::span<char> b) { return encode_subbed(topics, {}, b); }),
      encoded([&](std::span<char> b) { return encode_subbed(topics, lost, b, at); }),
      encoded([&](std::span<char> b) { return encode_unsubbed(topics, b); }),
      encoded([&](std::span<char> b) { return encode_error(client_error::forbidden, "mailbox:42", b); }),
      encoded([&](std::span<char> b) { return encode_error(client_error::too_many_subscriptions, {}, b); }),
      encoded([&](std::span<char> b) { return encode_authed(1735689600, topics, b); }),
      std::string(heartbeat_ping),
      R"({"op":"lost","topics":["news:sport"]})",  // the bus's notice (server/bus/redis_bus_parts.hpp)
  };
  const std::string_view ops[] = {"subbed", "subbed", "unsubbed", "error", "error", "authed", "ping", "lost"};
  for (std::size_t k = 0; k < std::size(replies); ++k) {
    CAPTURE(replies[k]);
    m = classify_message(replies[k]);
    CHECK(m.kind == sse_message::reply);
    CHECK(m.op == ops[k]);
    CHECK(inside(m.op, replies[k]));
    CHECK(m.topic.empty());
    CHECK(m.id.empty());
  }
  // a publish's answer has no form on a stream (it cannot publish)
  CHECK(classify_message(encoded([](std::span<char> b) { return encode_published("18", b); })).kind == sse_message::other);
}

TEST_CASE("sse: classify_message on anything else", "[sse]") {
  for (std::string_view junk : {
           "",
           "{",
           "null",
           "[1]",
           R"("op")",
           R"({"topic":)",
           R"({"topic":"t")",
           R"({"topic":"t)",
           R"({"topic":t,"id":"1"})",
           R"({"topic":"t","id":)",
           R"({"topic":"t","id":"1)",
           R"({"topic":"t","id":1})",
           R"({"topic":"t", "id":"1"})",
           R"({"topic":"t","data":1,"id":"1"})",
           R"({"id":"1","topic":"t"})",
           R"( {"topic":"t","id":"1"})",
           R"({ "topic":"t","id":"1"})",
           R"({"op":)",
           R"({"op":"subbed)",
           R"({"op":""})",
           R"({"op":5})",
           R"({"op":"Subbed"})",
           R"({"op":"sub_bed"})",
           R"({"op":"sub bed"})",
           R"({"op":"ping2"})",
           R"({"op" :"ping"})",
           R"({"Op":"ping"})",
       }) {
    CAPTURE(junk);
    CHECK(classify_message(junk).kind == sse_message::other);
  }
}

TEST_CASE("sse: for_each_subbed_entry", "[sse]") {
  const std::array<std::string_view, 3> topics = {"mailbox:42", "news:sport", "team:7"};
  const std::array<std::string_view, 1> lost = {"news:sport"};
  const std::array<std::string_view, 2> two_lost = {"mailbox:42", "team:7"};
  const std::array<std::string_view, 3> at = {"k3f9:17", "", "1700000000000-0"};
  const std::array<std::string_view, 3> all_at = {"e:1", "e:2", "e:3"};
  const std::array<std::string_view, 3> none_at = {"", "", ""};
  auto subbed = [&](std::span<const std::string_view> l, std::span<const std::string_view> a) {
    return encoded([&](std::span<char> b) { return encode_subbed(topics, l, b, a); });
  };
  CHECK(subbed_entries(subbed({}, {})).empty());
  CHECK(subbed_entries(subbed({}, none_at)).empty());
  CHECK(subbed_entries(subbed(lost, {})) == strings{"lost:news:sport"});
  CHECK(subbed_entries(subbed(two_lost, {})) == strings{"lost:mailbox:42", "lost:team:7"});
  CHECK(subbed_entries(subbed({}, at)) == strings{"at:mailbox:42=k3f9:17", "at:team:7=1700000000000-0"});
  CHECK(subbed_entries(subbed(lost, at)) ==
        strings{"lost:news:sport", "at:mailbox:42=k3f9:17", "at:team:7=1700000000000-0"});
  CHECK(subbed_entries(subbed(two_lost, all_at)) ==
        strings{"lost:mailbox:42", "lost:team:7", "at:mailbox:42=e:1", "at:news:sport=e:2", "at:team:7=e:3"});
  // the views point into the message
  const std::string m = subbed(lost, at);
  for_each_subbed_entry(m, [&](std::string_view topic, bool, std::string_view pos) {
    CHECK(inside(topic, m));
    if (!pos.empty()) CHECK(inside(pos, m));
  });
}

TEST_CASE("sse: for_each_subbed_entry refuses other shapes", "[sse]") {
  const std::array<std::string_view, 1> topics = {"a"};
  // other messages
  CHECK(subbed_entries(encoded([&](std::span<char> b) { return encode_unsubbed(topics, b); })) == strings{"false"});
  CHECK(subbed_entries(encoded([&](std::span<char> b) { return encode_error(client_error::forbidden, "a", b); })) ==
        strings{"false"});
  CHECK(subbed_entries(encoded([&](std::span<char> b) { return encode_event("a", "1", "1", b); })) == strings{"false"});
  CHECK(subbed_entries(R"({"op":"lost","topics":["a"]})") == strings{"false"});
  CHECK(subbed_entries("") == strings{"false"});
  // not the head encode_subbed writes
  CHECK(subbed_entries(R"({"op":"subbed"})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"]})") == strings{"false"});  // no lost
  CHECK(subbed_entries(R"({ "op":"subbed","topics":["a"],"lost":["a"]})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbedx","topics":["a"],"lost":["a"]})") == strings{"false"});
  // a broken lost list (the entries before the break have been reported)
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[)") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":["a)") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":["a",)") == strings{"lost:a", "false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[a]})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[1]})") == strings{"false"});
  // a broken at map
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{)") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a")") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a":)") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a":"1)") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a":"1")") == strings{"at:a=1", "false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a":1}})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a" :"1"}})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a""1"}})") == strings{"false"});
  CHECK(subbed_entries(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a","1"}})") == strings{"false"});
}

TEST_CASE("sse: encode_sse", "[sse]") {
  CHECK(sse("", "", "x") == "data: x\n\n");
  CHECK(sse("", "", R"({"topic":"a","id":"1","data":2})") == "data: {\"topic\":\"a\",\"id\":\"1\",\"data\":2}\n\n");
  CHECK(sse("subbed", "", "x") == "event: subbed\ndata: x\n\n");
  CHECK(sse("", "k3f9:18", "x") == "id: k3f9:18\ndata: x\n\n");
  CHECK(sse("subbed", "k3f9:18,", "x") == "event: subbed\nid: k3f9:18,\ndata: x\n\n");
  // every line break of the data starts another data line
  CHECK(sse("", "", "a\nb") == "data: a\ndata: b\n\n");
  CHECK(sse("", "", "a\r\nb") == "data: a\ndata: b\n\n");
  CHECK(sse("", "", "a\rb") == "data: a\ndata: b\n\n");
  CHECK(sse("", "", "a\n\nb") == "data: a\ndata: \ndata: b\n\n");
  CHECK(sse("", "", "a\r\n\r\nb") == "data: a\ndata: \ndata: b\n\n");
  CHECK(sse("", "", "a\n\rb") == "data: a\ndata: \ndata: b\n\n");  // LF CR is two breaks
  CHECK(sse("", "", "a\r\rb") == "data: a\ndata: \ndata: b\n\n");
  CHECK(sse("", "", "a\n") == "data: a\ndata: \n\n");
  CHECK(sse("", "", "a\r\n") == "data: a\ndata: \n\n");
  CHECK(sse("", "", "a\r") == "data: a\ndata: \n\n");
  CHECK(sse("", "", "\n") == "data: \ndata: \n\n");
  CHECK(sse("", "", "\r\n") == "data: \ndata: \n\n");
  CHECK(sse("", "", "\na") == "data: \ndata: a\n\n");
  CHECK(sse("", "", "") == "data: \n\n");
  CHECK(sse("e", "i", "") == "event: e\nid: i\ndata: \n\n");
  CHECK(sse({}, {}, {}) == "data: \n\n");  // views that hold no pointer (UBSan checks memcpy's)
  // leading spaces and colons are the data's own: one space follows `data:`
  CHECK(sse("", "", " a: b") == "data:  a: b\n\n");
}

TEST_CASE("sse: encode_sse as EventSource reads it", "[sse]") {
  for (std::string_view data : {"x", "", "a\nb", "a\r\nb", "a\rb", "a\n", "a\r", "a\r\n", "\n", "\r", "\r\n", "\n\r",
                                "\r\n\r\n", "a\n\n\nb", " lead", "a:b", "data: x", "\n\n", "a\r\r\n\nb"}) {
    CAPTURE(data);
    for (std::string_view event : {"", "subbed"}) {
      const received r = read_stream(sse(event, "k3f9:18", data));
      CHECK(r.complete);
      CHECK(r.dispatched == 1);
      CHECK(r.event == event);
      CHECK(r.id == "k3f9:18");
      CHECK(r.data == as_lf(data));
    }
  }
}

TEST_CASE("sse: encode_sse needs sse_bound bytes and writes no more", "[sse]") {
  CHECK(sse_bound("", "", "") == std::string_view("data: \n\n").size());
  CHECK(sse_bound("", "", "x") == std::string_view("data: x\n\n").size());
  CHECK(sse_bound("subbed", "k3f9:18", "x") == std::string_view("event: subbed\nid: k3f9:18\ndata: x\n\n").size());
  const std::string_view cases[][3] = {
      {"", "", ""},        {"", "", "x"},        {"subbed", "k3f9:18,k3f9:5", R"({"op":"subbed"})"},
      {"", "", "a\nb"},    {"", "", "a\r\nb"},   {"e", "", "\r\n\r\n"},
      {"", "i", "\r\r\r"}, {"", "", "a\n\rb\n"}, {"error", "", std::string_view("a\0b", 3)},
  };
  for (const auto& [event, id, data] : cases) {
    CAPTURE(event, id, data);
    const std::size_t bound = sse_bound(event, id, data);
    std::string buf(bound + 1, '\0');
    const std::size_t n = encode_sse(event, id, data, {buf.data(), bound});
    CHECK(n > 0);
    CHECK(n <= bound);
    if (data.find_first_of("\r\n") == std::string_view::npos) CHECK(n == bound);  // exact without line breaks
    CHECK(encode_sse(event, id, data, {buf.data(), bound + 1}) == n);
    // a buffer under the bound gets 0
    for (std::size_t k = 0; k < bound; ++k) {
      std::string small(k, '\0');
      CAPTURE(k);
      CHECK(encode_sse(event, id, data, {small.data(), small.size()}) == 0);
    }
  }
  CHECK(encode_sse("", "", "x", {}) == 0);
}
