// The Redis bus's subscriptions and the replay seam: a sub confirmed on the subscriber link, its
// history read in pages and joined with the live events kept aside meanwhile, catch-ups after
// an outage, and the answers to the shards.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

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
    topic_state& ts = state_of(s->topics[k]);
    if (s->new_hold[k]) ++ts.holders;  // a hold is always taken: the shard releases it later
    p.parts[k].home = ts.home;
    p.parts[k].topic = s->topics[k];
    p.parts[k].since = s->since[k];
    p.parts[k].joins = k < s->joins.size() && s->joins[k];
  }
  p.page_bytes = std::clamp<std::uint64_t>(s->room, 1, replay_page_bound);
  p.s = std::move(s);
  if (!all_up(p)) return park(pid);
  enlist(pid);
}

/// A topic's state, made (and given its Redis) on first use.
redis_bus::topic_state& redis_bus::state_of(const std::string& topic) {
  auto [it, fresh] = _topics.try_emplace(topic);
  if (fresh) it->second.home = home_of(topic);
  return it->second;
}

/// Every Redis that holds one of the sub's topics is up.
bool redis_bus::all_up(const pending& p) const noexcept {
  for (const auto& part : p.parts)
    if (part.home >= _instances.size() || !_instances[part.home]->up.load(std::memory_order_relaxed)) return false;
  return true;
}

/// The sub leaves its topics' lists (waiting for a confirmation, keeping live events aside).
void redis_bus::unhook(const pending& p) noexcept {
  for (const auto& part : p.parts) {
    auto t = _topics.find(part.topic);
    if (t == _topics.end()) continue;
    for (auto* v : {&t->second.waiting, &t->second.replaying}) v->erase(std::remove(v->begin(), v->end(), p.pid), v->end());
  }
}

/// Waits for each of the sub's topics to be subscribed in Redis (subscribing those not yet),
/// then goes on (advance).
void redis_bus::enlist(std::uint64_t pid) noexcept {
  pending& p = _pending.at(pid);
  for (auto& part : p.parts) {  // a topic moved meanwhile: the sub waits for the map (nothing taken yet)
    const topic_state& ts = state_of(part.topic);
    if (ts.home != part.home || ts.home >= _instances.size()) return park(pid);
  }
  for (auto& part : p.parts) {
    topic_state& ts = state_of(part.topic);
    if (ts.state == topic_state::idle) {
      ts.state = topic_state::subscribing;
      _instances[ts.home]->to_subscribe.push_back(part.topic);
    }
    if (ts.state != topic_state::active) {
      ts.waiting.push_back(pid);
      ++p.unconfirmed;
    }
  }
  if (p.unconfirmed == 0) advance(pid);
}

/// A Redis of the sub's topics is away: the sub waits for it (its topics stay held), until
/// held_sub_wait ends.
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

/// A Redis is back: every sub that waited and now has all its Redis goes on, in order, each
/// under a new number (a marker of its earlier attempt, late from the old connection, must not
/// count for the new one). The others wait on, in their order.
void redis_bus::unpark_ready() noexcept {
  std::deque<std::uint64_t> held;
  held.swap(_held_subs);
  for (std::uint64_t pid : held) {
    auto it = _pending.find(pid);
    if (it == _pending.end() || !it->second.held) continue;
    for (auto& part : it->second.parts) {  // a cluster's topic may have moved meanwhile
      const auto t = _topics.find(part.topic);
      if (t != _topics.end()) part.home = t->second.home;
    }
    if (!all_up(it->second)) {
      try {
        _held_subs.push_back(pid);
        continue;
      } catch (...) {
        drop_pending(pid);
        continue;
      }
    }
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
      _instances[ts.home]->to_unsubscribe.push_back(topic);
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
void redis_bus::send_batches(instance& in) noexcept {
  if (!in.sub.connected() || in.awaiting > 0) return;
  if (in.to_subscribe.size() < full_sub_batch && in.to_unsubscribe.size() < full_sub_batch) {
    if (in.to_subscribe.empty() && in.to_unsubscribe.empty()) return;
    if (in.small_batch_tick == _tick) return;
    in.small_batch_tick = _tick;
  }
  // Under Redis Cluster a command's shard channels share one slot: the topics go sorted by
  // slot, a command per slot (still at most channels_per_command each).
  auto send = [this, &in](std::string_view verb, std::vector<std::string>& topics) {
    if (_o.cluster)
      std::stable_sort(topics.begin(), topics.end(),
                       [](const std::string& a, const std::string& b) { return topic_slot(a) < topic_slot(b); });
    for (std::size_t at = 0; at < topics.size();) {
      std::size_t n = std::min(channels_per_command, topics.size() - at);
      if (_o.cluster) {
        const std::uint32_t slot = topic_slot(topics[at]);
        std::size_t same = 1;
        while (same < n && topic_slot(topics[at + same]) == slot) ++same;
        n = same;
      }
      std::vector<std::string> channels;
      channels.reserve(n);
      std::vector<const char*> argv{verb.data()};
      std::vector<std::size_t> lens{verb.size()};
      for (std::size_t k = 0; k < n; ++k) {
        channels.push_back(channel_of(topics[at + k]));
        argv.push_back(channels.back().data());
        lens.push_back(channels.back().size());
      }
      if (!in.sub.command(int(argv.size()), argv.data(), lens.data(), nullptr, nullptr)) return;
      (verb.find("UNSUBSCRIBE") == std::string_view::npos ? _n.subscribes : _n.unsubscribes).add();
      in.awaiting += n;
      at += n;
    }
    topics.clear();
  };
  if (!in.to_subscribe.empty()) send(_o.cluster ? "SSUBSCRIBE" : "SUBSCRIBE", in.to_subscribe);
  if (!in.to_unsubscribe.empty()) send(_o.cluster ? "SUNSUBSCRIBE" : "UNSUBSCRIBE", in.to_unsubscribe);
}

void redis_bus::confirmed(instance& in, const std::string& topic) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end() || it->second.home != in.index) return;  // moved meanwhile: a late answer
  topic_state& ts = it->second;
  if (ts.state != topic_state::subscribing) return;
  ts.state = topic_state::active;
  _n.topics.add();
  if (!ts.floored && !ts.listed) {
    try {
      in.unfloored.push_back(topic);  // the next mark heard is its floor
      ts.listed = true;
    } catch (...) {
    }
  }
  // Back after an outage: what was published meanwhile goes to the subscribers that stayed
  // (once the command connection is set up too: ready_check starts the early ones), before
  // the subs waiting for this confirmation go on: their connections join after it.
  if (ts.needs_catchup && in.up.load(std::memory_order_relaxed)) start_catchup(topic);
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
    in.to_unsubscribe.push_back(topic);
  }
}

void redis_bus::unsubscribed(instance& in, const std::string& topic) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end() || it->second.state != topic_state::unsubscribing || it->second.home != in.index) return;
  _n.topics.sub();
  if (it->second.holders > 0) {  // held again meanwhile: subscribe again
    it->second.floored = false;   // not subscribed in between: no floor until the next mark
    it->second.state = topic_state::subscribing;
    in.to_subscribe.push_back(topic);
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
/// in flight at a time; then a marker on this node's channel right behind the last page, on
/// each Redis replayed from (maybe_finish). Live events are kept aside until the marker is back.
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

/// A page of part `k` waits its turn: pages go to its Redis in the order they were queued, at
/// most max_pages_in_flight to each Redis.
void redis_bus::queue_page(std::uint64_t pid, std::uint32_t k) noexcept {
  instance& in = *_instances[_pending.at(pid).parts.at(k).home];
  try {
    in.page_queue.emplace_back(pid, k);
  } catch (...) {
    return drop_pending(pid);
  }
  pump_pages(in);
}

void redis_bus::pump_pages(instance& in) noexcept {
  while (in.pages_in_flight < max_pages_in_flight && !in.page_queue.empty()) {
    const auto [pid, k] = in.page_queue.front();
    in.page_queue.pop_front();
    auto it = _pending.find(pid);
    if (it == _pending.end() || it->second.failed || it->second.held || k >= it->second.parts.size()) continue;
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
    if (o) o->tag = in.link_gen;
    const std::string_view from = first ? part.since : part.cursor, page(bytes, std::size_t(n));
    bool sent = false;
    if (o && _o.cluster) {
      try {
        const std::string key = stream_key(part.topic);
        sent = command(in, {"FCALL", "wspush_replay", "1", key, part.topic, from, mode, replay_page_entries, page}, o);
      } catch (...) {
        delete o;
      }
    } else if (o) {
      sent = command(in, {"FCALL", "wspush_replay", "0", part.topic, from, mode, replay_page_entries, page}, o);
    }
    if (!sent) {
      drop_pending(pid);
      continue;
    }
    ++in.pages_in_flight;
  }
}

void redis_bus::maybe_finish(std::uint64_t pid) noexcept {
  auto it = _pending.find(pid);
  if (it == _pending.end()) return;
  pending& p = it->second;
  if (p.replies_left > 0) return;
  if (!p.marker_seen && !p.marker_sent) {
    // Every page is read: when a marker comes back from each Redis replayed from, every
    // publish made there before the last read has.
    const std::string token = std::to_string(pid);
    std::uint32_t sent_to = 0;  // a bit per Redis (past 32: each part's Redis, once per part)
    for (const auto& part : p.parts) {
      if (part.since.empty()) continue;
      const std::uint32_t bit = part.home < 32 ? 1u << part.home : 0;
      if (bit && (sent_to & bit)) continue;
      sent_to |= bit;
      auto* o = new (std::nothrow) op{op::marker, pid};
      instance& in = *_instances[part.home];
      if (!o || !command(in, {_o.cluster ? "SPUBLISH" : "PUBLISH", in.node_channel, token}, o)) return drop_pending(pid);
      ++p.markers_left;
    }
    p.marker_sent = true;
    if (p.markers_left == 0) p.marker_seen = true;
    else return;
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
          _instances[t->second.home]->to_unsubscribe.push_back(part.topic);
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
        _instances[t->second.home]->to_unsubscribe.push_back(part.topic);
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

}  // namespace wspush::server::bus
