#pragma once
/// \file presence.hpp
/// Who is subscribed to the topics whose namespace keeps presence, on this node: per topic, its
/// users (the process's user_table numbers) with how many of their connections are subscribed,
/// and the connections without a user (no token, or a token without `sub`). Sessions tell it of
/// each subscribe and unsubscribe (a close unsubscribes everything) of such a topic; the
/// `presence` op and GET /presence read it.
///
/// A user's first connection on a topic and its last one are what join/leave events announce:
/// add() and remove() say when they happen, so the caller announces once per user, not per tab.
///
/// Any thread: shards subscribe, the admin thread reads. The table is split by topic hash into
/// parts, each behind its own mutex, taken once per subscribe or unsubscribe of a presence
/// topic, never per message. Memory: one node per topic with subscribers (about 80 bytes with
/// its user inline, measured in docs/PERFORMANCE.md), plus a small hash map for a topic's
/// second and later users; it holds nothing for a topic nobody is subscribed to.

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"
#include "proto/envelope.hpp"

namespace wspush::server {
class user_table;
}

namespace wspush::server::pubsub {

class namespaces;

class presence_table {
 public:
  /// What a subscribe or unsubscribe changed for its user on the topic.
  enum class change : std::uint8_t {
    more,    ///< another connection of a user already there (or one without a user)
    first,   ///< the user's first connection on the topic (join)
    last,    ///< the user's last connection left the topic (leave)
    failed,  ///< out of memory: nothing was counted
  };

  explicit presence_table(std::uint32_t parts = 16);
  ~presence_table();
  presence_table(const presence_table&) = delete;
  presence_table& operator=(const presence_table&) = delete;

  /// Told, under the topic's part lock, what a change came to and the user's connections on the
  /// topic after it: so that what a caller says of it (a word to Redis, a join/leave) goes out
  /// in the order the changes happened, whichever shards made them. It must not call into the
  /// table; it may take the user_table's lock (the lock order: a part, then the user table).
  using on_change = void (*)(void* ctx, change c, std::uint32_t now) noexcept;
  /// A connection of `user` (0: none) subscribed to `topic`. `now`: the user's connections on
  /// the topic after it. `fn` (if any) is told unless it failed.
  change add(std::string_view topic, std::uint32_t user, std::uint32_t* now = nullptr, on_change fn = nullptr,
             void* ctx = nullptr) noexcept;
  /// A connection of `user` that add() counted on `topic` left it. A pair never added is ignored.
  change remove(std::string_view topic, std::uint32_t user, std::uint32_t* now = nullptr, on_change fn = nullptr,
                void* ctx = nullptr) noexcept;

  /// Calls fn(std::string_view topic, std::uint32_t user, std::uint32_t connections) for each
  /// (topic, user) counted in part `part` (< parts()), under that part's lock: fn must not call
  /// into the table. The Redis bus says again, this way, what the node has.
  template <class Fn>
  void visit(std::uint32_t part, Fn&& fn) const {
    const struct part& p = _parts[part];
    std::lock_guard lock(p.m);
    for (const auto& [topic, t] : p.topics) {
      if (t.count > 0) fn(std::string_view(topic), t.user, t.count);
      if (t.others)
        for (const auto& [user, n] : *t.others) fn(std::string_view(topic), user, n);
    }
  }
  std::uint32_t parts() const noexcept { return _mask + 1; }

  struct reading {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> users;  ///< (user, connections), at most max_users
    std::uint64_t user_count = 0;   ///< all of them, listed or not
    std::uint64_t connections = 0;  ///< every connection subscribed, users' or not
  };
  /// `topic`'s users now, at most `max_users` of them listed (0: counts only, kept as they change:
  /// no walk). May throw std::bad_alloc (a reader's call, not a shard's).
  void read(std::string_view topic, std::size_t max_users, reading& out) const;

  /// Topics with someone present, and (user, topic) pairs counted.
  std::uint64_t topics() const noexcept;
  std::uint64_t entries() const noexcept;

 private:
  struct topic_users {
    std::uint32_t anonymous = 0;    // connections without a user
    std::uint32_t user = 0, count = 0;  // the first user here, inline (a mailbox's only one)
    std::uint32_t total = 0;        // every connection subscribed (in the padding: still 24 bytes)
    std::unique_ptr<std::unordered_map<std::uint32_t, std::uint32_t>> others;  // the rest
    bool empty() const noexcept { return anonymous == 0 && count == 0 && (!others || others->empty()); }
  };
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct part {
    mutable std::mutex m;
    std::unordered_map<std::string, topic_users, name_hash, std::equal_to<>> topics;
    std::uint64_t entries = 0;
  };
  part& part_of(std::string_view topic) const noexcept;
  change add_locked(part& p, std::string_view topic, std::uint32_t user, std::uint32_t& n_now) noexcept;
  change remove_locked(part& p, std::string_view topic, std::uint32_t user, std::uint32_t& n_now) noexcept;

  std::unique_ptr<part[]> _parts;
  std::uint32_t _mask;
};

/// `{"op":"join","topic":T,"user":U}` (join false: "leave") framed as one WebSocket text message
/// in a block of `buffers`; `topic_offset` receives where the topic lies in the JSON text (after
/// the frame's header). Empty when out of memory.
pool::frame_ref join_leave_frame(pool::buffer_pool& buffers, bool join, std::string_view topic, std::string_view user,
                                 std::size_t& topic_offset) noexcept;

/// The JSON text of a server's unmasked text frame (its payload).
inline std::string_view text_of(const pool::frame_ref& frame) noexcept {
  const auto b = frame.bytes();
  if (b.size() < 2) return {};
  const std::uint8_t len7 = b[1] & 0x7f;
  const std::size_t header = len7 == 126 ? 4 : len7 == 127 ? 10 : 2;
  return {reinterpret_cast<const char*>(b.data()) + header, b.size() - header};
}

/// Users GET /presence lists at most (all are counted; past it `"truncated":true`).
inline constexpr std::size_t max_admin_users = 10000;

/// GET /presence's 200 body for `users` (empty with count_only) and the counts.
void render_presence_body(std::string_view topic, bool count_only, std::span<const proto::presence_user> users,
                          std::uint64_t user_count, std::uint64_t connections, std::string& body);

/// GET /presence: `topic`'s presence as the admin API answers it, written into `body`: 200 with
/// `{"topic":..,"users":{..},"user_count":..,"connections":..}` (count_only: without `users`),
/// or 404 `not_enabled` where its namespace keeps none. Lists every user (the backend asked).
std::uint16_t render_presence(const presence_table& table, const namespaces& ns, const user_table* users,
                              std::string_view topic, bool count_only, std::string& body);

}  // namespace wspush::server::pubsub
