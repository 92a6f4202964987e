#include "server/pubsub/presence.hpp"

#include <algorithm>
#include <bit>

#include "proto/envelope.hpp"
#include "proto/ws_frame.hpp"
#include "server/base/user_table.hpp"
#include "server/pubsub/namespaces.hpp"

namespace wspush::server::pubsub {

presence_table::presence_table(std::uint32_t parts)
    : _parts(std::make_unique<part[]>(std::bit_ceil(std::max<std::uint32_t>(parts, 1)))),
      _mask(std::bit_ceil(std::max<std::uint32_t>(parts, 1)) - 1) {}

presence_table::~presence_table() = default;

presence_table::part& presence_table::part_of(std::string_view topic) const noexcept {
  return _parts[name_hash{}(topic) >> 7 & _mask];  // the low bits pick the part's bucket
}

presence_table::change presence_table::add(std::string_view topic, std::uint32_t user, std::uint32_t* now,
                                           on_change fn, void* ctx) noexcept {
  std::uint32_t scratch;
  std::uint32_t& n_now = now ? *now : scratch;
  part& p = part_of(topic);
  std::lock_guard lock(p.m);
  const change c = add_locked(p, topic, user, n_now);
  if (fn && c != change::failed) fn(ctx, c, n_now);  // under the lock: the part's changes are told in order
  return c;
}

presence_table::change presence_table::remove(std::string_view topic, std::uint32_t user, std::uint32_t* now,
                                              on_change fn, void* ctx) noexcept {
  std::uint32_t scratch;
  std::uint32_t& n_now = now ? *now : scratch;
  part& p = part_of(topic);
  std::lock_guard lock(p.m);
  const change c = remove_locked(p, topic, user, n_now);
  if (fn) fn(ctx, c, n_now);
  return c;
}

presence_table::change presence_table::add_locked(part& p, std::string_view topic, std::uint32_t user,
                                                  std::uint32_t& n_now) noexcept {
  n_now = 0;
  try {
    auto it = p.topics.find(topic);
    if (it == p.topics.end()) it = p.topics.emplace(std::string(topic), topic_users{}).first;
    topic_users& t = it->second;
    if (user == 0) {
      ++t.total;
      n_now = ++t.anonymous;
      return change::more;
    }
    if (t.count > 0 && t.user == user) {
      ++t.total;
      n_now = ++t.count;
      return change::more;
    }
    if (t.count == 0 && !(t.others && t.others->count(user))) {
      ++t.total;
      t.user = user;
      n_now = t.count = 1;
      ++p.entries;
      return change::first;
    }
    if (!t.others) t.others = std::make_unique<std::unordered_map<std::uint32_t, std::uint32_t>>();
    std::uint32_t& n = (*t.others)[user];  // the last thing that may throw
    ++t.total;
    n_now = ++n;
    if (n > 1) return change::more;
    ++p.entries;
    return change::first;
  } catch (...) {
    // A topic made for this call and left empty goes again: nothing was counted.
    if (auto it = p.topics.find(topic); it != p.topics.end() && it->second.empty()) p.topics.erase(it);
    return change::failed;
  }
}

presence_table::change presence_table::remove_locked(part& p, std::string_view topic, std::uint32_t user,
                                                     std::uint32_t& n_now) noexcept {
  n_now = 0;
  auto it = p.topics.find(topic);
  if (it == p.topics.end()) return change::more;
  topic_users& t = it->second;
  change c = change::more;
  if (user == 0) {
    if (t.anonymous > 0) {
      n_now = --t.anonymous;
      --t.total;
    }
  } else if (t.count > 0 && t.user == user) {
    n_now = --t.count;
    --t.total;
    if (t.count == 0) {
      t.user = 0;
      --p.entries;
      c = change::last;
    }
  } else if (t.others) {
    auto u = t.others->find(user);
    if (u != t.others->end()) {
      n_now = --u->second;
      --t.total;
    }
    if (u != t.others->end() && u->second == 0) {
      t.others->erase(u);
      --p.entries;
      c = change::last;
      if (t.others->empty()) t.others.reset();
    }
  }
  if (t.empty()) p.topics.erase(it);
  return c;
}

void presence_table::read(std::string_view topic, std::size_t max_users, reading& out) const {
  out.users.clear();
  out.user_count = out.connections = 0;
  part& p = part_of(topic);
  std::lock_guard lock(p.m);
  auto it = p.topics.find(topic);
  if (it == p.topics.end()) return;
  const topic_users& t = it->second;
  if (max_users == 0) {  // the counts: kept as they change, never a walk over the users
    out.user_count = (t.count > 0 ? 1 : 0) + (t.others ? t.others->size() : 0);
    out.connections = t.total;
    return;
  }
  out.connections = t.anonymous;
  const auto list = [&](std::uint32_t user, std::uint32_t n) {
    ++out.user_count;
    out.connections += n;
    if (out.users.size() < max_users) out.users.emplace_back(user, n);
  };
  if (t.count > 0) list(t.user, t.count);
  if (t.others)
    for (const auto& [user, n] : *t.others) list(user, n);
}

std::uint64_t presence_table::topics() const noexcept {
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i <= _mask; ++i) {
    std::lock_guard lock(_parts[i].m);
    n += _parts[i].topics.size();
  }
  return n;
}

std::uint64_t presence_table::entries() const noexcept {
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i <= _mask; ++i) {
    std::lock_guard lock(_parts[i].m);
    n += _parts[i].entries;
  }
  return n;
}

pool::frame_ref join_leave_frame(pool::buffer_pool& buffers, bool join, std::string_view topic, std::string_view user,
                                 std::size_t& topic_offset) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  const std::size_t bound = 48 + 6 * (topic.size() + user.size());
  pool::lease l = buffers.acquire(room + bound);
  if (!l) return {};
  const std::size_t n = proto::encode_join_leave(join, topic, user, {reinterpret_cast<char*>(l.data()) + room, bound});
  if (n == 0) return {};
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  topic_offset = join ? 22 : 23;  // a valid topic needs no escaping: it lies after `{"op":"join","topic":"`
  return pool::frame_ref::adopt(std::move(l));
}

void render_presence_body(std::string_view topic, bool count_only, std::span<const proto::presence_user> users,
                          std::uint64_t user_count, std::uint64_t connections, std::string& body) {
  body.resize(proto::presence_size_bound(topic, users));
  body.resize(proto::encode_presence({}, topic, count_only ? nullptr : &users, user_count, connections,
                                     users.size() < user_count, {body.data(), body.size()}));
}

std::uint16_t render_presence(const presence_table& table, const namespaces& ns, const user_table* users,
                              std::string_view topic, bool count_only, std::string& body) {
  if (!ns.of(topic).presence) {
    body = R"({"error":"not_enabled","reason":"the topic's namespace keeps no presence"})";
    return 404;
  }
  presence_table::reading r;
  table.read(topic, count_only ? 0 : max_admin_users, r);
  const auto encode = [&](auto name_of) {
    std::vector<proto::presence_user> listed;
    listed.reserve(r.users.size());
    for (const auto& [user, n] : r.users)
      if (std::string_view name = name_of(user); !name.empty()) listed.push_back({name, n});
    render_presence_body(topic, count_only, listed, r.user_count, r.connections, body);
  };
  if (users) users->with_names(encode);
  else encode([](std::uint32_t) { return std::string_view{}; });
  return 200;
}

}  // namespace wspush::server::pubsub
