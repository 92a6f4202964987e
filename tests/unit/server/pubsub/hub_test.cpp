// The hub without shards: ids, history, the event frame and its topic, and ports that refuse.

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/ws_frame.hpp"
#include "server/pubsub/hub.hpp"

using namespace wspush;
using namespace wspush::server::pubsub;

namespace {

/// A shard's port as the hub sees it: keeps what it takes, refuses when told to.
struct fake_port final : event_port {
  std::vector<event> got;
  bool refuse = false, busy = false;
  int wakes = 0;
  bool offer(event&& e, bool) noexcept override {
    if (refuse) return false;
    got.push_back(std::move(e));
    return true;
  }
  void wake() noexcept override { ++wakes; }
  bool crowded() const noexcept override { return busy; }
};

std::string text(std::span<const std::uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

}  // namespace

TEST_CASE("hub: a publish is framed once, stored in the history with its id, data byte for byte") {
  pool::buffer_pool buffers;
  hub h(history_options{.size_per_topic = 2, .epoch = "e1"}, buffers);
  fake_port a, b;
  h.attach({&a, &b});
  history_id id;
  REQUIRE(h.publish("mailbox:42", R"({"a": [1, 2.50]})", id, true) == publish_status::ok);
  CHECK(id.view() == "e1:1");
  std::string big(70000, 'x');  // a 64-bit length frame header
  REQUIRE(h.publish("mailbox:42", "\"" + big + "\"", id, false) == publish_status::ok);
  CHECK(id.view() == "e1:2");
  CHECK(a.wakes == 1);  // woken by the first publish only

  std::vector<std::string> frames;
  auto r = h.events().replay("mailbox:42", "e1:0", 100, 0, [&](std::uint64_t, const pool::frame_ref& f) {
    frames.push_back(text(f.bytes()));
  });
  CHECK_FALSE(r.lost);
  REQUIRE(frames.size() == 2);
  auto hd = proto::parse_frame_header({reinterpret_cast<const std::uint8_t*>(frames[0].data()), frames[0].size()});
  REQUIRE(hd.status == proto::parse_status::done);
  CHECK(frames[0].substr(hd.header.size) == R"({"topic":"mailbox:42","id":"e1:1","data":{"a": [1, 2.50]}})");
  CHECK(frames[1].size() > 70000);

  // Every port got each event: the same shared frame, its topic (pointing into that frame),
  // its history part and seq (the resume seam).
  for (fake_port* p : {&a, &b}) {
    REQUIRE(p->got.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
      const event& e = p->got[k];
      CHECK(e.topic == "mailbox:42");
      CHECK(e.topic.data() >= reinterpret_cast<const char*>(e.frame.bytes().data()));
      CHECK(e.topic.data() < reinterpret_cast<const char*>(e.frame.bytes().data() + e.frame.bytes().size()));
      CHECK(text(e.frame.bytes()) == frames[k]);
      CHECK(e.part == h.events().part_of("mailbox:42"));
    }
    CHECK(p->got[0].seq < p->got[1].seq);
  }
  CHECK(a.got[0].frame.bytes().data() == b.got[0].frame.bytes().data());  // encoded once
}

TEST_CASE("hub: a crowded shard makes the publish busy and a refusing port drops and counts, never waits") {
  pool::buffer_pool buffers;
  hub h(history_options{.size_per_topic = 4, .epoch = "e2"}, buffers);
  fake_port a, b;
  h.attach({&a, &b});
  history_id id;
  b.busy = true;
  CHECK(h.publish("t", "1", id, true) == publish_status::busy);
  CHECK(h.relay({}, "*") == publish_status::busy);
  CHECK(a.got.empty());
  CHECK(h.events().stats().entries == 0);  // refused before the history

  b.busy = false;
  b.refuse = true;  // its shard stopped (drained): the publish goes on for the others
  REQUIRE(h.publish("t", "2", id, true) == publish_status::ok);
  CHECK(a.got.size() == 1);
  CHECK(b.got.empty());
  CHECK(h.dropped() == 1);
  CHECK(h.events().stats().entries == 1);
}

TEST_CASE("hub: relay hands a ready frame to every port, outside the history") {
  pool::buffer_pool buffers;
  hub h(history_options{.epoch = "e3"}, buffers);
  fake_port a, b;
  h.attach({&a, &b});
  pool::lease l = buffers.acquire(16);
  std::memcpy(l.data(), "\x81\x02hi", 4);
  l.set_size(4);
  REQUIRE(h.relay(pool::frame_ref::adopt(std::move(l)), "*") == publish_status::ok);
  REQUIRE(a.got.size() == 1);
  REQUIRE(b.got.size() == 1);
  CHECK(a.got[0].topic == "*");
  CHECK(a.got[0].part == no_part);
  CHECK(text(b.got[0].frame.bytes()) == "\x81\x02hi");
  CHECK(h.events().stats().entries == 0);
}

TEST_CASE("hub: a publish with an idempotency key seen on the topic is answered with the first id and not offered") {
  pool::buffer_pool buffers;
  hub h(history_options{.epoch = "e1"}, buffers);
  fake_port a;
  h.attach({&a});
  history_id id;
  REQUIRE(h.publish("t", "1", id, true, "order-17") == publish_status::ok);
  const std::string first(id.view());
  REQUIRE(h.publish("t", "1", id, true, "order-17") == publish_status::ok);
  CHECK(id.view() == first);
  CHECK(a.got.size() == 1);
  CHECK(a.wakes == 1);  // nothing new: nobody woken
  REQUIRE(h.publish("u", "1", id, true, "order-17") == publish_status::ok);  // another topic: its own event
  CHECK(a.got.size() == 2);
  CHECK(h.events().stats().duplicates == 1);
}
