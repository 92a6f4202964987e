#include "server/bus/redis_route.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <string>

using namespace wspush::server::bus;

// The slots below are what a real redis-server 7.0 in cluster mode answered to CLUSTER KEYSLOT
// (2026-11-27); the shards are what the jump consistent hash of the paper gives, computed
// apart from this code (a Python transcription of its reference implementation).

TEST_CASE("route: CRC16 and key slots are Redis Cluster's", "[route]") {
  CHECK(crc16("123456789") == 0x31C3);  // the cluster specification's test vector
  CHECK(key_slot("123456789") == 0x31C3 % 16384);
  CHECK(key_slot("foo") == 12182);
  CHECK(key_slot("somekey") == 11058);
  CHECK(key_slot("foo{hash_tag}") == 2515);
  CHECK(key_slot("{user1000}.following") == 3443);
  CHECK(key_slot("{user1000}.followers") == 3443);  // one hash tag, one slot
  CHECK(key_slot("foo{}{bar}") == 8363);            // an empty tag: the whole key
  CHECK(key_slot("foo{{bar}}zap") == 4015);         // the tag is "{bar"
  CHECK(key_slot("foo{bar}{zap}") == 5061);         // the first tag only
  CHECK(key_slot("}abc") == 9765);
}

TEST_CASE("route: a topic's slot and shard", "[route]") {
  struct vector {
    const char* topic;
    std::uint32_t slot;
    std::array<std::uint32_t, 4> shard;  // of 1, 2, 3 and 6 shards
  };
  const vector vectors[] = {
      {"mailbox:42", 5893, {0, 1, 1, 1}},
      {"mailbox:7", 11632, {0, 0, 0, 3}},
      {"user/7/inbox", 9314, {0, 1, 2, 4}},
      {"room.lobby", 12685, {0, 1, 2, 4}},
  };
  for (const vector& v : vectors) {
    CAPTURE(v.topic);
    CHECK(topic_slot(v.topic) == v.slot);
    CHECK(key_slot("{" + std::string(v.topic) + "}") == v.slot);  // a topic without braces, tagged
    const std::uint32_t counts[] = {1, 2, 3, 6};
    for (int k = 0; k < 4; ++k) CHECK(shard_of(v.topic, counts[k]) == v.shard[k]);
  }
  CHECK(jump_consistent_hash(0, 10) == 0);
  CHECK(jump_consistent_hash(1, 10) == 6);
  CHECK(jump_consistent_hash(16383, 10) == 9);
  CHECK(jump_consistent_hash(UINT64_MAX, 1000) == 313);
}

TEST_CASE("route: a shard added at the end takes slots from the others and moves nothing else", "[route]") {
  for (std::uint32_t n = 1; n < 12; ++n) {
    std::uint32_t moved = 0;
    std::array<std::uint32_t, 12> per{};
    for (std::uint32_t slot = 0; slot < cluster_slots; ++slot) {
      const std::uint32_t before = jump_consistent_hash(slot, n), after = jump_consistent_hash(slot, n + 1);
      REQUIRE(before < n);
      REQUIRE((after == before || after == n));  // stays, or goes to the new shard
      moved += after == n;
      ++per[after];
    }
    CAPTURE(n);
    // About 1/(n+1) of the slots move, and every shard holds about its share.
    CHECK(moved > cluster_slots / (n + 1) * 8 / 10);
    CHECK(moved < cluster_slots / (n + 1) * 12 / 10);
    for (std::uint32_t k = 0; k <= n; ++k) CHECK(per[k] > cluster_slots / (n + 1) * 8 / 10);
  }
}

TEST_CASE("route: every slot has a short tag that hashes to it", "[route]") {
  // What a real redis-server answered to CLUSTER KEYSLOT for keys named with these tags.
  CHECK(slot_tag(0) == "1bz");
  CHECK(slot_tag(1) == "emj");
  CHECK(slot_tag(5893) == "b8u");   // mailbox:42's slot: wspush:{b8u}:epoch is in 5893
  CHECK(slot_tag(11632) == "dkm");  // mailbox:7's: wspush:{dkm}:topic:mailbox:7 is in 11632
  CHECK(slot_tag(16383) == "hia");
  CHECK(slot_tag(9314) == "mq3");   // user/7/inbox's, as docs/REDIS.md gives it
  CHECK(slot_tag(12685) == "bc");   // room.lobby's
  for (std::uint32_t slot = 0; slot < cluster_slots; ++slot) {
    const std::string_view tag = slot_tag(slot);
    REQUIRE(!tag.empty());
    REQUIRE(tag.size() <= 4);
    REQUIRE(key_slot("wspush:{" + std::string(tag) + "}:topic:x{y}z") == slot);
  }
}
