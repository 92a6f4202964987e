#include "server/bus/redis_bus.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <new>
#include <random>

#include "proto/envelope.hpp"
#include "proto/topic.hpp"
#include "proto/ws_frame.hpp"
#include "server/base/clock.hpp"
#include "server/base/log.hpp"

namespace wspush::server::bus {

extern const char* const redis_functions;  // wspush.lua, built in (redis_functions.cpp)

namespace {

constexpr std::uint64_t key_sub = 1, key_cmd = 2;
constexpr std::string_view topic_prefix = "wspush:topic:";
constexpr std::string_view node_prefix = "wspush:node:";
constexpr std::size_t channels_per_command = 1000;
constexpr std::size_t full_sub_batch = 64;          // (un)subscribes that go at once (send_batches)
constexpr std::size_t max_backlog = 1 << 16;      // events kept per shard while its inbox is full
constexpr std::size_t max_kept_live = 1 << 14;    // live events kept aside for one replay
// A replay is read in pages (wspush_replay's bound): no reply Redis builds, nor one the node
// reads, is larger than a page, however long the history; and the pages in flight node-wide
// are bounded, so many resumes at once cost Redis a few pages' memory, not their sum.
constexpr std::string_view replay_page_entries = "64";
constexpr std::uint32_t max_pages_in_flight = 8;
constexpr std::size_t max_batch_pubs = 64;          // publishes in one FCALL wspush_publish_batch
constexpr std::size_t max_batch_bytes = 1 << 20;    // and their topics and data, about
constexpr std::size_t replay_page_bound = 1 << 20;  // the most a page holds (and what a catch-up's do)
constexpr std::uint32_t min_backoff_ticks = 4, max_backoff_ticks = 100;  // 0.2 s .. 5 s
constexpr std::uint32_t mark_every_ticks = 20;        // wspush_mark once a second
constexpr std::uint32_t held_sub_ticks = 200;         // a sub waits 10 s for Redis to come back
constexpr std::uint32_t max_held_subs = 1 << 16;      // subs waiting for Redis, node-wide
constexpr std::string_view lost_head = R"({"op":"lost","topics":[")", lost_tail = R"("]})";

/// Decimal digits only, within 64-bit unsigned range (what Redis reads in a stream id).
bool parse_number(std::string_view s, std::uint64_t& v) noexcept {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

/// An id's epoch (the life of Redis's data it was issued in): 1-16 of [0-9a-z].
bool valid_epoch(std::string_view epoch) noexcept {
  if (epoch.empty() || epoch.size() > 16) return false;
  for (char c : epoch)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'))) return false;
  return true;
}

/// "<epoch>:<ms>-<seq>" → (ms, seq); false when malformed.
bool parse_id(std::string_view id, std::uint64_t& ms, std::uint64_t& seq) noexcept {
  const auto colon = id.find(':');
  if (colon == std::string_view::npos || !valid_epoch(id.substr(0, colon))) return false;
  std::string_view rest = id.substr(colon + 1);
  const auto dash = rest.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash + 1 == rest.size()) return false;
  return parse_number(rest.substr(0, dash), ms) && parse_number(rest.substr(dash + 1), seq);
}

/// A sub's number is the shard's own: with the shard it names one sub of the node.
std::uint64_t request_key(std::uint32_t shard, std::uint64_t request) noexcept { return request << 10 ^ shard; }

struct id_key {
  std::uint64_t ms = 0, seq = 0;
  bool operator>(const id_key& o) const noexcept { return ms != o.ms ? ms > o.ms : seq > o.seq; }
};

/// Both ids are of the same epoch (the same life of Redis's data); false when one is empty.
bool same_epoch(std::string_view a, std::string_view b) noexcept {
  const auto ca = a.find(':'), cb = b.find(':');
  return ca != std::string_view::npos && ca == cb && a.substr(0, ca) == b.substr(0, cb);
}

id_key key_of(std::string_view id) noexcept {
  id_key k;
  parse_id(id, k.ms, k.seq);
  return k;
}

/// A place between events (redis_bus::mark_moment), not an event a stream issued.
bool is_moment(std::string_view id) noexcept { return key_of(id).seq == UINT64_MAX; }

std::string_view str(const resp::reply* r) noexcept {
  using enum resp::reply_type;
  return r && (r->type == string || r->type == status || r->type == error)
             ? std::string_view(r->str, r->len)
             : std::string_view{};
}

std::string random_node_id() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t(rd()) << 32) ^ rd();
  static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s;
  for (int k = 0; k < 10; ++k, v /= 36) s += digits[v % 36];
  return s;
}

}  // namespace

// ---- the parts ------------------------------------------------------------------------------

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
  enum kind_t : std::uint8_t { sub, release, client_pub, admin_pub, withdraw, more } kind = sub;
  std::uint32_t shard = 0;
  std::uint64_t tag = 0;  // client_pub: the session's tag
  std::string topic, data;
  std::unique_ptr<pubsub::bus_sub> s;
  std::shared_ptr<waiter> w;
  std::uint64_t sub_request = 0;  // withdraw, more: the sub's number (bus_sub::request)
  std::uint64_t room = 0;         // more: what the connection can take (bytes)
};

/// One publish of a batch (op::publishes), answered from its element of the reply.
struct redis_bus::batched_pub {
  bool client = false;      // a client's pub (else the admin API's)
  std::uint32_t shard = 0;  // client: its shard, its tag, what it counts in _pub_bytes
  std::uint64_t tag = 0;
  std::size_t bytes = 0;
  std::string topic;        // client: for its error, if one comes
  std::shared_ptr<waiter> w;
};

struct redis_bus::op {
  enum kind_t : std::uint8_t { setup, epoch, replay, publishes, marker, mark, node_bytes, other };
  explicit op(kind_t k, std::uint64_t p = 0, std::uint32_t i = 0) noexcept : kind(k), pid(p), index(i) {}
  kind_t kind;
  std::uint64_t pid = 0;
  std::uint32_t index = 0;
  std::uint32_t shard = 0;
  std::uint64_t tag = 0;    // replay: the link generation it was sent on
  std::vector<batched_pub> pubs;  // publishes: one per pair of the call, in order
  redis_bus* bus = nullptr;
};

struct redis_bus::topic_state {
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
  bool marker_sent = false;    // behind the last page of every part (maybe_finish)
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

// ---- the links' callbacks -------------------------------------------------------------------

namespace {

void reply_cb(const resp::reply* reply, void* priv) noexcept {
  auto* o = static_cast<redis_bus::op*>(priv);
  o->bus->on_reply(o, reply);
}

/// What a reply from Redis may hold (a bound past it drops the link, see redis_link.hpp). A bulk
/// string: one event's data plus its id and a space (a `message`'s payload), with room to spare.
/// An array: a replay's `lost` flag and id/data pairs for at most history_size entries, plus
/// slack. Nesting: replies and pushes the bus reads are flat; 4 leaves room. The bytes of one
/// reply: what a replay of a whole history of events of the largest size holds (a replay is read
/// in one reply today), at least 4 MiB. Nothing is reserved from a header: a reply costs memory
/// only as its bytes arrive.
resp::limits reply_limits(const redis_bus_options& o) noexcept {
  resp::limits l;
  l.max_bulk = std::size_t(o.max_event_bytes) + 256;
  l.max_elements = std::max<std::size_t>(2 * std::size_t(o.history_size), max_batch_pubs) + 16;
  l.max_depth = 4;
  l.max_total = std::max<std::size_t>(4u << 20, (std::size_t(o.history_size) + 1) * l.max_bulk) +
                l.max_elements * sizeof(resp::reply) + (64 << 10);
  return l;
}

}  // namespace

// ---- set-up and shutdown --------------------------------------------------------------------

redis_bus::redis_bus(redis_bus_options o, pool::buffer_pool& buffers)
    : _o(std::move(o)), _buffers(buffers), _loop(loop_options{}),
      _sub(_loop, key_sub, *this, {true, reply_limits(_o), &_n.protocol_errors}),
      _cmd(_loop, key_cmd, *this, {false, reply_limits(_o), &_n.protocol_errors}),
      _node_channel(std::string(node_prefix) + random_node_id()) {}

redis_bus::~redis_bus() { stop(); }

bool redis_bus::start(std::string& why) {
  bool fell_back = false;
  if (!_loop.start(false, -1, why, fell_back)) return false;  // epoll: it can watch the links' sockets
  _backlog.resize(_ports.size());
  _pubs_done.resize(_ports.size());
  _running = true;
  _thread = std::thread([this] {
    _bus_thread.store(std::this_thread::get_id(), std::memory_order_relaxed);
    _loop.run(*this);
  });
  return true;
}

void redis_bus::stop() {
  if (!_running.exchange(false)) return;
  _loop.request_drain();
  if (_thread.joinable()) _thread.join();
  _up = false;
}

std::uint64_t redis_bus::on_drain_begin() noexcept {
  _sub.disconnect();
  _cmd.disconnect();
  flush_settled();  // the publishes the links took with them: no turn follows
  return 0;
}

// ---- requests from other threads ------------------------------------------------------------

/// Queues a request for the bus thread and wakes it; false, and nothing queued, when there was
/// no memory for it. `topic` and `data` are copied into the request here, so that a poster
/// builds nothing that can throw.
bool redis_bus::post(request&& r, std::string_view topic, std::string_view data, bool wake) noexcept {
  try {
    r.topic.assign(topic);
    r.data.assign(data);
    std::lock_guard lock(_req_m);
    _requests.push_back(std::move(r));
  } catch (...) {
    return false;
  }
  if (wake) _loop.wake();
  else _unwoken.store(true, std::memory_order_release);
  return true;
}

void redis_bus::wake_for_posts() noexcept {
  if (_unwoken.exchange(false, std::memory_order_acq_rel)) _loop.wake();
}

bool redis_bus::subscribe(std::unique_ptr<pubsub::bus_sub> s) noexcept {
  // While Redis is away a sub waits for it (bounded); past the bound it is refused at once.
  if (!up() && _held.load(std::memory_order_relaxed) >= max_held_subs) return false;
  return post(request{request::sub, s->shard, 0, {}, {}, std::move(s), {}});
}

void redis_bus::release(std::uint32_t shard, std::string_view topic) noexcept {
  if (!post(request{request::release, shard, 0, {}, {}, {}, {}}, topic))
    log_ratelimited(log_level::error, "bus: out of memory; a topic stays subscribed");
}

void redis_bus::withdraw(std::uint32_t shard, std::uint64_t sub_request) noexcept {
  // Without memory for it, the sub goes when Redis has answered.
  post(request{request::withdraw, shard, 0, {}, {}, {}, {}, sub_request});
}

void redis_bus::more(std::uint32_t shard, std::uint64_t sub_request, std::uint64_t room) noexcept {
  // No memory: the replay stops here, and the connection waits until it closes.
  if (!post(request{request::more, shard, 0, {}, {}, {}, {}, sub_request, room}))
    log_ratelimited(log_level::error, "bus: out of memory; a replay stalls");
}

/// The ids a node issues: "<epoch>:<ms>-<seq>" on this bus, "<epoch>:<seq>" on the embedded bus
/// (a node moved from it to Redis: of another epoch, so `lost`). The epoch is 1-16 of [0-9a-z],
/// every number decimal within 64 bits: Redis refuses a stream id past that, and the node would
/// have nothing to answer but `unavailable`.
bool redis_bus::readable_since(std::string_view id) const noexcept {
  std::uint64_t ms, seq;
  if (parse_id(id, ms, seq)) return true;
  const auto colon = id.find(':');
  if (colon == std::string_view::npos || !valid_epoch(id.substr(0, colon))) return false;
  return parse_number(id.substr(colon + 1), seq);
}

/// A client's pub waits for Redis in this node's memory until answered: bounded node-wide by
/// max_pub_bytes (past it, refused at once), and per connection by the session (it stops
/// reading a connection with max_pubs_in_flight unanswered).
bool redis_bus::publish(std::uint32_t shard, std::uint64_t tag, std::string_view topic, std::string_view data) noexcept {
  if (!up()) return false;
  const std::size_t bytes = topic.size() + data.size();
  if (_pub_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes > _o.max_pub_bytes) {
    _pub_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    _n.pubs_refused.add();  // shard threads: a relaxed add may lose a count between two; it is a gauge of trouble
    return false;
  }
  if (!post(request{request::client_pub, shard, tag, {}, {}, {}, {}}, topic, data)) {
    _pub_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void redis_bus::set_publish_notify(publish_notify notify) noexcept {
  std::lock_guard lock(_notify_m);
  _notify = std::move(notify);
}

/// On the bus thread the tickets settled in one turn are told together at its end
/// (flush_settled), so that the admin thread wakes once for a batch's answers, not once each
/// (and, on one core, does not preempt the bus thread between two of them).
void redis_bus::notify_settled(std::uint64_t ticket) noexcept {
  if (std::this_thread::get_id() == _bus_thread.load(std::memory_order_relaxed)) {
    try {
      _settled.push_back(ticket);
      return;
    } catch (...) {
    }
  }
  std::lock_guard lock(_notify_m);
  if (_notify) _notify(std::span<const std::uint64_t>(&ticket, 1));
}

void redis_bus::flush_settled() noexcept {
  if (_settled.empty()) return;
  {
    std::lock_guard lock(_notify_m);
    if (_notify) _notify(_settled);
  }
  _settled.clear();
}

std::uint64_t redis_bus::publish_queue(std::string_view topic, std::string_view data, bool notify, bool wake) {
  auto w = std::make_shared<waiter>();
  std::uint64_t ticket;
  {
    std::lock_guard lock(_tickets_m);
    ticket = _next_ticket++;
    _tickets.emplace(ticket, w);
  }
  w->ticket = ticket;
  if (notify) w->notify = this;
  if (!up()) {
    w->finish(bus_publish::unavailable, "the bus is down");
    return ticket;
  }
  if (!post(request{request::admin_pub, 0, 0, {}, {}, {}, std::move(w)}, topic, data, wake))
    throw std::bad_alloc();  // no memory for it: the caller answers unavailable (bus_sink)
  return ticket;
}

bus_publish redis_bus::publish_collect(std::uint64_t ticket, std::string& id, std::chrono::milliseconds timeout) {
  std::shared_ptr<waiter> w;
  {
    std::lock_guard lock(_tickets_m);
    auto it = _tickets.find(ticket);
    if (it == _tickets.end()) return bus_publish::unavailable;
    w = std::move(it->second);
    _tickets.erase(it);
  }
  std::unique_lock lock(w->m);
  if (!w->cv.wait_for(lock, timeout, [&] { return w->done; })) {
    if (w->sent) return bus_publish::unknown;
    w->withdrawn = true;  // the bus thread drops it: "unavailable" stays true
    return bus_publish::unavailable;
  }
  id = w->id;
  return w->result;
}

bus_publish redis_bus::publish_wait(std::string_view topic, std::string_view data, std::string& id,
                                    std::chrono::milliseconds timeout) {
  return publish_collect(publish_queue(topic, data), id, timeout);
}

// ---- the loop -------------------------------------------------------------------------------

void redis_bus::on_turn() noexcept {
  take_requests();
  send_batches();
  pump_pages();
  for (std::uint32_t k = 0; k < _pubs_done.size(); ++k) {
    if (_pubs_done[k].empty()) continue;
    auto r = std::unique_ptr<pubsub::bus_reply>(new (std::nothrow) pubsub::bus_reply);
    if (!r) break;  // the next turn
    r->kind = pubsub::bus_reply::pubs_done;
    r->done_tags.swap(_pubs_done[k]);
    pubsub::event e;
    e.reply = std::move(r);
    offer(k, std::move(e));
  }
  // What the shards' inboxes refused before goes first, in order.
  for (std::size_t k = 0; k < _backlog.size(); ++k) {
    auto& b = _backlog[k];
    while (!b.empty() && _ports[k]->offer(std::move(b.front()), false)) b.pop_front();
  }
  for (pubsub::event_port* p : _ports) p->wake();
  _n.pending.set(_pending.size());
  flush_settled();  // what the replies read in this turn, and the requests taken, settled
}

void redis_bus::on_tick(std::uint32_t tick) noexcept {
  _tick = tick;
  if (!_up.load(std::memory_order_relaxed) && _sub.idle() && _cmd.idle() && tick >= _retry_at) connect_links();
  expire_held();
  if (_up.load(std::memory_order_relaxed) && !_mark_in_flight &&
      (std::int32_t(tick - _next_mark_tick) >= 0 || !_unfloored.empty()))
    send_mark();
  watch_stall();
}

void redis_bus::send_mark() noexcept {
  auto* o = new (std::nothrow) op{op::mark};
  if (!o || !command({"FCALL", "wspush_mark", "0", _node_channel}, o)) return;
  _mark_in_flight = true;
  _next_mark_tick = _tick + mark_every_ticks;
}

/// "mark <epoch> <ms>" on this node's channel: every publish made before <ms> on a topic that
/// was subscribed before it has arrived. The topics confirmed since the last one now have it
/// as their floor.
void redis_bus::mark_arrived(std::string_view payload) noexcept {
  _mark_in_flight = false;
  const auto space = payload.find(' ', 5);
  std::uint64_t ms = 0;
  if (space == std::string_view::npos || !parse_number(payload.substr(space + 1), ms) || ms == 0) {
    _n.malformed.add();
    return;
  }
  _n.marks.add();
  _mark_epoch.assign(payload.substr(5, space - 5));
  _mark_ms = ms;
  _mark_at = ++_order;
  _mark_current = true;
  // A topic still owed a catch-up has not had every event before this mark: it waits for the
  // next mark after its catch-up.
  std::size_t kept = 0;
  for (std::string& t : _unfloored) {
    auto it = _topics.find(t);
    if (it == _topics.end()) continue;
    topic_state& ts = it->second;
    if (ts.state != topic_state::active) {
      ts.listed = false;
    } else if (ts.catchup || ts.needs_catchup) {
      _unfloored[kept++].swap(t);
    } else {
      ts.floored = true;
      ts.listed = false;
    }
  }
  _unfloored.resize(kept);
}

/// Each tick: an idle link is pinged every second, and a command unanswered for longer than
/// --redis-timeout marks the bus stalled (readiness reads stalled()) until an answer comes or
/// the link drops.
void redis_bus::watch_stall() noexcept {
  constexpr std::uint64_t ping_after_ns = 1'000'000'000;
  const std::uint64_t now = monotonic_ns();
  _sub.keepalive(now, ping_after_ns);
  _cmd.keepalive(now, ping_after_ns);
  const std::uint64_t waited = std::max(_sub.waiting_ns(now), _cmd.waiting_ns(now));
  const bool stalled = double(waited) > _o.redis_timeout * 1e9;
  if (stalled == _stalled.load(std::memory_order_relaxed)) return;
  _stalled.store(stalled, std::memory_order_release);
  if (stalled)
    log(log_level::warn, "bus: %s has not answered a command for %.1fs (--redis-timeout %gs): stalled",
        _o.target.describe().c_str(), double(waited) / 1e9, _o.redis_timeout);
  else
    log(log_level::info, "bus: %s is no longer stalled (answered, or the link dropped)", _o.target.describe().c_str());
}

void redis_bus::on_ready(std::uint64_t key, bool r, bool w) noexcept {
  if (key == key_sub) _sub.on_ready(r, w);
  else if (key == key_cmd) _cmd.on_ready(r, w);
}

void redis_bus::take_requests() noexcept {
  {
    std::lock_guard lock(_req_m);
    if (_requests.empty()) return;
    _taking.swap(_requests);
  }
  // Publishes go to Redis in batches, a batch of what is queued back to back (never waiting for
  // more to come), in the order they were asked among the other requests.
  for (request& r : _taking) {
    if (r.kind == request::client_pub || r.kind == request::admin_pub) {
      gather_publish(r);
      continue;
    }
    send_publishes();
    handle(r);
  }
  send_publishes();
  _taking.clear();
}

void redis_bus::handle(request& r) noexcept {
  switch (r.kind) {
    case request::sub: return handle_sub(std::move(r.s));
    case request::release: return handle_release(r.shard, r.topic);
    case request::withdraw: return handle_withdraw(r.shard, r.sub_request);
    case request::more: return handle_more(r.shard, r.sub_request, r.room);
    case request::client_pub:
    case request::admin_pub: return gather_publish(r), send_publishes();
  }
}

bool redis_bus::command(std::initializer_list<std::string_view> args, op* o) noexcept {
  return command(std::span<const std::string_view>(args.begin(), args.size()), o);
}

/// Sends a command on the command link; `o` is answered by on_reply, or deleted if it was not sent.
bool redis_bus::command(std::span<const std::string_view> args, op* o) noexcept {
  try {
    _argp.resize(args.size());
    _argl.resize(args.size());
  } catch (...) {
    delete o;
    return false;
  }
  for (std::size_t k = 0; k < args.size(); ++k) {
    _argp[k] = args[k].data();
    _argl[k] = args[k].size();
  }
  o->bus = this;
  if (_cmd.command(int(args.size()), _argp.data(), _argl.data(), reply_cb, o)) return true;
  delete o;
  return false;
}

// ---- subscriptions --------------------------------------------------------------------------

void redis_bus::handle_sub(std::unique_ptr<pubsub::bus_sub> s) noexcept {
  const std::uint64_t pid = _next_pid++;
  pending& p = _pending[pid];
  p.kind = pending::sub;
  p.pid = pid;
  try {
    _pid_of_request[request_key(s->shard, s->request)] = pid;
  } catch (...) {
    // Out of memory: a withdraw will not find it; it goes when Redis has answered.
  }
  p.parts.resize(s->topics.size());
  for (std::size_t k = 0; k < s->topics.size(); ++k) {
    topic_state& ts = _topics[s->topics[k]];
    if (s->new_hold[k]) ++ts.holders;  // a hold is always taken: the shard releases it later
    p.parts[k].topic = s->topics[k];
    p.parts[k].since = s->since[k];
    p.parts[k].joins = k < s->joins.size() && s->joins[k];
  }
  p.page_bytes = std::clamp<std::uint64_t>(s->room, 1, replay_page_bound);
  p.s = std::move(s);
  if (!_up.load(std::memory_order_relaxed)) return park(pid);
  enlist(pid);
}

/// Waits for each of the sub's topics to be subscribed in Redis (subscribing those not yet),
/// then goes on (advance).
void redis_bus::enlist(std::uint64_t pid) noexcept {
  pending& p = _pending.at(pid);
  for (auto& part : p.parts) {
    topic_state& ts = _topics[part.topic];
    if (ts.state == topic_state::idle) {
      ts.state = topic_state::subscribing;
      _to_subscribe.push_back(part.topic);
    }
    if (ts.state != topic_state::active) {
      ts.waiting.push_back(pid);
      ++p.unconfirmed;
    }
  }
  if (p.unconfirmed == 0) advance(pid);
}

/// Redis is away: the sub waits for it (its topics stay held), until held_sub_wait ends.
void redis_bus::park(std::uint64_t pid) noexcept {
  pending& p = _pending.at(pid);
  try {
    _held_subs.push_back(pid);
  } catch (...) {
    return drop_pending(pid);
  }
  p.held = true;
  if (p.deadline == 0) p.deadline = _tick + held_sub_ticks;  // held again after a brief reconnect: the first wait counts
  _held.fetch_add(1, std::memory_order_relaxed);
  _n.held.add();
}

/// Redis is back: every sub that waited goes on, in order, each under a new number (a marker
/// of its earlier attempt, late from the old connection, must not count for the new one).
void redis_bus::unpark_all() noexcept {
  std::deque<std::uint64_t> held;
  held.swap(_held_subs);
  for (std::uint64_t pid : held) {
    auto it = _pending.find(pid);
    if (it == _pending.end() || !it->second.held) continue;
    const std::uint64_t now = _next_pid++;
    auto node = _pending.extract(it);
    node.key() = now;
    pending& p = node.mapped();
    p.pid = now;
    p.held = false;
    _held.fetch_sub(1, std::memory_order_relaxed);
    _n.held.sub();
    if (p.s) _pid_of_request[request_key(p.s->shard, p.s->request)] = now;
    _pending.insert(std::move(node));
    enlist(now);
  }
}

/// Subs that waited held_sub_wait for Redis in vain: `unavailable`.
void redis_bus::expire_held() noexcept {
  while (!_held_subs.empty()) {
    auto it = _pending.find(_held_subs.front());
    if (it != _pending.end() && it->second.held && std::int32_t(_tick - it->second.deadline) < 0) return;
    const std::uint64_t pid = _held_subs.front();
    _held_subs.pop_front();
    if (it != _pending.end() && it->second.held) drop_pending(pid);
  }
}

void redis_bus::handle_release(std::uint32_t, const std::string& topic) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end() || it->second.holders == 0) return;
  topic_state& ts = it->second;
  if (--ts.holders > 0) return;
  switch (ts.state) {
    case topic_state::active:
      if (ts.catchup) return;  // after its catch-up (finish() looks again)
      ts.state = topic_state::unsubscribing;
      _to_unsubscribe.push_back(topic);
      break;
    case topic_state::idle:
      if (ts.waiting.empty()) _topics.erase(it);
      break;
    default: break;  // subscribing: confirmed() looks again; unsubscribing: it goes
  }
}

/// Subscribes and unsubscribes go out in batches: one command while none is unanswered, with
/// everything that gathered meanwhile. A batch of fewer than full_sub_batch goes only if none
/// did in this tick, else at the next (on_turn after on_tick): a lone sub goes at once, and one
/// of many waits at most a tick (50 ms), so that 19,000 mailboxes connecting within a few
/// seconds cost Redis a few hundred commands, each a read, a wake-up and a write, not thousands.
void redis_bus::send_batches() noexcept {
  if (!_sub.connected() || _awaiting > 0) return;
  if (_to_subscribe.size() < full_sub_batch && _to_unsubscribe.size() < full_sub_batch) {
    if (_to_subscribe.empty() && _to_unsubscribe.empty()) return;
    if (_small_batch_tick == _tick) return;
    _small_batch_tick = _tick;
  }
  auto send = [this](std::string_view verb, std::vector<std::string>& topics) {
    for (std::size_t at = 0; at < topics.size(); at += channels_per_command) {
      const std::size_t n = std::min(channels_per_command, topics.size() - at);
      std::vector<std::string> channels;
      channels.reserve(n);
      std::vector<const char*> argv{verb.data()};
      std::vector<std::size_t> lens{verb.size()};
      for (std::size_t k = 0; k < n; ++k) {
        channels.push_back(std::string(topic_prefix) + topics[at + k]);
        argv.push_back(channels.back().data());
        lens.push_back(channels.back().size());
      }
      if (!_sub.command(int(argv.size()), argv.data(), lens.data(), nullptr, nullptr)) return;
      (verb == "SUBSCRIBE" ? _n.subscribes : _n.unsubscribes).add();
      _awaiting += n;
    }
    topics.clear();
  };
  if (!_to_subscribe.empty()) send("SUBSCRIBE", _to_subscribe);
  if (!_to_unsubscribe.empty()) send("UNSUBSCRIBE", _to_unsubscribe);
}

void redis_bus::confirmed(const std::string& topic) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end()) return;
  topic_state& ts = it->second;
  if (ts.state != topic_state::subscribing) return;
  ts.state = topic_state::active;
  _n.topics.add();
  if (!ts.floored && !ts.listed) {
    try {
      _unfloored.push_back(topic);  // the next mark heard is its floor
      ts.listed = true;
    } catch (...) {
    }
  }
  // Back after an outage: what was published meanwhile goes to the subscribers that stayed
  // (once the command connection is set up too: ready_check starts the early ones), before
  // the subs waiting for this confirmation go on: their connections join after it.
  if (ts.needs_catchup && _up.load(std::memory_order_relaxed)) start_catchup(topic);
  it = _topics.find(topic);
  if (it == _topics.end()) return;
  std::vector<std::uint64_t> waiting;
  waiting.swap(it->second.waiting);
  for (std::uint64_t pid : waiting) {
    auto p = _pending.find(pid);
    if (p != _pending.end() && p->second.unconfirmed > 0 && --p->second.unconfirmed == 0) advance(pid);
  }
  it = _topics.find(topic);
  if (it == _topics.end()) return;
  if (!it->second.needs_catchup && it->second.holders == 0 && it->second.catchup == 0) {
    it->second.state = topic_state::unsubscribing;
    _to_unsubscribe.push_back(topic);
  }
}

void redis_bus::unsubscribed(const std::string& topic) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end() || it->second.state != topic_state::unsubscribing) return;
  _n.topics.sub();
  if (it->second.holders > 0) {  // held again meanwhile: subscribe again
    it->second.floored = false;   // not subscribed in between: no floor until the next mark
    it->second.state = topic_state::subscribing;
    _to_subscribe.push_back(topic);
    return;
  }
  _topics.erase(it);
}

/// Every topic of the sub is confirmed: answer, or read the history first.
void redis_bus::advance(std::uint64_t pid) noexcept {
  pending& p = _pending.at(pid);
  bool any_since = false;
  for (const auto& part : p.parts) any_since |= !part.since.empty();
  if (!any_since) {
    p.marker_seen = true;
    return maybe_finish(pid);
  }
  start_replay(pid);
}

/// FCALL wspush_replay for each topic with a `since`, page after page, one page of the sub
/// in flight at a time; then a marker on this node's channel right behind the last page
/// (maybe_finish). Live events are kept aside until the marker is back.
void redis_bus::start_replay(std::uint64_t pid) noexcept {
  pending& p = _pending.at(pid);
  for (std::uint32_t k = 0; k < p.parts.size(); ++k) {
    auto& part = p.parts[k];
    if (part.since.empty()) {
      // A topic new to the connection without `since` joins with the others at the answer
      // (after the last page of a paced replay): what comes live meanwhile is kept aside for
      // it too, all of it (it has no replay to be newer than).
      if (p.kind == pending::sub && part.joins) {
        part.replaying = true;
        _topics[part.topic].replaying.push_back(pid);
      }
      continue;
    }
    part.last = key_of(part.since);
    ++p.replies_left;
    part.replaying = true;
    if (p.kind == pending::sub) _topics[part.topic].replaying.push_back(pid);
  }
  queue_page(pid, next_part(p, 0));
}

/// The first part at or after `from` with a `since` (parts.size(): none).
std::uint32_t redis_bus::next_part(const pending& p, std::uint32_t from) noexcept {
  while (from < p.parts.size() && p.parts[from].since.empty()) ++from;
  return std::uint32_t(from);
}

/// A page of part `k` waits its turn: pages go to Redis in the order they were queued, at
/// most max_pages_in_flight node-wide.
void redis_bus::queue_page(std::uint64_t pid, std::uint32_t k) noexcept {
  try {
    _page_queue.emplace_back(pid, k);
  } catch (...) {
    return drop_pending(pid);
  }
  pump_pages();
}

void redis_bus::pump_pages() noexcept {
  while (_pages_in_flight < max_pages_in_flight && !_page_queue.empty()) {
    const auto [pid, k] = _page_queue.front();
    _page_queue.pop_front();
    auto it = _pending.find(pid);
    if (it == _pending.end() || it->second.failed || k >= it->second.parts.size()) continue;
    pending& p = it->second;
    auto& part = p.parts[k];
    // The first page from `since` (a mark, for a catch-up); the next ones from the last id a
    // page returned, an id the stream issued.
    const bool first = part.cursor.empty();
    const std::string_view mode = first && (p.mark_mode || is_moment(part.since)) ? "mark" : "event";
    // A sub not answered yet gathers its topics' first pages into one: what they left of it.
    std::uint64_t room = p.page_bytes;
    if (p.kind == pending::sub && !p.answered)
      for (const auto& x : p.parts)
        for (const auto& f : x.entries) room -= std::min<std::uint64_t>(room - 1, f.bytes().size());
    char bytes[24];
    const auto n = std::to_chars(bytes, bytes + sizeof bytes, room).ptr - bytes;
    auto* o = new (std::nothrow) op{op::replay, pid, k};
    if (o) o->tag = _link_gen;
    if (!o || !command({"FCALL", "wspush_replay", "0", part.topic, first ? part.since : part.cursor, mode,
                        replay_page_entries, std::string_view(bytes, std::size_t(n))},
                       o)) {
      drop_pending(pid);
      continue;
    }
    ++_pages_in_flight;
  }
}

void redis_bus::maybe_finish(std::uint64_t pid) noexcept {
  auto it = _pending.find(pid);
  if (it == _pending.end()) return;
  pending& p = it->second;
  if (p.replies_left > 0) return;
  if (!p.marker_seen && !p.marker_sent) {
    // Every page is read: when this comes back, every publish made before the last read has.
    const std::string token = std::to_string(pid);
    auto* o = new (std::nothrow) op{op::marker, pid};
    if (!o || !command({"PUBLISH", _node_channel, token}, o)) return drop_pending(pid);
    p.marker_sent = true;
    return;
  }
  if (!p.marker_seen) return;
  finish(pid, p);
  forget(it);
}

/// The pending leaves both maps (its frames go with it).
void redis_bus::forget(std::unordered_map<std::uint64_t, pending>::iterator it) noexcept {
  if (it->second.held) {  // its place in _held_subs is skipped when it comes up
    _held.fetch_sub(1, std::memory_order_relaxed);
    _n.held.sub();
  }
  if (it->second.awaiting_more) _n.paced.sub();
  if (it->second.kind == pending::sub && it->second.s)
    _pid_of_request.erase(request_key(it->second.s->shard, it->second.s->request));
  _pending.erase(it);
}

void redis_bus::finish(std::uint64_t pid, pending& p) noexcept {
  std::unique_ptr<pubsub::bus_reply> r;
  if (p.kind == pending::sub) {
    r.reset(new (std::nothrow) pubsub::bus_reply);
    if (!r) return fail_pending(p);
  }
  for (auto& part : p.parts) {
    auto t = _topics.find(part.topic);
    if (part.replaying && t != _topics.end()) {
      auto& rp = t->second.replaying;
      rp.erase(std::remove(rp.begin(), rp.end(), pid), rp.end());
    }
    if (p.kind == pending::catchup) {
      // To the subscribers that stayed: the replay, then what came live behind it (held back
      // meanwhile), newer than its last entry.
      if (part.lost) {
        log_ratelimited(log_level::warn, "bus: the stream of %.*s no longer reaches back to what this node saw before "
                        "the outage (Redis lost its data, or trimmed it meanwhile): its subscribers are told it is lost",
                        int(part.topic.size()), part.topic.data());
        announce_lost(part.topic);
        if (t != _topics.end()) t->second.catchup_known = false;  // no floor: not everything was handed on
      }
      for (auto& f : part.entries) offer_all(f, part.topic);
      _n.catchup_events.add(part.entries.size());
      for (auto& [k, f] : part.live)
        if (k > part.last) offer_all(f, part.topic);
      if (t != _topics.end()) {
        // The newest event handed on: a live one held back, or the replay's last.
        bool live_newer = false;
        for (auto& [k, f] : part.live) live_newer |= k > part.last;
        std::string& newest = live_newer ? part.live_last_id : part.last_id;
        if (!newest.empty()) {
          t->second.last_id.swap(newest);
          t->second.last_at = ++_order;
        }
        t->second.catchup = 0;
        if (t->second.holders == 0 && t->second.state == topic_state::active) {
          t->second.state = topic_state::unsubscribing;
          _to_unsubscribe.push_back(part.topic);
        }
      }
      continue;
    }
    // The replay, then the live events kept aside, newer than its last entry.
    if (part.lost && !part.lost_told) {
      // replay_done: lost after `subbed` (live events past max_kept_live), told in the stream.
      if (!p.answered) r->lost.push_back(part.topic);
      else if (pool::frame_ref f = lost_frame(part.topic)) r->frames.push_back(std::move(f));
    }
    for (auto& f : part.entries) r->frames.push_back(std::move(f));
    for (auto& [k, f] : part.live)
      if (k > part.last) r->frames.push_back(std::move(f));
  }
  if (p.kind == pending::catchup) return;
  if (!p.answered) {
    try {
      add_positions(p, *r);
    } catch (...) {
      r->at.clear();  // out of memory: answered without positions
    }
  }
  answer_sub(p, std::move(r), p.answered ? pubsub::bus_reply::replay_done : pubsub::bus_reply::subbed);
}

/// Sends a sub's answer (`r` holds the replay, if any) to the shard that asked.
void redis_bus::answer_sub(pending& p, std::unique_ptr<pubsub::bus_reply> r, pubsub::bus_reply::kind_t kind) noexcept {
  r->kind = kind;
  r->conn = p.s->conn;
  r->request = p.s->request;
  r->topics = std::move(p.s->topics);
  r->new_hold = std::move(p.s->new_hold);
  pubsub::event e;
  e.reply = std::move(r);
  offer(p.s->shard, std::move(e));
}

/// A client's pub that Redis refused, or that never went (the client hears unavailable), or
/// one sent that the outage took unanswered (`maybe`: Redis may have run it, the client hears
/// timeout, as the admin API answers 504).
void redis_bus::pub_failed(std::uint32_t shard, std::uint64_t tag, std::string topic, bool maybe) noexcept {
  auto r = std::unique_ptr<pubsub::bus_reply>(new (std::nothrow) pubsub::bus_reply);
  if (!r) return;
  r->kind = pubsub::bus_reply::pub_failed;
  r->maybe = maybe;
  r->pub_tag = tag;
  r->pub_topic = std::move(topic);
  pubsub::event e;
  e.reply = std::move(r);
  offer(shard, std::move(e));
}

/// The sub cannot be answered (Redis refused its replay, or memory ran out): the shard hears
/// sub_failed. A catch-up that fails so tells the topic's subscribers it is lost (the live
/// events it held back go with it). Not for an outage: went_down holds subs and redoes
/// catch-ups.
void redis_bus::fail_pending(pending& p) noexcept {
  if (p.failed) return;
  p.failed = true;
  for (auto& part : p.parts) {
    auto t = _topics.find(part.topic);
    if (t == _topics.end()) continue;
    // Only this one's place: other subs of the topic wait and keep events aside as before.
    for (auto* v : {&t->second.waiting, &t->second.replaying}) v->erase(std::remove(v->begin(), v->end(), p.pid), v->end());
    if (p.kind == pending::catchup && t->second.catchup == p.pid) {
      t->second.catchup = 0;
      t->second.catchup_known = false;
      announce_lost(part.topic);
      for (auto& [k, f] : part.live) offer_all(f, part.topic);  // newer than anything lost
      if (!part.live.empty()) {
        t->second.last_id.swap(part.live_last_id);
        t->second.last_at = ++_order;
      }
      if (t->second.holders == 0 && t->second.state == topic_state::active) {
        t->second.state = topic_state::unsubscribing;  // released meanwhile (finish() would have)
        _to_unsubscribe.push_back(part.topic);
      }
    }
    part.entries.clear();
    part.live.clear();
  }
  if (p.kind != pending::sub || !p.s) return;
  auto r = std::unique_ptr<pubsub::bus_reply>(new (std::nothrow) pubsub::bus_reply);
  if (r) answer_sub(p, std::move(r), pubsub::bus_reply::sub_failed);
}

/// Fails a sub or catch-up under way and forgets it: every frame it kept goes now. Its
/// replies still to come find nothing and are dropped.
void redis_bus::drop_pending(std::uint64_t pid) noexcept {
  auto it = _pending.find(pid);
  if (it == _pending.end()) return;
  fail_pending(it->second);
  forget(it);
}

/// The connection of a sub under way closed: its pending goes now (the shard hears sub_failed
/// and drops the holds it took for it), not when Redis has answered.
void redis_bus::handle_withdraw(std::uint32_t shard, std::uint64_t request) noexcept {
  auto it = _pid_of_request.find(request_key(shard, request));
  if (it != _pid_of_request.end()) drop_pending(it->second);
}

/// The connection of a paced replay read its last page: the next one is asked of Redis, or,
/// after the last, the marker (then replay_done, maybe_finish).
void redis_bus::handle_more(std::uint32_t shard, std::uint64_t request, std::uint64_t room) noexcept {
  auto it = _pid_of_request.find(request_key(shard, request));
  if (it == _pid_of_request.end()) return;
  const std::uint64_t pid = it->second;
  auto p = _pending.find(pid);
  if (p == _pending.end() || p->second.failed || !p->second.answered || !p->second.awaiting_more) return;
  p->second.awaiting_more = false;
  p->second.page_bytes = std::clamp<std::uint64_t>(room, 1, replay_page_bound);
  _n.paced.sub();
  if (p->second.next_part < p->second.parts.size()) return queue_page(pid, p->second.next_part);
  maybe_finish(pid);
}

/// A page of a replay that does not fit in one goes to the shard at once: the first with
/// `subbed` (more to come), the next ones as replay_more; the page after it (`next`: its part)
/// waits for the shard's more(), so a replay is read at the pace its client reads, and the node
/// holds at most a page of it.
void redis_bus::send_page(std::uint64_t pid, pending& p, std::uint32_t next) noexcept {
  auto r = std::unique_ptr<pubsub::bus_reply>(new (std::nothrow) pubsub::bus_reply);
  if (!r) return drop_pending(pid);
  try {
    r->kind = p.answered ? pubsub::bus_reply::replay_more : pubsub::bus_reply::subbed;
    r->more = true;
    r->conn = p.s->conn;
    r->request = p.s->request;
    if (!p.answered) {
      r->topics = p.s->topics;
      r->new_hold = p.s->new_hold;
      add_positions(p, *r);
    }
    for (auto& part : p.parts) {
      if (part.lost && !part.lost_told) {
        // Found after `subbed` (trimmed between pages): the client hears it in the stream.
        if (!p.answered) r->lost.push_back(part.topic);
        else if (pool::frame_ref f = lost_frame(part.topic)) r->frames.push_back(std::move(f));
        part.lost_told = true;
      }
      for (auto& f : part.entries) r->frames.push_back(std::move(f));
      part.entries.clear();
    }
  } catch (...) {
    return drop_pending(pid);
  }
  if (!p.awaiting_more) _n.paced.add();
  p.answered = p.awaiting_more = true;
  p.next_part = next;
  pubsub::event e;
  e.reply = std::move(r);
  offer(p.s->shard, std::move(e));
}

// ---- publishes ------------------------------------------------------------------------------

/// Takes a publish into the batch being gathered (take_requests), which goes once it holds
/// max_batch_pubs publishes or max_batch_bytes of them, or when the requests taken run out.
void redis_bus::gather_publish(request& r) noexcept {
  if (r.w) {
    std::lock_guard lock(r.w->m);
    if (r.w->withdrawn) return;  // its publisher was told unavailable: keep that true
    r.w->sent = true;            // (a failed send settles it as unavailable)
  }
  try {
    _gathered.push_back(&r);
  } catch (...) {
    return publish_refused(r);
  }
  _gathered_bytes += r.topic.size() + r.data.size();
  if (_gathered.size() >= max_batch_pubs || _gathered_bytes >= max_batch_bytes) send_publishes();
}

/// The publishes gathered go to Redis in one FCALL wspush_publish_batch.
void redis_bus::send_publishes() noexcept {
  if (_gathered.empty()) return;
  auto* o = new (std::nothrow) op{op::publishes};
  bool sent = false;
  if (o) {
    try {
      o->pubs.resize(_gathered.size());
      _argv.assign({"FCALL", "wspush_publish_batch", "0"});
      for (std::size_t k = 0; k < _gathered.size(); ++k) {
        const request& r = *_gathered[k];
        _argv.push_back(r.topic);
        _argv.push_back(r.data);
        batched_pub& b = o->pubs[k];
        b.client = r.kind == request::client_pub;
        b.shard = r.shard;
        b.tag = r.tag;
        b.bytes = r.topic.size() + r.data.size();
        b.w = r.w;
      }
      sent = command(_argv, o);  // deletes o if it was not sent
      if (sent) _n.publish_calls.add();
    } catch (...) {
      delete o;
    }
  }
  for (std::size_t k = 0; k < _gathered.size(); ++k) {
    request& r = *_gathered[k];
    if (!sent) publish_refused(r);
    else if (r.kind == request::client_pub) o->pubs[k].topic = std::move(r.topic);  // sent: the bytes are copied
  }
  _gathered.clear();
  _gathered_bytes = 0;
}

/// A publish that did not go (down, or no memory): its publisher hears it.
void redis_bus::publish_refused(request& r) noexcept {
  if (r.w) r.w->finish(bus_publish::unavailable, "the bus is down");
  if (r.kind == request::client_pub) {
    pub_answered(r.topic.size() + r.data.size());
    pub_failed(r.shard, r.tag, r.topic);
  }
}

void redis_bus::pub_answered(std::size_t bytes) noexcept { _pub_bytes.fetch_sub(bytes, std::memory_order_relaxed); }

// ---- replies --------------------------------------------------------------------------------

void redis_bus::on_reply(op* o, const resp::reply* r) noexcept {
  std::unique_ptr<op> hold(o);
  const bool error = r == nullptr || r->type == resp::reply_type::error;
  switch (o->kind) {
    case op::setup:
    case op::epoch:
      // No reply at all: the link went away meanwhile, and that path says so.
      if (r == nullptr) return;
      if (error) return setup_refused(str(r));
      // After a refusal the link is closing: the set-up's later answers (Redis runs what
      // follows a refused AUTH as the default user) must not bring the bus up meanwhile.
      if (o->kind == op::setup || !_refusal.empty()) return;
      _epoch.assign(str(r));
      _cmd_ready = true;
      return ready_check();
    case op::publishes: return publishes_answered(*o, r);
    case op::replay: {
      if (o->tag == _link_gen && _pages_in_flight > 0) --_pages_in_flight;  // pump_pages (on_turn) sends the next
      if (r == nullptr) return;  // the link went: went_down holds the sub, or redoes the catch-up
      auto it = _pending.find(o->pid);
      if (it == _pending.end() || it->second.failed) return;
      pending& p = it->second;
      // A page is {lost, next, id, data, ...}; a library loaded by an older node (a fleet being
      // upgraded) answers the whole replay as {lost, id, data, ...}: an odd count tells it.
      const bool paged = r != nullptr && r->type == resp::reply_type::array && r->elements % 2 == 0;
      if (error || r->type != resp::reply_type::array || r->elements < 1 || r->element[0]->type != resp::reply_type::integer ||
          (paged && r->element[1]->type != resp::reply_type::string)) {
        if (r != nullptr && !error) _n.malformed.add();
        if (error && r != nullptr)
          log_ratelimited(log_level::warn, "bus: a replay of %.*s failed: %.*s", int(p.parts[o->index].topic.size()),
                          p.parts[o->index].topic.data(), int(str(r).size()), str(r).data());
        return drop_pending(o->pid);  // what the sub's other replies brought goes with it
      }
      auto& part = p.parts[o->index];
      if (r->element[0]->integer != 0) {
        // Each page found so is told (send_page): the stream may have been trimmed past the
        // replay's place again since the last notice.
        part.lost = true;
        part.lost_told = false;
      }
      for (std::size_t k = paged ? 2 : 1; k + 1 < r->elements; k += 2) {
        std::string_view id = str(r->element[k]), data = str(r->element[k + 1]);
        std::uint64_t ms, seq;
        if (!parse_id(id, ms, seq) || !valid_data(data)) {
          _n.malformed.add();
          continue;
        }
        pool::frame_ref f = frame_event(part.topic, id, data);
        if (!f) return drop_pending(o->pid);
        part.entries.push_back(std::move(f));
        part.last = id_key{ms, seq};
        part.last_id.assign(id);
      }
      const std::string_view next = paged ? str(r->element[1]) : std::string_view{};
      if (!next.empty()) {
        // The next page starts after it: it must move on, or a broken reply would loop.
        std::uint64_t ms, seq;
        const id_key from = key_of(part.cursor.empty() ? part.since : part.cursor);
        if (!parse_id(next, ms, seq) || !(id_key{ms, seq} > from)) {
          _n.malformed.add();
          return drop_pending(o->pid);
        }
        part.cursor.assign(next);
      } else {
        --p.replies_left;
      }
      const std::uint32_t k = next.empty() ? next_part(p, o->index + 1) : o->index;
      // A sub whose replay fits in a page is answered as a whole (maybe_finish), the pages of
      // its topics read in turn while they do; a longer one goes page by page, at its
      // client's pace.
      if (p.kind == pending::sub && k < p.parts.size() && !p.answered) {
        std::size_t bytes = 0;
        for (const auto& x : p.parts)
          for (const auto& f : x.entries) bytes += f.bytes().size();
        if (!next.empty() || bytes >= p.page_bytes) return send_page(o->pid, p, k);
      }
      if (p.kind == pending::sub && p.answered) return send_page(o->pid, p, k);
      if (k < p.parts.size()) return queue_page(o->pid, k);
      return maybe_finish(o->pid);
    }
    case op::mark:
      // Refused (OOM, BUSY, an older library): no mark comes; try again at the next one.
      if (error) {
        _mark_in_flight = false;
        if (r != nullptr) log_ratelimited(log_level::warn, "bus: wspush_mark: %.*s", int(str(r).size()), str(r).data());
      }
      return;
    case op::node_bytes: {
      // {name, value}; refused (an ACL user without CONFIG, a renamed command): nothing said.
      if (error || r->type != resp::reply_type::array || r->elements != 2) return;
      std::uint64_t bytes = 0;
      const std::string_view v = str(r->element[1]);
      if (std::from_chars(v.data(), v.data() + v.size(), bytes).ec != std::errc{} || bytes <= 1024) return;
      _told_node_bytes = true;
      log(log_level::warn, "bus: Redis keeps each topic's history in blocks of %llu bytes (stream-node-max-bytes): "
          "a topic with a few small events costs about %llu bytes of Redis memory, a million such topics %.1f GB; "
          "512 keeps such a topic under 1 KB and its first publish cheaper (docs/REDIS.md)",
          static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(bytes + 300), double(bytes + 300) / 1e3);
      return;
    }
    case op::marker:
    case op::other:
      if (error && r != nullptr) log_ratelimited(log_level::warn, "bus: %.*s", int(str(r).size()), str(r).data());
      return;
  }
}

/// Redis answered a batch of publishes: each by its element of the reply, in order. No reply
/// (the link went away with the call sent or about to be: Redis may have run it), an error for
/// the whole call (out of memory, or a library without the function), or a reply of another
/// shape answers every publish of the batch the same way.
void redis_bus::publishes_answered(op& o, const resp::reply* r) noexcept {
  const bool each = r != nullptr && r->type == resp::reply_type::array && r->elements == o.pubs.size();
  if (r != nullptr && !each && r->type != resp::reply_type::error) _n.malformed.add();
  if (r != nullptr && r->type == resp::reply_type::error && str(r).find("Function not found") != std::string_view::npos) {
    // A node of an older version loaded its library since (FUNCTION LOAD REPLACE on connect):
    // this one's holds every function the older one has, so it goes back. The batch did not
    // run: its publishers hear it refused, and a retry is safe.
    log_ratelimited(log_level::warn, "bus: Redis has no wspush_publish_batch (a node of an older version loaded its "
                    "functions): loading this node's again");
    if (auto* load = new (std::nothrow) op{op::other}) command({"FUNCTION", "LOAD", "REPLACE", redis_functions}, load);
  }
  for (std::size_t k = 0; k < o.pubs.size(); ++k) {
    batched_pub& b = o.pubs[k];
    const resp::reply* e = each ? r->element[k] : r;
    const bus_publish result = e == nullptr                              ? bus_publish::unknown
                               : e->type == resp::reply_type::error      ? bus_publish::refused
                               : e->type == resp::reply_type::string && e->len > 0 ? bus_publish::ok
                                                                         : bus_publish::refused;
    if (!b.client) {
      if (b.w) b.w->finish(result, result == bus_publish::refused && e->type != resp::reply_type::error ? "a malformed reply" : str(e));
      continue;
    }
    pub_answered(b.bytes);
    if (result == bus_publish::ok && b.shard < _pubs_done.size()) {
      try {
        _pubs_done[b.shard].push_back(b.tag);  // answered in one reply per shard (on_turn)
        continue;
      } catch (...) {
      }
    }
    // Refused: the client hears unavailable. Unanswered (the link broke with it sent), or taken
    // with no memory to say so: timeout, it may have been published.
    pub_failed(b.shard, b.tag, std::move(b.topic), result != bus_publish::refused);
  }
}

/// Everything the subscriber connection hears: subscribe and unsubscribe confirmations, events.
void redis_bus::on_sub_message(const resp::reply* r) noexcept {
  if (r == nullptr || r->type != resp::reply_type::array || r->elements < 3) return;
  const std::string_view kind = str(r->element[0]), channel = str(r->element[1]);
  if (kind == "message") {
    const std::string_view payload = str(r->element[2]);
    if (channel == _node_channel) return payload.substr(0, 5) == "mark " ? mark_arrived(payload) : marker(payload);
    if (channel.substr(0, topic_prefix.size()) != topic_prefix) return;
    return live(channel.substr(topic_prefix.size()), payload);
  }
  if (channel == _node_channel) {
    if (kind == "subscribe") {
      _sub_ready = true;
      ready_check();
    }
    return;
  }
  if (channel.substr(0, topic_prefix.size()) != topic_prefix) return;
  const std::string topic(channel.substr(topic_prefix.size()));
  if (kind == "subscribe" || kind == "unsubscribe") {
    if (_awaiting > 0) --_awaiting;
    if (kind == "subscribe") confirmed(topic);
    else unsubscribed(topic);
    if (_awaiting == 0) send_batches();  // what gathered meanwhile
  }
}

void redis_bus::marker(std::string_view payload) noexcept {
  std::uint64_t pid = 0;
  for (char c : payload) {
    if (c < '0' || c > '9') return;
    pid = pid * 10 + std::uint64_t(c - '0');
  }
  auto it = _pending.find(pid);
  if (it == _pending.end()) return;
  // Live events keep being kept aside until the answer goes (finish): those after the marker
  // were published after the replay's read, and reach the shard only through the answer.
  it->second.marker_seen = true;
  maybe_finish(pid);
}

bool redis_bus::valid_data(std::string_view data) noexcept {
  if (data.empty()) return false;
  _scratch.assign(data);
  _scratch.resize(data.size() + simdjson::SIMDJSON_PADDING, ' ');
  simdjson::dom::element e;
  return !_json.parse(_scratch.data(), data.size(), false).get(e);
}

/// One publish from Redis: framed once, kept aside for the replays that wait for it, and
/// offered to every shard (unless a catch-up of the topic holds it back to keep the order).
void redis_bus::live(std::string_view topic, std::string_view payload) noexcept {
  const auto space = payload.find(' ');
  std::uint64_t ms = 0, seq = 0;
  if (space == std::string_view::npos || !proto::is_valid_topic(topic) ||
      !parse_id(payload.substr(0, space), ms, seq) || !valid_data(payload.substr(space + 1))) {
    _n.malformed.add();
    log_ratelimited(log_level::warn, "bus: skipped a malformed message on %.*s%.*s", int(topic_prefix.size()),
                    topic_prefix.data(), int(topic.size()), topic.data());
    return;
  }
  _n.events_in.add();
  const std::string_view id = payload.substr(0, space), data = payload.substr(space + 1);
  auto it = _topics.find(std::string(topic));
  pool::frame_ref f = frame_event(topic, id, data);
  if (!f) {
    _n.dropped.add();
    return;
  }
  const id_key key{ms, seq};
  bool held_back = false;
  if (it != _topics.end()) {
    topic_state& ts = it->second;
    for (std::uint64_t pid : ts.replaying) {
      auto p = _pending.find(pid);
      if (p == _pending.end()) continue;
      for (auto& part : p->second.parts)
        if (part.replaying && part.topic == topic) {
          if (part.live.size() < max_kept_live) {
            part.live.emplace_back(key, f);
          } else {
            part.overflow = part.lost = true;
            part.lost_told = false;
          }
        }
    }
    if (ts.catchup) {
      // Behind the catch-up's replay, in order (at most max_kept_live: past it, lost).
      auto p = _pending.find(ts.catchup);
      if (p != _pending.end() && !p->second.failed) {
        auto& part = p->second.parts[0];
        if (part.live.size() < max_kept_live) {
          part.live.emplace_back(key, f);
          part.live_last_id.assign(id);
        } else {
          part.overflow = part.lost = true;
        }
        held_back = true;
      }
    } else if (ts.needs_catchup) {
      // Subscribed again after an outage, its catch-up not started yet (the command
      // connection is still being set up): the catch-up's replay will hold this event, in order.
      held_back = true;
    }
    if (!held_back) {
      ts.last_id.assign(id);
      ts.last_at = ++_order;
    }
  }
  if (!held_back) offer_all(f, topic);
}

pool::frame_ref redis_bus::frame_event(std::string_view topic, std::string_view id, std::string_view data) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  const std::size_t bound = proto::event_size_bound(topic, id, data);
  pool::lease l = _buffers.acquire(room + bound);
  if (!l) return {};
  const std::size_t n = proto::encode_event(topic, id, data, {reinterpret_cast<char*>(l.data()) + room, bound});
  if (n == 0) return {};
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  pool::frame_ref f = pool::frame_ref::adopt(std::move(l));
  if (_compression) _compression->attach(_buffers, f);
  return f;
}

void redis_bus::offer_all(const pool::frame_ref& frame, std::string_view topic) noexcept {
  offer_at(frame, proto::event_topic_offset, topic.size());
}

/// Offers a frame to every shard as a message of the topic found `topic_offset` bytes into its
/// payload (the event's topic must live as long as its frame: it points into the frame's bytes).
void redis_bus::offer_at(const pool::frame_ref& frame, std::size_t topic_offset, std::size_t topic_size) noexcept {
  auto b = frame.bytes();
  const std::uint8_t len7 = b.size() >= 2 ? (b[1] & 0x7f) : 0;
  const std::size_t header = len7 == 126 ? 4 : len7 == 127 ? 10 : 2;
  std::string_view in_frame(reinterpret_cast<const char*>(b.data()) + header + topic_offset, topic_size);
  for (std::uint32_t k = 0; k < _ports.size(); ++k) offer(k, pubsub::event{frame, in_frame, 0, pubsub::no_part, {}});
}

void redis_bus::offer(std::uint32_t shard, pubsub::event&& e) noexcept {
  if (shard >= _ports.size()) return;
  auto& b = _backlog[shard];
  if (b.empty() && _ports[shard]->offer(std::move(e), false)) return;
  if (b.size() >= max_backlog && !e.reply) {
    _n.dropped.add();
    return;
  }
  try {
    b.push_back(std::move(e));
  } catch (...) {
    _n.dropped.add();
  }
}

// ---- connecting -----------------------------------------------------------------------------

void redis_bus::connect_links() noexcept {
  std::string why;
  _cmd_ready = _sub_ready = false;
  _refusal.clear();
  if (!_cmd.connect(_o.target.host, _o.target.port, why) || !_sub.connect(_o.target.host, _o.target.port, why)) {
    went_down(why);
  }
}

void redis_bus::on_link_up(redis_link& l) noexcept {
  if (&l == &_cmd) setup_command_link();
  else setup_subscriber_link();
}

/// Both connections are set up: the bus is up; topics resubscribed after an outage catch up.
void redis_bus::ready_check() noexcept {
  if (!_cmd_ready || !_sub_ready || _up.load(std::memory_order_relaxed)) return;
  _up = true;
  _backoff_ticks = 0;
  std::size_t held = 0;
  for (auto& [t, ts] : _topics) {
    held += ts.holders > 0;
    if (ts.state == topic_state::active && ts.needs_catchup) start_catchup(t);
  }
  unpark_all();
  if (_ever_up) _n.reconnects.add();
  log(log_level::info, "bus: %s to %s (%zu topics subscribed)", _ever_up ? "reconnected" : "connected",
      _o.target.describe().c_str(), held);
  _ever_up = true;
}

/// The last mark heard as a place in every stream: the end of the millisecond before it (that
/// millisecond may hold events published before the mark: they arrived, and a topic's last
/// event covers them). A moment, not an event: its seq is the largest, which no stream issues
/// (is_moment), and wspush_replay reads it in mark mode. Empty before the first mark.
std::string redis_bus::mark_moment() const {
  if (_mark_epoch.empty()) return {};
  return _mark_epoch + ':' + std::to_string(_mark_ms - 1) + "-18446744073709551615";
}

/// `subbed`'s positions: each topic new to the connection is at the last mark heard on the
/// current links (mark_moment): every event published after it reaches the connection, live or
/// kept aside until it joins, or a resume from the position replays it; such a resume may bring
/// what came between the mark and the sub, which the client never had either. None before that
/// mark (one from before an outage could be of an older epoch, or ahead of a Redis whose clock
/// is behind).
void redis_bus::add_positions(const pending& p, pubsub::bus_reply& r) {
  if (!_mark_current) return;
  const std::string at = mark_moment();
  if (at.empty()) return;
  r.at.resize(p.parts.size());
  for (std::size_t k = 0; k < p.parts.size(); ++k)
    if (p.parts[k].joins) r.at[k] = at;
}

/// Where a topic's catch-up starts, fixed when an outage begins: the later of the last mark
/// (when the topic was subscribed before it) and its last event. With neither, the node cannot
/// know.
void redis_bus::note_catchup_start(topic_state& ts) noexcept {
  std::string best;
  std::uint64_t best_at = 0;
  auto consider = [&](const std::string& id, std::uint64_t at) {
    if (id.empty()) return;
    if (best.empty() || (same_epoch(id, best) ? key_of(id) > key_of(best) : at > best_at)) best = id, best_at = at;
  };
  try {
    if (ts.floored && !_mark_epoch.empty()) consider(mark_moment(), _mark_at);
    consider(ts.last_id, ts.last_at);
    if (ts.catchup_known) consider(ts.catchup_since, ts.catchup_at);
  } catch (...) {
    best.clear();  // out of memory: not known, so its subscribers will hear it is lost
  }
  ts.catchup_known = !best.empty();
  ts.catchup_since.swap(best);
  ts.catchup_at = best_at;
}

/// What the subscribers that stayed through an outage missed, from where note_catchup_start
/// put it; when it is not known they hear the topic is lost.
void redis_bus::start_catchup(const std::string& topic) noexcept {
  topic_state& ts = _topics.at(topic);
  ts.needs_catchup = false;
  if (ts.catchup) return;
  if (!ts.catchup_known) return announce_lost(topic);
  // Mark mode: the start need not be an event the stream holds (wspush.lua).
  const bool mark_mode = true;
  std::string since = ts.catchup_since;
  const std::uint64_t pid = _next_pid++;
  pending& c = _pending[pid];
  c.kind = pending::catchup;
  c.pid = pid;
  c.mark_mode = mark_mode;
  c.parts.resize(1);
  c.parts[0].topic = topic;
  c.parts[0].since = std::move(since);
  ts.catchup = pid;
  start_replay(pid);
}

/// Tells every subscriber of `topic` on this node that events of it may have been missed:
/// {"op":"lost","topics":["<topic>"]}, in order with its events.
void redis_bus::announce_lost(const std::string& topic) noexcept {
  pool::frame_ref f = lost_frame(topic);
  if (!f) {
    _n.dropped.add();
    return;
  }
  offer_at(f, lost_head.size(), topic.size());
}

/// `{"op":"lost","topics":[topic]}`, framed (empty: no memory).
pool::frame_ref redis_bus::lost_frame(std::string_view topic) noexcept {
  const std::size_t n = lost_head.size() + topic.size() + lost_tail.size();
  constexpr std::size_t room = proto::max_server_header_size;
  pool::lease l = _buffers.acquire(room + n);
  if (!l) return {};
  char* out = reinterpret_cast<char*>(l.data()) + room;
  std::memcpy(out, lost_head.data(), lost_head.size());
  std::memcpy(out + lost_head.size(), topic.data(), topic.size());  // a valid topic needs no escaping
  std::memcpy(out + lost_head.size() + topic.size(), lost_tail.data(), lost_tail.size());
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  _n.lost_notices.add();
  return pool::frame_ref::adopt(std::move(l));
}

/// AUTH, SELECT, the functions, the history limits, the epoch; the epoch's answer says ready.
void redis_bus::setup_command_link() noexcept {
  if (!_o.target.password.empty()) command({"AUTH", _o.target.password}, new op{op::setup});
  const std::string db = std::to_string(_o.target.db);
  if (_o.target.db != 0) command({"SELECT", db}, new op{op::setup});
  command({"FUNCTION", "LOAD", "REPLACE", redis_functions}, new op{op::setup});
  const std::string maxlen = std::to_string(_o.history_size);
  const std::string ttl = std::to_string(std::uint64_t(_o.history_ttl * 1000));
  const std::string max_bytes = std::to_string(_o.max_event_bytes);
  command({"HSET", "wspush:config", "maxlen", maxlen, "ttl_ms", ttl, "max_event_bytes", max_bytes}, new op{op::setup});
  command({"FCALL", "wspush_epoch", "0"}, new op{op::epoch});
  if (!_told_node_bytes) command({"CONFIG", "GET", "stream-node-max-bytes"}, new op{op::node_bytes});
}

/// AUTH, then this node's channel and every topic a shard holds, in batches.
void redis_bus::setup_subscriber_link() noexcept {
  if (!_o.target.password.empty()) {
    const char* argv[] = {"AUTH", _o.target.password.c_str()};
    std::size_t lens[] = {4, _o.target.password.size()};
    _sub.command(2, argv, lens, nullptr, nullptr);
  }
  const char* argv[] = {"SUBSCRIBE", _node_channel.c_str()};
  std::size_t lens[] = {9, _node_channel.size()};
  _sub.command(2, argv, lens, nullptr, nullptr);  // answered by pushes: on_push
  for (auto& [topic, ts] : _topics) {
    if (ts.holders == 0) continue;
    ts.state = topic_state::subscribing;
    _to_subscribe.push_back(topic);
  }
  send_batches();
}

/// Redis answered a set-up command with an error (LOADING while it reads its append-only file,
/// NOPERM from an ACL, a function it cannot load) and keeps the connection open: without the
/// set-up the bus cannot be up, so the connection is closed and tried again after the backoff,
/// or the node would wait on it forever.
void redis_bus::setup_refused(std::string_view error) noexcept {
  if (!_refusal.empty()) return;  // the first refusal closes it; the others say the same
  _refusal = "Redis refused the set-up: " + std::string(error);
  log_ratelimited(log_level::error, "bus: %s; trying again", _refusal.c_str());
  _cmd.disconnect();  // from its own callback: the link closes once the pending replies are in
}

void redis_bus::on_link_down(redis_link& l, const std::string& why) noexcept {
  went_down(_refusal.empty() ? why : _refusal, &l);
}

/// A connection failed (`gone`: the link whose callback this is, already ending): the other
/// one is dropped too, every sub under way fails, and a reconnect is scheduled.
void redis_bus::went_down(const std::string& why, redis_link* gone) noexcept {
  const bool was_up = _up.exchange(false);
  _cmd_ready = _sub_ready = false;
  if (!_running) {
    // stop(): the links were closed on purpose; nothing is lost and nothing reconnects.
    if (was_up) log(log_level::info, "bus: disconnected from %s", _o.target.describe().c_str());
  } else if (was_up || !_ever_up) {
    if (was_up) log(log_level::error, "bus: lost %s (%s); reconnecting", _o.target.describe().c_str(), why.c_str());
    else log_ratelimited(log_level::warn, "bus: cannot reach %s (%s); retrying", _o.target.describe().c_str(), why.c_str());
  }
  if (gone != &_sub) _sub.abort();
  if (gone != &_cmd) _cmd.abort();
  // Subs under way wait for Redis to come back, from the start; held topics are subscribed
  // again on the next connection. Catch-ups under way are done again then, from where they
  // started (the topic keeps it; the live events they held back were not handed on).
  std::vector<std::uint64_t> catchups, subs, paced;
  for (auto& [pid, p] : _pending) {
    if (p.kind == pending::catchup) {
      catchups.push_back(pid);
      continue;
    }
    if (p.held) continue;
    if (p.answered) {  // part of its replay went out: it cannot start again (the shard closes it)
      paced.push_back(pid);
      continue;
    }
    p.unconfirmed = p.replies_left = 0;
    p.marker_seen = p.marker_sent = false;
    for (auto& part : p.parts) {
      part.cursor.clear();
      part.lost = part.replaying = part.overflow = false;
      part.last = {};
      part.last_id.clear();
      part.entries.clear();
      part.live.clear();
    }
    subs.push_back(pid);
  }
  for (std::uint64_t pid : catchups) forget(_pending.find(pid));
  for (std::uint64_t pid : paced) drop_pending(pid);
  for (std::uint64_t pid : subs) park(pid);
  _mark_in_flight = false;
  _mark_current = false;  // positions wait for a mark heard on the next links
  _page_queue.clear();  // the pages of the subs held and the catch-ups redone are asked again
  _pages_in_flight = 0;
  ++_link_gen;          // the answers still due from the old links count for nothing
  _unfloored.clear();
  for (auto it = _topics.begin(); it != _topics.end();) {
    topic_state& ts = it->second;
    const bool owed = ts.needs_catchup || ts.catchup;  // an earlier outage's, not done yet
    if (ts.state == topic_state::active || ts.state == topic_state::unsubscribing) {
      _n.topics.sub();
      // Its subscribers stayed: what they miss is caught up, from where this outage began
      // (or the earlier one, still owed).
      if (ts.holders > 0 && !owed) note_catchup_start(ts);
      ts.needs_catchup = ts.holders > 0;
    }
    ts.floored = ts.listed = false;  // subscribed again later: the next mark after that is its floor
    ts.state = topic_state::idle;
    ts.waiting.clear();
    ts.replaying.clear();
    ts.catchup = 0;
    if (ts.holders == 0) it = _topics.erase(it);
    else ++it;
  }
  _to_subscribe.clear();
  _to_unsubscribe.clear();
  _awaiting = 0;
  _backoff_ticks = std::clamp(_backoff_ticks * 2, min_backoff_ticks, max_backoff_ticks);
  static thread_local std::minstd_rand jitter(std::random_device{}());
  _retry_at = _tick + _backoff_ticks / 2 + jitter() % (_backoff_ticks / 2 + 1);
}

}  // namespace wspush::server::bus
