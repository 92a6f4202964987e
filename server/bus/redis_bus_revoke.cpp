// The Redis bus's part in revokes (POST /disconnect): every node hears of a revoke, and the
// list of revoked users outlives any node (docs/REDIS.md, "Revokes").
//
// The first Redis of --bus (the master, under Sentinel) keeps them, whatever the topics:
//   wspush:revocations  sorted set: each revoked sub scored with its revoke's time (unix
//                       seconds). Each revoke removes the entries older than --revocation-ttl,
//                       keeps at most --max-revocations (the oldest go first), and sets the key
//                       to expire --revocation-ttl after it.
//   wspush:control      channel: "<node id> <at> <sub>" for each revoke; every node subscribes to
//                       it on its subscriber link there, and closes that user's connections
//                       (the node that made the revoke did so already, and skips its own).
// A node reads the set when it connects (or reconnects) to that Redis, after its subscription
// to the channel is in place: a revoke it missed while away is news, and closes that user's
// connections on it too. A revoke made while that Redis is away is sent once it is back.
//
// Under Redis Cluster the Redis that keeps them is the master of the set's slot (key_slot of
// wspush:revocations, whatever the map says now): the set's commands go there, and so does the
// node's SUBSCRIBE to the channel. The channel is plain pub/sub, not sharded: a PUBLISH on any
// master reaches the subscribers of every node of the cluster. When the slot moves (a failover,
// a resharding), the subscription moves with it and the node reads the list again there.

#include "server/bus/redis_bus_parts.hpp"

#include <ctime>

#include "server/bus/redis_route.hpp"

namespace wspush::server::bus {

// Under Redis Cluster the instances grow (on the bus's thread) while the admin thread asks:
// revokes are shared there from the start, sent once the set's master is known and up.
bool redis_bus::revokes_shared() const noexcept { return _o.cluster || !_instances.empty(); }

/// The instance that keeps the list and the control channel's subscription (no_home: under
/// Redis Cluster, its slot's master not known yet). Bus thread.
std::uint32_t redis_bus::control_index() const noexcept {
  if (!_o.cluster) return 0;
  static const std::uint32_t slot = key_slot(revocations_key);
  return _slot_owner[slot].load(std::memory_order_relaxed);
}

bool redis_bus::control_home(const instance& in) const noexcept {
  return revokes_shared() && in.index == control_index();
}

void redis_bus::subscribe_control(instance& in) noexcept {
  if (!control_home(in)) return;
  const char* argv[] = {"SUBSCRIBE", control_channel.data()};
  std::size_t lens[] = {9, control_channel.size()};
  in.sub.command(2, argv, lens, nullptr, nullptr);  // its confirmation is skipped (on_sub_message)
  _control_at = in.index;
}

/// Redis Cluster's map changed: if the set's slot has another master now, the subscription
/// leaves the old one and is made at the new one (if its links are set up already; else when
/// they are), where the list is read again: a revoke published in between is in it.
void redis_bus::control_moved() noexcept {
  const std::uint32_t k = control_index();
  if (!_o.cluster || k == _control_at) return;
  if (_control_at < _instances.size() && _instances[_control_at]->sub.connected()) {
    const char* argv[] = {"UNSUBSCRIBE", control_channel.data()};
    std::size_t lens[] = {11, control_channel.size()};
    _instances[_control_at]->sub.command(2, argv, lens, nullptr, nullptr);  // its confirmation is skipped too
  }
  _control_at = no_home;
  if (k >= _instances.size()) return;
  instance& in = *_instances[k];
  if (!in.sub.connected()) return;  // setup_subscriber_link subscribes
  subscribe_control(in);
  if (in.up.load(std::memory_order_relaxed)) control_up(in);
}

void redis_bus::revoke(std::string_view sub, std::int64_t at) noexcept {
  if (!revokes_shared() || sub.empty()) return;
  request r;
  r.kind = request::revoke;
  r.tag = std::uint64_t(at);
  if (!post(std::move(r), sub))
    log_ratelimited(log_level::error, "bus: out of memory; a revoke is not told to the other nodes");
}

void redis_bus::handle_revoke(std::string sub, std::int64_t at) noexcept {
  const std::uint32_t k = control_index();
  if (k < _instances.size() && _instances[k]->up.load(std::memory_order_relaxed) && send_revoke(*_instances[k], sub, at))
    return;
  try {  // sent once that Redis is back (control_up); at most as many as the list holds
    _unsent_revokes.emplace_back(std::move(sub), at);
    while (_unsent_revokes.size() > std::max<std::size_t>(_o.max_revocations, 1)) _unsent_revokes.pop_front();
  } catch (...) {
    log_ratelimited(log_level::error, "bus: out of memory; a revoke is not told to the other nodes");
  }
}

/// Records the revoke in the set (when the list is on) and tells every node; false when it
/// could not be sent (the link is down).
bool redis_bus::send_revoke(instance& in, const std::string& sub, std::int64_t at) noexcept {
  try {
    const std::string when = std::to_string(at);
    if (_o.revocation_ttl > 0 && _o.max_revocations > 0) {
      const std::int64_t now = std::int64_t(std::time(nullptr));
      const std::string key(revocations_key), expired = std::to_string(now - std::int64_t(_o.revocation_ttl));
      const std::string keep = std::to_string(-std::int64_t(_o.max_revocations) - 1), ttl = std::to_string(_o.revocation_ttl);
      // GT: a later revoke of the same sub moves it; an earlier one (heard late) does not.
      if (!command(in, {"ZADD", key, "GT", when, sub}, new op{op::revoke})) return false;
      command(in, {"ZREMRANGEBYSCORE", key, "-inf", expired}, new op{op::revoke});
      command(in, {"ZREMRANGEBYRANK", key, "0", keep}, new op{op::revoke});
      command(in, {"EXPIRE", key, ttl}, new op{op::revoke});
    }
    const std::string payload = _node_id + ' ' + when + ' ' + sub;
    return command(in, {"PUBLISH", control_channel, payload}, new op{op::revoke});
  } catch (...) {
    return false;
  }
}

/// The control's Redis is up (both links set up: the channel is subscribed): the list is read,
/// and the revokes made meanwhile go.
void redis_bus::control_up(instance& in) noexcept {
  if (!control_home(in)) return;
  try {
    if (_o.revocation_ttl > 0 && _o.max_revocations > 0) {
      const std::int64_t now = std::int64_t(std::time(nullptr));
      read_revocations(in, now - std::int64_t(_o.revocation_ttl) + 1, 0);
    }
    while (!_unsent_revokes.empty()) {
      auto& [sub, at] = _unsent_revokes.front();
      if (!send_revoke(in, sub, at)) break;
      _unsent_revokes.pop_front();
    }
  } catch (...) {
    log_ratelimited(log_level::error, "bus: out of memory; the revocation list is not read");
  }
}

namespace {

bool parse_seconds(std::string_view s, std::int64_t& out) noexcept {
  if (const auto dot = s.find('.'); dot != std::string_view::npos) s = s.substr(0, dot);  // a score as Redis writes it
  std::uint64_t v = 0;
  if (!parse_number(s, v) || v > std::uint64_t(INT64_MAX)) return false;
  out = std::int64_t(v);
  return true;
}

}  // namespace

/// Reads a page of the list: the entries from time `from` on, past the first `skip` of them
/// (those of time `from` the page before had already). A page holds revocation_page entries, so
/// a list of any length is read in replies within the bus's bounds, and entries pruned from its
/// old end meanwhile shift nothing.
void redis_bus::read_revocations(instance& in, std::int64_t from, std::uint32_t skip) noexcept {
  try {
    auto* o = new op{op::revocations, std::uint64_t(from), skip};
    command(in, {"ZRANGEBYSCORE", revocations_key, std::to_string(from), "+inf", "WITHSCORES", "LIMIT",
                 std::to_string(skip), std::to_string(revocation_page)},
            o);
  } catch (...) {
    log_ratelimited(log_level::error, "bus: out of memory; the revocation list is not read");
  }
}

/// ZRANGEBYSCORE ... WITHSCORES LIMIT: sub, time, sub, time, ... (a full page: more may follow).
void redis_bus::revocations_loaded(const op& o, const resp::reply* r) noexcept {
  if (r == nullptr) return;  // the link went: read again when it is back
  if (r->type != resp::reply_type::array) {
    log_ratelimited(log_level::warn, "bus: the revocation list: %.*s", int(str(r).size()), str(r).data());
    return;
  }
  std::int64_t last = std::int64_t(o.pid);
  std::uint32_t at_last = o.index;  // entries of time `last` read so far
  std::size_t n = 0;
  for (std::size_t k = 0; k + 1 < r->elements; k += 2) {
    std::int64_t at = 0;
    const std::string_view sub = str(r->element[k]);
    if (sub.empty() || !parse_seconds(str(r->element[k + 1]), at)) {
      _n.malformed.add();
      continue;
    }
    at_last = at == last ? at_last + 1 : 1;
    last = at;
    ++n;
    if (_on_revoke) _on_revoke(sub, at, true);
  }
  _revocations_read += n;
  if (r->elements / 2 >= revocation_page && o.in) return read_revocations(*o.in, last, at_last);
  if (_revocations_read > 0) log(log_level::info, "bus: %zu revoked users read from Redis", _revocations_read);
  _revocations_read = 0;
}

/// "<node id> <at> <sub>" on the control channel.
void redis_bus::control_message(std::string_view payload) noexcept {
  const auto a = payload.find(' ');
  const auto b = a == std::string_view::npos ? a : payload.find(' ', a + 1);
  std::int64_t at = 0;
  if (b == std::string_view::npos || b + 1 >= payload.size() || !parse_seconds(payload.substr(a + 1, b - a - 1), at)) {
    _n.malformed.add();
    return;
  }
  if (payload.substr(0, a) == _node_id) return;  // this node's own: done when it was made
  if (_on_revoke) _on_revoke(payload.substr(b + 1), at, false);
}

}  // namespace wspush::server::bus
