#include "server/pubsub/session.hpp"

#include <algorithm>
#include <cstring>

#include "proto/ws_frame.hpp"
#include "server/base/clock.hpp"
#include "server/base/heap.hpp"
#include "server/base/log.hpp"

namespace wspush::server::pubsub {
namespace {

/// Client messages refused in a row before the connection is closed with 1008: a client that
/// keeps sending what we refuse is broken or abusive, and each refusal costs us a reply.
constexpr std::uint8_t max_errors_in_a_row = 7;
constexpr std::uint32_t expire_every_ticks = 20;  // the history's TTL sweep: once a second
/// Pubs of one connection waiting for Redis: at this many its next messages wait (the kernel
/// keeps the rest, and TCP slows the client), so a client's flood holds at most this many
/// messages of the node's memory, plus the node-wide bound of the bus.
constexpr std::uint16_t max_pubs_in_flight = 16;
/// Messages refused past the rate before the connection is closed with 1008, unless it keeps to
/// its rate again in between: a client that slows down when told is served, one that does not
/// is not.
constexpr std::uint64_t max_refused_past_rate = 16;
/// Bytes of user names a `presence` answer lists at most: it stays one modest message.
constexpr std::size_t max_presence_bytes = 64 * 1024;

/// Writes `topics` into `out` (room for max_topics_per_message) each once, in the order first
/// named, and returns how many: a topic named twice in one sub is one subscription on either
/// bus (counted once against the limit, replayed once, named once in `subbed`). A sub names at
/// most max_topics_per_message topics, so scanning the ones kept is cheap and allocates nothing.
std::size_t unique_topics(std::span<const std::string_view> topics, std::string_view* out) noexcept {
  std::size_t n = 0;
  for (std::string_view t : topics)
    if (std::find(out, out + n, t) == out + n) out[n++] = t;
  return n;
}

std::size_t names_bound(std::span<const std::string_view> names) noexcept {
  std::size_t n = 0;
  for (std::string_view t : names) n += t.size() + 3;  // topics need no escaping: "t",
  return n;
}

/// Room encode_subbed needs: the topics, those lost, and `at`'s "topic":"position", pairs.
std::size_t subbed_bound(std::span<const std::string_view> topics, std::span<const std::string_view> lost,
                         std::span<const std::string_view> at) noexcept {
  return 64 + 2 * names_bound(topics) + names_bound(lost) + names_bound(at);
}

}  // namespace

session::session(const session_options& o, const proto::jwt_verifier* tokens, hub& h, fanout& f,
                 std::uint32_t max_message_bytes, bool expire_history, user_table* users)
    : _o(o),
      _tokens(tokens),
      _users(users),
      _expire_history(expire_history),
      _hub(h),
      _fanout(f),
      _parser(max_message_bytes),
      _env(std::make_unique<proto::envelope>()) {
  _replay.reserve(64);
  _names.reserve(std::size_t(o.max_topics_per_connection) * proto::max_topic_bytes);
  _gone.reserve(o.max_topics_per_connection);
  set_client_message_rate(o.client_message_rate, o.client_message_burst);
}

void session::set_client_message_rate(double per_second, std::uint32_t burst) noexcept {
  const std::uint64_t interval = per_second > 0 ? std::max<std::uint64_t>(1, std::uint64_t(1e6 / per_second)) : 0;
  _rate_tolerance_us.store(interval * (std::max<std::uint32_t>(burst, 1) - 1), std::memory_order_relaxed);
  _rate_interval_us.store(interval, std::memory_order_relaxed);
}

/// Whether `_rate` holds slot `c` (grown if need be: with the slots, not per connection).
bool session::rate_slot(conn_id c) noexcept {
  if (c < _rate.size()) return true;
  try {
    _rate.resize(std::max<std::size_t>(c + 1, _rate.size() * 2));
  } catch (const std::bad_alloc&) {
    return false;
  }
  return true;
}

session::~session() = default;

void session::bind(conn_ops& ops) noexcept {
  _ops = &ops;
  _fanout.bind(ops);
  _fanout.set_reply_handler(*this);  // a revoke comes that way with either bus
}

void session::use_bus(bus_port& bus, std::uint32_t shard, std::uint64_t max_pending_bytes) noexcept {
  _bus = &bus;
  _shard = shard;
  _pending_bound = max_pending_bytes;
  _fanout.set_reply_handler(*this);
}

bool session::on_open(conn_id c, const open_info& info) noexcept {
  // A revoke made while the token was being checked (on the task pool) reached this shard
  // before the connection did: its pass found no such connection, so the list is asked again.
  if (_revoked && _users && info.user != user_table::nobody && _revoked->any()) {
    bool revoked = false;
    _users->with_names([&](auto name_of) {
      revoked = _revoked->revoked(name_of(info.user), info.iat, std::int64_t(realtime_ms() / 1000));
    });
    if (revoked) {
      info.revoked = true;
      return false;
    }
  }
  if (c < _rate.size() || _rate_interval_us.load(std::memory_order_relaxed)) {
    if (!rate_slot(c)) return false;
    _rate[c] = 0;  // a full burst
  }
  return !_tokens || _sessions.set(c, info.exp, info.topics, info.pub, info.user);
}

/// Whether `c`'s message keeps to --client-message-rate. One past it is answered `rate_limited`
/// and not handled; max_refused_past_rate of them without the connection keeping to its rate
/// in between, and it is closed with 1008.
bool session::within_rate(conn_id c) noexcept {
  const std::uint64_t interval = _rate_interval_us.load(std::memory_order_relaxed);
  if (!interval || !rate_slot(c)) return true;  // a slot opened while there was no rate: a full burst
  constexpr std::uint64_t time_mask = (std::uint64_t(1) << 48) - 1;
  const std::uint64_t now = (monotonic_ns() / 1000) & time_mask;
  std::uint64_t tat = _rate[c] & time_mask, refused = _rate[c] >> 48;
  if (tat > now && tat - now > _rate_tolerance_us.load(std::memory_order_relaxed)) {
    ++refused;
    _rate[c] = (std::min<std::uint64_t>(refused, 0xFFFF) << 48) | tat;
    _fanout.counters().client_rate_limited.add();
    if (refused >= max_refused_past_rate) {
      log_ratelimited(log_level::info, "closing a connection that kept sending past --client-message-rate");
      _ops->close(c, proto::close_code::policy_violation);
      return false;
    }
    const bool pub = _env->op == proto::client_op::pub;
    client_error(c, proto::client_error::rate_limited, pub ? _env->topic : std::string_view{}, pub ? "pub" : "");
    return false;
  }
  if (tat <= now) refused = 0;  // it kept to its rate: nothing borrowed from its burst
  _rate[c] = (refused << 48) | ((std::max(tat, now) + interval) & time_mask);
  return true;
}

void session::on_close(conn_id c) noexcept {
  if (_presence) _fanout.registry().topics_of(c, [&](std::string_view t) { present(c, t, false); });
  if (_bus) {
    unsubscribe_all(c);
    if (auto o = _waiting_of.find(c); o != _waiting_of.end()) {
      if (auto w = _waiting_subs.find(o->second); w != _waiting_subs.end() && !w->second.closed) {
        w->second.closed = true;  // its answer finds no one (a reused slot is another connection)
        w->second.page.clear();   // nor the rest of its replay
        _bus->withdraw(_shard, o->second);  // and what the bus keeps for it goes now
      }
      _waiting_of.erase(o);
    }
    _pubs.erase(c);  // answers to its pubs find no one
    _presence_asks.erase(c);  // nor its presence op
  } else if (_fanout.registry().unsubscribe_all(c)) {
    _fanout.count_subscriptions();  // a reused slot starts with no topics
  }
  if (_users) _users->leave(_sessions.get(c).user);
  _sessions.clear(c);
}

void session::on_expired(conn_id c) noexcept {
  _fanout.counters().token_expired_closes.add();
  _ops->close(c, proto::close_code::policy_violation);
}

void session::on_tick(std::uint32_t tick) noexcept {
  if (_paced > 0)  // paced replays whose readers have taken what they had since
    for (auto& [request, w] : _waiting_subs)
      if (w.paced && !w.closed && (w.page_sent < w.page.size() || !w.asked)) pace(request, w);
  if (tick % expire_every_ticks != 0) return;
  if (_expire_history && !_bus) {
    // What expired went back to the pool, whose blocks idle for a whole second go to the heap,
    // most of it allocated by whichever thread published (see server/base/heap.hpp).
    std::size_t freed = _hub.events().expire(monotonic_ns());
    heap_released(freed + _ops->buffers().trim());
  }
  heap_collect();  // a shard that published (clients' `pub`) owns what the history frees
}

/// Frames a JSON text written by `encode(std::span<char>) -> bytes` (at most `bound`) and
/// queues it for `c`.
template <class Encode>
bool session::reply(conn_id c, std::size_t bound, Encode&& encode) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  pool::lease l = _ops->buffers().acquire(room + bound);
  if (!l) return false;
  std::size_t n = encode(std::span<char>(reinterpret_cast<char*>(l.data()) + room, bound));
  if (n == 0) return false;
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  return _ops->send(c, pool::frame_ref::adopt(std::move(l)));
}

void session::on_message(conn_id c, message& m) noexcept {
  if (m.op != proto::opcode::text) return _ops->close(c, proto::close_code::unsupported_data);  // the protocol is JSON text
  std::string_view text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  auto r = _parser.parse(text, m.readable, *_env);
  // Read first, so that a refusal names what it refuses as every other does (a pub's has `of`);
  // the heartbeat's pong answers the server and is neither counted nor refused.
  if (r.ok() && _env->op != proto::client_op::pong && !within_rate(c)) return;
  if (!r.ok()) return client_error(c, r.error, {});
  switch (_env->op) {
    case proto::client_op::sub: return client_sub(c);
    case proto::client_op::unsub: return client_unsub(c);
    case proto::client_op::pub: return client_pub(c);
    case proto::client_op::auth: return client_auth(c);
    case proto::client_op::presence:
    case proto::client_op::presence_count: return client_presence(c);
    case proto::client_op::pong: return;  // the heartbeat's answer: that it came is all (ws_phase)
  }
}

void session::client_error(conn_id c, proto::client_error e, std::string_view topic, std::string_view of) noexcept {
  _fanout.counters().client_errors.add();
  // `unavailable` and `timeout` are the node's state (its bus is away), not the client's fault,
  // and a client sends such a sub or pub again until Redis is back: they must not close the
  // connection.
  const bool node_state = e == proto::client_error::unavailable || e == proto::client_error::timeout ||
                          e == proto::client_error::rate_limited;  // within_rate counts those itself
  auto errors = std::uint8_t(_ops->app_bits(c) + (node_state ? 0 : 1));
  reply(c, 64 + of.size() + 6 * topic.size(), [&](std::span<char> out) { return proto::encode_error(e, topic, out, of); });
  if (errors > max_errors_in_a_row) {
    log_ratelimited(log_level::info, "closing a connection after %u refused messages in a row", unsigned(errors));
    return _ops->close(c, proto::close_code::policy_violation);
  }
  if (_ops->is_open(c)) _ops->set_app_bits(c, errors);
}

proto::grants_view session::grants_of(conn_id c, bool pub) const noexcept {
  if (!_tokens) return pub && !_o.allow_client_publish ? proto::grants_view{} : proto::grants_all;
  const session_grants& s = _sessions.get(c);
  return pub ? s.pub() : s.topics();
}

void session::client_sub(conn_id c) noexcept {
  if (_bus) return bus_sub(c);
  std::string_view unique[proto::max_topics_per_message];
  std::span<const std::string_view> topics(unique, unique_topics(_env->topics(), unique));
  proto::grants_view granted = grants_of(c, false);
  for (std::string_view t : topics)  // all or nothing: a refused sub changes nothing
    if (!proto::grants_match(granted, t)) return client_error(c, proto::client_error::forbidden, t);
  topic_registry& reg = _fanout.registry();
  static_assert(proto::max_topics_per_message <= 32, "one bit of `added` per topic of a sub");
  std::uint32_t added = 0;  // bit k: topics[k] is new to this connection
  for (std::size_t k = 0; k < topics.size(); ++k) {
    auto r = reg.subscribe(c, topics[k]);
    if (r == sub_result::added) {
      added |= 1u << k;
    } else if (r != sub_result::already) {
      for (std::size_t j = 0; j < k; ++j)
        if (added & (1u << j)) reg.unsubscribe(c, topics[j]);
      _fanout.count_subscriptions();
      return client_error(c,
                          r == sub_result::too_many_topics ? proto::client_error::too_many_subscriptions
                                                           : proto::client_error::unavailable,
                          topics[k]);
    }
  }
  _fanout.count_subscriptions();
  if (_presence)
    for (std::size_t k = 0; k < topics.size(); ++k)
      if (added & (1u << k)) present(c, topics[k], true);
  std::string_view lost[proto::max_topics_per_message];
  std::uint32_t lost_count = replay_since(topics, added, lost);
  std::span<const std::string_view> lost_span(lost, lost_count);
  // Each topic new to the connection is at the replay's seam: the last seq of its part this
  // shard fanned out (history.hpp). The replay (if any) reaches it, live events come after it:
  // a resume from there misses nothing this connection was not handed.
  history_id positions[proto::max_topics_per_message];
  std::string_view at[proto::max_topics_per_message];
  history& h = _hub.events();
  for (std::size_t k = 0; k < topics.size(); ++k) {
    if (!(added & (1u << k))) continue;
    positions[k] = h.format_id(_fanout.fanned(h.part_of(topics[k])));
    at[k] = positions[k].view();
  }
  std::span<const std::string_view> at_span(at, topics.size());
  bool ok = reply(c, subbed_bound(topics, lost_span, at_span),
                  [&](std::span<char> out) { return proto::encode_subbed(topics, lost_span, out, at_span); });
  for (pool::frame_ref& f : _replay) {
    ok = ok && _ops->send(c, std::move(f));
    if (ok) _fanout.counters().deliveries.add();
  }
  _replay.clear();
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

/// Collects into _replay what the connection missed on the topics it just subscribed to with
/// a `since`, and writes the topics whose history does not reach back that far into `lost`.
/// The replay stops at what this shard has already fanned out; anything later is still in
/// its inbox and reaches the connection live (history.hpp, "the seam").
std::uint32_t session::replay_since(std::span<const std::string_view> topics, std::uint32_t added,
                                    std::string_view* lost) noexcept {
  std::uint32_t n = 0;
  history& h = _hub.events();
  for (const proto::since_entry& s : _env->since()) {
    auto k = std::size_t(std::find(topics.begin(), topics.end(), s.topic) - topics.begin());
    if (k >= topics.size() || !(added & (1u << k))) continue;  // already subscribed: it has them live
    auto r = h.replay(s.topic, s.id, _fanout.fanned(h.part_of(s.topic)), monotonic_ns(),
                      [this](std::uint64_t, const pool::frame_ref& f) noexcept { _replay.push_back(f); });
    if (r.lost) lost[n++] = s.topic;
  }
  return n;
}

void session::client_unsub(conn_id c) noexcept {
  auto topics = _env->topics();
  for (std::string_view t : topics) {
    if (!_fanout.registry().unsubscribe(c, t)) continue;
    if (_presence) present(c, t, false);
    if (_bus) release_if_unheld(t);
  }
  _fanout.count_subscriptions();
  reply(c, 64 + names_bound(topics), [&](std::span<char> out) { return proto::encode_unsubbed(topics, out); });
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

void session::client_pub(conn_id c) noexcept {
  const proto::envelope& env = *_env;
  pubsub_counters& n = _fanout.counters();
  // The topic's namespace first: `client-publish = false` refuses whatever the token grants.
  // Without tokens a namespace's value decides (the global one is --allow-client-publish).
  const namespaces& spaces = _hub.spaces();
  const topic_options& kind = spaces.of(env.topic);
  const bool may = !kind.client_publish ? false
                   : _tokens || &kind == &spaces.defaults() ? proto::grants_match(grants_of(c, true), env.topic)
                                                            : true;
  if (!may) {
    n.client_pubs_forbidden.add();
    return client_error(c, proto::client_error::forbidden, env.topic, "pub");
  }
  if (_bus) return bus_pub(c);
  history_id id;
  // A shard never waits on a crowded sibling: the hub refuses instead (two shards waiting on
  // each other's full inbox would wait forever).
  if (_hub.publish(env.topic, env.data, id, true, env.idempotency_key) != publish_status::ok) {
    n.client_pubs_unavailable.add();
    return client_error(c, proto::client_error::unavailable, env.topic, "pub");
  }
  n.client_pubs_ok.add();
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

/// In-band token refresh: the new token's grants and expiry replace the old ones, and the
/// subscriptions they no longer allow are removed and named. A token that does not verify is
/// refused and changes nothing: the connection keeps its old token until that one expires.
void session::client_auth(conn_id c) noexcept {
  if (!_tokens) return client_error(c, proto::client_error::bad_request, {});  // --auth=none: no token to refresh
  char storage[proto::jwt_claims_storage_bytes];
  proto::jwt_claims claims;
  const std::int64_t now = realtime_ms() / 1000;
  if (!_tokens->verify(_env->token, now, storage, claims).ok() || (_revoked && _revoked->revoked(claims.sub, claims.iat, now)))
    return client_error(c, proto::client_error::unauthorized, {});
  // A connection keeps the user it opened with: another `sub`'s token would let it slip past
  // what is counted and decided per user.
  const std::uint32_t user = _sessions.get(c).user;
  if (_users && !_users->is(user, claims.sub)) return client_error(c, proto::client_error::forbidden, {});
  if (!_sessions.set(c, claims.exp, claims.topics.bytes(), claims.pub.bytes(), user))
    return client_error(c, proto::client_error::unavailable, {});
  // What the new grants no longer allow: copied out before unsubscribing (a topic the registry
  // drops takes its name with it).
  _names.clear();
  _gone.clear();
  topic_registry& reg = _fanout.registry();
  reg.topics_of(c, [&](std::string_view t) {  // at most max_topics_per_connection: the reserves hold them
    if (proto::grants_match(claims.topics, t)) return;
    _gone.emplace_back(_names.data() + _names.size(), t.size());
    _names.append(t);
  });
  for (std::string_view t : _gone) {
    reg.unsubscribe(c, t);
    if (_presence) present(c, t, false);
    if (_bus) release_if_unheld(t);
  }
  if (!_gone.empty()) _fanout.count_subscriptions();
  std::span<const std::string_view> names(_gone);
  reply(c, 64 + names_bound(names), [&](std::span<char> out) { return proto::encode_authed(claims.exp, names, out); });
  _ops->expiry_changed(c);
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

// ---- presence ---------------------------------------------------------------------------------

void session::present(conn_id c, std::string_view topic, bool joined) noexcept {
  const topic_options& o = _hub.spaces().of(topic);
  if (!o.presence && !o.join_leave) return;
  // What the change means is said from under the table's lock (presence_table::on_change): two
  // shards changing one user's count on a topic say so in the order the counts changed.
  struct said {
    session* s;
    std::string_view topic;
    std::uint32_t user;
    const topic_options* o;
    bool joined;
  } ctx{this, topic, _sessions.get(c).user, &o, joined};
  const auto tell = [](void* p, presence_table::change ch, std::uint32_t now) noexcept {
    const said& x = *static_cast<const said*>(p);
    session& s = *x.s;
    if (s._bus) {
      // Redis keeps what every node has, per user (a connection without one is this node's
      // alone), and announces a user's first and last connection anywhere.
      if (x.user != 0 && s._users)
        s._users->with_names([&](auto name_of) { s._bus->presence_set(x.topic, name_of(x.user), now, x.o->join_leave); });
      return;
    }
    if (x.o->join_leave && ch == (x.joined ? presence_table::change::first : presence_table::change::last))
      s.announce(x.joined, x.topic, x.user);
  };
  const presence_table::change ch =
      joined ? _presence->add(topic, ctx.user, nullptr, tell, &ctx) : _presence->remove(topic, ctx.user, nullptr, tell, &ctx);
  if (ch == presence_table::change::failed) _fanout.counters().presence_failures.add();
}

/// Tells the topic's subscribers, on every shard, that `user` joined or left it: the event goes
/// the way of a publish (hub::relay), outside the history (a resume does not replay it).
void session::announce(bool join, std::string_view topic, std::uint32_t user) noexcept {
  if (!_users) return;
  pool::frame_ref frame;
  std::size_t at = 0;
  _users->with_names([&](auto name_of) { frame = join_leave_frame(_ops->buffers(), join, topic, name_of(user), at); });
  pubsub_counters& n = _fanout.counters();
  if (!frame) return n.presence_failures.add();
  const std::string_view topic_in_frame = text_of(frame).substr(at, topic.size());
  if (_hub.relay(std::move(frame), topic_in_frame) == publish_status::ok) (join ? n.joins : n.leaves).add();
  else n.presence_failures.add();  // a crowded node: the subscribers miss this one
}

/// `{"op":"presence","topic":...}`: the users subscribed to a topic the connection may
/// subscribe to, and how many connections each has there (presence_count: the counts only).
void session::client_presence(conn_id c) noexcept {
  const std::string_view topic = _env->topic;
  const bool list = _env->op == proto::client_op::presence;
  const std::string_view op = list ? "presence" : "presence_count";
  if (!proto::grants_match(grants_of(c, false), topic)) return client_error(c, proto::client_error::forbidden, topic, op);
  if (!_presence || !_hub.spaces().of(topic).presence) return client_error(c, proto::client_error::not_enabled, topic, op);
  if (_bus) {
    // Across the nodes: the bus asks Redis, and the connection reads nothing more until the
    // answer (so it has at most one ask in flight).
    const std::uint64_t request = _next_request++;
    try {
      _presence_asks[c] = request;
    } catch (const std::bad_alloc&) {
      return client_error(c, proto::client_error::unavailable, topic, op);
    }
    if (!_bus->presence_get(_shard, c, request, topic, !list)) {
      _presence_asks.erase(c);
      return client_error(c, proto::client_error::unavailable, topic, op);
    }
    return _ops->hold(c);
  }
  try {
    _presence->read(topic, list ? max_presence_users : 0, _reading);
    _listed.reserve(_reading.users.size());
  } catch (const std::bad_alloc&) {
    return client_error(c, proto::client_error::unavailable, topic, op);
  }
  // The names are copied out under the user table's lock and the answer sent after it: a send
  // may close the connection at once, and a close takes that lock.
  _listed.clear();
  if (_users) {
    const bool copied = _users->with_names([&](auto name_of) {
      std::size_t bytes = 0;
      for (const auto& [user, n] : _reading.users) bytes += name_of(user).size();
      _presence_names.clear();
      try {
        _presence_names.reserve(bytes);  // the views below stay put
      } catch (const std::bad_alloc&) {
        return false;
      }
      for (const auto& [user, n] : _reading.users) {
        const std::string_view name = name_of(user);
        if (name.empty()) continue;
        _listed.push_back({std::string_view(_presence_names.data() + _presence_names.size(), name.size()), n});  // reserved
        _presence_names.append(name);
      }
      return true;
    });
    if (!copied) return client_error(c, proto::client_error::unavailable, topic, op);
  }
  send_presence(c, list, topic, _reading.user_count, _reading.connections);
}

/// The answer to a presence op: the users in _listed (as many as fit max_presence_bytes), and
/// the counts.
void session::send_presence(conn_id c, bool list, std::string_view topic, std::uint64_t user_count,
                            std::uint64_t connections) noexcept {
  std::size_t bytes = 0, n = 0;
  for (; n < _listed.size(); ++n) {
    bytes += 6 * _listed[n].user.size() + 16;
    if (bytes > max_presence_bytes) break;
  }
  const std::span<const proto::presence_user> users(_listed.data(), n);
  const bool truncated = n < user_count;
  reply(c, proto::presence_size_bound(topic, users), [&](std::span<char> out) {
    return proto::encode_presence(list ? "presence" : "presence_count", topic, list ? &users : nullptr, user_count,
                                  connections, truncated, out);
  });
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

/// The bus's answer to a presence op (Redis: across the nodes).
void session::presence_answered(bus_reply& r) noexcept {
  auto it = _presence_asks.find(r.conn);
  if (it == _presence_asks.end() || it->second != r.request) return;  // its connection closed
  _presence_asks.erase(it);
  const conn_id c = r.conn;
  if (!_ops->is_open(c)) return;
  const std::string_view topic = r.topics.empty() ? std::string_view{} : std::string_view(r.topics.front());
  if (!r.present.ok) {
    client_error(c, proto::client_error::unavailable, topic, r.count_only ? "presence_count" : "presence");
  } else {
    try {
      _listed.clear();
      _listed.reserve(r.present.users.size());
    } catch (const std::bad_alloc&) {
      client_error(c, proto::client_error::unavailable, topic, r.count_only ? "presence_count" : "presence");
      if (_ops->is_open(c)) _ops->resume(c);
      return;
    }
    for (const auto& [user, n] : r.present.users) _listed.push_back({user, n});
    send_presence(c, !r.count_only, topic, r.present.user_count, r.present.connections);
  }
  if (_ops->is_open(c)) _ops->resume(c);
}

// ---- with a bus outside the process (Redis) ---------------------------------------------------

bool session::holds(std::string_view topic) const noexcept {
  if (_fanout.registry().subscriber_count(topic) > 0) return true;
  auto it = _waiting_topics.find(std::string(topic));
  return it != _waiting_topics.end() && it->second > 0;
}

void session::release_if_unheld(std::string_view topic) noexcept {
  if (!holds(topic)) _bus->release(_shard, topic);
}

void session::unsubscribe_all(conn_id c) noexcept {
  topic_registry& reg = _fanout.registry();
  _names.clear();
  _gone.clear();
  reg.topics_of(c, [&](std::string_view t) {
    _gone.emplace_back(_names.data() + _names.size(), t.size());
    _names.append(t);
  });
  if (_gone.empty()) return;
  reg.unsubscribe_all(c);
  _fanout.count_subscriptions();
  for (std::string_view t : _gone) release_if_unheld(t);
}

/// A `sub` through the bus: its answer comes later (on_bus_reply); until then the connection's
/// next messages wait (conn_ops::hold), so they are still handled in order.
void session::bus_sub(conn_id c) noexcept {
  std::string_view unique[proto::max_topics_per_message];
  std::span<const std::string_view> topics(unique, unique_topics(_env->topics(), unique));
  proto::grants_view granted = grants_of(c, false);
  for (std::string_view t : topics)
    if (!proto::grants_match(granted, t)) return client_error(c, proto::client_error::forbidden, t);
  topic_registry& reg = _fanout.registry();
  // Which topics are new to the connection, and whether they fit, before anything is counted
  // or allocated: a refused sub leaves nothing behind.
  static_assert(proto::max_topics_per_message <= 32, "one bit of `added` per topic of a sub");
  std::uint32_t added = 0;  // bit k: topics[k] is new to this connection
  std::uint32_t adding = 0;
  for (std::size_t k = 0; k < topics.size(); ++k) {
    bool mine = false;
    reg.topics_of(c, [&](std::string_view x) { mine |= x == topics[k]; });
    if (!mine) {
      added |= 1u << k;
      ++adding;
    }
  }
  if (reg.topic_count_of(c) + adding > _o.max_topics_per_connection)
    return client_error(c, proto::client_error::too_many_subscriptions, topics.front());
  // A `since` the bus cannot read is the client's error, before the bus is asked anything.
  for (const proto::since_entry& e : _env->since())
    if (!_bus->readable_since(e.id)) return client_error(c, proto::client_error::bad_request, e.topic);
  std::unique_ptr<pubsub::bus_sub> s;
  waiting_sub w;
  try {
    s = std::make_unique<pubsub::bus_sub>();
    s->topics.reserve(topics.size());
    w.counted.reserve(adding);
    for (std::size_t k = 0; k < topics.size(); ++k) {
      std::string_view t = topics[k];
      const bool mine = !(added & (1u << k));
      std::string since;
      for (const proto::since_entry& e : _env->since())
        if (e.topic == t && !mine) since.assign(e.id);  // already subscribed: it has them live
      s->topics.emplace_back(t);
      s->since.push_back(std::move(since));
      s->new_hold.push_back(!mine && !holds(t));
      s->joins.push_back(!mine);
      if (!mine) {  // counted exactly when wait_for took it: a throw leaves neither behind
        std::string name(t);
        wait_for(name);
        w.counted.push_back(std::move(name));  // reserved: does not throw
      }
    }
  } catch (const std::bad_alloc&) {
    for (const std::string& t : w.counted) stop_waiting_for(t);
    return client_error(c, proto::client_error::unavailable, topics.front());
  }
  const std::uint64_t request = _next_request++;
  s->shard = _shard;
  s->conn = c;
  s->request = request;
  s->room = room(c);
  w.conn = c;
  auto refuse = [&](std::vector<std::string>& counted) {
    for (const std::string& t : counted) stop_waiting_for(t);
    client_error(c, proto::client_error::unavailable, topics.front());
  };
  decltype(_waiting_subs)::iterator at;
  try {
    // Room first: then only the node's allocation can throw, before `w` is moved.
    _waiting_subs.reserve(_waiting_subs.size() + 1);
    _waiting_of[c] = request;
    at = _waiting_subs.emplace(request, std::move(w)).first;
  } catch (const std::bad_alloc&) {
    _waiting_of.erase(c);
    return refuse(w.counted);
  }
  if (!_bus->subscribe(std::move(s))) {  // the bus is down: nothing was taken, no hold either
    refuse(at->second.counted);
    _waiting_subs.erase(at);
    _waiting_of.erase(c);
    return;
  }
  _ops->hold(c);
}

/// _waiting_topics counts, per topic, the subs waiting for Redis that want it; a topic leaves
/// the map when its count reaches 0 (kept at 0, every name ever asked for would stay).
void session::wait_for(const std::string& topic) {
  ++_waiting_topics[topic];
  _fanout.counters().waiting_topics.set(_waiting_topics.size());
}

void session::stop_waiting_for(const std::string& topic) noexcept {
  auto it = _waiting_topics.find(topic);
  if (it != _waiting_topics.end() && --it->second == 0) _waiting_topics.erase(it);
  _fanout.counters().waiting_topics.set(_waiting_topics.size());
}

void session::bus_pub(conn_id c) noexcept {
  pubsub_counters& n = _fanout.counters();
  pub_flow* f;
  try {
    auto [it, added] = _pubs.try_emplace(c);
    if (added) it->second.number = _next_flow++;
    f = &it->second;
  } catch (const std::bad_alloc&) {
    n.client_pubs_unavailable.add();
    return client_error(c, proto::client_error::unavailable, _env->topic, "pub");
  }
  const std::uint64_t tag = std::uint64_t(f->number) << 32 | c;
  if (!_bus->publish(_shard, tag, _env->topic, _env->data, _env->idempotency_key)) {
    if (f->in_flight == 0) _pubs.erase(c);
    n.client_pubs_unavailable.add();
    return client_error(c, proto::client_error::unavailable, _env->topic, "pub");
  }
  n.client_pubs_ok.add();
  if (++f->in_flight >= max_pubs_in_flight && !f->held) {
    f->held = true;
    _ops->hold(c);  // until Redis answers one (pub_answered)
  }
  if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
}

/// Redis took a client's pub (failed: none), or it failed: the client hears `unavailable` (it
/// was not published) or `timeout` (sent, unanswered: it may have been). A connection held for
/// its pubs reads again.
void session::pub_answered(std::uint64_t tag, proto::client_error failed, std::string_view topic) noexcept {
  const auto c = conn_id(tag);
  auto it = _pubs.find(c);
  if (it == _pubs.end() || it->second.number != std::uint32_t(tag >> 32)) return;  // it closed
  if (it->second.in_flight > 0) --it->second.in_flight;
  if (failed != proto::client_error::none) {
    pubsub_counters& n = _fanout.counters();
    (failed == proto::client_error::timeout ? n.client_pubs_timeout : n.client_pubs_unavailable).add();
    if (_ops->is_open(c)) client_error(c, failed, topic, "pub");
    it = _pubs.find(c);  // the error may have closed it (out of memory): then it is gone
    if (it == _pubs.end()) return;
  }
  pub_flow& f = it->second;
  if (f.held && f.in_flight < max_pubs_in_flight) {
    f.held = false;
    if (_ops->is_open(c)) _ops->resume(c);
  }
  if (f.in_flight == 0 && !f.held) _pubs.erase(it);
}

/// The bus answered a sub (or refused a pub). Comes through the event inbox: every event
/// before it was offered to the shard's subscribers before the connection joins them.
void session::on_bus_reply(std::unique_ptr<bus_reply> r) noexcept {
  if (r->kind == bus_reply::revoke) return r->revoked.order() ? revoke(*r->revoked.order()) : void();
  if (r->kind == bus_reply::presence) return presence_answered(*r);
  if (r->kind == bus_reply::pub_failed)
    return pub_answered(r->pub_tag, r->maybe ? proto::client_error::timeout : proto::client_error::unavailable,
                        r->pub_topic);
  if (r->kind == bus_reply::pubs_done) {
    for (std::uint64_t tag : r->done_tags) pub_answered(tag, proto::client_error::none, {});
    return;
  }
  auto it = _waiting_subs.find(r->request);
  if (it == _waiting_subs.end()) return;
  if (r->kind == bus_reply::replay_more || (r->kind == bus_reply::subbed && r->more)) {
    waiting_sub& w = it->second;
    const conn_id c = w.conn;
    if (w.closed || !_ops->is_open(c)) return;  // withdrawn: sub_failed follows
    if (r->kind == bus_reply::subbed) {
      // The first page of a long replay: the connection stays held, and joins its topics at
      // replay_done (the live events meanwhile come with it, after the replay).
      send_subbed(c, *r);
      if (!w.paced) ++_paced;
      w.paced = true;
      if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
    }
    w.page = std::move(r->frames);
    w.page_sent = 0;
    w.asked = false;
    return pace(it->first, w);
  }
  waiting_sub w = std::move(it->second);
  _waiting_subs.erase(it);
  if (auto o = _waiting_of.find(w.conn); o != _waiting_of.end() && o->second == r->request) _waiting_of.erase(o);
  if (w.paced) --_paced;
  for (const std::string& t : w.counted) stop_waiting_for(t);
  const conn_id c = r->conn;
  const bool here = !w.closed && _ops->is_open(c);
  if (here && (r->kind == bus_reply::subbed || r->kind == bus_reply::replay_done)) {
    topic_registry& reg = _fanout.registry();
    for (const std::string& t : r->topics)
      if (reg.subscribe(c, t) == sub_result::added && _presence) present(c, t, true);
    _fanout.count_subscriptions();
  }
  // Topics this shard held only for this sub (it failed, or its connection left).
  for (const std::string& t : w.counted) release_if_unheld(t);
  if (!here) return;
  if (r->kind == bus_reply::sub_failed && w.paced) {
    // Part of the replay went out after `subbed`: the client resumes from what it got.
    return _ops->close(c, proto::close_code::try_again_later);
  }
  if (r->kind == bus_reply::sub_failed) {
    client_error(c, proto::client_error::unavailable, r->topics.empty() ? std::string_view{} : r->topics.front());
  } else {
    bool ok = true;
    if (r->kind == bus_reply::subbed) ok = send_subbed(c, *r);
    for (pool::frame_ref& f : r->frames) {
      ok = ok && _ops->send(c, std::move(f));
      if (ok) _fanout.counters().deliveries.add();
    }
    if (_ops->is_open(c)) _ops->set_app_bits(c, 0);
  }
  if (_ops->is_open(c)) _ops->resume(c);
}

/// The bus's `subbed`: its topics, those lost, and their positions.
bool session::send_subbed(conn_id c, const bus_reply& r) noexcept {
  try {
    std::vector<std::string_view> topics(r.topics.begin(), r.topics.end());
    std::vector<std::string_view> lost(r.lost.begin(), r.lost.end());
    std::vector<std::string_view> at(r.at.begin(), r.at.end());
    return reply(c, subbed_bound(topics, lost, at),
                 [&](std::span<char> out) { return proto::encode_subbed(topics, lost, out, at); });
  } catch (...) {
    return false;
  }
}

/// What a connection can take of a replay page now: half its bound, less what it has unsent
/// (at least 1: a page holds at least one event).
std::uint64_t session::room(conn_id c) const noexcept {
  const std::uint64_t half = _pending_bound / 2, unsent = _ops->unsent_bytes(c);
  return unsent < half ? half - unsent : 1;
}

/// Sends a paced replay's page (sized by the room the connection had when it was asked, so
/// normally all of it; what would take the connection past its bound waits for on_tick, one
/// frame larger than the bound goes once nothing else is unsent), then, once the connection
/// has less than half its bound unsent, asks the bus for the next page. So the node holds no
/// more of a replay than of any subscriber's events (its unsent bytes within
/// --max-pending-bytes), and the client gets its whole backlog, however much larger than that
/// bound, as fast as it reads.
void session::pace(std::uint64_t request, waiting_sub& w) noexcept {
  const conn_id c = w.conn;
  while (w.page_sent < w.page.size()) {
    const std::uint64_t unsent = _ops->unsent_bytes(c), n = w.page[w.page_sent].bytes().size();
    if (unsent > 0 && unsent + n > _pending_bound) return;  // on_tick looks again
    if (!_ops->send(c, std::move(w.page[w.page_sent++]))) return;  // closing: on_close withdraws the sub
    _fanout.counters().deliveries.add();
  }
  w.page.clear();
  w.page_sent = 0;
  if (!w.asked && _ops->unsent_bytes(c) < _pending_bound / 2) {
    w.asked = true;
    _bus->more(_shard, request, room(c));
  }
}

// ---- revokes ------------------------------------------------------------------------------

/// Closes this shard's connections of a revoked user (4403 "revoked"; a stream gets a `refused`
/// event first). A user is fixed at the upgrade and kept beside each connection's grants, so
/// this is one pass over this shard's session records (32 bytes each, read in order): about
/// what a shard of 100k connections reads in well under a millisecond, once per revoke, and
/// nothing at all per message. Only when the user has a connection in this process.
void session::revoke(revoke_order& o) noexcept {
  if (!_tokens || !_users || o.user == user_table::nobody) return;
  // The number was the user's when the order was made; if every connection of the user has
  // closed since, it may be another user's now. While it is the user's, no connection of
  // this shard opens or closes during the pass (both happen on this thread).
  if (!_users->is(o.user, o.sub)) return;
  std::uint32_t n = 0;
  const std::uint32_t slots = _sessions.capacity();
  for (conn_id c = 0; c < slots; ++c) {
    if (_sessions.get(c).user != o.user || !_ops->is_open(c)) continue;
    _ops->close(c, proto::close_code::revoked);
    ++n;
  }
  if (n == 0) return;
  _fanout.counters().revoked_closes.add(n);
  o.closed.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace wspush::server::pubsub
