#include "server/pubsub/history.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "pool/buffer_pool.hpp"

namespace wspush::server::pubsub {

namespace detail {

inline constexpr std::uint32_t none = 0xFFFFFFFFu;

struct sv_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct topic_state {
  std::uint64_t floor = 0;  // newest seq this topic lost (evicted/expired): since below it is lost
  std::uint64_t last = 0;   // newest seq appended
  std::uint32_t head = none, tail = none;  // oldest and newest retained entry
  std::uint32_t count = 0;
  std::uint32_t lane = 0;  // its namespace's TTL: the part's FIFO it is in
};
using topic_map = std::unordered_map<std::string, topic_state, sv_hash, std::equal_to<>>;

/// One retained publish. Budget: 56 bytes besides the frame's block.
struct history_entry {
  pool::frame_ref frame;
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 0;
  std::uint64_t stamp = 0;            // global append order
  topic_map::value_type* topic = nullptr;  // stable: map nodes never move
  std::uint32_t topic_next = none;    // next newer entry of the topic; free list link when free
  std::uint32_t older = none, newer = none;  // its lane's FIFO
};
static_assert(sizeof(history_entry) <= 56, "history_entry budget: 56 bytes");

/// Heap bytes an allocation of `n` takes: size-class allocators (mimalloc, jemalloc) round up
/// to 16 bytes, and past 64 to a quarter of the power of two below (a 129-byte name takes 160).
constexpr std::size_t heap_bytes(std::size_t n) noexcept {
  std::size_t step = std::max<std::size_t>(16, std::bit_floor(std::max<std::size_t>(n, 1)) / 4);
  return (n + step - 1) / step * step;
}

/// What a topic's state costs besides its bucket (counted with the part's arrays): the map's
/// node (next pointer, key, state) and the key's own buffer when it is too long for the
/// string's inline one.
constexpr std::size_t topic_bytes(std::size_t name) noexcept {
  constexpr std::size_t inline_chars = 15;  // libstdc++'s short-string buffer
  return heap_bytes(sizeof(void*) + sizeof(topic_map::value_type)) + (name > inline_chars ? heap_bytes(name + 1) : 0);
}

/// Idempotency keys: a part remembers each as "<topic>\0<key>" (a topic holds no NUL) with the
/// seq its publish got, looked up by the two views without building the string.
struct idem_view {
  std::string_view topic, key;
};

inline idem_view split_idem(std::string_view s) noexcept {
  const std::size_t z = s.find('\0');
  return {s.substr(0, z), s.substr(z + 1)};
}

struct idem_hash {
  using is_transparent = void;
  std::size_t operator()(idem_view v) const noexcept {
    const std::size_t a = std::hash<std::string_view>{}(v.topic), b = std::hash<std::string_view>{}(v.key);
    return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  }
  std::size_t operator()(const std::string& s) const noexcept { return (*this)(split_idem(s)); }
};

struct idem_eq {
  using is_transparent = void;
  bool operator()(const std::string& a, const std::string& b) const noexcept { return a == b; }
  bool operator()(idem_view v, const std::string& s) const noexcept {
    const idem_view w = split_idem(s);
    return v.topic == w.topic && v.key == w.key;
  }
  bool operator()(const std::string& s, idem_view v) const noexcept { return (*this)(v, s); }
};

struct idem_entry {
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 0;  // when it was published (a key published again after the window: the later)
};
using idem_map = std::unordered_map<std::string, idem_entry, idem_hash, idem_eq>;

/// The order keys are forgotten in, oldest first. A key published again after its window is
/// stamped anew and recorded again: a record whose time is not its key's is stale and only
/// dropped, so a key leaves the map with its newest record, and the map never holds more keys
/// than there are records.
struct idem_record {
  std::uint64_t time_ns;
  idem_map::value_type* key;  // stable: map nodes never move
};

/// The entries of one TTL, in append order: the oldest is the first to expire.
struct history_lane {
  std::uint32_t oldest = none, newest = none;
};

struct history_part {
  mutable std::mutex mu;
  idem_map idem;
  std::deque<idem_record> idem_order;
  std::vector<history_entry> entries;
  std::uint32_t free = none;
  topic_map topics;
  std::vector<history_lane> lanes;  // one per distinct TTL (history::_lane_ttl), made at start-up
  std::uint64_t seq = 0;
  std::uint64_t dropped_floor = 0;  // newest seq lost by a topic whose state was dropped
  std::atomic<std::uint64_t> oldest_stamp{UINT64_MAX};  // read without the lock by enforce_cap
  std::size_t arrays = 0;  // bytes of `entries` and of the map's buckets, as counted in n.bytes
  history_stats n;  // entries, bytes, topics, appends, evictions of this part
};

}  // namespace detail

using detail::history_entry;
using detail::history_lane;
using detail::history_part;
using detail::none;
using detail::topic_map;
using detail::topic_state;
using detail::idem_map;
using detail::idem_record;
using detail::idem_view;

namespace {

std::string random_epoch() {
  static constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::random_device rd;
  std::uint64_t v = (std::uint64_t(rd()) << 32) | rd();
  std::string e(6, '0');
  for (char& c : e) {
    c = digits[v % 36];
    v /= 36;
  }
  return e;
}

bool expired(const history_entry& e, std::uint64_t ttl_ns, std::uint64_t now_ns) noexcept {
  return ttl_ns != 0 && now_ns > e.time_ns && now_ns - e.time_ns >= ttl_ns;
}

/// The entry's block as the heap holds it: an encoder sized for the worst case leaves a block
/// larger than the frame, and the history keeps all of it; and its compressed twin's block, if
/// it has one (made before the entry is added, so the count is the same when it leaves). (The
/// slot itself is counted with the part's arrays.)
std::size_t entry_bytes(const history_entry& e) noexcept {
  const std::size_t twin = e.frame.twin_capacity();
  return pool::buffer_pool::block_footprint(e.frame.capacity()) + (twin ? pool::buffer_pool::block_footprint(twin) : 0);
}

void add_bytes(history_part& p, std::size_t n, std::atomic<std::uint64_t>& total) noexcept {
  p.n.bytes += n;
  total.fetch_add(n, std::memory_order_relaxed);
}

void sub_bytes(history_part& p, std::size_t n, std::atomic<std::uint64_t>& total) noexcept {
  p.n.bytes -= n;
  total.fetch_sub(n, std::memory_order_relaxed);
}

/// Brings the count of the part's arrays (entry slots and map buckets, at their capacity: a
/// slot an eviction freed keeps its memory) up to date after they grew or were released.
void recount_arrays(history_part& p, std::atomic<std::uint64_t>& total) noexcept {
  std::size_t buckets = p.topics.bucket_count() > 1 ? p.topics.bucket_count() : 0;  // one is inline
  std::size_t now = p.entries.capacity() * sizeof(history_entry) + buckets * sizeof(void*);
  if (now == p.arrays) return;  // the common case: nothing grew
  if (now > p.arrays) add_bytes(p, now - p.arrays, total);
  else sub_bytes(p, p.arrays - now, total);
  p.arrays = now;
}

/// A part left with no entry gives its arrays back: a burst of topics does not leave its
/// high-water mark of slots and buckets behind.
void release_arrays(history_part& p, std::atomic<std::uint64_t>& total) noexcept {
  std::vector<history_entry>().swap(p.entries);
  p.free = none;
  topic_map().swap(p.topics);
  recount_arrays(p, total);
}

void count_eviction(history_stats& n, evict_cause why) noexcept {
  if (why == evict_cause::size) ++n.evicted_size;
  else if (why == evict_cause::ttl) ++n.evicted_ttl;
  else ++n.evicted_memory;
}

/// The part's oldest entry: the oldest of its lanes' oldest ones (none when it holds none).
std::uint32_t oldest_entry(const history_part& p) noexcept {
  std::uint32_t best = none;
  for (const history_lane& l : p.lanes)
    if (l.oldest != none && (best == none || p.entries[l.oldest].stamp < p.entries[best].stamp)) best = l.oldest;
  return best;
}

/// Publishes the part's oldest stamp, for enforce_cap (after a lane's oldest entry went).
void refresh_oldest(history_part& p) noexcept {
  const std::uint32_t k = oldest_entry(p);
  p.oldest_stamp.store(k != none ? p.entries[k].stamp : UINT64_MAX, std::memory_order_relaxed);
}

/// Removes the oldest entry of topic `t` (its lane's FIFO may hold it anywhere: a size
/// eviction takes a topic's oldest, which is not the part's oldest). When it was the
/// topic's last entry the topic's state goes too, its floor kept in dropped_floor (and with
/// the part's last entry its arrays), and `t` is dangling: the return value says so.
bool remove_head(history_part& p, topic_map::value_type* t, evict_cause why, std::atomic<std::uint64_t>& total) noexcept {
  topic_state& ts = t->second;
  std::uint32_t k = ts.head;
  history_entry& e = p.entries[k];
  ts.head = e.topic_next;
  if (ts.head == none) ts.tail = none;
  ts.floor = std::max(ts.floor, e.seq);
  --ts.count;
  history_lane& lane = p.lanes[ts.lane];
  const bool was_oldest = e.older == none;
  if (e.older != none) p.entries[e.older].newer = e.newer;
  else lane.oldest = e.newer;
  if (e.newer != none) p.entries[e.newer].older = e.older;
  else lane.newest = e.older;
  if (was_oldest) refresh_oldest(p);
  sub_bytes(p, entry_bytes(e), total);
  --p.n.entries;
  count_eviction(p.n, why);
  e.frame.reset();
  e.topic = nullptr;
  e.older = e.newer = none;
  e.topic_next = p.free;
  p.free = k;
  bool dropped = ts.count == 0;
  if (dropped) {
    p.dropped_floor = std::max(p.dropped_floor, ts.floor);
    sub_bytes(p, detail::topic_bytes(t->first.size()), total);
    --p.n.topics;
    p.topics.erase(p.topics.find(std::string_view(t->first)));
    if (p.n.entries == 0) release_arrays(p, total);
  }
  return dropped;
}

/// Expires the topic's oldest entries; false when that dropped the topic.
bool expire_topic(history_part& p, topic_map::value_type* t, std::uint64_t ttl_ns, std::uint64_t now_ns,
                  std::atomic<std::uint64_t>& total) noexcept {
  while (t->second.head != none && expired(p.entries[t->second.head], ttl_ns, now_ns))
    if (remove_head(p, t, evict_cause::ttl, total)) return false;
  return true;
}

/// A free entry index, growing the vector (may throw std::bad_alloc).
std::uint32_t take_entry(history_part& p) {
  if (p.free != none) {
    std::uint32_t k = p.free;
    p.free = p.entries[k].topic_next;
    return k;
  }
  p.entries.emplace_back();
  return std::uint32_t(p.entries.size() - 1);
}

/// The topic's state (created with the part's dropped floor if new) and a free entry, or
/// none when memory ran out; then `t` is the topic only if it already had entries.
std::uint32_t take_slot(history_part& p, std::string_view topic, std::uint32_t lane, topic_map::value_type*& t,
                        std::atomic<std::uint64_t>& total) noexcept {
  const std::size_t topic_bytes = detail::topic_bytes(topic.size());
  try {
    auto it = p.topics.find(topic);  // no key string built for a topic that exists
    if (it == p.topics.end()) {
      it = p.topics.try_emplace(std::string(topic)).first;
      it->second.floor = p.dropped_floor;  // what an earlier state of this topic lost
      it->second.lane = lane;
      ++p.n.topics;
      add_bytes(p, topic_bytes, total);
    }
    t = &*it;
    std::uint32_t k = take_entry(p);
    recount_arrays(p, total);
    return k;
  } catch (...) {
    if (t != nullptr && t->second.count == 0) {
      sub_bytes(p, topic_bytes, total);
      --p.n.topics;
      p.topics.erase(p.topics.find(topic));
      t = nullptr;
    }
    if (p.n.entries == 0) release_arrays(p, total);
    else recount_arrays(p, total);  // the map may have grown its buckets before the throw
    return none;
  }
}

/// Entry `k` becomes the newest of its topic and of its lane's FIFO.
void link_entry(history_part& p, topic_map::value_type* t, std::uint32_t k, pool::frame_ref frame, std::uint64_t seq,
                std::uint64_t now_ns, std::uint64_t stamp, std::atomic<std::uint64_t>& total) noexcept {
  history_entry& e = p.entries[k];
  e.frame = std::move(frame);
  e.seq = seq;
  e.time_ns = now_ns;
  e.stamp = stamp;
  e.topic = t;
  e.topic_next = none;
  topic_state& ts = t->second;
  history_lane& lane = p.lanes[ts.lane];
  e.older = lane.newest;
  e.newer = none;
  if (lane.newest != none) p.entries[lane.newest].newer = k;
  else lane.oldest = k;
  lane.newest = k;
  // Stamps grow in append order under the part's lock: the new entry is the part's oldest only
  // when it holds no other.
  if (p.oldest_stamp.load(std::memory_order_relaxed) == UINT64_MAX) p.oldest_stamp.store(stamp, std::memory_order_relaxed);
  if (ts.tail != none) p.entries[ts.tail].topic_next = k;
  else ts.head = k;
  ts.tail = k;
  ts.last = seq;
  ++ts.count;
  ++p.n.entries;
  add_bytes(p, entry_bytes(e), total);
}

/// Forgets the keys out of the window, and the oldest past `cap` records.
void forget_keys(history_part& p, std::uint64_t window_ns, std::uint64_t now_ns, std::size_t cap) noexcept {
  while (!p.idem_order.empty()) {
    const idem_record r = p.idem_order.front();
    const bool old = now_ns > r.time_ns && now_ns - r.time_ns >= window_ns;
    if (!old && p.idem_order.size() < cap) return;
    p.idem_order.pop_front();
    if (r.key->second.time_ns != r.time_ns) continue;  // stale: the key was recorded again since
    p.idem.erase(p.idem.find(r.key->first));
  }
  if (p.idem.empty()) idem_map().swap(p.idem);  // a burst leaves no buckets behind
}

/// Whether `key` was published on `topic` within the window (then `seq` is that publish's),
/// having forgotten the keys out of it first.
bool seen_key(history_part& p, std::string_view topic, std::string_view key, std::uint64_t window_ns,
              std::uint64_t now_ns, std::size_t cap, std::uint64_t& seq) noexcept {
  forget_keys(p, window_ns, now_ns, cap);
  const auto it = p.idem.find(idem_view{topic, key});
  if (it == p.idem.end()) return false;
  const std::uint64_t t = it->second.time_ns;
  if (now_ns > t && now_ns - t >= window_ns) return false;  // published again after its window
  seq = it->second.seq;
  return true;
}

/// Remembers `key` of `topic` as published with `seq` now. Out of memory: not remembered (a
/// retry may publish twice), the publish stands.
void remember_key(history_part& p, std::string_view topic, std::string_view key, std::uint64_t seq,
                  std::uint64_t now_ns) noexcept {
  try {
    auto it = p.idem.find(idem_view{topic, key});
    if (it == p.idem.end()) {
      std::string name;
      name.reserve(topic.size() + 1 + key.size());
      name.append(topic).append(1, '\0').append(key);
      it = p.idem.try_emplace(std::move(name)).first;
    }
    it->second = {seq, now_ns};
    try {
      p.idem_order.push_back({now_ns, &*it});
    } catch (...) {
      p.idem.erase(it);  // no record to forget it by: not kept
    }
  } catch (...) {
  }
}

}  // namespace

history::history(history_options o) : _o(std::move(o)) {
  _epoch = _o.epoch.empty() ? random_epoch() : _o.epoch;
  if (_epoch.size() > max_epoch_bytes) throw std::invalid_argument("history epoch too long");
  for (char c : _epoch)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'))) throw std::invalid_argument("history epoch not base36");
  std::uint32_t n = std::bit_ceil(std::max<std::uint32_t>(_o.parts, 1));
  _mask = n - 1;
  _parts = std::make_unique<history_part[]>(n);
  // Each namespace's limits (the last: the global ones), and a lane per distinct TTL.
  const std::size_t kinds = _o.spaces ? _o.spaces->list().size() + 1 : 1;
  for (std::size_t k = 0; k < kinds; ++k) {
    std::uint32_t size = _o.size_per_topic;
    std::uint64_t ttl = _o.ttl_ns;
    if (_o.spaces) {
      const topic_options& t = _o.spaces->at(k);
      size = t.history_size;
      ttl = std::uint64_t(t.history_ttl * 1e9);
    }
    std::uint32_t lane = 0;
    while (lane < _lane_ttl.size() && _lane_ttl[lane] != ttl) ++lane;
    if (lane == _lane_ttl.size()) _lane_ttl.push_back(ttl);
    _limits.push_back({size, lane});
  }
  for (std::uint32_t i = 0; i < n; ++i) _parts[i].lanes.resize(_lane_ttl.size());
  _idem_per_part = std::max<std::uint32_t>(1, _o.idempotency_keys / n);
}

history::~history() = default;

std::uint32_t history::part_of(std::string_view topic) const noexcept {
  // The high bits: the map inside the part buckets by the low ones.
  return std::uint32_t(detail::sv_hash{}(topic) >> 40) & _mask;
}

history_id history::format_id(std::uint64_t seq) const noexcept {
  history_id id;
  std::memcpy(id.bytes, _epoch.data(), _epoch.size());
  id.bytes[_epoch.size()] = ':';
  char* end = std::to_chars(id.bytes + _epoch.size() + 1, id.bytes + sizeof id.bytes, seq).ptr;
  id.len = std::uint8_t(end - id.bytes);
  return id;
}

bool history::parse_id(std::string_view id, std::uint64_t& seq) const noexcept {
  if (id.size() <= _epoch.size() + 1 || id.substr(0, _epoch.size()) != _epoch || id[_epoch.size()] != ':') return false;
  std::string_view digits = id.substr(_epoch.size() + 1);
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), seq);
  return ec == std::errc() && end == digits.data() + digits.size();
}

std::uint64_t history::last_seq(std::uint32_t part) const noexcept {
  history_part& p = _parts[part & _mask];
  std::lock_guard lock(p.mu);
  return p.seq;
}

append_result history::append_impl(std::string_view topic, std::uint64_t now_ns, std::string_view idempotency_key,
                                   void* ctx, make_fn make) noexcept {
  append_result r;
  r.part = part_of(topic);
  history_part& p = _parts[r.part];
  const topic_limits lim = _limits[_o.spaces ? _o.spaces->index_of(topic) : 0];
  {
    std::lock_guard lock(p.mu);
    // Under the part's lock: two publishes of one key, from any threads, append once.
    if (!idempotency_key.empty() &&
        seen_key(p, topic, idempotency_key, _o.idempotency_window_ns, now_ns, _idem_per_part, r.seq)) {
      ++p.n.duplicates;
      r.ok = r.duplicate = true;
      return r;
    }
    history_id id = format_id(p.seq + 1);
    pool::frame_ref frame = make(ctx, id.view(), p.seq + 1);
    if (!frame) return r;
    r.seq = ++p.seq;
    r.ok = true;
    ++p.n.appends;
    if (!idempotency_key.empty()) remember_key(p, topic, idempotency_key, r.seq, now_ns);
    topic_map::value_type* t = nullptr;
    std::uint32_t k = lim.size != 0 ? take_slot(p, topic, lim.lane, t, _bytes) : none;
    if (k == none) {
      // Published but not retained (size 0, or out of memory): lost to anyone resuming
      // from before it.
      if (t != nullptr) t->second.floor = t->second.last = r.seq;
      else p.dropped_floor = r.seq;
      return r;
    }
    link_entry(p, t, k, std::move(frame), r.seq, now_ns, _stamp.fetch_add(1, std::memory_order_relaxed), _bytes);
    expire_topic(p, t, _lane_ttl[lim.lane], now_ns, _bytes);  // never the new entry: it is not old
    while (t->second.count > lim.size) remove_head(p, t, evict_cause::size, _bytes);
  }
  if (_bytes.load(std::memory_order_relaxed) > _o.max_bytes) enforce_cap();
  return r;
}

/// Evicts the globally oldest entries until the total is under the cap: the part whose
/// oldest stamp is smallest gives up its oldest entry, one lock at a time. Stamps are read
/// without locks, so under concurrent appends the order is oldest-first give or take the
/// entries appended while this runs.
void history::enforce_cap() noexcept {
  while (_bytes.load(std::memory_order_relaxed) > _o.max_bytes) {
    std::uint32_t best = none;
    std::uint64_t best_stamp = UINT64_MAX;
    for (std::uint32_t i = 0; i <= _mask; ++i) {
      std::uint64_t s = _parts[i].oldest_stamp.load(std::memory_order_relaxed);
      if (s < best_stamp) best_stamp = s, best = i;
    }
    if (best == none) return;  // nothing retained anywhere: the rest is bookkeeping in flight
    history_part& p = _parts[best];
    std::lock_guard lock(p.mu);
    const std::uint32_t oldest = oldest_entry(p);
    if (oldest == none) continue;
    remove_head(p, p.entries[oldest].topic, evict_cause::memory, _bytes);
  }
}

replay_result history::replay_impl(std::string_view topic, std::string_view since_id, std::uint64_t until_seq,
                                   std::uint64_t now_ns, void* ctx, visit_fn fn) noexcept {
  replay_result r;
  std::uint64_t since = 0;
  bool known = parse_id(since_id, since);
  history_part& p = _parts[part_of(topic)];
  std::lock_guard lock(p.mu);
  auto it = p.topics.find(topic);
  topic_map::value_type* t = it != p.topics.end() ? &*it : nullptr;
  if (t != nullptr && !expire_topic(p, t, _lane_ttl[t->second.lane], now_ns, _bytes)) t = nullptr;
  if (!known) r.lost = true;
  // Ahead of anything the part issued: never issued. A since past the topic's last event but
  // issued (to another topic of the part) is a position (`subbed`'s `at`): nothing missed.
  else if (t != nullptr) r.lost = since < t->second.floor || since > p.seq;
  else r.lost = since < p.dropped_floor || since > p.seq;
  if (t == nullptr) return r;
  for (std::uint32_t k = t->second.head; k != none; k = p.entries[k].topic_next) {
    const history_entry& e = p.entries[k];
    if (e.seq > until_seq) break;
    if (r.lost || e.seq > since) {
      fn(ctx, e.seq, e.frame);
      ++r.replayed;
    }
  }
  return r;
}

std::size_t history::expire(std::uint64_t now_ns) noexcept {
  if (std::all_of(_lane_ttl.begin(), _lane_ttl.end(), [](std::uint64_t ttl) { return ttl == 0; })) return 0;
  std::size_t released = 0;
  for (std::uint32_t i = 0; i <= _mask; ++i) {
    history_part& p = _parts[i];
    std::lock_guard lock(p.mu);
    std::uint64_t before = p.n.bytes;
    // Each lane is in append order and of one TTL, so its expired entries are a prefix of it.
    for (std::uint32_t l = 0; l < _lane_ttl.size(); ++l) {
      const std::uint64_t ttl = _lane_ttl[l];
      while (p.lanes[l].oldest != none && expired(p.entries[p.lanes[l].oldest], ttl, now_ns))
        remove_head(p, p.entries[p.lanes[l].oldest].topic, evict_cause::ttl, _bytes);
    }
    released += std::size_t(before - p.n.bytes);
  }
  return released;
}

history_stats history::stats() const noexcept {
  history_stats s;
  for (std::uint32_t i = 0; i <= _mask; ++i) {
    const history_part& p = _parts[i];
    std::lock_guard lock(p.mu);
    s.entries += p.n.entries;
    s.bytes += p.n.bytes;
    s.topics += p.n.topics;
    s.appends += p.n.appends;
    s.evicted_size += p.n.evicted_size;
    s.evicted_ttl += p.n.evicted_ttl;
    s.evicted_memory += p.n.evicted_memory;
    s.idempotency_keys += p.idem.size();
    s.duplicates += p.n.duplicates;
  }
  return s;
}

}  // namespace wspush::server::pubsub
