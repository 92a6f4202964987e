// The Redis bus behind Sentinel (--bus=redis-sentinel://sentinels/MASTER_NAME): one Redis, as
// --bus=redis:// is, whose address the Sentinels give.
//
// Before every connection to it (the first, and each after one was lost) the node asks a
// Sentinel, on a link of its own, SENTINEL get-master-addr-by-name; a Sentinel that does not
// answer, or does not know the name, passes the turn to the next. The command link's set-up
// then checks ROLE: an address that is not a master (a Sentinel's stale answer, a failover under
// way) is refused and asked again. A second link, subscribed to a Sentinel's +switch-master,
// ends the connections at once when the master moves, rather than when they break.
//
// A failover to a replica that lacks the last events the old master acknowledged is told as
// under Redis Cluster: the node sets the epoch up guarded (wspush:epoch:writer names the
// replication id of the master that last wrote), and the first function call on a master that
// took over from that one gives the data a new epoch (wspush.lua, single_epoch). docs/REDIS.md.

#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {

namespace {

void sentinel_cb(const resp::reply* reply, void* priv) noexcept {
  auto* o = static_cast<redis_bus::op*>(priv);
  o->bus->on_reply(o, reply);
}

std::string sentinel_name(const redis_target& t) { return t.host + ':' + std::to_string(t.port); }

}  // namespace

std::string redis_bus::where(const instance& in) const {
  if (!sentinel() || in.host.empty()) return in.target.describe();
  redis_target t = in.target;
  t.host = in.host;
  t.port = in.port;
  return t.describe() + " (master " + _o.master_name + ")";
}

/// Asks the current Sentinel where the master is (connecting to it first); the answer connects
/// the links (sentinel_answered).
void redis_bus::ask_sentinel() noexcept {
  if (_sentinel_asking || !_running) return;
  _sentinel_asked_tick = _tick;  // a Sentinel that does not answer within --redis-timeout is passed over
  if (!_probe->connected()) {
    if (!_probe->idle()) return;  // connecting: on_link_up asks
    std::string why;
    const redis_target& s = _o.sentinels[_sentinel_at];
    _sentinel_asking = true;
    if (!_probe->connect(s.host, s.port, why)) sentinel_failed(why);
    return;
  }
  auto* o = new (std::nothrow) op{op::sentinel_addr};
  if (!o) return;
  o->bus = this;
  o->in = _instances.front().get();
  const char* argv[] = {"SENTINEL", "get-master-addr-by-name", _o.master_name.c_str()};
  std::size_t lens[] = {8, 23, _o.master_name.size()};
  _sentinel_asking = true;
  if (!_probe->command(3, argv, lens, sentinel_cb, o)) {
    delete o;
    sentinel_failed("cannot send to it");
  }
}

/// A Sentinel answered {ip, port}, or nil (it does not know the name).
void redis_bus::sentinel_answered(const resp::reply* r) noexcept {
  if (r == nullptr) return;  // the link went: on_link_down (or whoever dropped it) passes the turn
  _sentinel_asking = false;
  instance& in = *_instances.front();
  const bool addr = r->type == resp::reply_type::array && r->elements == 2 &&
                    r->element[0]->type == resp::reply_type::string && r->element[1]->type == resp::reply_type::string;
  unsigned port = 0;
  if (addr) {
    const std::string_view p = str(r->element[1]);
    std::from_chars(p.data(), p.data() + p.size(), port);
  }
  if (!addr || port == 0 || port > 65535 || r->element[0]->len == 0) {
    const std::string what = r->type == resp::reply_type::error ? std::string(str(r))
                             : r->type == resp::reply_type::nil ? "it monitors no master named " + _o.master_name
                                                                : std::string("an answer that is not {ip, port}");
    return sentinel_failed(what);
  }
  try {
    std::string host(str(r->element[0]));
    if (in.host != host || in.port != port)
      log(log_level::info, "bus: Sentinel %s names %s:%u as master %s", sentinel_name(_o.sentinels[_sentinel_at]).c_str(),
          host.c_str(), port, _o.master_name.c_str());
    in.host = std::move(host);
  } catch (...) {
    return;
  }
  in.port = std::uint16_t(port);
  in.located = true;
  connect_links(in);
}

/// The Sentinel asked could not say: the next one is asked on the next try (the master's
/// backoff: went_down schedules it).
void redis_bus::sentinel_failed(const std::string& why) noexcept {
  _sentinel_asking = false;
  const std::string who = sentinel_name(_o.sentinels[_sentinel_at]);
  _sentinel_at = (_sentinel_at + 1) % _o.sentinels.size();
  if (!_probe->idle()) _probe->abort();
  went_down(*_instances.front(), "Sentinel " + who + ": " + why);
}

/// The link to a Sentinel asked for the master went away.
void redis_bus::sentinel_link_down(redis_link& l, const std::string& why) noexcept {
  if (&l == _watch.get()) return watch_failed(why);
  if (_sentinel_asking) sentinel_failed(why);
}

/// The watch's Sentinel went away or fell silent: the next one is watched, a second later.
void redis_bus::watch_failed(const std::string& why) noexcept {
  if (!_running) return;
  log_ratelimited(log_level::warn, "bus: Sentinel %s, watched for +switch-master: %s; watching the next",
                  sentinel_name(_o.sentinels[_watch_at]).c_str(), why.c_str());
  _watch_at = (_watch_at + 1) % _o.sentinels.size();
  _watch_retry = _tick + 20;
}

/// On each tick: a question no Sentinel answered within --redis-timeout passes the turn; the
/// watch stays connected to a Sentinel (pinged when quiet, dropped when it stops answering).
void redis_bus::watch_sentinels() noexcept {
  if (!_running) return;
  const auto timeout_ticks = std::uint32_t(_o.redis_timeout * 20) + 1;  // ticks of 50 ms
  if (_sentinel_asking && _tick - _sentinel_asked_tick > timeout_ticks) sentinel_failed("no answer within --redis-timeout");
  const std::uint64_t now = monotonic_ns();
  if (_watch->connected()) {
    if (_watch->waiting_ns(now) > std::uint64_t(_o.redis_timeout * 1e9)) {
      _watch->abort();
      return watch_failed("no answer within --redis-timeout");
    }
    _watch->keepalive(now, 1'000'000'000);
    return;
  }
  if (!_watch->idle()) {
    if (_tick - _watch_connect_tick > timeout_ticks) {
      _watch->abort();
      watch_failed("could not connect within --redis-timeout");
    }
    return;
  }
  if (std::int32_t(_tick - _watch_retry) < 0) return;
  const redis_target& s = _o.sentinels[_watch_at];
  std::string why;
  _watch_connect_tick = _tick;
  if (!_watch->connect(s.host, s.port, why)) watch_failed(why);
}

void redis_bus::watch_up() noexcept {
  const char* argv[] = {"SUBSCRIBE", "+switch-master"};
  std::size_t lens[] = {9, 14};
  _watch->command(2, argv, lens, nullptr, nullptr);
}

/// "+switch-master <name> <old ip> <old port> <new ip> <new port>": this bus's master moved.
void redis_bus::sentinel_message(const resp::reply& r) noexcept {
  if (str(r.element[0]) != "message" || r.elements != 3) return;
  const std::string_view m = str(r.element[2]);
  std::string_view parts[5];
  std::size_t n = 0, from = 0;
  while (n < 5 && from <= m.size()) {
    const auto sp = m.find(' ', from);
    parts[n++] = m.substr(from, sp == std::string_view::npos ? std::string_view::npos : sp - from);
    if (sp == std::string_view::npos) break;
    from = sp + 1;
  }
  if (n != 5 || parts[0] != _o.master_name) return;
  instance& in = *_instances.front();
  unsigned port = 0;
  std::from_chars(parts[4].data(), parts[4].data() + parts[4].size(), port);
  if (in.located && parts[3] == in.host && port == in.port) return;  // there already
  log(log_level::warn, "bus: Sentinel says master %s moved from %.*s:%.*s to %.*s:%.*s", _o.master_name.c_str(),
      int(parts[1].size()), parts[1].data(), int(parts[2].size()), parts[2].data(), int(parts[3].size()), parts[3].data(),
      int(parts[4].size()), parts[4].data());
  if (in.sub.idle() && in.cmd.idle()) {
    in.retry_at = _tick;  // down already: asked again at once
    return;
  }
  in.cmd.abort();
  in.sub.abort();
  went_down(in, "Sentinel switched the master");
  in.retry_at = _tick;  // not the backoff: the new master is there
  in.backoff_ticks = 0;
}

}  // namespace wspush::server::bus
