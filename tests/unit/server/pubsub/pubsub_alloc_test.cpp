// Proves the steady-state paths of the hub allocate nothing: subscribe/unsubscribe once the
// registry's entries, nodes and table have grown, fan-out iteration, history appends to a
// topic at its size limit and replays. This binary replaces the global operator new with a
// counting one (its own executable: sanitizer builds skip it, as they replace the allocator).

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/pubsub/history.hpp"
#include "server/pubsub/topic_registry.hpp"
#include "tests/support/counting_alloc.hpp"

using namespace wspush;
using namespace wspush::server::pubsub;
using namespace wspush::server;

TEST_CASE("registry: subscribe and unsubscribe allocate nothing in steady state") {
  topic_registry r;
  std::vector<std::string> base, churn;
  for (int i = 0; i < 1000; ++i) base.push_back("mailbox:" + std::to_string(i));
  for (int i = 0; i < 200; ++i) churn.push_back(i % 2 ? "churn:" + std::to_string(i) : "a-much-longer-topic-name-for-churn:" + std::to_string(i));
  for (std::uint32_t c = 0; c < 1000; ++c) REQUIRE(r.subscribe(c, base[c]) == sub_result::added);
  for (std::uint32_t c = 0; c < 1000; ++c) REQUIRE(r.subscribe(c, "everyone") == sub_result::added);
  auto cycle = [&] {
    for (std::uint32_t k = 0; k < 200; ++k) r.subscribe(k, churn[k]);           // new topics
    for (std::uint32_t k = 0; k < 200; ++k) r.subscribe(k + 500, base[k]);      // second tab
    for (std::uint32_t k = 0; k < 200; ++k) r.unsubscribe(k, "everyone");       // leave the big one
    std::uint64_t sum = 0;
    r.for_each_subscriber("everyone", [&](std::uint32_t c) { sum += c; });
    for (std::uint32_t k = 0; k < 200; ++k) r.subscribe(k, "everyone");
    for (std::uint32_t k = 0; k < 200; ++k) r.unsubscribe(k + 500, base[k]);
    for (std::uint32_t k = 0; k < 200; ++k) r.unsubscribe(k, churn[k]);
    return sum;
  };
  cycle();  // warm-up: long names of the churn topics are allocated each time (see below)
  std::size_t before = wspush::test::thread_allocation_count();
  for (int i = 0; i < 5; ++i) cycle();
  // Names over 30 bytes are the one allocation a new topic makes (100 per cycle here);
  // everything else is recycled.
  CHECK(wspush::test::thread_allocation_count() - before == 5 * 100);
}

TEST_CASE("history: appends at the size limit and replays allocate nothing") {
  pool::buffer_pool buffers;
  history_options o;
  o.size_per_topic = 8;
  o.ttl_ns = 0;
  o.epoch = "e1";
  history h(o);
  auto append = [&](std::string_view topic) {
    return h.append(topic, 0, [&](std::string_view id, std::uint64_t) {
      pool::lease l = buffers.acquire(64);
      std::memcpy(l.data(), id.data(), id.size());
      l.set_size(id.size());
      return pool::frame_ref::adopt(std::move(l));
    });
  };
  for (int i = 0; i < 16; ++i) REQUIRE(append("mailbox:1").ok);  // entries and the pool warm
  std::size_t before = wspush::test::thread_allocation_count();
  std::size_t replayed = 0;
  for (int i = 0; i < 100; ++i) {
    REQUIRE(append("mailbox:1").ok);
    h.replay("mailbox:1", "e1:0", UINT64_MAX, 0, [&](std::uint64_t, const pool::frame_ref&) { ++replayed; });
  }
  CHECK(wspush::test::thread_allocation_count() == before);
  CHECK(replayed == 100 * 8);
}

TEST_CASE("history: with namespaces, appends at each one's size limit and replays allocate nothing") {
  pool::buffer_pool buffers;
  topic_options global;
  global.history_size = 8;
  global.history_ttl = 300;
  topic_options mailbox = global;
  mailbox.history_size = 4;
  mailbox.history_ttl = 86400;
  const namespaces spaces(global, {{"mailbox:", mailbox, "test"}, {"team:", global, "test"}});
  history_options o;
  o.epoch = "e1";
  o.spaces = &spaces;
  history h(o);
  auto append = [&](std::string_view topic) {
    return h.append(topic, 0, [&](std::string_view id, std::uint64_t) {
      pool::lease l = buffers.acquire(64);
      std::memcpy(l.data(), id.data(), id.size());
      l.set_size(id.size());
      return pool::frame_ref::adopt(std::move(l));
    });
  };
  for (int i = 0; i < 16; ++i) {  // entries, lanes and the pool warm
    REQUIRE(append("mailbox:1").ok);
    REQUIRE(append("room:1").ok);
  }
  std::size_t before = wspush::test::thread_allocation_count();
  std::size_t replayed = 0;
  for (int i = 0; i < 100; ++i) {
    REQUIRE(append("mailbox:1").ok);
    REQUIRE(append("room:1").ok);
    h.replay("mailbox:1", "e1:0", UINT64_MAX, 0, [&](std::uint64_t, const pool::frame_ref&) { ++replayed; });
    h.replay("room:1", "e1:0", UINT64_MAX, 0, [&](std::uint64_t, const pool::frame_ref&) { ++replayed; });
    h.expire(0);
  }
  CHECK(wspush::test::thread_allocation_count() == before);
  CHECK(replayed == 100 * (4 + 8));
}
