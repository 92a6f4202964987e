#include "loadgen/publisher.hpp"
#include "loadgen/wire.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace wspush::loadgen;

namespace {

struct collect {
  std::vector<std::string> messages;
  std::vector<std::string> pings;
  int closes = 0;
  void on_message(std::span<const std::uint8_t> m, std::uint8_t) {
    messages.emplace_back(reinterpret_cast<const char*>(m.data()), m.size());
  }
  void on_ping(std::span<const std::uint8_t> p) { pings.emplace_back(reinterpret_cast<const char*>(p.data()), p.size()); }
  void on_close(std::span<const std::uint8_t>) { ++closes; }
};

std::string server_frame(std::uint8_t first, std::string_view payload) {
  std::string f(1, static_cast<char>(first));
  if (payload.size() < 126) {
    f += static_cast<char>(payload.size());
  } else {
    f += static_cast<char>(126);
    f += static_cast<char>(payload.size() >> 8);
    f += static_cast<char>(payload.size() & 0xff);
  }
  return f + std::string(payload);
}

std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("wire: payload is JSON of the asked size and reads back") {
  std::vector<char> buf(512);
  for (std::size_t size : {16u, 48u, 64u, 300u}) {
    const std::size_t n = write_payload(buf, size, 123456, 987654321012345ull);
    const std::string_view p(buf.data(), n);
    CHECK(p.starts_with(R"({"s":123456,"t":987654321012345)"));
    CHECK(p.back() == '}');
    if (size >= 48) CHECK(n == size);
    const delivery d = read_delivery(p);
    CHECK(d.ok);
    CHECK(d.seq == 123456);
    CHECK(d.send_ns == 987654321012345ull);
    CHECK(d.topic.empty());
  }
}

TEST_CASE("wire: a pub/sub event yields topic, id and payload") {
  const std::string ev = R"({"topic":"lg-mb-42","id":"k3f9:18","data":{"s":7,"t":99,"p":"...."}})";
  const delivery d = read_delivery(ev);
  CHECK(d.ok);
  CHECK(d.seq == 7);
  CHECK(d.send_ns == 99);
  CHECK(d.topic == "lg-mb-42");
  CHECK(d.id == "k3f9:18");
  CHECK(classify(ev) == server_msg::event);
  CHECK_FALSE(read_delivery(R"({"s":x,"t":1})").ok);
  CHECK_FALSE(read_delivery("hello").ok);
  // another field order is still found, by search
  const delivery e = read_delivery(R"({"id":"k3f9:19","topic":"lg-mb-42","data":{"s":8,"t":100}})");
  CHECK(e.ok);
  CHECK(e.seq == 8);
  CHECK(e.topic == "lg-mb-42");
  CHECK(e.id == "k3f9:19");
  // cut short anywhere (a prefix of a cut message), never a misread
  for (std::size_t n = 0; n < ev.size(); ++n) {
    const delivery p = read_delivery(std::string_view(ev).substr(0, n));
    CHECK((!p.ok || (p.seq == 7 && p.send_ns == 99)));
  }
  CHECK_FALSE(read_delivery(R"({"s":1,"t":123456789012345678901})").ok);   // past 19 digits
}

TEST_CASE("wire: the memo answers as read_delivery does, and only for the same bytes") {
  delivery_memo memo("lg-fanout");
  std::vector<char> buf(128);
  auto event = [&](std::string_view topic, std::string_view id, std::uint64_t seq, std::uint64_t t) {
    const std::size_t n = write_payload(buf, 64, seq, t);
    return R"({"topic":")" + std::string(topic) + R"(","id":")" + std::string(id) + R"(","data":)" +
           std::string(buf.data(), n) + "}";
  };
  auto same = [](const delivery& a, const delivery& b) {
    return a.ok == b.ok && a.seq == b.seq && a.send_ns == b.send_ns && a.topic == b.topic && a.id == b.id;
  };
  const std::vector<std::string> messages = {
      event("lg-fanout", "e:1", 0, 123456789012345), event("lg-fanout", "e:1", 0, 123456789012345),   // a hit
      event("lg-mb-1", "e:1", 0, 123456789012345),    // same number, another topic: misdelivery stays visible
      event("lg-mb-2", "e:77", 0, 123456789012346),   // same number, another id and time
      event("lg-fanout", "e:2", 1, 123456789012399), event("lg-fanout", "e:2", 1, 12345678901239),   // one digit less
      std::string(buf.data(), write_payload(buf, 64, 1, 99)), std::string(buf.data(), write_payload(buf, 64, 1, 990)),
      R"({"op":"subbed","topics":["a"],"lost":[]})", R"({"topic":"t","id":"e:3","data":{"s":2,"t":5}})",
      R"({"topic":"t","id":"e:3","data":{"s":2,"t":5)", R"({"id":"e:3","topic":"t","data":{"s":2,"t":5}})"};
  for (int pass = 0; pass < 2; ++pass) {   // the second pass meets every head remembered
    for (const std::string& m : messages) {
      for (std::uint64_t expect : {0u, 1u, 2u}) CHECK(same(memo.read(m, expect), read_delivery(m)));
      for (std::size_t n = 0; n < m.size(); ++n) {   // cut short anywhere
        const std::string_view cut = std::string_view(m).substr(0, n);
        CHECK(same(memo.read(cut, 0), read_delivery(cut)));
      }
    }
  }
  CHECK(memo.read(messages[2], 0).topic == "lg-mb-1");
  CHECK(memo.read(messages[3], 0).id == "e:77");
  CHECK(memo.read(messages[5], 1).send_ns == 12345678901239);
  // only its own topic is remembered, so a hit vouches for the topic
  CHECK(memo.read(messages[0], 0).memo_topic);
  CHECK_FALSE(memo.read(messages[2], 0).memo_topic);
  CHECK_FALSE(memo.read(messages[2], 0).memo_topic);
  CHECK_FALSE(read_delivery(messages[0]).memo_topic);
  delivery_memo plain;   // a broadcast worker's: plain payloads have no topic
  const std::string& p = messages[6];
  CHECK_FALSE(plain.read(p, 1).memo_topic);
  CHECK(plain.read(p, 1).memo_topic);
  CHECK_FALSE(plain.read(messages[0], 0).memo_topic);
  CHECK_FALSE(plain.read(messages[0], 0).memo_topic);
}

TEST_CASE("wire: the memo keeps messages 4,000 apart, and a number 4,096 on is a miss, not a misread") {
  delivery_memo memo("lg-fanout");
  std::vector<char> buf(128);
  auto event = [&](std::uint64_t seq) {
    const std::size_t n = write_payload(buf, 64, seq, 1'000'000 + seq);
    return R"({"topic":"lg-fanout","id":"e:)" + std::to_string(seq) + R"(","data":)" + std::string(buf.data(), n) + "}";
  };
  // readers far ahead parse messages 0..3999 first; a reader behind still finds message 5
  for (std::uint64_t k = 0; k < 4000; ++k) CHECK(memo.read(event(k), k).seq == k);
  const std::string m5 = event(5);
  CHECK(memo.read(m5, 5).memo_topic);   // a hit: remembered, not parsed again
  // message 5 + 4096 lands in the same entry: the first read parses it, the old reader's
  // message 5 is then parsed again, and neither is mistaken for the other
  const std::string far = event(5 + 4096);
  const delivery f = memo.read(far, 5 + 4096);
  CHECK((f.ok && f.seq == 5 + 4096 && !f.memo_topic));
  const delivery again = memo.read(m5, 5);
  CHECK((again.ok && again.seq == 5 && again.send_ns == 1'000'005 && again.id == "e:5" && !again.memo_topic));
}

TEST_CASE("wire: same_bytes at every length and every differing byte") {
  std::string a(70, 'x');
  for (std::size_t n = 0; n <= a.size(); ++n) {
    std::string b = a;
    CHECK(same_bytes(a.data(), b.data(), n));
    for (std::size_t k = 0; k < n; ++k) {
      b[k] = 'y';
      CHECK_FALSE(same_bytes(a.data(), b.data(), n));
      b[k] = 'x';
    }
  }
}

TEST_CASE("wire: server messages are told apart") {
  CHECK(classify(R"({"op":"subbed","topics":["a"],"lost":[]})") == server_msg::subbed);
  CHECK(classify(R"({"op":"error","code":"forbidden","topic":"a"})") == server_msg::error);
  CHECK(classify(R"({"op":"unsubbed","topics":["a"]})") == server_msg::other);
  CHECK(classify(R"({"op":"lost","topics":["a"]})") == server_msg::lost);
  CHECK_FALSE(subbed_reports_lost(R"({"op":"subbed","topics":["a"],"lost":[]})"));
  CHECK(subbed_reports_lost(R"({"op":"subbed","topics":["a"],"lost":["a"]})"));
  CHECK(subbed_position(R"({"op":"subbed","topics":["a"],"lost":[]})").empty());
  CHECK(subbed_position(R"({"op":"subbed","topics":["m:1"],"lost":[],"at":{"m:1":"e:7"}})") == "e:7");
  CHECK(subbed_position(R"({"op":"subbed","topics":["a"],"lost":["a"],"at":{"a":"f0:17-18446744073709551615"}})") ==
        "f0:17-18446744073709551615");
  CHECK(subbed_position(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a)").empty());  // cut short
  CHECK(subbed_position(R"({"op":"subbed","topics":["a"],"lost":[],"at":{"a":"e:7)").empty());
}

TEST_CASE("wire: sub and pub messages") {
  CHECK(make_sub("t", "") == R"({"op":"sub","topics":["t"]})");
  CHECK(make_sub("t", "e:5") == R"({"op":"sub","topics":["t"],"since":{"t":"e:5"}})");
  CHECK(make_pub("t", R"({"s":1})") == R"({"op":"pub","topic":"t","data":{"s":1}})");
  CHECK(make_publish_body("t", R"({"s":1})") == R"({"topic":"t","data":{"s":1}})");
}

TEST_CASE("wire: upgrade request carries the token, response check reads the status") {
  const std::string r = make_upgrade_request("/ws", "127.0.0.1:80", "dGhlIHNhbXBsZSBub25jZQ==", "a.b.c");
  CHECK(r.starts_with("GET /ws?token=a.b.c HTTP/1.1\r\nHost: 127.0.0.1:80\r\n"));
  CHECK(r.ends_with("\r\n\r\n"));
  CHECK(expected_accept("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");   // RFC 6455 1.3
  const upgrade_answer ok = check_upgrade_response(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
      "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  CHECK(ok.status == 101);
  CHECK(ok.accept_ok);
  CHECK(check_upgrade_response("HTTP/1.1 101 OK\r\nSec-WebSocket-Accept: wrong\r\n\r\n", "x").accept_ok == false);
  CHECK(check_upgrade_response("HTTP/1.1 401 Unauthorized\r\n\r\n", "x").status == 401);
  CHECK(check_upgrade_response("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\r\n", "x").status == 503);
  CHECK(check_upgrade_response("garbage\r\n\r\n", "x").status == 0);
}

TEST_CASE("wire: frame reader handles any split of several frames") {
  const std::string big(300, 'x');
  const std::string stream = server_frame(0x81, "hello") + server_frame(0x89, "pp") + server_frame(0x01, "frag") +
                             server_frame(0x8a, "") + server_frame(0x80, "ment") + server_frame(0x81, big) +
                             server_frame(0x81, "") + server_frame(0x88, "\x03\xe9");
  spill_pool pool;
  for (std::size_t step = 1; step <= stream.size(); ++step) {
    frame_reader r;
    collect c;
    for (std::size_t at = 0; at < stream.size(); at += step) {
      REQUIRE(r.consume(bytes(std::string_view(stream).substr(at, step)), c, pool));
    }
    REQUIRE(c.messages.size() == 4);
    CHECK(c.messages[0] == "hello");
    CHECK(c.messages[1] == "fragment");
    // whole in one read: all of it, where it lies; cut: its first keep_bytes
    CHECK((c.messages[2] == big || c.messages[2] == big.substr(0, frame_reader::keep_bytes)));
    if (step == stream.size()) CHECK(c.messages[2] == big);
    CHECK(c.messages[3].empty());
    CHECK(c.pings == std::vector<std::string>{"pp"});
    CHECK(c.closes == 1);
    CHECK(pool.leased() == 0);   // nothing cut at the end: every spill given back
  }
}

TEST_CASE("wire: frame reader keeps a spill only while a frame is cut") {
  spill_pool pool;
  const std::string f = server_frame(0x81, "hello") + server_frame(0x81, "world");
  frame_reader r;
  collect c;
  REQUIRE(r.consume(bytes(std::string_view(f).substr(0, 9)), c, pool));   // "hello", then 2 bytes of "world"
  CHECK(c.messages == std::vector<std::string>{"hello"});
  CHECK(pool.leased() == 1);
  REQUIRE(r.consume(bytes(std::string_view(f).substr(9)), c, pool));
  CHECK(c.messages == std::vector<std::string>{"hello", "world"});
  CHECK(pool.leased() == 0);
  REQUIRE(r.consume(bytes(std::string_view(f).substr(0, 1)), c, pool));   // half a header
  CHECK(pool.leased() == 1);
  r.reset(pool);
  CHECK(pool.leased() == 0);
}

TEST_CASE("wire: frame reader refuses what a server must not send") {
  spill_pool pool;
  for (const std::string& bad : {std::string("\x81\x85" "abcd" "hello", 11),   // masked
                                 server_frame(0x80, "x"),                        // continuation without a start
                                 server_frame(0x09, "x"),                        // fragmented ping
                                 server_frame(0x91, "x"),                        // RSV1 without an extension
                                 server_frame(0x83, "x"),                        // reserved opcode
                                 server_frame(0x89, std::string(126, 'p')),      // control over 125 bytes
                                 server_frame(0x01, "a") + server_frame(0x81, "b")}) {   // a new message inside one
    for (std::size_t step : {std::size_t{1}, bad.size()}) {
      frame_reader r;
      collect c;
      bool ok = true;
      for (std::size_t at = 0; at < bad.size() && ok; at += step) ok = r.consume(bytes(std::string_view(bad).substr(at, step)), c, pool);
      CHECK_FALSE(ok);
      r.reset(pool);
    }
  }
  CHECK(pool.leased() == 0);
}

TEST_CASE("wire: sequence accounting tells gaps, duplicates and reordering apart") {
  seq_tracker t;
  seq_counters c;
  for (std::uint32_t s : {0u, 1u, 3u, 2u, 3u, 4u}) t.on_seq(s, c);
  CHECK(c.unique == 5);
  CHECK(c.gaps == 1);
  CHECK(c.reordered == 1);
  CHECK(c.duplicates == 1);
  t.on_seq(200, c);
  t.on_seq(1, c);   // far below the window
  CHECK(c.stale == 1);
}

TEST_CASE("wire: admin responses are read across any split, pipelined") {
  const std::string stream =
      "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"id\":\"e:1\"}"
      "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"id\":\"e:2\"}";
  for (std::size_t step = 1; step <= stream.size(); ++step) {
    response_reader r;
    std::vector<int> statuses;
    for (std::size_t at = 0; at < stream.size(); at += step) {
      REQUIRE(r.consume(std::string_view(stream).substr(at, step), [&](int s) { statuses.push_back(s); }));
    }
    CHECK(statuses == std::vector<int>{200, 503, 200});
  }
}
