// The Redis bus's publishes, batched into one function call, and what Redis answers: replies
// to commands, pub/sub messages (live events and marks), framing and offering events to the
// shards.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

// ---- publishes ------------------------------------------------------------------------------

/// Takes a publish into the batch being gathered for its topic's Redis (take_requests), which
/// goes once it holds max_batch_pubs publishes or max_batch_bytes of them, or when the
/// requests taken run out.
void redis_bus::gather_publish(request& r) noexcept {
  if (r.w) {
    std::lock_guard lock(r.w->m);
    if (r.w->withdrawn) return;  // its publisher was told unavailable: keep that true
    r.w->sent = true;            // (a failed send settles it as unavailable)
  }
  instance* where = home(r.topic);
  if (!where) return publish_refused(r);  // a cluster's slot no master is known to serve
  instance& in = *where;
  try {
    in.gathered.push_back(&r);
  } catch (...) {
    return publish_refused(r);
  }
  in.gathered_bytes += r.topic.size() + r.data.size() + r.key.size();
  if (in.gathered.size() >= max_batch_pubs || in.gathered_bytes >= max_batch_bytes) send_publishes(in);
}

void redis_bus::send_publishes() noexcept {
  for (auto& in : _instances) send_publishes(*in);
}

/// The publishes gathered for a Redis go to it in one FCALL wspush_publish_batch; under Redis
/// Cluster in one FCALL wspush_publish_many over the slots of the master (a mailbox a slot:
/// one call per slot would be a call per event). A batch with an idempotency key goes to the
/// _keyed twin of either, a key per publish ("": none) behind the window: a batch without one
/// costs Redis what it did.
void redis_bus::send_publishes(instance& in) noexcept {
  auto& gathered = in.gathered;
  if (gathered.empty()) return;
  send_batch(in, gathered);
  gathered.clear();
  in.gathered_bytes = 0;
}

void redis_bus::send_batch(instance& in, std::span<request* const> run) noexcept {
  auto* o = new (std::nothrow) op{op::publishes};
  bool sent = false;
  if (o) {
    try {
      o->pubs.resize(run.size());
      const bool keyed = std::any_of(run.begin(), run.end(), [](const request* r) { return !r->key.empty(); });
      if (_o.cluster) {
        // The first stream key declared (it routes the call to this master), then a stream key
        // before each topic and data.
        if (_keys.size() < run.size() + 1) _keys.resize(run.size() + 1);  // never shrunk: the strings keep their room
        for (std::size_t k = 0; k < run.size(); ++k) name_into(_keys[k], topic_slot(run[k]->topic), "stream:", run[k]->topic);
        // Declared: a key of this node's channel's slot, which the master serves whatever
        // other slot is moving (a stream key of a moving slot would refuse the whole call).
        name_into(_keys[run.size()], in.node_slot, "epoch", {});
        _argv.assign({"FCALL", keyed ? "wspush_publish_many_keyed" : "wspush_publish_many", "1", _keys[run.size()]});
      } else {
        _argv.assign({"FCALL", keyed ? "wspush_publish_keyed" : "wspush_publish_batch", "0"});
      }
      if (keyed) _argv.push_back(_window_ms);
      for (std::size_t k = 0; k < run.size(); ++k) {
        const request& r = *run[k];
        if (_o.cluster) _argv.push_back(_keys[k]);
        _argv.push_back(r.topic);
        _argv.push_back(r.data);
        if (keyed) _argv.push_back(r.key);
        batched_pub& b = o->pubs[k];
        b.client = r.kind == request::client_pub;
        b.shard = r.shard;
        b.tag = r.tag;
        b.bytes = r.topic.size() + r.data.size() + r.key.size();  // what publish() counted
        b.w = r.w;
      }
      sent = command(in, _argv, o);  // deletes o if it was not sent
      if (sent) _n.publish_calls.add();
      if (sent && _o.wait_replicas > 0) follow_with_wait(in, *o);
    } catch (...) {
      delete o;
    }
  }
  for (std::size_t k = 0; k < run.size(); ++k) {
    request& r = *run[k];
    if (!sent) publish_refused(r);
    else if (r.kind == request::client_pub) o->pubs[k].topic = std::move(r.topic);  // sent: the bytes are copied
  }
}

/// Durable: WAIT answers once wait_replicas replicas of this Redis have every write made before
/// it on this link (or wait_ms ran out), and the batch's publishes are settled by its answer
/// (replicas_answered). Redis runs nothing else of a link while its WAIT waits, so at most one
/// is in flight: a batch sent meanwhile waits for the next one, which covers every batch sent
/// until the first answers. Replicas that are away so cost each batch at most two waits, not
/// one for every batch ahead of it (which would soon look like a stalled Redis).
void redis_bus::follow_with_wait(instance& in, op& o) noexcept {
  if (in.wait_in_flight) {
    if (!in.next_wait) in.next_wait.reset(new (std::nothrow) op{op::wait});
    if (in.next_wait) {
      o.then_wait = in.next_wait.get();
      return;
    }
  } else if (auto* w = new (std::nothrow) op{op::wait}) {
    if (command_on(in.cmd, in, std::span<const std::string_view>(_wait_argv), w)) {
      o.then_wait = w;
      in.wait_in_flight = true;
      return;
    }
  }
  o.unconfirmed = true;  // no memory for the WAIT: its publishes are not said to be on replicas
}

/// A publish that did not go (down, or no memory): its publisher hears it.
void redis_bus::publish_refused(request& r) noexcept {
  if (r.w) r.w->finish(bus_publish::unavailable, "the bus is down");
  if (r.kind == request::client_pub) {
    pub_answered(r.topic.size() + r.data.size() + r.key.size());
    pub_failed(r.shard, r.tag, r.topic);
  }
}

void redis_bus::pub_answered(std::size_t bytes) noexcept { _pub_bytes.fetch_sub(bytes, std::memory_order_relaxed); }

// ---- replies --------------------------------------------------------------------------------

void redis_bus::on_reply(op* o, const resp::reply* r) noexcept {
  std::unique_ptr<op> hold(o);
  if (o->kind == op::slots) return map_arrived(r);
  if (o->kind == op::sentinel_addr) return sentinel_answered(r);
  instance& in = *o->in;
  // A slot served elsewhere now (a reshard, a failover): the map is asked again. What was
  // refused so is answered as refused (it did not run), and a retry goes to the new master.
  if (_o.cluster && r != nullptr && r->type == resp::reply_type::error && parse_redirect(str(r)).kind != redirect::none)
    _map_wanted = true;
  if (_o.cluster && o->kind == op::publishes && r != nullptr && r->type == resp::reply_type::array)
    for (std::size_t k = 0; k < r->elements; ++k)
      if (r->element[k]->type == resp::reply_type::error && str(r->element[k]).find("not served here") != std::string_view::npos)
        _map_wanted = true;  // wspush_publish_many: a slot moved
  const bool error = r == nullptr || r->type == resp::reply_type::error;
  switch (o->kind) {
    case op::setup:
    case op::epoch:
      // No reply at all: the link went away meanwhile, and that path says so.
      if (r == nullptr) return;
      if (error) return setup_refused(in, str(r));
      // After a refusal the link is closing: the set-up's later answers (Redis runs what
      // follows a refused AUTH as the default user) must not bring the bus up meanwhile.
      if (o->kind == op::setup || !in.refusal.empty()) return;
      in.epoch.assign(str(r));
      in.cmd_ready = true;
      return ready_check(in);
    case op::role: {
      if (r == nullptr || error) return;  // gone, or an error the next set-up command says too
      const bool master = r->type == resp::reply_type::array && r->elements > 0 &&
                          r->element[0]->type == resp::reply_type::string && str(r->element[0]) == "master";
      if (!master)
        setup_refused(in, "ROLE is " + std::string(r->type == resp::reply_type::array && r->elements > 0
                                                       ? str(r->element[0]) : std::string_view("not an array")) +
                              ", not master (a Sentinel's answer from before a failover): asking again");
      return;
    }
    case op::publishes: return publishes_answered(*o, r);
    case op::wait: return replicas_answered(*o, r);
    case op::replay: {
      if (o->tag == in.link_gen && in.pages_in_flight > 0) --in.pages_in_flight;  // pump_pages (on_turn) sends the next
      if (r == nullptr) return;  // the link went: went_down holds the sub, or redoes the catch-up
      auto it = _pending.find(o->pid);
      // Held: another of its Redis went away meanwhile; it starts again when that one is back.
      if (it == _pending.end() || it->second.failed || it->second.held) return;
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
      // A catch-up found lost because the epoch changed (Redis lost data: a failover to a
      // replica behind, a restart) is read from the start of the stream; its subscribers had
      // every event up to `since` already, and are told of the loss: they get what is newer.
      // Stream ids grow with Redis's clock across such lives (first_id in wspush.lua).
      const id_key floor = p.kind == pending::catchup && r->element[0]->integer != 0 ? key_of(part.since) : id_key{};
      for (std::size_t k = paged ? 2 : 1; k + 1 < r->elements; k += 2) {
        std::string_view id = str(r->element[k]), data = str(r->element[k + 1]);
        std::uint64_t ms, seq;
        if (!parse_id(id, ms, seq) || !valid_data(data)) {
          _n.malformed.add();
          continue;
        }
        if (!(id_key{ms, seq} > floor)) continue;
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
        in.mark_in_flight = false;
        if (r != nullptr) log_ratelimited(log_level::warn, "bus: wspush_mark: %.*s", int(str(r).size()), str(r).data());
      }
      return;
    case op::node_bytes: {
      // {name, value}; refused (an ACL user without CONFIG, a renamed command): nothing said.
      // No answer (the link went): asked again of the next Redis set up.
      if (r == nullptr) _node_bytes_asked = false;
      if (error || r->type != resp::reply_type::array || r->elements != 2) return;
      std::uint64_t bytes = 0;
      const std::string_view v = str(r->element[1]);
      if (std::from_chars(v.data(), v.data() + v.size(), bytes).ec != std::errc{} || bytes <= 1024) return;
      log(log_level::warn, "bus: Redis keeps each topic's history in blocks of %llu bytes (stream-node-max-bytes): "
          "a topic with a few small events costs about %llu bytes of Redis memory, a million such topics %.1f GB; "
          "512 keeps such a topic under 1 KB and its first publish cheaper (docs/REDIS.md)",
          static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(bytes + 300), double(bytes + 300) / 1e3);
      return;
    }
    case op::marker:
      // Refused: under Redis Cluster the node's channel moved with its slot (MOVED) before the
      // marker went; the sub cannot know where its replay ends and fails (its client may retry).
      if (error && r != nullptr) {
        log_ratelimited(log_level::warn, "bus: a marker: %.*s", int(str(r).size()), str(r).data());
        drop_pending(o->pid);
      }
      return;
    case op::revocations:
      if (error && _o.cluster && r != nullptr && str(r).starts_with("MOVED")) _map_wanted = true;  // its slot moved
      return revocations_loaded(*o, r);
    case op::presence_get: return presence_got(*o, r);
    case op::slots:  // answered above
    case op::sentinel_addr:
    case op::presence:
    case op::revoke:
      if (error && _o.cluster && r != nullptr && str(r).starts_with("MOVED")) _map_wanted = true;
      [[fallthrough]];
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
    log_ratelimited(log_level::warn, "bus: Redis lacks a function of this node's (a node of an older version loaded its "
                    "functions): loading this node's again");
    if (auto* load = new (std::nothrow) op{op::other})
      command(*o.in, {"FUNCTION", "LOAD", "REPLACE", _library}, load);
  }
  for (std::size_t k = 0; k < o.pubs.size(); ++k) {
    batched_pub& b = o.pubs[k];
    const resp::reply* e = each ? r->element[k] : r;
    const bus_publish result = e == nullptr                              ? bus_publish::unknown
                               : e->type == resp::reply_type::error      ? bus_publish::refused
                               : e->type == resp::reply_type::string && e->len > 0 ? bus_publish::ok
                                                                         : bus_publish::refused;
    const std::string_view text = result == bus_publish::refused && e->type != resp::reply_type::error ? "a malformed reply" : str(e);
    if (o.unconfirmed && result == bus_publish::ok) {
      settle_pub(b, bus_publish::unknown, {});  // published; whether replicas have it is not known
      continue;
    }
    if (o.then_wait == nullptr) {
      settle_pub(b, result, text);
      continue;
    }
    b.result = result;
    if (!b.client) {
      try {
        b.text.assign(text);
      } catch (...) {
        b.result = bus_publish::unknown;  // its id cannot be kept: it may have been published
      }
    }
  }
  if (o.then_wait == nullptr || o.unconfirmed) return;
  auto& to = o.then_wait->pubs;
  try {
    to.insert(to.end(), std::make_move_iterator(o.pubs.begin()), std::make_move_iterator(o.pubs.end()));
  } catch (...) {
    for (batched_pub& b : o.pubs) settle_pub(b, b.result == bus_publish::ok ? bus_publish::unknown : b.result, b.text);
  }
}

/// WAIT answered for a batch of durable publishes: those Redis ran are answered ok if enough
/// replicas have them, else timeout (published on the master, which a failover may lose: a
/// retry may publish twice). No answer: the link broke, and they stay unknown.
void redis_bus::replicas_answered(op& o, const resp::reply* r) noexcept {
  const long long had = r != nullptr && r->type == resp::reply_type::integer ? r->integer : -1;
  const bool enough = had >= static_cast<long long>(_o.wait_replicas);
  for (batched_pub& b : o.pubs) {
    if (b.result == bus_publish::ok && !enough) {
      _n.unreplicated.add();
      b.result = bus_publish::unknown;
      if (had >= 0) {
        char why[160];
        std::snprintf(why, sizeof why, "published as %.64s, but %lld of %u replicas had it within %u ms", b.text.c_str(), had,
                      _o.wait_replicas, _o.wait_ms);
        b.text.assign(why);
      } else {
        b.text.clear();
      }
    }
    settle_pub(b, b.result, b.text);
  }
  // The WAIT in flight answered: the next one, if batches wait for it, goes now (not when the
  // link is gone: went_down settles it).
  instance& in = *o.in;
  in.wait_in_flight = false;
  if (r != nullptr && in.next_wait && command_on(in.cmd, in, std::span<const std::string_view>(_wait_argv), in.next_wait.get(), false)) {
    (void)in.next_wait.release();  // the link owns it now
    in.wait_in_flight = true;
  }
}

/// The link went with batches waiting for the next WAIT: they were published or not, and
/// whether replicas have them is not known.
void redis_bus::drop_next_wait(instance& in) noexcept {
  in.wait_in_flight = false;
  if (!in.next_wait) return;
  for (batched_pub& b : in.next_wait->pubs) settle_pub(b, b.result == bus_publish::ok ? bus_publish::unknown : b.result, b.text);
  in.next_wait.reset();
}

/// One publish of a batch answered: its admin waiter, or its client's shard.
void redis_bus::settle_pub(batched_pub& b, bus_publish result, std::string_view text) noexcept {
  if (!b.client) {
    if (b.w) b.w->finish(result, text);
    return;
  }
  pub_answered(b.bytes);
  if (result == bus_publish::ok && b.shard < _pubs_done.size()) {
    try {
      _pubs_done[b.shard].push_back(b.tag);  // answered in one reply per shard (on_turn)
      return;
    } catch (...) {
    }
  }
  // Refused: the client hears unavailable. Unanswered (the link broke with it sent), or taken
  // with no memory to say so: timeout, it may have been published.
  pub_failed(b.shard, b.tag, std::move(b.topic), result != bus_publish::refused);
}

/// Everything a subscriber connection hears: subscribe and unsubscribe confirmations, events.
void redis_bus::on_sub_message(instance& in, const resp::reply* r) noexcept {
  if (r == nullptr || r->type != resp::reply_type::array || r->elements < 3) return;
  std::string_view kind = str(r->element[0]), channel = str(r->element[1]);
  if (channel == control_channel && revokes_shared()) {  // revokes (redis_bus_revoke.cpp)
    if (kind == "message") control_message(str(r->element[2]));
    return;
  }
  if (_o.cluster && kind.substr(0, 1) == "s") kind.remove_prefix(1);  // the sharded twins: smessage, ssubscribe, ...
  // This node's own channel there; under Redis Cluster any it had (a mark or marker sent on
  // the one before its slot moved still counts).
  const bool own = _o.cluster ? channel.ends_with(_node_suffix) : channel == in.node_channel;
  if (kind == "message") {
    const std::string_view payload = str(r->element[2]);
    if (own) return payload.substr(0, 5) == "mark " ? mark_arrived(in, payload) : marker(payload);
    const std::string_view topic = topic_of_channel(channel);
    if (topic.empty()) return;
    return live(topic, payload);
  }
  if (own) {
    if (kind == "subscribe") {
      in.sub_ready = true;
      ready_check(in);
    } else if (kind == "unsubscribe" && _o.cluster && channel == in.node_channel) {
      _map_wanted = true;  // its slot left this master: the node's channel there is chosen again (apply_map)
    }
    return;
  }
  const std::string_view bare = topic_of_channel(channel);
  if (bare.empty()) return;
  const std::string topic(bare);
  if (kind == "subscribe" || kind == "unsubscribe") {
    if (_o.cluster && kind == "unsubscribe") {
      // Not asked (the node asks only for a topic of this master it is unsubscribing): Redis
      // Cluster dropped it, its slot having left this master. It answers no command. (One for
      // a topic that moved since cannot be told from the answer to the node's own: it counts
      // as an answer, which at worst lets the next batch go a little early.)
      auto it = _topics.find(topic);
      if (it != _topics.end() && it->second.home == in.index && it->second.state != topic_state::unsubscribing)
        return moved_off(in, topic);
    }
    if (in.awaiting > 0) --in.awaiting;
    if (kind == "subscribe") confirmed(in, topic);
    else unsubscribed(in, topic);
    if (in.awaiting == 0) send_batches(in);  // what gathered meanwhile
  }
}

void redis_bus::marker(std::string_view payload) noexcept {
  std::uint64_t pid = 0;
  for (char c : payload) {
    if (c < '0' || c > '9') return;
    pid = pid * 10 + std::uint64_t(c - '0');
  }
  auto it = _pending.find(pid);
  if (it == _pending.end() || it->second.held || it->second.failed || it->second.markers_left == 0) return;
  // Live events keep being kept aside until the answer goes (finish): those after the marker
  // were published after the replay's read, and reach the shard only through the answer.
  if (--it->second.markers_left > 0) return;  // another Redis's is still to come
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
  if (payload.starts_with("join ") || payload.starts_with("leave ")) return join_leave(topic, payload);
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
  if (_o.cluster) {
    // Each slot's epoch as last seen: what a mark is read in for its topics (mark_moment).
    std::string& e = _slot_epoch[topic_slot(topic)];
    const std::string_view epoch = id.substr(0, id.find(':'));
    if (e != epoch) e.assign(epoch);
  }
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
  if (_compression && (!_o.spaces || _o.spaces->of(topic).compression)) _compression->attach(_buffers, f);
  return f;
}

void redis_bus::offer_all(const pool::frame_ref& frame, std::string_view topic) noexcept {
  offer_at(frame, proto::event_topic_offset, topic.size());
}

/// Offers a frame to every shard as a message of the topic found `topic_offset` bytes into its
/// payload (the event's topic must live as long as its frame: it points into the frame's bytes).
void redis_bus::offer_at(const pool::frame_ref& frame, std::size_t topic_offset, std::size_t topic_size) noexcept {
  const std::string_view in_frame = pubsub::text_of(frame).substr(topic_offset, topic_size);
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

}  // namespace wspush::server::bus
