#pragma once
// Where a topic lives when the bus spans several Redis: the rule a backend in any language
// follows to publish a topic to the right place (docs/REDIS.md gives it with test vectors).
//
//   slot  = CRC16-XMODEM(topic) mod 16384    (Redis Cluster's key slot of the bare topic)
//   shard = jump_consistent_hash(slot, n)    (isolated shards: n Redis URLs in --bus, in order)
//
// Jump consistent hash (Lamping and Veach, 2014) moves only 1/(n+1) of the slots when a shard
// is added at the end of the list. key_slot() is Redis's own rule for a whole key, hash tags
// included, to check a key's slot against what a cluster answers (CLUSTER KEYSLOT).

#include <cstdint>
#include <string_view>

namespace wspush::server::bus {

inline constexpr std::uint32_t cluster_slots = 16384;

/// CRC16 with the XMODEM polynomial (0x1021, initial 0), as Redis Cluster computes it.
std::uint16_t crc16(std::string_view bytes) noexcept;

/// Redis Cluster's slot of a key: CRC16 of its hash tag (the bytes between the first `{` and
/// the first `}` after it, when not empty) or of the whole key, mod 16384.
std::uint32_t key_slot(std::string_view key) noexcept;

/// The slot of a topic: CRC16 of the topic itself (not of a key built from it), mod 16384.
inline std::uint32_t topic_slot(std::string_view topic) noexcept { return crc16(topic) % cluster_slots; }

/// Jump consistent hash: a bucket in [0, buckets) for `key`; buckets >= 1.
std::uint32_t jump_consistent_hash(std::uint64_t key, std::uint32_t buckets) noexcept;

/// The shortest lowercase base-36 word whose CRC16 falls in `slot` (the first in the order 0,
/// 1, ..., z, 10, 11, ...; at most 4 letters): a hash tag that puts keys in that slot. A topic's
/// keys are named with its slot's tag, `wspush:{<tag>}:...`, so that they share one slot
/// whatever bytes the topic holds (a topic may contain `{` and `}`), and a slot's keys (its
/// topics, its epoch) move together when Redis Cluster migrates it. slot < 16384.
std::string_view slot_tag(std::uint32_t slot) noexcept;

/// The isolated shard (0-based, in --bus order) that holds `topic`.
inline std::uint32_t shard_of(std::string_view topic, std::uint32_t shards) noexcept {
  return jump_consistent_hash(topic_slot(topic), shards);
}

}  // namespace wspush::server::bus
