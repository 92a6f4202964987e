#pragma once
// A Redis Cluster as the bus sees it (issue 21, not used yet): which master serves each slot,
// read from CLUSTER SLOTS, and the redirections a master answers with (MOVED, ASK) when a slot
// is elsewhere or migrating.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/bus/redis_route.hpp"
#include "server/bus/resp.hpp"

namespace wspush::server::bus {

struct cluster_node {
  std::string host;  // as the cluster announces it; empty: the host the reply came from
  std::uint16_t port = 0;
  std::string id;    // its node id (40 hex digits), when announced
  bool operator==(const cluster_node&) const = default;
};

class cluster_map {
 public:
  /// Reads a CLUSTER SLOTS reply. False with `why` (the map unchanged) when it is not one: a
  /// range out of order or past 16383, a master without host or port, slots claimed twice.
  /// Slots the reply does not name stay unserved (a cluster whose slots are not all covered).
  bool load(const resp::reply& r, std::string& why);
  /// The master serving `slot`, or null.
  const cluster_node* master_of(std::uint32_t slot) const noexcept;
  /// Each master once, in the order the reply named them.
  std::span<const cluster_node> masters() const noexcept { return _masters; }
  /// Every slot has a master.
  bool covered() const noexcept { return _served == cluster_slots; }

 private:
  static constexpr std::uint16_t none = 0xFFFF;
  std::vector<cluster_node> _masters;
  std::array<std::uint16_t, cluster_slots> _owner{};  // index into _masters, or none
  std::uint32_t _served = 0;
  bool _loaded = false;
};

/// What an error reply says about a slot that is served elsewhere: `MOVED <slot> <host>:<port>`
/// (the slot's owner changed: refresh the map) or `ASK <slot> <host>:<port>` (migrating: send
/// ASKING and the command there, once). `none` for any other error.
struct redirect {
  enum kind_t : std::uint8_t { none, moved, ask } kind = none;
  std::uint32_t slot = 0;
  std::string host;  // empty: the same host the error came from (an unknown endpoint, `:port`)
  std::uint16_t port = 0;
};
redirect parse_redirect(std::string_view error) noexcept;

}  // namespace wspush::server::bus
