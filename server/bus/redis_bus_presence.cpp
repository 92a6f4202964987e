// The Redis bus's part in presence (where a namespace keeps it): what each node has, said to
// Redis, which adds up the nodes and announces joins and leaves (wspush.lua, "presence";
// docs/REDIS.md, "Presence").
//
// A shard tells the bus each change of a (topic, user) on this node: the user's connections
// subscribed to the topic here now. The bus sends the words taken in a turn to each topic's
// Redis, many to a call (one topic a call under Redis Cluster, where a call's keys share a
// slot). Every --presence-ttl / 3 it says everything again, one part of the node's presence
// table a tick, so that its entries in Redis outlive it by at most --presence-ttl, and come
// back by themselves after Redis lost them. A word that could not go (its Redis away) is said
// by the next refresh.
//
// Asking (the `presence` op, GET /presence) reads the topic's hash in its Redis.

#include <algorithm>

#include "proto/topic.hpp"
#include "server/base/user_table.hpp"
#include "server/bus/redis_bus_parts.hpp"

namespace wspush::server::bus {
namespace {

/// A count Lua returned (an integer reply).
bool count_of(const resp::reply* r, std::uint64_t& out) noexcept {
  if (r == nullptr || r->type != resp::reply_type::integer || r->integer < 0) return false;
  out = std::uint64_t(r->integer);
  return true;
}

/// Words (quadruples) in one call, outside Redis Cluster.
constexpr std::size_t presence_words_per_call = 128;
constexpr std::uint32_t ticks_per_second = 1000 / loop_tick_ms;

}  // namespace

void redis_bus::presence_set(std::string_view topic, std::string_view user, std::uint32_t connections,
                             bool announce) noexcept {
  request r;
  r.kind = request::presence_set;
  r.tag = connections;
  r.room = announce ? 1 : 0;
  if (!post(std::move(r), topic, user))
    log_ratelimited(log_level::error, "bus: out of memory; a presence change waits for the refresh");
}

bool redis_bus::presence_get(std::uint32_t shard, conn_id conn, std::uint64_t request_number,
                             std::string_view topic, bool count_only) noexcept {
  if (!up_for(topic)) return false;
  request r;
  r.kind = request::presence_get;
  r.shard = shard;
  r.tag = conn;
  r.sub_request = request_number;
  r.room = count_only ? 1 : 0;
  return post(std::move(r), topic);
}

pubsub::presence_answer redis_bus::presence_wait(std::string_view topic, bool count_only,
                                                 std::chrono::milliseconds timeout) {
  auto w = std::make_shared<presence_waiter>();
  request r;
  r.kind = request::presence_get;
  r.room = count_only ? 1 : 0;
  r.pw = w;
  if (!up_for(topic) || !post(std::move(r), topic)) return {};
  std::unique_lock lock(w->m);
  if (!w->cv.wait_for(lock, timeout, [&] { return w->done; })) return {};
  return std::move(w->answer);
}

/// A shard's word, kept for its Redis's next call (send_presence, at the end of the turn).
void redis_bus::gather_presence(request& r) noexcept {
  instance* in = home(r.topic);
  if (!in || !in->up.load(std::memory_order_relaxed)) return;  // the refresh says it once it is back
  try {
    auto& w = in->presence_words;
    w.reserve(w.size() + 4);
    w.push_back(std::move(r.topic));
    w.push_back(std::move(r.data));
    w.push_back(std::to_string(r.tag));
    w.push_back(r.room ? "1" : "0");
  } catch (...) {
    log_ratelimited(log_level::error, "bus: out of memory; a presence change waits for the refresh");
  }
}

void redis_bus::send_presence(instance& in) noexcept {
  auto& words = in.presence_words;
  if (words.empty()) return;
  const std::string ttl = std::to_string(_o.presence_ttl_ms);
  std::string key;
  std::vector<std::string_view> args;
  try {
    const std::size_t per_call = _o.cluster ? 4 : 4 * presence_words_per_call;
    for (std::size_t at = 0; at < words.size(); at += per_call) {
      const std::size_t end = std::min(words.size(), at + per_call);
      args.assign({"FCALL", "wspush_presence", _o.cluster ? "1" : "0"});
      if (_o.cluster) {
        name_into(key, topic_slot(words[at]), "presence:", words[at]);
        args.push_back(key);
      }
      args.push_back(_node_id);
      args.push_back(ttl);
      for (std::size_t k = at; k < end; ++k) args.push_back(words[k]);
      auto* o = new (std::nothrow) op{op::presence};
      if (o) command(in, args, o);
    }
  } catch (...) {
    log_ratelimited(log_level::error, "bus: out of memory; presence changes wait for the refresh");
  }
  words.clear();
}

void redis_bus::handle_presence_get(request& r) noexcept {
  instance* in = home(r.topic);
  const auto fail = [&] {
    if (r.pw) return r.pw->finish({});
    answer_presence(r.shard, conn_id(r.tag), r.sub_request, r.room != 0, std::move(r.topic), {});
  };
  if (!in || !in->up.load(std::memory_order_relaxed)) return fail();
  auto o = std::unique_ptr<op>(new (std::nothrow) op{op::presence_get, r.sub_request});
  if (!o) return fail();
  o->shard = r.shard;
  o->tag = r.tag;
  o->count_only = r.room != 0;
  o->pw = r.pw;
  std::string key;
  const std::string max = std::to_string(o->count_only ? 0 : r.pw ? max_admin_presence_users : pubsub::max_presence_users);
  try {
    o->topic = std::move(r.topic);
    if (_o.cluster) name_into(key, topic_slot(o->topic), "presence:", o->topic);
  } catch (...) {
    r.topic = std::move(o->topic);
    return fail();
  }
  const std::string topic = o->topic;
  op* raw = o.release();
  const bool sent = _o.cluster ? command(*in, {"FCALL_RO", "wspush_presence_get", "1", key, topic, max}, raw)
                               : command(*in, {"FCALL_RO", "wspush_presence_get", "0", topic, max}, raw);
  if (!sent) {  // the op was deleted
    r.topic = topic;
    fail();
  }
}

/// {user count, connections, user, n, ...}, or an error, or nothing (the link went).
void redis_bus::presence_got(op& o, const resp::reply* r) noexcept {
  pubsub::presence_answer a;
  if (r != nullptr && r->type == resp::reply_type::array && r->elements >= 2) {
    std::uint64_t users = 0, connections = 0;
    a.ok = count_of(r->element[0], users) && count_of(r->element[1], connections);
    a.user_count = users;
    a.connections = connections;
    try {
      a.users.reserve((r->elements - 2) / 2);
      for (std::size_t k = 2; a.ok && k + 1 < r->elements; k += 2) {
        std::uint64_t n = 0;
        if (!count_of(r->element[k + 1], n)) {
          a.ok = false;
          break;
        }
        a.users.emplace_back(std::string(str(r->element[k])), std::uint32_t(std::min<std::uint64_t>(n, UINT32_MAX)));
      }
    } catch (...) {
      a.ok = false;
    }
  } else if (r != nullptr) {
    log_ratelimited(log_level::warn, "bus: presence of %s: %.*s", o.topic.c_str(), int(str(r).size()), str(r).data());
  }
  if (!a.ok) a = {};
  if (o.pw) return o.pw->finish(std::move(a));
  answer_presence(o.shard, conn_id(o.tag), o.pid, o.count_only, std::move(o.topic), std::move(a));
}

/// A session's presence op answered (not ok: failed), through its shard's inbox. Out of memory
/// it is not: the connection stays held until it closes.
void redis_bus::answer_presence(std::uint32_t shard, conn_id conn, std::uint64_t request, bool count_only,
                                std::string topic, pubsub::presence_answer a) noexcept {
  auto reply = std::unique_ptr<pubsub::bus_reply>(new (std::nothrow) pubsub::bus_reply);
  if (!reply) return;
  reply->kind = pubsub::bus_reply::presence;
  reply->conn = conn;
  reply->request = request;
  reply->count_only = count_only;
  reply->present = std::move(a);
  try {
    reply->topics.push_back(std::move(topic));
  } catch (...) {
  }
  pubsub::event e;
  e.reply = std::move(reply);
  offer(shard, std::move(e));
}

/// Says again what one part of the node's presence table holds (on_tick, one part a tick, each
/// part once every --presence-ttl / 3).
void redis_bus::refresh_presence() noexcept {
  if (!_presence || !_presence_users) return;
  const std::uint32_t parts = _presence->parts();
  if (std::int32_t(_tick - _presence_next_tick) < 0) return;
  const std::uint32_t pass_ticks = _o.presence_ttl_ms / 3 * ticks_per_second / 1000;
  _presence_next_tick = _tick + std::max<std::uint32_t>(1, pass_ticks / parts);
  // Names are read while the part is locked (a part, then the user table: the shards' order),
  // so a user number freed and given to another user meanwhile cannot lend its name.
  const pubsub::namespaces* spaces = _o.spaces;
  try {
    _presence->visit(_presence_part, [&](std::string_view topic, std::uint32_t user, std::uint32_t n) {
      if (user == 0) return;
      request r;
      r.kind = request::presence_set;
      r.tag = n;
      r.room = spaces && spaces->of(topic).join_leave ? 1 : 0;
      _presence_users->with_names([&](auto name_of) { r.data.assign(name_of(user)); });
      if (r.data.empty()) return;
      r.topic.assign(topic);
      gather_presence(r);
    });
  } catch (...) {
    return;  // this part again next tick
  }
  _presence_part = (_presence_part + 1) % parts;
  for (auto& in : _instances) send_presence(*in);
}

/// "join <user>" / "leave <user>" on a topic's channel: the frame for its subscribers here.
void redis_bus::join_leave(std::string_view topic, std::string_view payload) noexcept {
  const bool join = payload.starts_with("join ");
  const std::string_view user = payload.substr(join ? 5 : 6);
  if (user.empty() || !proto::is_valid_topic(topic)) {
    _n.malformed.add();
    return;
  }
  std::size_t at = 0;
  pool::frame_ref f = pubsub::join_leave_frame(_buffers, join, topic, user, at);
  if (!f) {
    _n.dropped.add();
    return;
  }
  offer_at(f, at, topic.size());
  (join ? _n.joins : _n.leaves).add();
}

}  // namespace wspush::server::bus
