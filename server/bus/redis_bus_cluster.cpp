// The Redis bus under Redis Cluster (--bus=redis-cluster://seeds): which master serves each slot
// (CLUSTER SLOTS, asked on a link of its own of the seeds and of every master seen, in turn), the
// masters as the bus's instances, and the topics that move when their slot does.
//
// Each master is an instance as an isolated shard is: a command link and a subscriber link
// (SSUBSCRIBE: sharded pub/sub, so a publish goes only to the master of its channel's slot),
// never one link per slot. The map is asked at start, every map_every_ticks, and at once when a
// master answers MOVED or ASK, goes away, or drops a shard channel by itself (its slot left).
// A topic whose slot moved is caught up as after an outage: from its last event, or the last
// mark of its old master, at its new master, which the stream moved to with the slot.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

namespace {

void map_cb(const resp::reply* reply, void* priv) noexcept {
  auto* o = static_cast<redis_bus::op*>(priv);
  o->bus->on_reply(o, reply);
}

}  // namespace

/// Asks for the map on the probe link, connecting it first (to the next address in turn).
void redis_bus::ask_map() noexcept {
  if (!_probe || _map_in_flight || !_running) return;
  if (_probe->connected()) {
    const char* auth[3];
    std::size_t auth_lens[3];
    if (const int n = _o.targets.front().auth_argv(auth, auth_lens))
      _probe->command(n, auth, auth_lens, nullptr, nullptr);  // refused: CLUSTER SLOTS says NOAUTH
    auto* o = new (std::nothrow) op{op::slots};
    if (!o) return;
    o->bus = this;
    const char* argv[] = {"CLUSTER", "SLOTS"};
    std::size_t lens[] = {7, 5};
    if (!_probe->command(2, argv, lens, map_cb, o)) {
      delete o;
      return;
    }
    _map_in_flight = true;
    _map_wanted = false;
    _next_map_tick = _tick + map_every_ticks;
    return;
  }
  if (!_probe->idle() || _map_sources.empty()) return;  // connecting: on_link_up asks
  const auto& source = _map_sources[_next_source++ % _map_sources.size()];
  _probe_host = source.first;
  std::string why;
  if (!_probe->connect(source.first, source.second, why))
    log_ratelimited(log_level::warn, "bus: cannot ask %s:%u for the cluster's map (%s)", source.first.c_str(),
                    unsigned(source.second), why.c_str());
}

void redis_bus::map_arrived(const resp::reply* r) noexcept {
  _map_in_flight = false;
  if (r == nullptr) return;  // the link went (on_link_down asks again)
  const std::string from = _probe_host;  // what a master announced as "?" is reached at
  cluster_map m;
  std::string why;
  if (r->type == resp::reply_type::error) why = std::string(str(r));
  else if (!m.load(*r, why)) why = "not a slot map: " + why;
  if (!why.empty()) {
    log_ratelimited(log_level::error, "bus: a node named in --bus does not give the cluster's map (%s); asking another",
                    why.c_str());
    _map_wanted = true;
    _probe->disconnect();
    return;
  }
  try {
    apply_map(m, from);
  } catch (...) {
    _map_wanted = true;  // out of memory: the next tick asks again
  }
}

/// The map as read: a master not seen before becomes an instance (it connects on the next
/// tick), one that serves no slot any more is left alone, a master whose slot of this node's
/// channel moved connects again with another, and every topic whose slot is served elsewhere
/// now moves (rehome).
void redis_bus::apply_map(const cluster_map& m, const std::string& from_host) {
  const auto masters = m.masters();
  std::vector<std::uint32_t> index(masters.size(), no_home);
  bool changed = false;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    const std::string host = masters[i].host.empty() ? from_host : masters[i].host;
    for (const auto& in : _instances)
      if (in->target.host == host && in->target.port == masters[i].port) index[i] = in->index;
    if (index[i] != no_home) continue;
    if (_instances.size() >= max_instances) {
      log_ratelimited(log_level::error, "bus: the cluster shows more than %zu masters over this node's life; %s:%u is "
                      "not used", max_instances, host.c_str(), unsigned(masters[i].port));
      continue;
    }
    redis_target t = _o.targets.front();  // the seeds' user, password and TLS
    t.host = host;
    t.port = masters[i].port;
    const auto k = std::uint32_t(_instances.size());
    _instances.push_back(std::make_unique<instance>(*this, k, t, reply_limits(_o), &_n.protocol_errors));
    _instance_count.store(k + 1, std::memory_order_release);
    index[i] = k;
    changed = true;
    bool known = false;
    for (const auto& s : _map_sources) known |= s.first == host && s.second == t.port;
    if (!known) _map_sources.emplace_back(host, t.port);
  }
  // Each slot's master now; what each instance serves.
  std::vector<std::uint32_t> first_slot(_instances.size(), no_home);
  for (std::uint32_t slot = 0; slot < cluster_slots; ++slot) {
    const cluster_node* owner = m.master_of(slot);
    const std::uint32_t k = owner ? index[std::size_t(owner - masters.data())] : no_home;
    if (_slot_owner[slot].load(std::memory_order_relaxed) != k) {
      _slot_owner[slot].store(std::uint16_t(k), std::memory_order_release);
      changed = true;
    }
    if (k != no_home && first_slot[k] == no_home) first_slot[k] = slot;
  }
  _map_covered = m.covered();
  if (!_map_covered) _map_wanted = true;  // a failover under way: asked again at the next tick
  for (auto& p : _instances) {
    instance& in = *p;
    const bool serving = first_slot[in.index] != no_home;
    const bool node_slot_kept = serving && in.node_slot != no_home &&
                                _slot_owner[in.node_slot].load(std::memory_order_relaxed) == in.index;
    if (serving && !node_slot_kept) {
      // This node's channel there: a shard channel of a slot the master serves (a marker must
      // come back on the subscriber link, in order with the topics' messages).
      in.node_slot = first_slot[in.index];
      name_into(in.node_channel, in.node_slot, "node:", _node_id);
      // Links set up already move to it (a new channel on the same link: the publishes in
      // flight there go on); a marker sent to the old one is answered MOVED (op::marker).
      if (in.sub.connected()) {
        const char* argv[] = {"SSUBSCRIBE", in.node_channel.c_str()};
        std::size_t lens[] = {10, in.node_channel.size()};
        if (!in.sub.command(2, argv, lens, nullptr, nullptr)) went_down(in, "cannot move this node's channel there");
      }
    }
    if (!serving && in.serving && (!in.sub.idle() || !in.cmd.idle())) went_down(in, "it serves no slot any more");
    in.serving = serving;
  }
  if (changed)
    log(log_level::info, "bus: the cluster's map: %zu masters, %s", masters.size(),
        _map_covered ? "every slot served" : "some slots served by none (a failover under way?)");
  // Topics whose slot is served elsewhere now.
  std::vector<std::pair<std::string, std::uint32_t>> moved;
  for (const auto& [topic, ts] : _topics) {
    const std::uint32_t to = _slot_owner[topic_slot(topic)].load(std::memory_order_relaxed);
    if (to != ts.home) moved.emplace_back(topic, to);
  }
  for (const auto& [topic, to] : moved) rehome(topic, to);
  control_moved();  // the revocation list's slot (redis_bus_revoke.cpp)
  refresh_up();
  unpark_ready();
}

/// A topic moves to the master `to` (no_home: not known yet). Its subscription ends where it
/// was (Redis Cluster dropped it with the slot); the subscribers that stay are caught up at
/// the new master from where the old one left them, as after an outage; subs under way with it
/// start again once the new master is up.
void redis_bus::rehome(const std::string& topic, std::uint32_t to) noexcept {
  auto it = _topics.find(topic);
  if (it == _topics.end()) return;
  topic_state& ts = it->second;
  lose_subscription(ts, topic);
  ts.home = to;
  std::vector<std::uint64_t> involved, subs;
  for (const auto& [pid, p] : _pending)
    for (const auto& part : p.parts)
      if (part.topic == topic) {
        involved.push_back(pid);
        break;
      }
  for (std::uint64_t pid : involved) unsettle(pid, subs);
  for (std::uint64_t pid : subs) park(pid);
  it = _topics.find(topic);
  if (it == _topics.end()) return;
  if (it->second.holders == 0 && it->second.waiting.empty()) {
    _topics.erase(it);
    return;
  }
  // Subscribed at the new master now if its links are there (else when they are set up).
  if (to < _instances.size() && _instances[to]->sub.connected() && it->second.holders > 0) {
    it->second.state = topic_state::subscribing;
    _instances[to]->to_subscribe.push_back(topic);
  }
}

/// Redis Cluster dropped a topic's shard channel on its own: its slot left this master. Where
/// it went is asked; until the map says, the topic waits (its subscribers stay, and are caught
/// up once it is subscribed again).
void redis_bus::moved_off(instance& in, const std::string& topic) noexcept {
  _map_wanted = true;
  const std::uint32_t to = _slot_owner[topic_slot(topic)].load(std::memory_order_relaxed);
  rehome(topic, to == in.index ? no_home : to);
}

}  // namespace wspush::server::bus
