// Namespaces: the longest prefix wins, and a history keeps each topic by its namespace's size
// and age (lanes: history.hpp).

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/pubsub/history.hpp"
#include "server/pubsub/namespaces.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::pubsub;

namespace {

constexpr std::uint64_t sec = 1'000'000'000ull;

topic_options with(std::uint32_t size, double ttl) {
  topic_options t;
  t.history_size = size;
  t.history_ttl = ttl;
  return t;
}

struct fixture {
  pool::buffer_pool buffers;
  namespaces spaces;
  history h;

  explicit fixture(namespaces s) : spaces(std::move(s)), h(options()) {}
  history_options options() {
    history_options o;
    o.parts = 2;  // many topics share a part: lanes of different ages side by side
    o.epoch = "ns";
    o.spaces = &spaces;
    return o;
  }
  std::string publish(std::string_view topic, std::uint64_t now) {
    std::string id;
    const append_result r = h.append(topic, now, [&](std::string_view i, std::uint64_t) {
      id = std::string(i);
      pool::lease l = buffers.acquire(64);
      std::memcpy(l.data(), i.data(), i.size());
      l.set_size(i.size());
      return pool::frame_ref::adopt(std::move(l));
    });
    REQUIRE(r.ok);
    return id;
  }
  std::vector<std::string> replay(std::string_view topic, std::uint64_t now, bool* lost = nullptr) {
    std::vector<std::string> ids;
    const replay_result r = h.replay(topic, "ns:0", UINT64_MAX, now, [&](std::uint64_t, const pool::frame_ref& f) {
      ids.emplace_back(reinterpret_cast<const char*>(f.bytes().data()), f.bytes().size());
    });
    if (lost) *lost = r.lost;
    return ids;
  }
};

}  // namespace

TEST_CASE("namespaces: the longest prefix a topic starts with wins, else the global options") {
  topic_options global = with(100, 300), mailbox = with(20, 86400), vip = with(5, 10);
  mailbox.client_publish = false;
  vip.join_leave = true;
  const namespaces s(global, {{"mailbox:", mailbox, "f:1"}, {"mailbox:vip:", vip, "f:5"}, {"team:", global, "f:9"}});
  CHECK(s.list().front().prefix == "mailbox:vip:");  // longest first
  CHECK(s.of("mailbox:42").history_size == 20);
  CHECK_FALSE(s.of("mailbox:42").client_publish);
  CHECK(s.of("mailbox:vip:7").history_size == 5);
  CHECK(s.of("mailbox:vip:7").join_leave);
  CHECK(s.prefix_of("mailbox:vip:7") == "mailbox:vip:");
  CHECK(s.of("mailbox").history_size == 100);  // not the prefix: shorter than it
  CHECK(s.of("room:1").history_size == 100);
  CHECK(&s.of("room:1") == &s.defaults());
  CHECK(s.prefix_of("room:1").empty());
  CHECK(s.index_of("room:1") == s.list().size());
  CHECK(&s.at(s.index_of("mailbox:1")) == &s.of("mailbox:1"));
  CHECK(s.max_history_size() == 100);
  CHECK(s.any_presence());  // join/leave needs presence
  CHECK(s.any_join_leave());
  CHECK_FALSE(namespaces(global, {{"a:", mailbox, ""}}).any_presence());
}

TEST_CASE("history: each topic keeps its namespace's number of events") {
  fixture x(namespaces(with(5, 300), {{"mailbox:", with(2, 300), ""}, {"log:", with(0, 300), ""}}));
  std::vector<std::string> mail, room;
  for (int k = 0; k < 6; ++k) mail.push_back(x.publish("mailbox:1", 0)), room.push_back(x.publish("room:1", 0));
  bool lost = false;
  CHECK(x.replay("mailbox:1", 0, &lost) == std::vector<std::string>(mail.end() - 2, mail.end()));
  CHECK(lost);
  CHECK(x.replay("room:1", 0) == std::vector<std::string>(room.end() - 5, room.end()));
  x.publish("log:1", 0);  // size 0: an id, nothing kept
  CHECK(x.replay("log:1", 0, &lost).empty());
  CHECK(lost);
  CHECK(x.h.stats().entries == 2 + 5);
}

TEST_CASE("history: each topic's entries leave at its namespace's age, whichever is older in the part") {
  fixture x(namespaces(with(100, 100), {{"short:", with(100, 1), ""}, {"long:", with(100, 1000), ""}}));
  // Appended in turns, so that every part holds entries of all three ages interleaved.
  std::vector<std::string> s, l, g;
  for (int k = 0; k < 8; ++k) {
    const std::string n = std::to_string(k);
    l.push_back(x.publish("long:" + n, 0));
    g.push_back(x.publish("room:" + n, 0));
    s.push_back(x.publish("short:" + n, 0));
  }
  // A replay never hands out an entry past its topic's age, whether or not a sweep ran.
  bool lost = false;
  CHECK(x.replay("short:3", 1 * sec, &lost).empty());
  CHECK(lost);
  CHECK(x.replay("room:3", 1 * sec) == std::vector<std::string>{g[3]});
  // The sweep takes every short entry out from behind the older-aged ones that stay.
  x.h.expire(1 * sec);
  CHECK(x.h.stats().entries == 16);
  CHECK(x.h.stats().topics == 16);
  x.h.expire(100 * sec);
  CHECK(x.h.stats().entries == 8);
  CHECK(x.replay("long:5", 100 * sec) == std::vector<std::string>{l[5]});
  CHECK(x.replay("room:5", 100 * sec, &lost).empty());
  CHECK(lost);
  // A new short entry among the long ones expires alone, and the long ones at their age.
  const std::string late = x.publish("short:1", 500 * sec);
  CHECK(x.replay("short:1", 500 * sec) == std::vector<std::string>{late});
  x.h.expire(501 * sec);
  CHECK(x.h.stats().entries == 8);
  x.h.expire(1000 * sec);
  CHECK(x.h.stats().entries == 0);
  CHECK(x.h.stats().bytes == 0);
}

TEST_CASE("history: the memory cap evicts the oldest entries first across the lanes") {
  // As without namespaces (history_test.cpp): 4 KiB blocks, room for ten, here of topics of
  // three ages in turn; exactly the ten newest stay, whichever lane holds them.
  const std::size_t block = pool::buffer_pool::block_footprint(4096);
  namespaces spaces(with(100, 100), {{"short:", with(100, 1), ""}, {"long:", with(100, 1000), ""}});
  history_options o;
  o.parts = 2;
  o.epoch = "ns";
  o.spaces = &spaces;
  o.max_bytes = 10 * block + block / 2;
  history h(o);
  pool::buffer_pool buffers;
  std::vector<std::pair<std::string, std::uint64_t>> order;
  const char* kinds[] = {"short:", "long:", "room:"};
  for (int i = 0; i < 30; ++i) {
    const std::string topic = kinds[i % 3] + std::to_string(i % 4);
    const append_result r = h.append(topic, 0, [&](std::string_view, std::uint64_t) {
      pool::lease l = buffers.acquire(3000);
      l.set_size(3000);
      return pool::frame_ref::adopt(std::move(l));
    });
    REQUIRE(r.ok);
    order.emplace_back(topic, r.seq);
  }
  CHECK(h.stats().entries == 10);
  CHECK(h.stats().evicted_memory == 20);
  for (std::size_t k = 0; k < order.size(); ++k) {
    bool present = false;
    h.replay(order[k].first, "ns:0", UINT64_MAX, 0, [&](std::uint64_t seq, const pool::frame_ref&) {
      present |= seq == order[k].second;
    });
    CHECK(present == (k >= 20));
  }
}
