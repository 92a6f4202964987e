#pragma once
// The users connected to this process: each token's `sub`, interned once while any of its
// connections is open, with how many there are. A connection holds its user's number (4 bytes)
// from its upgrade to its close: so a user is counted against --max-connections-per-user, and a
// connection keeps the user it opened with (an in-band token of another `sub` is refused).
//
// Any thread: upgrades join on the task pool, closes leave on the shards. A mutex guards it;
// it is taken once when a connection opens and once when it closes, never per message.

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace wspush::server {

class user_table {
 public:
  /// A connection's user when its token names none (or there are no tokens): never limited.
  static constexpr std::uint32_t nobody = 0;

  explicit user_table(std::uint32_t max_connections_per_user = 0) : _limit(max_connections_per_user) {}

  /// Counts one more connection of `sub`; its number, or `nobody` when `sub` is empty. False
  /// (nothing counted) when the user has its --max-connections-per-user already, or memory ran out.
  bool join(std::string_view sub, std::uint32_t& id) noexcept {
    id = nobody;
    if (sub.empty()) return true;
    std::lock_guard lock(_m);
    auto it = _ids.find(sub);  // no string made for a user already here
    if (it == _ids.end()) {
      try {
        if (_free.empty()) {  // room first: once the name is in, nothing below can fail
          _users.reserve(_users.size() + 1);
          _free.reserve(_users.size() + 1);  // so that leave() never allocates
        }
        it = _ids.emplace(std::string(sub), 0).first;
      } catch (...) {
        return false;
      }
      if (_free.empty()) {
        _users.push_back({});
        it->second = std::uint32_t(_users.size());  // numbers from 1: 0 is nobody
      } else {
        it->second = _free.back();
        _free.pop_back();
      }
      _users[it->second - 1] = {&it->first, 0};
    }
    user& u = _users[it->second - 1];
    if (_limit && u.connections >= _limit) return false;  // a user just added has none: never refused
    ++u.connections;
    id = it->second;
    return true;
  }

  /// The connection of user `id` is gone.
  void leave(std::uint32_t id) noexcept {
    if (id == nobody) return;
    std::lock_guard lock(_m);
    user& u = _users[id - 1];
    if (--u.connections > 0) return;
    const std::string* name = u.name;
    u = {};
    _ids.erase(*name);
    _free.push_back(id);  // within the room join() reserved
  }

  /// Whether user `id` is `sub` (nobody is the empty one).
  bool is(std::uint32_t id, std::string_view sub) const noexcept {
    if (id == nobody) return sub.empty();
    std::lock_guard lock(_m);
    if (id > _users.size()) return false;
    const std::string* name = _users[id - 1].name;  // null: the number is free now
    return name && *name == sub;
  }
  /// The number of `sub` while it has a connection; else nobody.
  std::uint32_t id_of(std::string_view sub) const {
    if (sub.empty()) return nobody;
    std::lock_guard lock(_m);
    auto it = _ids.find(sub);
    return it == _ids.end() ? nobody : it->second;
  }

  /// Users with at least one connection, and connections of `sub` (for tests and metrics).
  std::size_t users() const noexcept {
    std::lock_guard lock(_m);
    return _ids.size();
  }
  std::uint32_t connections_of(std::string_view sub) const {
    std::lock_guard lock(_m);
    auto it = _ids.find(sub);
    return it == _ids.end() ? 0 : _users[it->second - 1].connections;
  }
  std::uint32_t limit() const noexcept { return _limit; }

  /// Returns fn(name_of) under the table's lock, where name_of(id) is user id's `sub` (empty for
  /// nobody or a number not in use), valid while fn runs. fn must not call into the table.
  template <class Fn>
  decltype(auto) with_names(Fn&& fn) const {
    std::lock_guard lock(_m);
    return fn([this](std::uint32_t id) -> std::string_view {
      if (id == nobody || id > _users.size() || !_users[id - 1].name) return {};
      return *_users[id - 1].name;
    });
  }

 private:
  struct user {
    const std::string* name = nullptr;  // the map's key (node-based: stable)
    std::uint32_t connections = 0;
  };
  struct name_hash {  // finds a std::string key by a string_view
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  const std::uint32_t _limit;
  mutable std::mutex _m;
  std::unordered_map<std::string, std::uint32_t, name_hash, std::equal_to<>> _ids;
  std::vector<user> _users;  // by number - 1
  std::vector<std::uint32_t> _free;
};

}  // namespace wspush::server
