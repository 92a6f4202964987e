#include "server/pubsub/topic_registry.hpp"

#include <bit>
#include <chrono>
#include <new>
#include <random>

namespace wspush::server::pubsub {

using detail::sub_node;
using detail::table_slot;
using detail::topic_entry;

namespace {

constexpr std::uint32_t min_table = 16;

/// A seed nobody outside the process can guess: topic names come from clients, so a fixed
/// hash would let one craft names that all probe the same run of slots.
std::uint64_t random_seed() noexcept {
  std::uint64_t s = std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    std::random_device rd;
    s ^= (std::uint64_t(rd()) << 32) | rd();
  } catch (...) {
    // no entropy source: the clock and the address below still differ per process
  }
  s ^= std::uint64_t(reinterpret_cast<std::uintptr_t>(&s));
  return s | 1;
}

std::uint64_t mix(std::uint64_t h) noexcept {
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return h;
}

topic_entry free_entry() noexcept {
  topic_entry e;
  std::memset(static_cast<void*>(&e), 0, sizeof e);
  e.count = no_slot;
  return e;
}

}  // namespace

topic_registry::topic_registry(registry_options o) noexcept : _o(o) {
  if (_o.seed == 0) _o.seed = random_seed();
  if (_o.max_topic_bytes > 0x7FFF) _o.max_topic_bytes = 0x7FFF;
}

topic_registry::~topic_registry() {
  for (std::uint32_t t = 0; t < _entry_used; ++t) {
    topic_entry& e = _entries[t];
    if (e.len() == 0) continue;
    if (e.spilled()) delete[] e.spill;
    if (e.len() > topic_entry::inline_name_bytes) delete[] e.name_data();
  }
}

/// Eight bytes at a time, each word folded in with a multiply and a shift; the seed makes
/// the sequence of probes unpredictable from outside.
std::uint32_t topic_registry::hash_of(std::string_view s) const noexcept {
  std::uint64_t h = _o.seed ^ (s.size() * 0x9e3779b97f4a7c15ull);
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
  }
  std::uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = mix((h ^ w) * 0xbf58476d1ce4e5b9ull);
  return std::uint32_t(h ^ (h >> 32));
}

std::uint32_t topic_registry::find(std::string_view topic, std::uint32_t h) const noexcept {
  if (_table == nullptr) return no_slot;
  for (std::uint32_t i = h & _table_mask;; i = (i + 1) & _table_mask) {
    const table_slot& s = _table[i];
    if (s.topic == no_slot) return no_slot;
    if (s.hash == h && _entries[s.topic].name() == topic) return s.topic;
  }
}

/// The node of `conn` for `topic` (no_slot if none), its predecessor in the chain, and how
/// many nodes the walk passed (the whole chain when the topic is not found).
std::uint32_t topic_registry::find_node(std::uint32_t conn, std::uint32_t topic, std::uint32_t* prev,
                                        std::uint32_t* count) const noexcept {
  std::uint32_t p = no_slot, n = 0;
  for (std::uint32_t k = head_of(conn); k != no_slot; p = k, k = _nodes[k].next, ++n) {
    if (_nodes[k].topic == topic) {
      if (prev != nullptr) *prev = p;
      if (count != nullptr) *count = n;
      return k;
    }
  }
  if (count != nullptr) *count = n;
  return no_slot;
}

sub_result topic_registry::subscribe(std::uint32_t conn, std::string_view topic) noexcept {
  if (topic.empty() || topic.size() > _o.max_topic_bytes || conn == no_slot) return sub_result::bad_topic;
  std::uint32_t h = hash_of(topic);
  std::uint32_t t = find(topic, h);
  std::uint32_t chain = 0;
  if (t != no_slot && find_node(conn, t, nullptr, &chain) != no_slot) return sub_result::already;
  if (t == no_slot) find_node(conn, no_slot, nullptr, &chain);
  if (chain >= _o.max_topics_per_conn) return sub_result::too_many_topics;

  // Everything that can fail comes first, so a failure leaves nothing behind.
  while (conn >= _heads.capacity())
    if (!_heads.grow(no_slot)) return sub_result::out_of_memory;
  if (_free_node == no_slot && _node_used == _nodes.capacity() && !_nodes.grow(sub_node{no_slot, 0, no_slot}))
    return sub_result::out_of_memory;
  bool created = false;
  if (t == no_slot) {
    if ((t = create_topic(topic, h)) == no_slot) return sub_result::out_of_memory;
    created = true;
  }
  std::uint32_t pos;
  if (!push_sub(t, conn, pos)) {
    if (created) destroy_topic(t);
    return sub_result::out_of_memory;
  }
  std::uint32_t k = _free_node;
  if (k != no_slot) _free_node = _nodes[k].next;
  else k = _node_used++;
  _nodes[k] = sub_node{t, pos, _heads[conn]};
  _heads[conn] = k;
  ++_subscriptions;
  return sub_result::added;
}

bool topic_registry::unsubscribe(std::uint32_t conn, std::string_view topic) noexcept {
  if (topic.empty() || topic.size() > _o.max_topic_bytes) return false;
  std::uint32_t t = find(topic, hash_of(topic));
  if (t == no_slot) return false;
  std::uint32_t prev = no_slot;
  std::uint32_t k = find_node(conn, t, &prev, nullptr);
  if (k == no_slot) return false;
  std::uint32_t pos = _nodes[k].pos;
  unlink(conn, k, prev);
  remove_sub(t, pos);
  return true;
}

std::uint32_t topic_registry::unsubscribe_all(std::uint32_t conn) noexcept {
  std::uint32_t n = 0;
  while (head_of(conn) != no_slot) {
    std::uint32_t k = _heads[conn];
    std::uint32_t t = _nodes[k].topic, pos = _nodes[k].pos;
    unlink(conn, k, no_slot);
    remove_sub(t, pos);
    ++n;
  }
  return n;
}

void topic_registry::unlink(std::uint32_t conn, std::uint32_t node, std::uint32_t prev) noexcept {
  std::uint32_t next = _nodes[node].next;
  if (prev == no_slot) _heads[conn] = next;
  else _nodes[prev].next = next;
  _nodes[node] = sub_node{no_slot, 0, _free_node};
  _free_node = node;
  --_subscriptions;
}

std::span<const std::uint32_t> topic_registry::subscribers(std::string_view topic) const noexcept {
  if (topic.empty() || topic.size() > _o.max_topic_bytes) return {};
  std::uint32_t t = find(topic, hash_of(topic));
  if (t == no_slot) return {};
  const topic_entry& e = _entries[t];
  return {e.subs(), e.count};
}

std::uint32_t topic_registry::subscriber_count(std::string_view topic) const noexcept {
  return std::uint32_t(subscribers(topic).size());
}

registry_memory topic_registry::memory() const noexcept {
  registry_memory m;
  m.topic_entries = _entries.bytes();
  m.hash_table = _table != nullptr ? std::size_t(_table_mask + 1) * sizeof(table_slot) : 0;
  m.sub_nodes = _nodes.bytes();
  m.conn_heads = _heads.bytes();
  m.spills = _spill_bytes;
  m.long_names = _long_name_bytes;
  return m;
}

// ---- topics ---------------------------------------------------------------------------

std::uint32_t topic_registry::create_topic(std::string_view name, std::uint32_t h) noexcept {
  if (_free_entry == no_slot && _entry_used == _entries.capacity() && !_entries.grow(free_entry()))
    return no_slot;
  char* long_name = nullptr;
  if (name.size() > topic_entry::inline_name_bytes) {
    long_name = new (std::nothrow) char[name.size()];
    if (long_name == nullptr) return no_slot;
    std::memcpy(long_name, name.data(), name.size());
  }
  std::uint32_t t = _free_entry != no_slot ? _free_entry : _entry_used;
  if (!table_insert(t, h)) {
    delete[] long_name;
    return no_slot;
  }
  if (t == _free_entry) _free_entry = _entries[t].count;
  else ++_entry_used;
  topic_entry& e = _entries[t];
  e.hash = h;
  e.count = 0;
  e.len_bits = std::uint16_t(name.size());
  if (long_name != nullptr) {
    std::memcpy(e.name_bytes, &long_name, sizeof long_name);
    _long_name_bytes += name.size();
  } else {
    std::memcpy(e.name_bytes, name.data(), name.size());
  }
  ++_topics;
  return t;
}

void topic_registry::destroy_topic(std::uint32_t t) noexcept {
  table_erase(t);
  topic_entry& e = _entries[t];
  if (e.spilled()) {
    _spill_bytes -= (std::size_t(e.spill[0]) + 1) * sizeof(std::uint32_t);
    delete[] e.spill;
  }
  if (e.len() > topic_entry::inline_name_bytes) {
    _long_name_bytes -= e.len();
    delete[] e.name_data();
  }
  e = free_entry();
  e.count = _free_entry;
  _free_entry = t;
  --_topics;
  // Shrink a table left mostly empty (a burst of topics that went away), keeping slack
  // so that a topic count hovering near a boundary does not rehash back and forth.
  std::uint32_t cap = _table_mask + 1;
  if (cap > min_table && _topics < cap / 8) rehash(cap / 2);
}

/// Inserts topic `t` (not yet in the table), growing at a load of 3/4.
bool topic_registry::table_insert(std::uint32_t t, std::uint32_t h) noexcept {
  std::uint32_t cap = _table != nullptr ? _table_mask + 1 : 0;
  if ((std::uint64_t(_topics) + 1) * 4 > std::uint64_t(cap) * 3) {
    if (!rehash(cap == 0 ? min_table : cap * 2)) return false;
  }
  std::uint32_t i = h & _table_mask;
  while (_table[i].topic != no_slot) i = (i + 1) & _table_mask;
  _table[i] = table_slot{t, h};
  return true;
}

/// Backward-shift deletion: later slots of the same probe run move up into the hole, so
/// lookups never meet a tombstone and the table never needs cleaning.
void topic_registry::table_erase(std::uint32_t t) noexcept {
  std::uint32_t i = _entries[t].hash & _table_mask;
  while (_table[i].topic != t) i = (i + 1) & _table_mask;
  for (std::uint32_t j = (i + 1) & _table_mask;; j = (j + 1) & _table_mask) {
    if (_table[j].topic == no_slot) break;
    std::uint32_t home = _table[j].hash & _table_mask;
    // j's element may move to i only if its home is not in the cyclic range (i, j].
    bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (between) continue;
    _table[i] = _table[j];
    i = j;
  }
  _table[i] = table_slot{no_slot, 0};
}

bool topic_registry::rehash(std::uint32_t new_capacity) noexcept {
  std::unique_ptr<table_slot[]> fresh(new (std::nothrow) table_slot[new_capacity]);
  if (!fresh) return false;
  std::uint32_t mask = new_capacity - 1;
  for (std::uint32_t i = 0; i < new_capacity; ++i) fresh[i] = table_slot{no_slot, 0};
  if (_table != nullptr) {
    for (std::uint32_t i = 0; i <= _table_mask; ++i) {
      const table_slot& s = _table[i];
      if (s.topic == no_slot) continue;
      std::uint32_t j = s.hash & mask;
      while (fresh[j].topic != no_slot) j = (j + 1) & mask;
      fresh[j] = s;
    }
  }
  _table = std::move(fresh);
  _table_mask = mask;
  return true;
}

// ---- subscriber arrays ----------------------------------------------------------------

/// Appends `conn` to topic `t`'s subscribers: inline up to two, then a heap array that
/// doubles (capacity in its first word).
bool topic_registry::push_sub(std::uint32_t t, std::uint32_t conn, std::uint32_t& pos) noexcept {
  topic_entry& e = _entries[t];
  std::uint32_t cap = e.spilled() ? e.spill[0] : 2;
  if (e.count == cap) {
    std::uint32_t new_cap = cap * 2;
    auto* grown = new (std::nothrow) std::uint32_t[std::size_t(new_cap) + 1];
    if (grown == nullptr) return false;
    grown[0] = new_cap;
    std::memcpy(grown + 1, e.subs(), std::size_t(e.count) * sizeof(std::uint32_t));
    if (e.spilled()) {
      _spill_bytes -= (std::size_t(cap) + 1) * sizeof(std::uint32_t);
      delete[] e.spill;
    }
    e.spill = grown;
    e.len_bits |= topic_entry::spilled_bit;
    _spill_bytes += (std::size_t(new_cap) + 1) * sizeof(std::uint32_t);
  }
  pos = e.count;
  e.subs()[e.count++] = conn;
  return true;
}

/// Removes the subscriber at `pos`: the last one moves into the hole, and its node (found
/// on its own short chain) learns its new position. The topic goes when it is empty.
void topic_registry::remove_sub(std::uint32_t t, std::uint32_t pos) noexcept {
  topic_entry& e = _entries[t];
  std::uint32_t* subs = e.subs();
  std::uint32_t last = --e.count;
  if (pos != last) {
    std::uint32_t moved = subs[last];
    subs[pos] = moved;
    _nodes[find_node(moved, t, nullptr, nullptr)].pos = pos;
  }
  if (e.count == 0) {
    destroy_topic(t);
    return;
  }
  if (e.spilled()) shrink_subs(e);
}

/// Halves a spilled array at a quarter full (so a count oscillating around a power of two
/// does not allocate every time), and goes back inline when a halving would reach 2.
void topic_registry::shrink_subs(topic_entry& e) noexcept {
  std::uint32_t cap = e.spill[0];
  if (e.count > cap / 4) return;
  std::uint32_t* old = e.spill;
  std::uint32_t new_cap = cap / 2;
  if (new_cap <= 2) {
    std::memcpy(e.inline_subs, old + 1, std::size_t(e.count) * sizeof(std::uint32_t));
    e.len_bits &= std::uint16_t(~topic_entry::spilled_bit);
  } else {
    auto* smaller = new (std::nothrow) std::uint32_t[std::size_t(new_cap) + 1];
    if (smaller == nullptr) return;  // keep the bigger array; correct, just not shrunk
    smaller[0] = new_cap;
    std::memcpy(smaller + 1, old + 1, std::size_t(e.count) * sizeof(std::uint32_t));
    e.spill = smaller;
    _spill_bytes += (std::size_t(new_cap) + 1) * sizeof(std::uint32_t);
  }
  _spill_bytes -= (std::size_t(cap) + 1) * sizeof(std::uint32_t);
  delete[] old;
}

}  // namespace wspush::server::pubsub
