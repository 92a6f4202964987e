#pragma once
/// \file topic_registry.hpp
/// One shard's subscriptions: topic name → the shard's connections subscribed to it, and
/// connection → its topics. Single-threaded (the shard's loop owns it), no I/O.
///
/// Sized for both ends of the webmail shape: millions of topics with one or two subscribers
/// each (one mailbox per user) and one topic with every connection on it. Memory, with the
/// budgets asserted below:
///   - a topic is one 48-byte `topic_entry` (name inline up to 30 bytes, subscribers inline
///     up to 2) plus one 8-byte hash-table slot at a load of 3/8..3/4;
///   - a subscription is one 12-byte `sub_node` in the connection's chain, plus its 4-byte
///     index in the topic's subscriber array once the topic has more than two;
///   - a connection index the registry has seen costs a 4-byte chain head.
/// So a connection alone on its mailbox topic costs 48 + 12 + 4 + ~8..21 ≈ 72..85 bytes.
///
/// Connections are slab indices (`std::uint32_t`), without the generation: the shard must
/// call unsubscribe_all(i) before it releases slot i, so that a reused slot starts with no
/// topics.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace wspush::server::pubsub {

inline constexpr std::uint32_t no_slot = 0xFFFFFFFFu;

enum class sub_result : std::uint8_t {
  added,            ///< the connection is now subscribed
  already,          ///< it was subscribed before; nothing changed
  too_many_topics,  ///< the connection holds max_topics_per_conn topics; nothing changed
  out_of_memory,    ///< an allocation failed; nothing changed
  bad_topic,        ///< empty name or longer than max_topic_bytes; nothing changed
};

struct registry_options {
  std::uint32_t max_topics_per_conn = 64;
  std::uint32_t max_topic_bytes = 256;  ///< at most 32767 (15 bits of the length field)
  std::uint64_t seed = 0;               ///< hash seed; 0 picks one at random (hash flooding)
};

/// Bytes the registry holds from the heap, by part (its own accounting, exact for the
/// parts it allocates; the allocator's per-block overhead is not included).
struct registry_memory {
  std::size_t topic_entries = 0;  ///< chunks of topic_entry (free ones included)
  std::size_t hash_table = 0;
  std::size_t sub_nodes = 0;      ///< chunks of sub_node (free ones included)
  std::size_t conn_heads = 0;     ///< chunks of per-connection chain heads
  std::size_t spills = 0;         ///< subscriber arrays of topics with > 2 subscribers
  std::size_t long_names = 0;     ///< names over 30 bytes
  std::size_t total() const noexcept {
    return topic_entries + hash_table + sub_nodes + conn_heads + spills + long_names;
  }
};

namespace detail {

/// One topic. Budget: 48 bytes. Free entries have len == 0 and chain through `count`.
struct topic_entry {
  static constexpr std::size_t inline_name_bytes = 30;
  static constexpr std::uint16_t spilled_bit = 0x8000;

  std::uint32_t hash;   // full hash of the name (the table slot repeats it)
  std::uint32_t count;  // subscribers; next free entry when free
  union {
    std::uint32_t inline_subs[2];  // count <= 2 and not spilled
    std::uint32_t* spill;          // spilled: spill[0] = capacity, spill[1..] = subscribers
  };
  alignas(8) char name_bytes[inline_name_bytes];  // the name, or a char* to it when long
  std::uint16_t len_bits;                          // name length | spilled_bit

  std::size_t len() const noexcept { return len_bits & ~spilled_bit; }
  bool spilled() const noexcept { return (len_bits & spilled_bit) != 0; }
  const char* name_data() const noexcept {
    if (len() <= inline_name_bytes) return name_bytes;
    const char* p;
    std::memcpy(&p, name_bytes, sizeof p);
    return p;
  }
  std::string_view name() const noexcept { return {name_data(), len()}; }
  const std::uint32_t* subs() const noexcept { return spilled() ? spill + 1 : inline_subs; }
  std::uint32_t* subs() noexcept { return spilled() ? spill + 1 : inline_subs; }
};
static_assert(sizeof(topic_entry) == 48, "topic_entry budget: 48 bytes");

/// One subscription in its connection's chain: which topic, where the connection sits in
/// that topic's subscriber array (for O(1) removal), and the next node. Budget: 12 bytes.
struct sub_node {
  std::uint32_t topic;
  std::uint32_t pos;
  std::uint32_t next;  // next node of the same connection; next free node when free
};
static_assert(sizeof(sub_node) == 12, "sub_node budget: 12 bytes");

/// Open-addressing slot (linear probing, backward-shift deletion: no tombstones).
struct table_slot {
  std::uint32_t topic;  // no_slot when empty
  std::uint32_t hash;
};
static_assert(sizeof(table_slot) == 8, "table_slot budget: 8 bytes");

/// An array in fixed chunks that never move (like conn_table): growth costs one chunk,
/// never a copy, and at a million elements the slack is under one chunk.
template <class T, std::uint32_t ChunkSize>
class chunked_array {
 public:
  static constexpr std::uint32_t chunk_size = ChunkSize;
  T& operator[](std::uint32_t i) noexcept { return _chunks[i / ChunkSize][i % ChunkSize]; }
  const T& operator[](std::uint32_t i) const noexcept { return _chunks[i / ChunkSize][i % ChunkSize]; }
  std::uint32_t capacity() const noexcept { return std::uint32_t(_chunks.size()) * ChunkSize; }
  std::size_t bytes() const noexcept {
    return _chunks.size() * (sizeof(T) * ChunkSize) + _chunks.capacity() * sizeof(void*);
  }
  /// Adds one chunk, its elements set to `fill`. False when out of memory.
  bool grow(const T& fill) noexcept {
    std::unique_ptr<T[]> c(new (std::nothrow) T[ChunkSize]);
    if (!c) return false;
    for (std::uint32_t k = 0; k < ChunkSize; ++k) c[k] = fill;
    try {
      _chunks.push_back(std::move(c));
    } catch (...) {
      return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<T[]>> _chunks;
};

}  // namespace detail

/// The registry. Every call is O(1) expected in the number of topics and subscribers,
/// times the connection's own topic count (bounded by max_topics_per_conn) where a
/// connection's chain is walked. In steady state subscribe/unsubscribe reuse free entries
/// and nodes; only table, chunk and spill growth allocate (amortised), and removals recycle
/// (entries, nodes) or shrink (table below 1/8 load, spill arrays below 1/4).
class topic_registry {
 public:
  explicit topic_registry(registry_options o = {}) noexcept;
  ~topic_registry();
  topic_registry(const topic_registry&) = delete;
  topic_registry& operator=(const topic_registry&) = delete;

  sub_result subscribe(std::uint32_t conn, std::string_view topic) noexcept;
  /// False when the connection was not subscribed.
  bool unsubscribe(std::uint32_t conn, std::string_view topic) noexcept;
  /// Drops every subscription of `conn` (on close); returns how many there were.
  std::uint32_t unsubscribe_all(std::uint32_t conn) noexcept;

  /// The topic's subscribers (connection indices, in no particular order); empty when the
  /// topic has none. Valid until the next subscribe/unsubscribe of any kind: a fan-out cut
  /// into chunks must copy the span, or finish before the registry changes.
  std::span<const std::uint32_t> subscribers(std::string_view topic) const noexcept;

  /// Calls fn(std::uint32_t conn) for each subscriber. fn must NOT subscribe or unsubscribe
  /// anything (the array it walks would move or shrink under it): collect closes and
  /// unsubscribes and apply them after the loop.
  template <class Fn>
  void for_each_subscriber(std::string_view topic, Fn&& fn) const noexcept {
    for (std::uint32_t c : subscribers(topic)) fn(c);
  }

  std::uint32_t subscriber_count(std::string_view topic) const noexcept;
  std::uint32_t topic_count() const noexcept { return _topics; }
  std::uint64_t subscription_count() const noexcept { return _subscriptions; }

  /// Calls fn(std::string_view topic) for each topic of `conn` (newest first); the view is
  /// valid until the registry changes. fn must not mutate the registry. Returns the count.
  template <class Fn>
  std::uint32_t topics_of(std::uint32_t conn, Fn&& fn) const noexcept {
    std::uint32_t n = 0;
    for (std::uint32_t k = head_of(conn); k != no_slot; k = _nodes[k].next, ++n)
      fn(_entries[_nodes[k].topic].name());
    return n;
  }
  std::uint32_t topic_count_of(std::uint32_t conn) const noexcept {
    return topics_of(conn, [](std::string_view) {});
  }

  registry_memory memory() const noexcept;
  const registry_options& options() const noexcept { return _o; }

 private:
  using entry_array = detail::chunked_array<detail::topic_entry, 4096>;
  using node_array = detail::chunked_array<detail::sub_node, 4096>;
  using head_array = detail::chunked_array<std::uint32_t, 4096>;

  std::uint32_t hash_of(std::string_view s) const noexcept;
  std::uint32_t find(std::string_view topic, std::uint32_t h) const noexcept;
  std::uint32_t head_of(std::uint32_t conn) const noexcept {
    return conn < _heads.capacity() ? _heads[conn] : no_slot;
  }
  std::uint32_t find_node(std::uint32_t conn, std::uint32_t topic, std::uint32_t* prev, std::uint32_t* count) const noexcept;

  // topics (topic_registry.cpp)
  std::uint32_t create_topic(std::string_view name, std::uint32_t h) noexcept;
  void destroy_topic(std::uint32_t t) noexcept;
  bool table_insert(std::uint32_t t, std::uint32_t h) noexcept;
  void table_erase(std::uint32_t t) noexcept;
  bool rehash(std::uint32_t new_capacity) noexcept;

  // subscriber arrays
  bool push_sub(std::uint32_t t, std::uint32_t conn, std::uint32_t& pos) noexcept;
  void remove_sub(std::uint32_t t, std::uint32_t pos) noexcept;
  void shrink_subs(detail::topic_entry& e) noexcept;
  void unlink(std::uint32_t conn, std::uint32_t node, std::uint32_t prev) noexcept;

  registry_options _o;
  entry_array _entries;
  node_array _nodes;
  head_array _heads;
  std::unique_ptr<detail::table_slot[]> _table;
  std::uint32_t _table_mask = 0;  // capacity - 1; capacity 0 when no table yet
  std::uint32_t _entry_used = 0;  // entries ever handed out (high-water mark)
  std::uint32_t _free_entry = no_slot;
  std::uint32_t _node_used = 0;
  std::uint32_t _free_node = no_slot;
  std::uint32_t _topics = 0;
  std::uint64_t _subscriptions = 0;
  std::size_t _spill_bytes = 0;
  std::size_t _long_name_bytes = 0;
};

}  // namespace wspush::server::pubsub
