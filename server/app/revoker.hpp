#pragma once
// Revoking a user (POST /disconnect): the admin API's revoke_sink. A revoke is recorded in the
// revocation list (its older tokens are refused from here on), told to the other nodes through
// the Redis bus (which records it there too), and closes the user's connections on this
// process: each shard gets a share of one order through its event inbox (pubsub/revoke.hpp)
// and closes them on its own thread. The admin thread waits for the shards' count (each takes
// the order at its next pass over the inbox: well under a millisecond on a live shard), at
// most max_wait; another node's revoke (the bus thread) waits for nothing.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/admin/admin_api.hpp"
#include "server/base/log.hpp"
#include "server/base/revocation_list.hpp"
#include "server/base/user_table.hpp"
#include "server/bus/redis_bus.hpp"
#include "server/pubsub/event.hpp"

namespace wspush::server {

class revoker final : public revoke_sink {
 public:
  /// `users`: null without tokens (nobody to close). `bus`: null on the embedded bus.
  revoker(revocation_list& list, user_table* users, std::vector<pubsub::event_port*> ports, bus::redis_bus* bus)
      : _list(list), _users(users), _ports(std::move(ports)), _bus(bus) {}

  static constexpr std::chrono::milliseconds max_wait{2000};

  /// Admin thread.
  std::uint32_t revoke(std::string_view sub) noexcept override {
    const auto now = std::int64_t(std::time(nullptr));
    try {
      const std::string name(sub);
      _list.record(name, now, now);
      if (_bus) _bus->revoke(name, now);
      const std::uint32_t n = close_here(name, true);
      log(log_level::info, "revoked user '%.*s': %u connection%s closed here", int(std::min<std::size_t>(sub.size(), 200)),
          sub.data(), n, n == 1 ? "" : "s");
      return n;
    } catch (...) {
      return 0;
    }
  }

  /// The bus thread: another node's revoke, or (`loaded`) one read from Redis's list. Closes
  /// the user's connections here when the revoke is news to this node.
  void heard(std::string_view sub, std::int64_t at, bool loaded) noexcept {
    const auto now = std::int64_t(std::time(nullptr));
    try {
      const std::string name(sub);
      const bool news = _list.record(name, at, now);
      // Without a list (--revocation-ttl=0) every revoke told is acted on; one loaded never is.
      if (news || (!_list.enabled() && !loaded)) close_here(name, false);
    } catch (...) {
    }
  }

 private:
  std::uint32_t close_here(const std::string& sub, bool wait) {
    if (!_users || _ports.empty()) return 0;
    const std::uint32_t user = _users->id_of(sub);
    if (user == user_table::nobody) return 0;  // no connection of it in this process
    auto order = std::make_shared<pubsub::revoke_order>(sub, user, std::uint32_t(_ports.size()));
    const auto deadline = std::chrono::steady_clock::now() + max_wait;
    for (pubsub::event_port* port : _ports) {
      pubsub::event e;
      e.reply = std::make_unique<pubsub::bus_reply>();
      e.reply->kind = pubsub::bus_reply::revoke;
      e.reply->revoked = pubsub::revoke_share(order);
      // A full inbox (a flood of events) takes it once the shard has taken some; the bus's
      // thread does not wait for that (the revoke stays in the list: new upgrades are refused).
      while (!port->offer(std::move(e), true)) {
        if (!wait || std::chrono::steady_clock::now() >= deadline) {
          log_ratelimited(log_level::warn, "revoke: a shard's inbox is full; some connections of a revoked user stay");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (wait && !order->wait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())))
      log_ratelimited(log_level::warn, "revoke: a shard did not answer in time; its closes are not counted");
    return order->closed.load(std::memory_order_relaxed);
  }

  revocation_list& _list;
  user_table* const _users;
  const std::vector<pubsub::event_port*> _ports;
  bus::redis_bus* const _bus;
};

}  // namespace wspush::server
