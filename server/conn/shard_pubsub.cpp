// The pub/sub protocol on a shard (DESIGN.md "Wire protocol"): client messages (sub, unsub,
// pub) parsed where they lie and answered in order; events from the hub fanned out to this
// shard's subscribers as one shared frame; resume from the history with an exact seam; the
// token's expiry kept on the connection's one deadline.

#include <algorithm>
#include <cstring>
#include <ctime>

#include "server/app/log.hpp"
#include "server/conn/shard.hpp"
#include "server/conn/shard_internal.hpp"
#include "server/pubsub/hub.hpp"
#include "server/reactor/clock.hpp"

namespace wspush::server {
namespace {

/// Client messages refused in a row before the connection is closed with 1008: a client that
/// keeps sending what we refuse is broken or abusive, and each refusal costs us a reply.
constexpr std::uint16_t max_errors_in_a_row = 7;

std::int64_t realtime_ms() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}


std::size_t names_bound(std::span<const std::string_view> names) noexcept {
  std::size_t n = 0;
  for (std::string_view t : names) n += t.size() + 3;  // topics need no escaping: "t",
  return n;
}

void set_errors(connection& c, std::uint16_t n) noexcept {
  c.flags = std::uint16_t((c.flags & ~flag_errors_mask) | (n << flag_errors_shift));
}

}  // namespace

/// Frames a JSON text written by `encode(std::span<char>) -> bytes` (at most `bound`) and
/// queues it for connection i.
template <class Encode>
bool shard::queue_json(std::uint32_t i, std::size_t bound, Encode&& encode) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  pool::lease l = _g.buffers->acquire(room + bound);
  if (!l) return false;
  std::size_t n = encode(std::span<char>(reinterpret_cast<char*>(l.data()) + room, bound));
  if (n == 0) return false;
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  if (!queue(i, pool::frame_ref::adopt(std::move(l)))) return false;
  _n.messages_out.add();
  return true;
}

bool shard::client_message(std::uint32_t i, proto::opcode op, std::string_view text, std::size_t readable) noexcept {
  if (op != proto::opcode::text) {  // the protocol is JSON text
    fail(i, proto::close_code::unsupported_data);
    return false;
  }
  auto r = _parser->parse(text, readable, *_env);
  if (!_g.hub) {
    client_error(i, proto::client_error::unavailable, {});
  } else if (!r.ok()) {
    client_error(i, r.error, {});
  } else {
    switch (_env->op) {
      case proto::client_op::sub: client_sub(i); break;
      case proto::client_op::unsub: client_unsub(i); break;
      case proto::client_op::pub: client_pub(i); break;
    }
  }
  return _conns.at(i).state == conn_state::open;
}

void shard::client_error(std::uint32_t i, proto::client_error e, std::string_view topic) noexcept {
  _n.client_errors.add();
  connection& c = _conns.at(i);
  auto errors = std::uint16_t(((c.flags & flag_errors_mask) >> flag_errors_shift) + 1);
  queue_json(i, 64 + 6 * topic.size(), [&](std::span<char> out) { return proto::encode_error(e, topic, out); });
  if (errors > max_errors_in_a_row) {
    log_ratelimited(log_level::info, "closing a connection after %u refused messages in a row", unsigned(errors));
    return start_close(i, proto::close_code::policy_violation, true);
  }
  if (c.state == conn_state::open) set_errors(c, errors);
}

proto::grants_view shard::grants_of(std::uint32_t i, bool pub) const noexcept {
  if (!_g.tokens) return pub && !_cfg.allow_client_publish ? proto::grants_view{} : proto::grants_all;
  const session& s = _sessions.get(i);
  return pub ? s.pub() : s.topics();
}

void shard::client_sub(std::uint32_t i) noexcept {
  const proto::envelope& env = *_env;
  auto topics = env.topics();
  proto::grants_view granted = grants_of(i, false);
  for (std::string_view t : topics)  // all or nothing: a refused sub changes nothing
    if (!proto::grants_match(granted, t)) return client_error(i, proto::client_error::forbidden, t);
  std::uint32_t added = 0;  // bit k: topics[k] is new to this connection
  for (std::size_t k = 0; k < topics.size(); ++k) {
    auto r = _topics.subscribe(i, topics[k]);
    if (r == pubsub::sub_result::added) {
      added |= 1u << k;
    } else if (r != pubsub::sub_result::already) {
      for (std::size_t j = 0; j < k; ++j)
        if (added & (1u << j)) _topics.unsubscribe(i, topics[j]);
      count_subscriptions();
      return client_error(i,
                          r == pubsub::sub_result::too_many_topics ? proto::client_error::too_many_subscriptions
                                                                   : proto::client_error::unavailable,
                          topics[k]);
    }
  }
  count_subscriptions();
  std::string_view lost[proto::max_topics_per_message];
  std::uint32_t lost_count = replay_since(i, added, lost);
  std::span<const std::string_view> lost_span(lost, lost_count);
  bool ok = queue_json(i, 64 + names_bound(topics) + names_bound(lost_span),
                       [&](std::span<char> out) { return proto::encode_subbed(topics, lost_span, out); });
  for (pool::frame_ref& f : _replay) {
    ok = ok && _conns.at(i).state == conn_state::open && queue(i, std::move(f));
    if (ok) _n.deliveries.add(), _n.messages_out.add();
  }
  _replay.clear();
  set_errors(_conns.at(i), 0);
}

/// Collects into _replay what the connection missed on the topics it just subscribed to with
/// a `since`, and writes the topics whose history does not reach back that far into `lost`.
/// The replay stops at what this shard has already fanned out; anything later is still in
/// the inbox and reaches the connection live (history.hpp, "the seam").
std::uint32_t shard::replay_since(std::uint32_t i, std::uint32_t added, std::string_view* lost) noexcept {
  std::uint32_t n = 0;
  auto topics = _env->topics();
  pubsub::history& h = _g.hub->history();
  for (const proto::since_entry& s : _env->since()) {
    auto k = std::size_t(std::find(topics.begin(), topics.end(), s.topic) - topics.begin());
    if (k >= topics.size() || !(added & (1u << k))) continue;  // already subscribed: it has them live
    auto r = h.replay(s.topic, s.id, _fanned[h.shard_of(s.topic)], monotonic_ns(),
                      [this](std::uint64_t, const pool::frame_ref& f) noexcept { _replay.push_back(f); });
    if (r.lost) lost[n++] = s.topic;
  }
  return n;
}

void shard::client_unsub(std::uint32_t i) noexcept {
  auto topics = _env->topics();
  for (std::string_view t : topics) _topics.unsubscribe(i, t);
  count_subscriptions();
  queue_json(i, 64 + names_bound(topics), [&](std::span<char> out) { return proto::encode_unsubbed(topics, out); });
  set_errors(_conns.at(i), 0);
}

void shard::client_pub(std::uint32_t i) noexcept {
  const proto::envelope& env = *_env;
  if (!proto::grants_match(grants_of(i, true), env.topic)) {
    _n.client_pubs_forbidden.add();
    return client_error(i, proto::client_error::forbidden, env.topic);
  }
  pubsub::history_id id;
  if (_g.hub->crowded() || !_g.hub->publish(env.topic, env.data, id, true)) {
    _n.client_pubs_unavailable.add();
    return client_error(i, proto::client_error::unavailable, env.topic);
  }
  _n.client_pubs_ok.add();
  set_errors(_conns.at(i), 0);
}

void shard::on_event(pool::frame_ref f, std::uint64_t seq, std::uint32_t part) noexcept {
  std::string_view topic = event_topic(f.bytes());
  std::uint64_t queued = 0, slow = 0, closed = 0;
  _fanning = true;  // nothing may leave the registry while we walk its subscriber array
  for (std::uint32_t c : _topics.subscribers(topic)) {
    if (_conns.at(c).state != conn_state::open) ++closed;  // closing: it gets nothing more
    else if (queue(c, f)) ++queued;
    else ++slow;  // over --max-pending-bytes (closed with 1013 just now), or out of memory
  }
  _fanning = false;
  if (part < _fanned.size()) _fanned[part] = seq;
  _n.deliveries.add(queued);
  _n.messages_out.add(queued);
  if (slow) _n.drops_slow.add(slow);
  if (closed) _n.drops_closed.add(closed);
  if (!_release_later.empty()) release_deferred();
}

void shard::release_deferred() noexcept {
  for (std::size_t k = 0; k < _release_later.size(); ++k) finish_dead(_release_later[k]);
  _release_later.clear();
}

void shard::count_subscriptions() noexcept {
  _n.topics.set(_topics.topic_count());
  _n.subscriptions.set(_topics.subscription_count());
}

/// Arms an open connection's deadline `ticks` ahead, or at its token's expiry if that comes
/// first (then flag_timer_exp says so): a connection is closed within a tick of its `exp`.
void shard::arm_open(std::uint32_t i, std::uint32_t ticks) noexcept {
  connection& c = _conns.at(i);
  c.flags &= ~flag_timer_exp;
  if (std::uint32_t exp = _g.tokens ? _sessions.get(i).exp : 0) {
    std::int64_t left_ms = std::min<std::int64_t>(std::int64_t(exp) * 1000 - realtime_ms(), 86'400'000);
    std::uint32_t until = left_ms <= 0 ? 1 : ticks_for(double(left_ms) / 1000.0);
    if (until <= ticks) {
      ticks = until;
      c.flags |= flag_timer_exp;
    }
  }
  _wheel.arm(i, ticks);
}

/// The deadline was the token's expiry: close with 1008 once it has passed (the wheel's
/// monotonic ticks and the wall clock may disagree by a little: if it is not quite time yet,
/// wait for the rest; every other deadline was later than this one).
void shard::on_expiry_timer(std::uint32_t i) noexcept {
  if (realtime_ms() >= std::int64_t(_sessions.get(i).exp) * 1000) {
    _n.token_expired_closes.add();
    return start_close(i, proto::close_code::policy_violation, true);
  }
  arm_open(i, UINT32_MAX);
}

}  // namespace wspush::server
