// The Redis bus: set-up and shutdown, requests from other threads, the bus thread's loop and its
// commands, connecting and losing the links.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

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
      _node_channel(std::string(node_prefix) + random_node_id()) {
  const resp::limits limits = reply_limits(_o);
  for (std::uint32_t k = 0; k < _o.targets.size(); ++k)
    _instances.push_back(std::make_unique<instance>(*this, k, _o.targets[k], limits, &_n.protocol_errors));
}

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
  for (auto& in : _instances) in->up = false;
}

bool redis_bus::up() const noexcept {
  for (const auto& in : _instances)
    if (!in->up.load(std::memory_order_acquire)) return false;
  return !_instances.empty();
}

bool redis_bus::any_up() const noexcept {
  for (const auto& in : _instances)
    if (in->up.load(std::memory_order_acquire)) return true;
  return false;
}

bool redis_bus::up_at(std::size_t k) const noexcept {
  return k < _instances.size() && _instances[k]->up.load(std::memory_order_acquire);
}

bool redis_bus::up_for(std::string_view topic) const noexcept {
  return up_at(_instances.size() == 1 ? 0 : shard_of(topic, std::uint32_t(_instances.size())));
}

redis_bus::instance& redis_bus::home(std::string_view topic) noexcept {
  return *_instances[_instances.size() == 1 ? 0 : shard_of(topic, std::uint32_t(_instances.size()))];
}

redis_bus::instance& redis_bus::of_link(const redis_link& l) noexcept { return *_instances[(l.key() - 1) / 2]; }

std::uint64_t redis_bus::on_drain_begin() noexcept {
  for (auto& in : _instances) {
    in->sub.disconnect();
    in->cmd.disconnect();
  }
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
  if (!up_for(topic)) return false;
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
  if (!up_for(topic)) {
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
  for (auto& in : _instances) {
    send_batches(*in);
    pump_pages(*in);
  }
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
  for (auto& p : _instances) {
    instance& in = *p;
    const bool up = in.up.load(std::memory_order_relaxed);
    if (!up && in.sub.idle() && in.cmd.idle() && std::int32_t(tick - in.retry_at) >= 0) connect_links(in);
    if (up && !in.mark_in_flight && (std::int32_t(tick - in.next_mark_tick) >= 0 || !in.unfloored.empty()))
      send_mark(in);
  }
  expire_held();
  watch_stall();
}

void redis_bus::send_mark(instance& in) noexcept {
  auto* o = new (std::nothrow) op{op::mark};
  if (!o || !command(in, {"FCALL", "wspush_mark", "0", _node_channel}, o)) return;
  in.mark_in_flight = true;
  in.next_mark_tick = _tick + mark_every_ticks;
}

/// "mark <epoch> <ms>" on this node's channel: every publish made before <ms> on a topic that
/// was subscribed before it has arrived. The topics confirmed since the last one now have it
/// as their floor.
void redis_bus::mark_arrived(instance& in, std::string_view payload) noexcept {
  in.mark_in_flight = false;
  const auto space = payload.find(' ', 5);
  std::uint64_t ms = 0;
  if (space == std::string_view::npos || !parse_number(payload.substr(space + 1), ms) || ms == 0) {
    _n.malformed.add();
    return;
  }
  _n.marks.add();
  in.mark_epoch.assign(payload.substr(5, space - 5));
  in.mark_ms = ms;
  in.mark_at = ++_order;
  in.mark_current = true;
  // A topic still owed a catch-up has not had every event before this mark: it waits for the
  // next mark after its catch-up.
  std::size_t kept = 0;
  for (std::string& t : in.unfloored) {
    auto it = _topics.find(t);
    if (it == _topics.end()) continue;
    topic_state& ts = it->second;
    if (ts.state != topic_state::active) {
      ts.listed = false;
    } else if (ts.catchup || ts.needs_catchup) {
      in.unfloored[kept++].swap(t);
    } else {
      ts.floored = true;
      ts.listed = false;
    }
  }
  in.unfloored.resize(kept);
}

/// Each tick: an idle link is pinged every second, and a command unanswered for longer than
/// --redis-timeout marks the bus stalled (readiness reads stalled()) until an answer comes or
/// the link drops.
void redis_bus::watch_stall() noexcept {
  constexpr std::uint64_t ping_after_ns = 1'000'000'000;
  const std::uint64_t now = monotonic_ns();
  bool any = false;
  for (auto& p : _instances) {
    instance& in = *p;
    in.sub.keepalive(now, ping_after_ns);
    in.cmd.keepalive(now, ping_after_ns);
    const std::uint64_t waited = std::max(in.sub.waiting_ns(now), in.cmd.waiting_ns(now));
    const bool stalled = double(waited) > _o.redis_timeout * 1e9;
    any |= stalled;
    if (stalled == in.stalled) continue;
    in.stalled = stalled;
    if (stalled)
      log(log_level::warn, "bus: %s has not answered a command for %.1fs (--redis-timeout %gs): stalled",
          in.target.describe().c_str(), double(waited) / 1e9, _o.redis_timeout);
    else
      log(log_level::info, "bus: %s is no longer stalled (answered, or the link dropped)", in.target.describe().c_str());
  }
  _stalled.store(any, std::memory_order_release);
}

void redis_bus::on_ready(std::uint64_t key, bool r, bool w) noexcept {
  if (key == 0 || (key - 1) / 2 >= _instances.size()) return;
  instance& in = *_instances[(key - 1) / 2];
  (key % 2 ? in.sub : in.cmd).on_ready(r, w);
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

bool redis_bus::command(instance& in, std::initializer_list<std::string_view> args, op* o) noexcept {
  return command(in, std::span<const std::string_view>(args.begin(), args.size()), o);
}

/// Sends a command on the command link; `o` is answered by on_reply, or deleted if it was not sent.
bool redis_bus::command(instance& in, std::span<const std::string_view> args, op* o) noexcept {
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
  o->in = &in;
  if (in.cmd.command(int(args.size()), _argp.data(), _argl.data(), reply_cb, o)) return true;
  delete o;
  return false;
}

// ---- connecting -----------------------------------------------------------------------------

void redis_bus::connect_links(instance& in) noexcept {
  std::string why;
  in.cmd_ready = in.sub_ready = false;
  in.refusal.clear();
  if (!in.cmd.connect(in.target.host, in.target.port, why) || !in.sub.connect(in.target.host, in.target.port, why))
    went_down(in, why);
}

void redis_bus::on_link_up(redis_link& l) noexcept {
  instance& in = of_link(l);
  if (&l == &in.cmd) setup_command_link(in);
  else setup_subscriber_link(in);
}

void redis_bus::on_push(redis_link& l, const resp::reply& r) noexcept { on_sub_message(of_link(l), &r); }

/// Both links to a Redis are set up: the bus is up on it; its topics resubscribed after an
/// outage catch up, and the subs that waited for it go on.
void redis_bus::ready_check(instance& in) noexcept {
  if (!in.cmd_ready || !in.sub_ready || in.up.load(std::memory_order_relaxed)) return;
  in.up = true;
  in.backoff_ticks = 0;
  std::size_t held = 0;
  for (auto& [t, ts] : _topics) {
    if (ts.home != in.index) continue;
    held += ts.holders > 0;
    if (ts.state == topic_state::active && ts.needs_catchup) start_catchup(t);
  }
  unpark_ready();
  if (in.ever_up) _n.reconnects.add();
  log(log_level::info, "bus: %s to %s (%zu topics subscribed)", in.ever_up ? "reconnected" : "connected",
      in.target.describe().c_str(), held);
  in.ever_up = true;
}

/// The last mark heard from a Redis as a place in each of its streams: the end of the
/// millisecond before it (that millisecond may hold events published before the mark: they
/// arrived, and a topic's last event covers them). A moment, not an event: its seq is the
/// largest, which no stream issues (is_moment), and wspush_replay reads it in mark mode. Empty
/// before the first mark.
std::string redis_bus::mark_moment(const instance& in) const {
  if (in.mark_epoch.empty()) return {};
  return in.mark_epoch + ':' + std::to_string(in.mark_ms - 1) + "-18446744073709551615";
}

/// `subbed`'s positions: each topic new to the connection is at the last mark heard on the
/// current links of its Redis (mark_moment): every event published after it reaches the
/// connection, live or kept aside until it joins, or a resume from the position replays it;
/// such a resume may bring what came between the mark and the sub, which the client never had
/// either. None before that mark (one from before an outage could be of an older epoch, or
/// ahead of a Redis whose clock is behind).
void redis_bus::add_positions(const pending& p, pubsub::bus_reply& r) {
  for (std::size_t k = 0; k < p.parts.size(); ++k) {
    const instance& in = *_instances[p.parts[k].home];
    if (!p.parts[k].joins || !in.mark_current || in.mark_epoch.empty()) continue;
    r.at.resize(p.parts.size());
    r.at[k] = mark_moment(in);
  }
}

/// Where a topic's catch-up starts, fixed when an outage of its Redis begins: the later of
/// that Redis's last mark (when the topic was subscribed before it) and its last event. With
/// neither, the node cannot know.
void redis_bus::note_catchup_start(topic_state& ts) noexcept {
  const instance& in = *_instances[ts.home];
  std::string best;
  std::uint64_t best_at = 0;
  auto consider = [&](const std::string& id, std::uint64_t at) {
    if (id.empty()) return;
    if (best.empty() || (same_epoch(id, best) ? key_of(id) > key_of(best) : at > best_at)) best = id, best_at = at;
  };
  try {
    if (ts.floored && !in.mark_epoch.empty()) consider(mark_moment(in), in.mark_at);
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
  c.parts[0].home = ts.home;
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
void redis_bus::setup_command_link(instance& in) noexcept {
  const redis_target& t = in.target;
  if (!t.password.empty()) command(in, {"AUTH", t.password}, new op{op::setup});
  const std::string db = std::to_string(t.db);
  if (t.db != 0) command(in, {"SELECT", db}, new op{op::setup});
  command(in, {"FUNCTION", "LOAD", "REPLACE", redis_functions}, new op{op::setup});
  const std::string maxlen = std::to_string(_o.history_size);
  const std::string ttl = std::to_string(std::uint64_t(_o.history_ttl * 1000));
  const std::string max_bytes = std::to_string(_o.max_event_bytes);
  command(in, {"HSET", "wspush:config", "maxlen", maxlen, "ttl_ms", ttl, "max_event_bytes", max_bytes}, new op{op::setup});
  command(in, {"FCALL", "wspush_epoch", "0"}, new op{op::epoch});
  if (!_told_node_bytes) command(in, {"CONFIG", "GET", "stream-node-max-bytes"}, new op{op::node_bytes});
}

/// AUTH, then this node's channel and every topic a shard holds on this Redis, in batches.
void redis_bus::setup_subscriber_link(instance& in) noexcept {
  const redis_target& t = in.target;
  if (!t.password.empty()) {
    const char* argv[] = {"AUTH", t.password.c_str()};
    std::size_t lens[] = {4, t.password.size()};
    in.sub.command(2, argv, lens, nullptr, nullptr);
  }
  const char* argv[] = {"SUBSCRIBE", _node_channel.c_str()};
  std::size_t lens[] = {9, _node_channel.size()};
  in.sub.command(2, argv, lens, nullptr, nullptr);  // answered by pushes: on_push
  for (auto& [topic, ts] : _topics) {
    if (ts.holders == 0 || ts.home != in.index) continue;
    ts.state = topic_state::subscribing;
    in.to_subscribe.push_back(topic);
  }
  send_batches(in);
}

/// Redis answered a set-up command with an error (LOADING while it reads its append-only file,
/// NOPERM from an ACL, a function it cannot load) and keeps the connection open: without the
/// set-up the bus cannot be up on it, so the connection is closed and tried again after the
/// backoff, or the node would wait on it forever.
void redis_bus::setup_refused(instance& in, std::string_view error) noexcept {
  if (!in.refusal.empty()) return;  // the first refusal closes it; the others say the same
  in.refusal = "Redis refused the set-up: " + std::string(error);
  log_ratelimited(log_level::error, "bus: %s (%s); trying again", in.refusal.c_str(), in.target.describe().c_str());
  in.cmd.disconnect();  // from its own callback: the link closes once the pending replies are in
}

void redis_bus::on_link_down(redis_link& l, const std::string& why) noexcept {
  instance& in = of_link(l);
  went_down(in, in.refusal.empty() ? why : in.refusal, &l);
}

/// A connection to a Redis failed (`gone`: the link whose callback this is, already ending):
/// its other one is dropped too, every sub under way on it waits for it, and a reconnect is
/// scheduled. The other Redis of the bus go on.
void redis_bus::went_down(instance& in, const std::string& why, redis_link* gone) noexcept {
  const bool was_up = in.up.exchange(false);
  in.cmd_ready = in.sub_ready = false;
  const std::string where = in.target.describe();
  if (!_running) {
    // stop(): the links were closed on purpose; nothing is lost and nothing reconnects.
    if (was_up) log(log_level::info, "bus: disconnected from %s", where.c_str());
  } else if (was_up || !in.ever_up) {
    if (was_up) log(log_level::error, "bus: lost %s (%s); reconnecting", where.c_str(), why.c_str());
    else log_ratelimited(log_level::warn, "bus: cannot reach %s (%s); retrying", where.c_str(), why.c_str());
  }
  if (gone != &in.sub) in.sub.abort();
  if (gone != &in.cmd) in.cmd.abort();
  // Subs under way with a topic on this Redis wait for it to come back, from the start; held
  // topics are subscribed again on the next connection. Catch-ups under way on it are done
  // again then, from where they started (the topic keeps it; the live events they held back
  // were not handed on).
  std::vector<std::uint64_t> catchups, subs, paced;
  for (auto& [pid, p] : _pending) {
    bool here = false;
    for (const auto& part : p.parts) here |= part.home == in.index;
    if (!here) continue;
    if (p.kind == pending::catchup) {
      catchups.push_back(pid);
      continue;
    }
    if (p.held) continue;
    if (p.answered) {  // part of its replay went out: it cannot start again (the shard closes it)
      paced.push_back(pid);
      continue;
    }
    unhook(p);  // its places on the other Redis's topics go too: it enlists again from the start
    p.unconfirmed = p.replies_left = p.markers_left = 0;
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
  in.mark_in_flight = false;
  in.mark_current = false;  // positions wait for a mark heard on the next links
  in.page_queue.clear();    // the pages of the subs held and the catch-ups redone are asked again
  in.pages_in_flight = 0;
  ++in.link_gen;            // the answers still due from the old links count for nothing
  in.unfloored.clear();
  for (auto it = _topics.begin(); it != _topics.end();) {
    topic_state& ts = it->second;
    if (ts.home != in.index) {
      ++it;
      continue;
    }
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
  in.to_subscribe.clear();
  in.to_unsubscribe.clear();
  in.awaiting = 0;
  in.backoff_ticks = std::clamp(in.backoff_ticks * 2, min_backoff_ticks, max_backoff_ticks);
  static thread_local std::minstd_rand jitter(std::random_device{}());
  in.retry_at = _tick + in.backoff_ticks / 2 + jitter() % (in.backoff_ticks / 2 + 1);
}

}  // namespace wspush::server::bus
