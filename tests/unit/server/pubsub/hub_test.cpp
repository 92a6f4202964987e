// The hub without shards: ids, history, the event frame and its topic.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/ws_frame.hpp"
#include "server/pubsub/hub.hpp"

using namespace wspush;
using namespace wspush::server;

TEST_CASE("hub: a publish is framed once, stored in the history with its id, data byte for byte") {
  pool::buffer_pool buffers;
  std::vector<shard*> none;
  hub bus(pubsub::history_options{.size_per_topic = 2, .epoch = "e1"}, buffers, none);
  pubsub::history_id id;
  REQUIRE(bus.publish("mailbox:42", R"({"a": [1, 2.50]})", id, true));
  CHECK(id.view() == "e1:1");
  std::string big(70000, 'x');  // a 64-bit length frame header
  REQUIRE(bus.publish("mailbox:42", "\"" + big + "\"", id, true));
  CHECK(id.view() == "e1:2");

  std::vector<std::string> frames;
  auto r = bus.history().replay("mailbox:42", "e1:0", 100, 0, [&](std::uint64_t, const pool::frame_ref& f) {
    frames.emplace_back(reinterpret_cast<const char*>(f.bytes().data()), f.bytes().size());
  });
  CHECK_FALSE(r.lost);
  REQUIRE(frames.size() == 2);
  auto as_bytes = [](const std::string& s) {
    return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  };
  auto h = proto::parse_frame_header(as_bytes(frames[0]));
  REQUIRE(h.status == proto::parse_status::done);
  CHECK(frames[0].substr(h.header.size) == R"({"topic":"mailbox:42","id":"e1:1","data":{"a": [1, 2.50]}})");
  CHECK(event_topic(as_bytes(frames[0])) == "mailbox:42");
  CHECK(event_topic(as_bytes(frames[1])) == "mailbox:42");  // 10-byte header
  CHECK(frames[1].size() > 70000);
}

TEST_CASE("hub: event_topic finds nothing in other frames") {
  auto topic = [](std::string s) {
    return std::string(event_topic({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}));
  };
  CHECK(topic("") == "");
  CHECK(topic(std::string("\x81\x05hello", 7)) == "");
  CHECK(topic(std::string("\x81\x0b{\"topic\":\"a", 13)) == "");  // no closing quote
  CHECK(topic(std::string("\x81\x0d{\"topic\":\"ab\"", 15)) == "ab");
}
