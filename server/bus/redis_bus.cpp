// The Redis bus: set-up and shutdown, requests from other threads, the bus thread's loop and its
// commands (connecting to each Redis and losing it: redis_bus_links.cpp).

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

// ---- the links' callbacks -------------------------------------------------------------------

namespace {

void reply_cb(const resp::reply* reply, void* priv) noexcept {
  auto* o = static_cast<redis_bus::op*>(priv);
  o->bus->on_reply(o, reply);
}

}  // namespace

/// What a reply from Redis may hold (a bound past it drops the link, see redis_link.hpp). A bulk
/// string: one event's data plus its id and a space (a `message`'s payload), with room to spare.
/// An array: a replay's `lost` flag and id/data pairs for at most history_size entries (of the
/// namespace that keeps the most), plus
/// slack. Nesting: replies and pushes the bus reads are flat; 4 leaves room. The bytes of one
/// reply: what a replay of a whole history of events of the largest size holds (a replay is read
/// in one reply today), at least 4 MiB. Nothing is reserved from a header: a reply costs memory
/// only as its bytes arrive.
resp::limits reply_limits(const redis_bus_options& o) noexcept {
  resp::limits l;
  l.max_bulk = std::size_t(o.max_event_bytes) + 256;
  // The topic that keeps the most: a namespace may keep more than --history-size.
  const std::size_t history = o.spaces ? std::max(o.history_size, o.spaces->max_history_size()) : o.history_size;
  // Besides: a page of the revocation list, and presence's pairs (user, connections).
  l.max_elements = std::max({2 * history, max_batch_pubs, 2 * std::size_t(revocation_page),
                             2 * max_admin_presence_users + 2}) + 16;
  l.max_depth = 4;
  l.max_total = std::max<std::size_t>(4u << 20, (history + 1) * l.max_bulk) +
                l.max_elements * sizeof(resp::reply) + (64 << 10);
  return l;
}


// ---- set-up and shutdown --------------------------------------------------------------------

redis_bus::redis_bus(redis_bus_options o, pool::buffer_pool& buffers)
    : _o(std::move(o)), _buffers(buffers), _loop(loop_options{}), _node_id(random_node_id()),
      _node_channel(std::string(node_prefix) + _node_id), _node_suffix(":node:" + _node_id) {
  _instances.reserve(max_instances);  // never moved: other threads read them (up_at)
  if (sentinel()) {
    // The Sentinels' answers are short: an address, a name, an announcement.
    resp::limits small;
    small.max_bulk = 4096;
    small.max_elements = 16;
    small.max_depth = 3;
    small.max_total = 1u << 20;
    redis_link::listener& self = *this;
    const tls_client_context* tls = _o.sentinels.front().tls ? _o.tls.get() : nullptr;
    _probe = std::make_unique<redis_link>(_loop, probe_key, self, redis_link::options{false, small, &_n.protocol_errors, tls});
    _watch = std::make_unique<redis_link>(_loop, watch_key, self, redis_link::options{true, small, &_n.protocol_errors, tls});
  }
  _wait_args[0] = std::to_string(_o.wait_replicas);
  _wait_args[1] = std::to_string(_o.wait_ms);
  _wait_argv[0] = "WAIT";
  _wait_argv[1] = _wait_args[0];
  _wait_argv[2] = _wait_args[1];
  _window_ms = std::to_string(std::uint64_t(_o.idempotency_window * 1000));
  // The namespaces' history limits, written into the library, longest prefix first (the first
  // a topic starts with is its namespace), so that every publish, a backend's FCALL too, trims
  // the topic's stream to its namespace's: nodes sharing a Redis agree on them; the last one
  // set up wins. A prefix holds no `"` nor `\` (a topic's rule): quoted as it is.
  _library = redis_functions;
  if (_o.spaces && !_o.spaces->list().empty()) {
    std::string list;
    for (const topic_namespace& n : _o.spaces->list())
      list += (list.empty() ? "{\"" : ", {\"") + n.prefix + "\", " + std::to_string(n.options.history_size) + ", " +
              std::to_string(std::uint64_t(n.options.history_ttl * 1000)) + "}";
    const std::string line = "local namespaces = {} -- @namespaces@";
    if (const auto at = _library.find(line); at != std::string::npos)
      _library.replace(at, line.size(), "local namespaces = {" + list + "}");
  }
  if (_o.cluster) {
    // The masters come from the cluster's map (apply_map); the seeds are where it is asked.
    _slot_owner.reset(new std::atomic<std::uint16_t>[cluster_slots]);
    for (std::uint32_t k = 0; k < cluster_slots; ++k) _slot_owner[k].store(no_home, std::memory_order_relaxed);
    _slot_epoch.resize(cluster_slots);
    for (const auto& t : _o.targets) _map_sources.emplace_back(t.host, t.port);
    // CLUSTER SLOTS: a range per element at most (16,384), each naming its master and replicas.
    resp::limits map_limits;
    map_limits.max_bulk = 4096;
    map_limits.max_elements = 8 * cluster_slots;
    map_limits.max_depth = 5;
    map_limits.max_total = 64u << 20;
    redis_link::listener& self = *this;
    _probe = std::make_unique<redis_link>(_loop, probe_key, self,
                                          redis_link::options{false, map_limits, &_n.protocol_errors,
                                                              _o.targets.front().tls ? _o.tls.get() : nullptr});
    // The limits every slot's functions read, written into the library (no key is common to
    // all slots): nodes sharing a cluster agree on them; the last one set up wins.
    const std::string line = "local cluster_config = nil -- @cluster_config@";
    const auto at = _library.find(line);
    if (at != std::string::npos)
      _library.replace(at, line.size(),
                       "local cluster_config = {" + std::to_string(_o.history_size) + ", " +
                           std::to_string(std::uint64_t(_o.history_ttl * 1000)) + ", " +
                           std::to_string(_o.max_event_bytes) + ", " +
                           std::to_string(std::uint64_t(_o.idempotency_window * 1000)) + "}");
    return;
  }
  const resp::limits limits = reply_limits(_o);
  for (std::uint32_t k = 0; k < _o.targets.size(); ++k) {
    _instances.push_back(std::make_unique<instance>(*this, k, _o.targets[k], limits, &_n.protocol_errors));
    _instances.back()->node_channel = _node_channel;
  }
  _instance_count.store(std::uint32_t(_instances.size()), std::memory_order_release);
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
  _all_up = _any_up = false;
}

/// The bus thread: whether every Redis that serves topics is up, and whether any is (read by
/// other threads), after one came or went, or a cluster's map changed.
void redis_bus::refresh_up() noexcept {
  bool all = !_instances.empty() && (!_o.cluster || _map_covered), any = false;
  for (const auto& in : _instances) {
    if (!in->serving) continue;
    const bool up = in->up.load(std::memory_order_relaxed);
    all &= up;
    any |= up;
  }
  _all_up.store(all, std::memory_order_release);
  _any_up.store(any, std::memory_order_release);
}

bool redis_bus::up() const noexcept { return _all_up.load(std::memory_order_acquire); }

bool redis_bus::any_up() const noexcept { return _any_up.load(std::memory_order_acquire); }

bool redis_bus::up_at(std::size_t k) const noexcept {
  return k < _instance_count.load(std::memory_order_acquire) && _instances.data()[k]->up.load(std::memory_order_acquire);
}

bool redis_bus::up_for(std::string_view topic) const noexcept { return up_at(home_of(topic)); }

/// Any thread: the index of the Redis that holds `topic` (no_home: a cluster's slot not known
/// to be served yet).
std::uint32_t redis_bus::home_of(std::string_view topic) const noexcept {
  if (_o.cluster) return _slot_owner[topic_slot(topic)].load(std::memory_order_acquire);
  const auto n = std::uint32_t(_o.targets.size());
  return n == 1 ? 0 : shard_of(topic, n);
}

redis_bus::instance* redis_bus::home(std::string_view topic) noexcept {
  const std::uint32_t k = home_of(topic);
  return k < _instances.size() ? _instances[k].get() : nullptr;
}

redis_bus::instance& redis_bus::of_link(const redis_link& l) noexcept { return *_instances[(l.key() - 1) / 2]; }

/// Writes a name in Redis into `out`: the place, `wspush:` or under Redis Cluster `wspush:{<tag>}:`
/// of `slot` (redis_route.hpp), then `what` and `topic`. `out` keeps its capacity, so that a
/// batch's keys, written into the same strings each time, allocate nothing once warm.
void redis_bus::name_into(std::string& out, std::uint32_t slot, std::string_view what, std::string_view topic) const {
  out.assign("wspush:");
  if (_o.cluster) out.append("{").append(slot_tag(slot)).append("}:");
  out.append(what).append(topic);
}

std::string redis_bus::stream_key(std::string_view topic) const {
  std::string key;
  name_into(key, topic_slot(topic), "stream:", topic);
  return key;
}

std::string redis_bus::channel_of(std::string_view topic) const {
  std::string channel;
  name_into(channel, topic_slot(topic), "topic:", topic);
  return channel;
}

/// The topic of one of its channels (empty: not a topic's channel).
std::string_view redis_bus::topic_of_channel(std::string_view channel) const noexcept {
  if (!_o.cluster) return channel.substr(0, topic_prefix.size()) == topic_prefix ? channel.substr(topic_prefix.size()) : std::string_view{};
  constexpr std::string_view head = "wspush:{", tail = "}:topic:";
  if (channel.substr(0, head.size()) != head) return {};
  const auto end = channel.find(tail, head.size());
  return end == std::string_view::npos ? std::string_view{} : channel.substr(end + tail.size());
}

std::uint64_t redis_bus::on_drain_begin() noexcept {
  for (auto& in : _instances) {
    in->sub.disconnect();
    in->cmd.disconnect();
  }
  if (_probe) _probe->disconnect();
  if (_watch) _watch->disconnect();
  flush_settled();  // the publishes the links took with them: no turn follows
  return 0;
}

// ---- requests from other threads ------------------------------------------------------------

/// Queues a request for the bus thread and wakes it; false, and nothing queued, when there was
/// no memory for it. `topic` and `data` are copied into the request here, so that a poster
/// builds nothing that can throw.
bool redis_bus::post(request&& r, std::string_view topic, std::string_view data, bool wake,
                     std::string_view idempotency_key) noexcept {
  try {
    r.topic.assign(topic);
    r.data.assign(data);
    r.key.assign(idempotency_key);  // none: nothing allocated
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
std::string redis_bus::down_reason() const {
  const std::uint32_t n = _instance_count.load(std::memory_order_acquire);
  std::lock_guard lock(_why_m);
  for (std::uint32_t k = 0; k < n; ++k) {
    const instance& in = *_instances[k];
    if (in.up.load(std::memory_order_acquire)) continue;
    return in.why_down.empty() ? in.target.describe() + ": connecting" : in.why_down;
  }
  return {};
}

bool redis_bus::publish(std::uint32_t shard, std::uint64_t tag, std::string_view topic, std::string_view data,
                        std::string_view idempotency_key) noexcept {
  if (!up_for(topic)) return false;
  const std::size_t bytes = topic.size() + data.size() + idempotency_key.size();
  if (_pub_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes > _o.max_pub_bytes) {
    _pub_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    _n.pubs_refused.add();  // shard threads: a relaxed add may lose a count between two; it is a gauge of trouble
    return false;
  }
  if (!post(request{request::client_pub, shard, tag, {}, {}, {}, {}}, topic, data, true, idempotency_key)) {
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

std::uint64_t redis_bus::publish_queue(std::string_view topic, std::string_view data, std::string_view idempotency_key,
                                       bool notify, bool wake) {
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
  if (!post(request{request::admin_pub, 0, 0, {}, {}, {}, std::move(w)}, topic, data, wake, idempotency_key))
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
  return publish_collect(publish_queue(topic, data, {}), id, timeout);
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
  // The gauge before the shards wake: a client told its sub failed must not find it still
  // counted under way (test_redis_setup read it in that gap once).
  _n.pending.set(_pending.size());
  for (pubsub::event_port* p : _ports) p->wake();
  flush_settled();  // what the replies read in this turn, and the requests taken, settled
}

void redis_bus::on_tick(std::uint32_t tick) noexcept {
  _tick = tick;
  for (auto& p : _instances) {
    instance& in = *p;
    const bool up = in.up.load(std::memory_order_relaxed);
    // A mark that never came back (its channel moved with its slot, say): the next one goes.
    if (in.mark_in_flight && _tick - in.mark_sent_tick > 5 * mark_every_ticks) in.mark_in_flight = false;
    if (!up && in.serving && in.sub.idle() && in.cmd.idle() && std::int32_t(tick - in.retry_at) >= 0) connect_links(in);
    if (up && !in.mark_in_flight && (std::int32_t(tick - in.next_mark_tick) >= 0 || !in.unfloored.empty()))
      send_mark(in);
  }
  if (_o.cluster && !_map_in_flight && (_map_wanted || std::int32_t(tick - _next_map_tick) >= 0)) ask_map();
  if (sentinel()) watch_sentinels();
  expire_held();
  refresh_presence();
  watch_stall();
}

void redis_bus::send_mark(instance& in) noexcept {
  auto* o = new (std::nothrow) op{op::mark};
  // Under Redis Cluster the channel is the call's declared key (a shard channel of that master).
  if (!o || !command(in, {"FCALL", "wspush_mark", _o.cluster ? "1" : "0", in.node_channel}, o)) return;
  in.mark_in_flight = true;
  in.mark_sent_tick = _tick;
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
          where(in).c_str(), double(waited) / 1e9, _o.redis_timeout);
    else
      log(log_level::info, "bus: %s is no longer stalled (answered, or the link dropped)", where(in).c_str());
  }
  _stalled.store(any, std::memory_order_release);
}

void redis_bus::on_ready(std::uint64_t key, bool r, bool w) noexcept {
  if (key == probe_key && _probe) return _probe->on_ready(r, w);
  if (key == watch_key && _watch) return _watch->on_ready(r, w);
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
  for (auto& in : _instances) send_presence(*in);
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
    case request::revoke: return handle_revoke(std::move(r.topic), std::int64_t(r.tag));
    case request::presence_set: return gather_presence(r);
    case request::presence_get: return handle_presence_get(r);
  }
}

bool redis_bus::command(instance& in, std::initializer_list<std::string_view> args, op* o) noexcept {
  return command(in, std::span<const std::string_view>(args.begin(), args.size()), o);
}

/// Sends a command on the command link; `o` is answered by on_reply, or deleted if it was not sent.
bool redis_bus::command(instance& in, std::span<const std::string_view> args, op* o) noexcept {
  return command_on(in.cmd, in, args, o);
}

/// The same on either link of `in` (the subscriber link's AUTH is answered so too).
bool redis_bus::command_on(redis_link& link, instance& in, std::span<const std::string_view> args, op* o,
                           bool delete_unsent) noexcept {
  try {
    _argp.resize(args.size());
    _argl.resize(args.size());
  } catch (...) {
    if (delete_unsent) delete o;
    return false;
  }
  for (std::size_t k = 0; k < args.size(); ++k) {
    _argp[k] = args[k].data();
    _argl[k] = args[k].size();
  }
  o->bus = this;
  o->in = &in;
  if (link.command(int(args.size()), _argp.data(), _argl.data(), reply_cb, o)) return true;
  if (delete_unsent) delete o;
  return false;
}

}  // namespace wspush::server::bus
