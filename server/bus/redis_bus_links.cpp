// The Redis bus's links to each Redis: connecting, setting each link up, the bus up on a Redis
// once both are, the catch-up owed after an outage, and what an outage does to the subs under
// way.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

// ---- connecting -----------------------------------------------------------------------------

void redis_bus::connect_links(instance& in) noexcept {
  std::string why;
  in.cmd_ready = in.sub_ready = false;
  in.refusal.clear();
  if (sentinel() && !in.located) return ask_sentinel();  // every connection starts with asking where
  if (!in.cmd.connect(in.host, in.port, why) || !in.sub.connect(in.host, in.port, why)) went_down(in, why);
}

void redis_bus::on_link_up(redis_link& l) noexcept {
  if (&l == _probe.get() && sentinel()) {
    _sentinel_asking = false;  // it was connecting; now it asks
    return ask_sentinel();
  }
  if (&l == _probe.get()) return ask_map();
  if (&l == _watch.get()) return watch_up();
  instance& in = of_link(l);
  if (&l == &in.cmd) setup_command_link(in);
  else setup_subscriber_link(in);
}

void redis_bus::on_push(redis_link& l, const resp::reply& r) noexcept {
  if (&l == _watch.get()) return sentinel_message(r);
  if (&l != _probe.get()) on_sub_message(of_link(l), &r);
}

/// Both links to a Redis are set up: the bus is up on it; its topics resubscribed after an
/// outage catch up, and the subs that waited for it go on.
void redis_bus::ready_check(instance& in) noexcept {
  if (!in.cmd_ready || !in.sub_ready || in.up.load(std::memory_order_relaxed)) return;
  in.up = true;
  in.backoff_ticks = 0;
  {
    std::lock_guard lock(_why_m);
    in.why_down.clear();
  }
  refresh_up();
  std::size_t held = 0;
  for (auto& [t, ts] : _topics) {
    if (ts.home != in.index) continue;
    held += ts.holders > 0;
    if (ts.state == topic_state::active && ts.needs_catchup) start_catchup(t);
  }
  unpark_ready();
  control_up(in);
  if (in.ever_up) _n.reconnects.add();
  log(log_level::info, "bus: %s to %s (%zu topics subscribed)", in.ever_up ? "reconnected" : "connected",
      where(in).c_str(), held);
  in.ever_up = true;
}

/// The last mark heard from a Redis as a place in each of its streams: the end of the
/// millisecond before it (that millisecond may hold events published before the mark: they
/// arrived, and a topic's last event covers them). A moment, not an event: its seq is the
/// largest, which no stream issues (is_moment), and wspush_replay reads it in mark mode. Empty
/// before the first mark.
/// Under Redis Cluster the epoch is the topic's slot's, as last seen in an id (each slot has its
/// own; a mark carries its channel's): none seen, no moment.
std::string redis_bus::mark_moment(const instance& in, std::string_view topic) const {
  if (in.mark_epoch.empty() || in.mark_ms == 0) return {};
  const std::string& epoch = _o.cluster ? _slot_epoch[topic_slot(topic)] : in.mark_epoch;
  if (epoch.empty() || !valid_epoch(epoch)) return {};
  return epoch + ':' + std::to_string(in.mark_ms - 1) + "-18446744073709551615";
}

/// `subbed`'s positions: each topic new to the connection is at the last mark heard on the
/// current links of its Redis (mark_moment): every event published after it reaches the
/// connection, live or kept aside until it joins, or a resume from the position replays it;
/// such a resume may bring what came between the mark and the sub, which the client never had
/// either. None before that mark (one from before an outage could be of an older epoch, or
/// ahead of a Redis whose clock is behind).
void redis_bus::add_positions(const pending& p, pubsub::bus_reply& r) {
  for (std::size_t k = 0; k < p.parts.size(); ++k) {
    if (!p.parts[k].joins || p.parts[k].home >= _instances.size()) continue;
    const instance& in = *_instances[p.parts[k].home];
    if (!in.mark_current) continue;
    std::string at = mark_moment(in, p.parts[k].topic);
    if (at.empty()) continue;
    r.at.resize(p.parts.size());
    r.at[k] = std::move(at);
  }
}

/// Where a topic's catch-up starts, fixed when an outage of its Redis begins: the later of
/// that Redis's last mark (when the topic was subscribed before it) and its last event. With
/// neither, the node cannot know.
void redis_bus::note_catchup_start(topic_state& ts, const std::string& topic) noexcept {
  const instance& in = *_instances[ts.home];
  std::string best;
  std::uint64_t best_at = 0;
  auto consider = [&](const std::string& id, std::uint64_t at) {
    if (id.empty()) return;
    if (best.empty() || (same_epoch(id, best) ? key_of(id) > key_of(best) : at > best_at)) best = id, best_at = at;
  };
  try {
    if (ts.floored) consider(mark_moment(in, topic), in.mark_at);
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

/// AUTH [user] password, first on a link; refused (WRONGPASS), it is the set-up's refusal
/// (setup_refused), not the NOAUTH the next command gets.
void redis_bus::send_auth(redis_link& link, instance& in) noexcept {
  const char* auth[3];
  std::size_t lens[3];
  const int n = in.target.auth_argv(auth, lens);
  if (n == 0) return;
  std::string_view args[3];
  for (int k = 0; k < n; ++k) args[k] = {auth[k], lens[k]};
  if (auto* o = new (std::nothrow) op{op::setup}) command_on(link, in, std::span<const std::string_view>(args, std::size_t(n)), o);
}

/// AUTH, SELECT, the functions, the history limits, the epoch; the epoch's answer says ready.
/// Under Redis Cluster: AUTH, the functions with the limits written in, and the epoch of the
/// slot of this node's channel there (made if missing: it says ready).
void redis_bus::setup_command_link(instance& in) noexcept {
  const redis_target& t = in.target;
  send_auth(in.cmd, in);
  // What a Sentinel named must be a master now (its answer may be stale, a failover under way).
  if (sentinel()) command(in, {"ROLE"}, new op{op::role});
  // The epoch's salt: the shards of a bus are set up together, and their epochs must differ.
  const std::string_view salt = std::string_view(_node_id).substr(0, 5);
  if (_o.cluster) {
    command(in, {"FUNCTION", "LOAD", "REPLACE", _library}, new op{op::setup});
    std::string key;
    name_into(key, in.node_slot, "epoch", {});
    command(in, {"FCALL", "wspush_epoch", "1", key, salt}, new op{op::epoch});
  } else {
    const std::string db = std::to_string(t.db);
    if (t.db != 0) command(in, {"SELECT", db}, new op{op::setup});
    command(in, {"FUNCTION", "LOAD", "REPLACE", _library}, new op{op::setup});
    const std::string maxlen = std::to_string(_o.history_size);
    const std::string ttl = std::to_string(std::uint64_t(_o.history_ttl * 1000));
    const std::string max_bytes = std::to_string(_o.max_event_bytes);
    command(in, {"HSET", "wspush:config", "maxlen", maxlen, "ttl_ms", ttl, "max_event_bytes", max_bytes}, new op{op::setup});
    // Under Sentinel the epoch is guarded: a master that took over from its writer voids it.
    if (sentinel()) command(in, {"FCALL", "wspush_epoch", "0", salt, "guard"}, new op{op::epoch});
    else command(in, {"FCALL", "wspush_epoch", "0", salt}, new op{op::epoch});
  }
  if (!_node_bytes_asked) _node_bytes_asked = command(in, {"CONFIG", "GET", "stream-node-max-bytes"}, new op{op::node_bytes});
}

/// AUTH, then this node's channel and every topic a shard holds on this Redis, in batches.
void redis_bus::setup_subscriber_link(instance& in) noexcept {
  send_auth(in.sub, in);
  subscribe_control(in);  // before the node's channel: subscribed once that one is confirmed
  const char* verb = _o.cluster ? "SSUBSCRIBE" : "SUBSCRIBE";
  const char* argv[] = {verb, in.node_channel.c_str()};
  std::size_t lens[] = {std::strlen(verb), in.node_channel.size()};
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
  in.refusal = "Redis refused the set-up: " + std::string(error) + std::string(refusal_hint(error));
  try {
    std::lock_guard lock(_why_m);
    in.why_down = where(in) + ": " + in.refusal;  // said now: the link closes after its last reply
  } catch (...) {
  }
  log_ratelimited(log_level::error, "bus: %s (%s); trying again", in.refusal.c_str(), where(in).c_str());
  in.cmd.disconnect();  // from its own callback: the link closes once the pending replies are in
}

void redis_bus::on_link_down(redis_link& l, const std::string& why) noexcept {
  if (sentinel() && (&l == _probe.get() || &l == _watch.get())) return sentinel_link_down(l, why);
  if (&l == _probe.get()) {
    _map_in_flight = false;
    _map_wanted = true;
    if (_running) log_ratelimited(log_level::warn, "bus: the cluster's map: %s", why.c_str());
    return;
  }
  instance& in = of_link(l);
  // A subscriber link's set-up refused (its AUTH, a SUBSCRIBE without it) ends it with Redis's words.
  went_down(in, in.refusal.empty() ? why + std::string(refusal_hint(why)) : in.refusal, &l);
}

/// A connection to a Redis failed (`gone`: the link whose callback this is, already ending):
/// its other one is dropped too, every sub under way on it waits for it, and a reconnect is
/// scheduled. The other Redis of the bus go on.
void redis_bus::went_down(instance& in, const std::string& why, redis_link* gone) noexcept {
  const bool was_up = in.up.exchange(false);
  in.cmd_ready = in.sub_ready = false;
  in.located = false;  // Sentinel: asked again before the next connection
  const std::string place = where(in);
  try {
    std::lock_guard lock(_why_m);
    in.why_down = place + ": " + why;
  } catch (...) {
  }
  if (!_running) {
    // stop(): the links were closed on purpose; nothing is lost and nothing reconnects.
    if (was_up) log(log_level::info, "bus: disconnected from %s", place.c_str());
  } else if (was_up || !in.ever_up) {
    if (was_up) log(log_level::error, "bus: lost %s (%s); reconnecting", place.c_str(), why.c_str());
    else log_ratelimited(log_level::warn, "bus: cannot reach %s (%s); retrying", place.c_str(), why.c_str());
  }
  if (gone != &in.sub) in.sub.abort();
  if (gone != &in.cmd) in.cmd.abort();
  drop_next_wait(in);  // after the command link's replies, which hand it their publishes
  // Subs under way with a topic on this Redis wait for it to come back, from the start; held
  // topics are subscribed again on the next connection. Catch-ups under way on it are done
  // again then, from where they started (the topic keeps it; the live events they held back
  // were not handed on).
  std::vector<std::uint64_t> here, subs;
  for (auto& [pid, p] : _pending)
    for (const auto& part : p.parts)
      if (part.home == in.index) {
        here.push_back(pid);
        break;
      }
  for (std::uint64_t pid : here) unsettle(pid, subs);
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
    lose_subscription(ts, it->first);
    if (ts.holders == 0) it = _topics.erase(it);
    else ++it;
  }
  in.to_subscribe.clear();
  in.to_unsubscribe.clear();
  in.awaiting = 0;
  refresh_up();
  if (_o.cluster) _map_wanted = true;  // a failover, maybe: where are its slots now?
  in.backoff_ticks = std::clamp(in.backoff_ticks * 2, min_backoff_ticks, max_backoff_ticks);
  static thread_local std::minstd_rand jitter(std::random_device{}());
  in.retry_at = _tick + in.backoff_ticks / 2 + jitter() % (in.backoff_ticks / 2 + 1);
}

/// A sub or catch-up under way that can no longer go on where it is (its Redis went away, or a
/// topic of it moved to another master): a catch-up is forgotten (the topic redoes it), a sub
/// whose replay has begun to go out fails (the shard closes its connection), and any other sub
/// is reset to start again, its pid put in `subs` to be held (park) until its Redis are up.
void redis_bus::unsettle(std::uint64_t pid, std::vector<std::uint64_t>& subs) noexcept {
  auto it = _pending.find(pid);
  if (it == _pending.end()) return;
  pending& p = it->second;
  if (p.kind == pending::catchup) return forget(it);
  if (p.held) return;
  if (p.answered) return drop_pending(pid);
  unhook(p);  // its places on the other Redis's topics go too: it enlists again from the start
  p.unconfirmed = p.replies_left = p.markers_left = 0;
  p.marker_seen = p.marker_sent = false;
  for (auto& part : p.parts) {
    const auto t = _topics.find(part.topic);
    part.home = t != _topics.end() ? t->second.home : home_of(part.topic);
    part.cursor.clear();
    part.lost = part.replaying = part.overflow = false;
    part.last = {};
    part.last_id.clear();
    part.entries.clear();
    part.live.clear();
  }
  try {
    subs.push_back(pid);
  } catch (...) {
    drop_pending(pid);
  }
}

/// A topic's subscription in Redis is gone (its Redis went away, or its slot moved): it is
/// idle again, and its subscribers that stay are owed a catch-up from where they were left
/// (or from an earlier one's start, still owed).
void redis_bus::lose_subscription(topic_state& ts, const std::string& topic) noexcept {
  const bool owed = ts.needs_catchup || ts.catchup;
  if (ts.state == topic_state::active || ts.state == topic_state::unsubscribing) {
    _n.topics.sub();
    if (ts.holders > 0 && !owed && ts.home < _instances.size()) note_catchup_start(ts, topic);
    ts.needs_catchup = ts.holders > 0;
  }
  ts.floored = ts.listed = false;  // subscribed again later: the next mark after that is its floor
  ts.state = topic_state::idle;
  ts.waiting.clear();
  ts.replaying.clear();
  ts.catchup = 0;
}

}  // namespace wspush::server::bus
