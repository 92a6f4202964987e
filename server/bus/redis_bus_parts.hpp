#pragma once
// The Redis bus's inner parts, shared by its source files (redis_bus.cpp: set-up, requests from
// other threads, the loop; redis_bus_links.cpp: connecting to each Redis and losing it;
// redis_bus_subs.cpp: subscriptions and the replay seam; redis_bus_replies.cpp: publishes and
// what Redis answers). Not a header for anyone else.

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <random>

#include "proto/envelope.hpp"
#include "proto/topic.hpp"
#include "proto/ws_frame.hpp"
#include "server/base/clock.hpp"
#include "server/base/log.hpp"
#include "server/bus/redis_bus.hpp"
#include "server/bus/redis_route.hpp"

namespace wspush::server::bus {

extern const char* const redis_functions;  // wspush.lua, built in (redis_functions.cpp)
resp::limits reply_limits(const redis_bus_options& o) noexcept;  // what one reply from Redis may hold

namespace detail {

/// What the loop's on_ready carries for a link: the Redis's index, and which of its two links.
inline constexpr std::uint64_t link_key(std::size_t instance, bool subscriber) noexcept {
  return 2 * std::uint64_t(instance) + (subscriber ? 1 : 2);
}
inline constexpr std::uint64_t probe_key = (std::uint64_t(1) << 40) - 1;  // a cluster's map link (within the loop's 56-bit keys)
inline constexpr std::uint64_t watch_key = probe_key - 1;                   // Sentinel's +switch-master
inline constexpr std::uint32_t no_home = 0xFFFF;       // a slot no master is known to serve
inline constexpr std::size_t max_instances = 1024;      // masters a cluster may show, over the node's life
inline constexpr std::uint32_t map_every_ticks = 100;   // a cluster's map asked again every 5 s
inline constexpr std::string_view topic_prefix = "wspush:topic:";
inline constexpr std::string_view node_prefix = "wspush:node:";
/// Entries of the revocation list read in one reply (redis_bus_revoke.cpp).
inline constexpr std::uint32_t revocation_page = 500;
/// Users GET /presence lists at most (pubsub/presence.hpp): Redis answers them in one reply.
inline constexpr std::size_t max_admin_presence_users = pubsub::max_admin_users;
inline constexpr std::string_view control_channel = "wspush:control";  // revokes, to every node
inline constexpr std::string_view revocations_key = "wspush:revocations";  // sorted set: sub by revoke time
inline constexpr std::size_t channels_per_command = 1000;
inline constexpr std::size_t full_sub_batch = 64;          // (un)subscribes that go at once (send_batches)
inline constexpr std::size_t max_backlog = 1 << 16;      // events kept per shard while its inbox is full
inline constexpr std::size_t max_kept_live = 1 << 14;    // live events kept aside for one replay
// A replay is read in pages (wspush_replay's bound): no reply Redis builds, nor one the node
// reads, is larger than a page, however long the history; and the pages in flight node-wide
// are bounded, so many resumes at once cost Redis a few pages' memory, not their sum.
inline constexpr std::string_view replay_page_entries = "64";
inline constexpr std::uint32_t max_pages_in_flight = 8;
inline constexpr std::size_t max_batch_pubs = 64;          // publishes in one FCALL wspush_publish_batch (or _keyed)
inline constexpr std::size_t max_batch_bytes = 1 << 20;    // and their topics and data, about
inline constexpr std::size_t replay_page_bound = 1 << 20;  // the most a page holds (and what a catch-up's do)
inline constexpr std::uint32_t min_backoff_ticks = 4, max_backoff_ticks = 100;  // 0.2 s .. 5 s
inline constexpr std::uint32_t mark_every_ticks = 20;        // wspush_mark once a second
inline constexpr std::uint32_t held_sub_ticks = 200;         // a sub waits 10 s for Redis to come back
inline constexpr std::uint32_t max_held_subs = 1 << 16;      // subs waiting for Redis, node-wide
inline constexpr std::string_view lost_head = R"({"op":"lost","topics":[")", lost_tail = R"("]})";

/// Decimal digits only, within 64-bit unsigned range (what Redis reads in a stream id).
inline bool parse_number(std::string_view s, std::uint64_t& v) noexcept {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

/// An id's epoch (the life of Redis's data it was issued in): 1-16 of [0-9a-z].
inline bool valid_epoch(std::string_view epoch) noexcept {
  if (epoch.empty() || epoch.size() > 16) return false;
  for (char c : epoch)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'))) return false;
  return true;
}

/// "<epoch>:<ms>-<seq>" → (ms, seq); false when malformed.
inline bool parse_id(std::string_view id, std::uint64_t& ms, std::uint64_t& seq) noexcept {
  const auto colon = id.find(':');
  if (colon == std::string_view::npos || !valid_epoch(id.substr(0, colon))) return false;
  std::string_view rest = id.substr(colon + 1);
  const auto dash = rest.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash + 1 == rest.size()) return false;
  return parse_number(rest.substr(0, dash), ms) && parse_number(rest.substr(dash + 1), seq);
}

/// A sub's number is the shard's own: with the shard it names one sub of the node.
inline std::uint64_t request_key(std::uint32_t shard, std::uint64_t request) noexcept { return request << 10 ^ shard; }

struct id_key {
  std::uint64_t ms = 0, seq = 0;
  bool operator>(const id_key& o) const noexcept { return ms != o.ms ? ms > o.ms : seq > o.seq; }
};

/// Both ids are of the same epoch (the same life of Redis's data); false when one is empty.
inline bool same_epoch(std::string_view a, std::string_view b) noexcept {
  const auto ca = a.find(':'), cb = b.find(':');
  return ca != std::string_view::npos && ca == cb && a.substr(0, ca) == b.substr(0, cb);
}

inline id_key key_of(std::string_view id) noexcept {
  id_key k;
  parse_id(id, k.ms, k.seq);
  return k;
}

/// A place between events (redis_bus::mark_moment), not an event a stream issued.
inline bool is_moment(std::string_view id) noexcept { return key_of(id).seq == UINT64_MAX; }

inline std::string_view str(const resp::reply* r) noexcept {
  using enum resp::reply_type;
  return r && (r->type == string || r->type == status || r->type == error)
             ? std::string_view(r->str, r->len)
             : std::string_view{};
}

inline std::string random_node_id() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t(rd()) << 32) ^ rd();
  static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s;
  for (int k = 0; k < 10; ++k, v /= 36) s += digits[v % 36];
  return s;
}

}  // namespace detail

using namespace detail;

// ---- the parts ------------------------------------------------------------------------------

/// GET /presence waiting for Redis's answer (presence_wait).
struct redis_bus::presence_waiter {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  pubsub::presence_answer answer;
  void finish(pubsub::presence_answer a) {
    std::lock_guard lock(m);
    answer = std::move(a);
    done = true;
    cv.notify_all();
  }
};

struct redis_bus::waiter {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool sent = false;       // handed to Redis: from here on only Redis's answer settles it
  bool withdrawn = false;  // the publisher stopped waiting before it was sent: never send it
  bus_publish result = bus_publish::unavailable;
  std::string id;
  std::uint64_t ticket = 0;
  redis_bus* notify = nullptr;  // its publish notify is told the ticket once settled (publish_queue)
  void finish(bus_publish r, std::string_view text) {
    {
      std::lock_guard lock(m);
      result = r;
      id.assign(text);
      done = true;
      cv.notify_all();
    }
    if (notify) notify->notify_settled(ticket);
  }
};

struct redis_bus::request {
  enum kind_t : std::uint8_t { sub, release, client_pub, admin_pub, withdraw, more, revoke, presence_set, presence_get } kind = sub;
  std::uint32_t shard = 0;
  std::uint64_t tag = 0;  // client_pub: the session's tag; revoke: when (unix seconds), `topic` the sub
  std::string topic, data;
  std::unique_ptr<pubsub::bus_sub> s;
  std::shared_ptr<waiter> w;
  std::uint64_t sub_request = 0;  // withdraw, more: the sub's number (bus_sub::request)
  std::uint64_t room = 0;         // more: what the connection can take (bytes)
  std::string key = {};           // client_pub, admin_pub: its idempotency key (empty: none)
  // presence_set: `topic`, `data` the user, `tag` its connections here, `room` 1: announce.
  // presence_get: `topic`, `shard`, `tag` the connection, `sub_request` the session's number,
  // `room` 1: counts only; or `pw` (the admin API waits).
  std::shared_ptr<presence_waiter> pw = {};
};

/// One publish of a batch (op::publishes), answered from its element of the reply.
struct redis_bus::batched_pub {
  bool client = false;      // a client's pub (else the admin API's)
  std::uint32_t shard = 0;  // client: its shard, its tag, what it counts in _pub_bytes
  std::uint64_t tag = 0;
  std::size_t bytes = 0;
  std::string topic;        // client: for its error, if one comes
  std::shared_ptr<waiter> w;
  // Durable publishes (--redis-wait-replicas): what Redis answered, kept until WAIT answers.
  bus_publish result = bus_publish::unknown;
  std::string text;
};

struct redis_bus::op {
  enum kind_t : std::uint8_t { setup, role, epoch, replay, publishes, wait, marker, mark, node_bytes, slots, sentinel_addr,
                               revoke, revocations, presence, presence_get, other };
  explicit op(kind_t k, std::uint64_t p = 0, std::uint32_t i = 0) noexcept : kind(k), pid(p), index(i) {}
  kind_t kind;
  std::uint64_t pid = 0;
  std::uint32_t index = 0;
  std::uint32_t shard = 0;
  std::uint64_t tag = 0;    // replay: the link generation it was sent on
  std::vector<batched_pub> pubs;  // publishes: one per pair of the call, in order (wait: handed on)
  op* then_wait = nullptr;  // publishes: the WAIT that settles them (durable: follow_with_wait)
  bool unconfirmed = false; // publishes: durable, but no WAIT could follow them (no memory)
  redis_bus* bus = nullptr;
  instance* in = nullptr;   // the Redis it was sent to
  std::string topic;        // presence_get: the topic asked (pid: the session's number, tag: the connection)
  bool count_only = false;
  std::shared_ptr<presence_waiter> pw;  // presence_get asked by the admin API
};

/// One Redis of the bus: its two links and what the bus knows of it. The bus is up on it once
/// both links are set up; each Redis connects, fails and comes back on its own.
struct redis_bus::instance {
  instance(redis_bus& bus, std::uint32_t i, redis_target t, const resp::limits& limits, relaxed_counter* errors)
      : index(i), target(std::move(t)),
        sub(bus._loop, link_key(i, true), bus, {true, limits, errors, target.tls ? bus._o.tls.get() : nullptr}),
        cmd(bus._loop, link_key(i, false), bus, {false, limits, errors, target.tls ? bus._o.tls.get() : nullptr}),
        host(target.host), port(target.port) {}
  const std::uint32_t index;
  const redis_target target;
  redis_link sub, cmd;
  std::string host;           // where it is connected (the target's; under Sentinel, what a Sentinel said)
  std::uint16_t port = 0;
  bool located = false;       // Sentinel: asked since the last connection was lost
  bool wait_in_flight = false;      // durable publishes: a WAIT sent, not answered
  std::unique_ptr<op> next_wait;    // ... and the one the batches sent meanwhile wait for (not sent yet)
  bool serving = true;        // a cluster's master that serves slots (else it is left alone)
  std::string node_channel;   // this node's channel there (a cluster: a shard channel in a slot it serves)
  std::uint32_t node_slot = no_home;  // a cluster: that channel's slot
  std::atomic<bool> up{false};
  bool stalled = false;
  bool cmd_ready = false, sub_ready = false;
  std::string refusal;  // why Redis refused this connection's set-up (empty: it did not)
  std::string why_down; // "<url>: why" while it is down (_why_m: other threads read it)
  std::uint32_t retry_at = 0, backoff_ticks = 0;
  bool ever_up = false;
  std::string epoch;                  // its epoch (wspush_epoch), as of the last set-up
  std::string mark_epoch;             // the last mark heard (wspush_mark): its epoch, its
  std::uint64_t mark_ms = 0, mark_at = 0;  // TIME, when it came (in bus::_order)
  bool mark_current = false;  // the last mark was heard on the current links (add_positions)
  bool mark_in_flight = false;
  std::uint32_t next_mark_tick = 0, mark_sent_tick = 0;
  std::vector<std::string> unfloored;  // its topics confirmed since its last mark was heard
  std::deque<std::pair<std::uint64_t, std::uint32_t>> page_queue;  // replay pages waiting: (pid, part)
  std::uint32_t pages_in_flight = 0;  // replay pages sent, not yet answered (at most max_pages_in_flight)
  std::uint64_t link_gen = 0;         // counts outages: a page sent before one is not in flight after it
  std::vector<std::string> to_subscribe, to_unsubscribe;
  std::size_t awaiting = 0;  // channels of sent (UN)SUBSCRIBE commands not yet confirmed
  std::uint32_t small_batch_tick = UINT32_MAX;  // the tick a batch short of full_sub_batch last went
  // Presence words taken and not sent yet (args of wspush_presence: topic, user, n, announce).
  std::vector<std::string> presence_words;
  // The publishes taken and not sent yet (take_requests batches them per Redis).
  std::vector<request*> gathered;
  std::size_t gathered_bytes = 0;
};

struct redis_bus::topic_state {
  std::uint32_t home = 0;           // the Redis that holds it (bus::_instances)
  std::uint16_t holders = 0;
  enum state_t : std::uint8_t { idle, subscribing, active, unsubscribing } state = idle;
  bool needs_catchup = false;       // subscribed before an outage: replay what was missed
  // Subscribed without a break since before the last mark heard, owing no catch-up: every
  // event published before that mark has been handed on (the mark is a floor).
  bool floored = false;
  bool listed = false;              // in _unfloored
  // Where the catch-up owed after an outage starts, fixed when the outage began (a mark heard
  // later is no floor for a topic that was not subscribed meanwhile); not known: its
  // subscribers hear it is lost. Once that catch-up is done it stays a floor for the next one
  // (everything after it was handed on), unless the catch-up was lost.
  bool catchup_known = false;
  std::string catchup_since;
  std::uint64_t catchup_at = 0;     // when it was known (bus::_order)
  std::uint64_t last_at = 0;        // when last_id was set (bus::_order)
  std::uint64_t catchup = 0;        // the catch-up under way (its live events are kept aside)
  std::vector<std::uint64_t> waiting;    // subs waiting for the confirmation
  std::vector<std::uint64_t> replaying;  // subs keeping live events aside
  std::string last_id;              // the last event seen (where a catch-up starts)
};

struct redis_bus::pending {
  enum kind_t : std::uint8_t { sub, catchup } kind = sub;
  std::uint64_t pid = 0;
  std::unique_ptr<pubsub::bus_sub> s;
  std::uint32_t unconfirmed = 0, replies_left = 0;
  bool marker_seen = false, failed = false;
  bool marker_sent = false;    // behind the last page of every part, on each Redis replayed from (maybe_finish)
  std::uint32_t markers_left = 0;  // sent, not back yet
  bool held = false;           // waits for Redis to come back (bus::_held_subs)
  // Paced (send_page): `subbed` went with the first page; each next page, and then the
  // marker and replay_done, wait for the shard's more() (the client read what it had).
  bool answered = false;
  bool awaiting_more = false;
  std::uint32_t next_part = 0;  // answered: the part whose page comes next (parts.size(): the marker)
  // What a page may hold (bytes, and at least one entry): a sub's connection's room (asked
  // with the sub, then with each more()), so that the shard holds none of a page back.
  std::uint64_t page_bytes = replay_page_bound;
  std::uint32_t deadline = 0;  // held: the tick it is refused at
  bool mark_mode = false;      // catch-up: `since` is a floor, not an event (wspush.lua)
  struct part {
    std::uint32_t home = 0;    // the Redis that holds the topic
    std::string topic, since;
    std::string last_id;       // the newest id replayed
    std::string live_last_id;  // catch-up: the newest live event held back
    std::string cursor;        // where the next page starts (wspush_replay's `next`); empty: the first
    bool lost = false, replaying = false, overflow = false;
    bool joins = false;        // sub: new to the connection (given a position; joins with the answer)
    bool lost_told = false;    // told (in `subbed`, or in the stream) since it was last found lost
    id_key last;  // the newest id replayed (or `since`)
    std::vector<pool::frame_ref> entries;
    std::vector<std::pair<id_key, pool::frame_ref>> live;
  };
  std::vector<part> parts;
};

}  // namespace wspush::server::bus
