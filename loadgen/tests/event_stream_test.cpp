// The event-stream reader (--transport sse) and the request that opens a stream: events split
// at every byte boundary, several data lines, comments, CRLF and CR line ends, bounded spills,
// and the server's own encoder (proto::encode_sse) read back.
#include "loadgen/event_stream.hpp"
#include "loadgen/wire.hpp"
#include "proto/sse.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace wspush::loadgen;

namespace {

struct seen_event {
  std::string name, data, id;
  bool has_id;
  bool operator==(const seen_event&) const = default;
};

struct collect {
  std::vector<seen_event> events;
  int comments = 0;
  std::vector<std::string> retries;
  void on_event(const sse_event& e) {
    events.push_back({std::string(e.name), std::string(e.data), std::string(e.id), e.has_id});
  }
  void on_comment() { ++comments; }
  void on_retry(std::string_view v) { retries.emplace_back(v); }
};

std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// Reads `stream` in pieces cut at `cuts` (ascending), with a fresh reader.
collect read_cut(std::string_view stream, std::initializer_list<std::size_t> cuts, sse_spill_pool& pool) {
  sse_reader r;
  collect c;
  std::size_t from = 0;
  for (const std::size_t at : cuts) {
    r.consume(bytes(stream.substr(from, at - from)), c, pool);
    from = at;
  }
  r.consume(bytes(stream.substr(from)), c, pool);
  r.reset(pool);
  return c;
}

/// What the server writes on a stream of mailbox 42: `subbed`, a keepalive, two events, one
/// whose data has line breaks, `lost`, and the close.
const std::string k_stream =
    "event: subbed\nid: k3f9:17\n"
    "data: {\"op\":\"subbed\",\"topics\":[\"mailbox:42\"],\"lost\":[],\"at\":{\"mailbox:42\":\"k3f9:17\"}}\n\n"
    ":\n\n"
    "id: k3f9:18\ndata: {\"topic\":\"mailbox:42\",\"id\":\"k3f9:18\",\"data\":{\"s\":0,\"t\":99}}\n\n"
    "id: k3f9:19\ndata: {\"topic\":\"mailbox:42\",\"id\":\"k3f9:19\",\ndata: \"data\":{\"s\":1,\ndata: \"t\":100}}\n\n"
    "event: lost\ndata: {\"op\":\"lost\",\"topic\":\"mailbox:42\"}\n\n"
    "retry: 4321\n\n";

const std::vector<seen_event> k_events = {
    {"subbed", R"({"op":"subbed","topics":["mailbox:42"],"lost":[],"at":{"mailbox:42":"k3f9:17"}})", "k3f9:17", true},
    {"", R"({"topic":"mailbox:42","id":"k3f9:18","data":{"s":0,"t":99}})", "k3f9:18", true},
    {"", "{\"topic\":\"mailbox:42\",\"id\":\"k3f9:19\",\n\"data\":{\"s\":1,\n\"t\":100}}", "k3f9:19", true},
    {"lost", R"({"op":"lost","topic":"mailbox:42"})", "", false},
};

std::string with_line_ends(std::string_view lf, std::string_view end) {
  std::string out;
  for (const char ch : lf) {
    if (ch == '\n') out += end;
    else out += ch;
  }
  return out;
}

void check_stream(const collect& c) {
  CHECK(c.events == k_events);
  CHECK(c.comments == 1);
  CHECK(c.retries == std::vector<std::string>{"4321"});
}

}  // namespace

TEST_CASE("event stream: every split in two and in three reads, LF, CRLF and CR") {
  for (const std::string_view end : {"\n", "\r\n", "\r"}) {
    const std::string stream = with_line_ends(k_stream, end);
    sse_spill_pool pool;
    check_stream(read_cut(stream, {}, pool));
    for (std::size_t a = 0; a <= stream.size(); ++a) {
      check_stream(read_cut(stream, {a}, pool));
      for (std::size_t b = a; b <= stream.size(); b += 7) check_stream(read_cut(stream, {a, b}, pool));
    }
    for (std::size_t step = 1; step <= stream.size(); ++step) {   // every step: byte by byte, and more
      sse_reader r;
      collect c;
      for (std::size_t at = 0; at < stream.size(); at += step) {
        r.consume(bytes(std::string_view(stream).substr(at, step)), c, pool);
      }
      check_stream(c);
      CHECK(pool.leased() == 0);   // nothing cut at the end: every spill given back
    }
    CHECK(pool.leased() == 0);
  }
}

TEST_CASE("event stream: a CRLF cut between its CR and its LF ends one line") {
  sse_spill_pool pool;
  const collect c = read_cut("data: a\r\n\r\ndata: b\r\n\r\n", {8, 10}, pool);   // "data: a\r" | "\n\r" | "\ndata..."
  CHECK(c.events == std::vector<seen_event>{{"", "a", "", false}, {"", "b", "", false}});
}

TEST_CASE("event stream: data lines, fields and comments as EventSource reads them") {
  sse_spill_pool pool;
  // several data lines joined with LF, an empty one kept; no space after the colon; only one
  // space dropped; a line without a colon is a field with an empty value
  CHECK(read_cut("data: a\ndata\ndata:b\ndata:  c\n\n", {}, pool).events ==
        std::vector<seen_event>{{"", "a\n\nb\n c", "", false}});
  // comments of any text, unknown fields and an event of no data and no id: nothing dispatched
  const collect quiet = read_cut(": hello\n:\nfoo: bar\nevent: x\n\n\n\n", {}, pool);
  CHECK(quiet.events.empty());
  CHECK(quiet.comments == 2);
  // an id alone is handed over (EventSource keeps it as the last event id); an empty id is one
  CHECK(read_cut("id: e:5\n\nid\ndata: x\n\n", {}, pool).events ==
        std::vector<seen_event>{{"", "", "e:5", true}, {"", "x", "", true}});
  // the last id: and event: of an event win
  CHECK(read_cut("id: 1\nevent: a\nid: 2\nevent: b\ndata: x\n\n", {}, pool).events ==
        std::vector<seen_event>{{"b", "x", "2", true}});
  // a stream's end without the blank line: the event is not complete, nothing is handed over
  CHECK(read_cut("data: x\n", {}, pool).events.empty());
  CHECK(pool.leased() == 0);
}

TEST_CASE("event stream: a connection keeps a bounded spill only while an event is cut") {
  sse_spill_pool pool;
  sse_reader r;
  collect c;
  const std::string big(1000, 'x'), long_id(300, 'i');
  const std::string stream = "id: " + long_id + "\ndata: " + big + "\n\nid: e:2\ndata: " + big + "\ndata: y\n\n";
  r.consume(bytes(std::string_view(stream).substr(0, 600)), c, pool);
  CHECK(pool.leased() == 1);
  r.consume(bytes(std::string_view(stream).substr(600)), c, pool);
  CHECK(pool.leased() == 0);
  REQUIRE(c.events.size() == 2);
  CHECK(c.events[0].data == big.substr(0, sse_reader::keep_bytes));   // its first keep_bytes
  CHECK_FALSE(c.events[0].has_id);                                     // an id that did not fit is not one
  CHECK(c.events[1].data == big.substr(0, sse_reader::keep_bytes));   // joined in the spill: as much as fits
  CHECK(c.events[1].id == "e:2");
  // whole in one read with one data line: all of it, where it lies
  const collect whole = read_cut("data: " + big + "\n\n", {}, pool);
  REQUIRE(whole.events.size() == 1);
  CHECK(whole.events[0].data == big);
  // a reset gives back what a cut event held
  r.consume(bytes("data: half"), c, pool);
  CHECK(pool.leased() == 1);
  r.reset(pool);
  CHECK(pool.leased() == 0);
}

TEST_CASE("event stream: the server's encoder read back, data with line breaks rejoined with LF") {
  const std::vector<std::string> datas = {R"({"topic":"mailbox:42","id":"k3f9:18","data":{"a":1}})",
                                          "{\"topic\":\"t\",\"id\":\"1\",\"data\":\"a\nb\"}",
                                          "{\"x\":\r\n1,\r\"y\":\n\n2}", ""};
  std::string stream;
  std::vector<seen_event> want;
  for (const std::string& d : datas) {
    std::vector<char> out(wspush::proto::sse_bound("", "k3f9:18,k3f9:5", d));
    const std::size_t n = wspush::proto::encode_sse("", "k3f9:18,k3f9:5", d, out);
    REQUIRE(n > 0);
    stream.append(out.data(), n);
    std::string lf;   // CR, LF and CRLF in the data each become one LF
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (d[i] == '\r' && i + 1 < d.size() && d[i + 1] == '\n') continue;
      lf += d[i] == '\r' ? '\n' : d[i];
    }
    want.push_back({"", lf, "k3f9:18,k3f9:5", true});
  }
  sse_spill_pool pool;
  for (std::size_t a = 0; a <= stream.size(); ++a) CHECK(read_cut(stream, {a}, pool).events == want);
}

TEST_CASE("event stream: the request names the topic, the token and where it resumes") {
  const std::string r = make_stream_request("/sse", "127.0.0.1:80", "lg-mb-7", "a.b.c", "");
  CHECK(r.starts_with("GET /sse?topics=lg-mb-7&token=a.b.c HTTP/1.1\r\nHost: 127.0.0.1:80\r\n"));
  CHECK(r.find("\r\nAccept: text/event-stream\r\n") != std::string::npos);
  CHECK(r.find("Last-Event-ID") == std::string::npos);
  CHECK(r.ends_with("\r\n\r\n"));
  const std::string resumed = make_stream_request("/sse?x=1", "h:1", "mail box,1:2", "", "k3f9:18");
  CHECK(resumed.starts_with("GET /sse?x=1&topics=mail%20box%2C1:2 HTTP/1.1\r\n"));
  CHECK(resumed.find("\r\nLast-Event-ID: k3f9:18\r\n") != std::string::npos);
  const upgrade_answer ok = check_stream_response(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\r\n");
  CHECK(ok.status == 200);
  CHECK(ok.accept_ok);
  CHECK(check_stream_response("HTTP/1.1 200 OK\r\ncontent-type: Text/Event-Stream; charset=utf-8\r\n\r\n").accept_ok);
  CHECK_FALSE(check_stream_response("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n").accept_ok);
  CHECK_FALSE(check_stream_response("HTTP/1.1 200 OK\r\nContent-Type: text/event-streamx\r\n\r\n").accept_ok);
  CHECK(check_stream_response("HTTP/1.1 403 Forbidden\r\n\r\n").status == 403);
  CHECK(check_stream_response("garbage\r\n\r\n").status == 0);
}
