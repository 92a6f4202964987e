#pragma once
/// \file fanout.hpp
/// One shard's end of the pub/sub path: its event port (an inbox the hub posts to), its topic
/// registry, and the walk that hands each event's shared frame to the subscribers of its topic
/// on this shard. The pub/sub session and the broadcast application both deliver this way:
/// there is one fan-out path.

#include <cstdint>
#include <string_view>
#include <vector>

#include "server/base/counter.hpp"
#include "server/conn/app.hpp"
#include "server/pubsub/event.hpp"
#include "server/pubsub/topic_registry.hpp"
#include "server/reactor/inbox.hpp"

namespace wspush::server::pubsub {

/// What a shard's pub/sub side counts (docs/METRICS.md).
struct pubsub_counters {
  relaxed_counter deliveries;                // events queued to subscribers
  relaxed_counter drops_slow, drops_closed;  // events not queued: slow consumer; closing
  relaxed_counter client_pubs_ok, client_pubs_forbidden, client_pubs_unavailable;
  relaxed_counter client_errors, token_expired_closes;
  relaxed_counter topics, subscriptions;  // gauges: this shard's registry
};

class fanout final : public event_port, public inbox_consumer<event> {
 public:
  /// Events come through an inbox of `l` holding `inbox_capacity`; `parts` is the number of
  /// history parts (the resume seam keeps the last seq fanned out per part).
  fanout(loop& l, std::size_t inbox_capacity, std::uint32_t parts, registry_options o);
  /// The connection layer deliveries go to (before the first event).
  void bind(conn_ops& ops) noexcept { _ops = &ops; }

  // event_port: any thread
  bool offer(event&& e, bool wake) noexcept override { return _inbox.post(std::move(e), wake); }
  void wake() noexcept override { _inbox.wake(); }
  bool crowded() const noexcept override { return _inbox.crowded(); }

  /// The shard's thread: queues the event's frame to every subscriber of its topic here.
  /// Returns the deliveries (the loop's budget counts them).
  std::uint64_t on_item(event&& e) noexcept override;

  topic_registry& registry() noexcept { return _registry; }
  /// The last seq of history part `part` this shard has fanned out (history.hpp, "the seam").
  std::uint64_t fanned(std::uint32_t part) const noexcept { return part < _fanned.size() ? _fanned[part] : 0; }
  /// Keeps the registry gauges current (after subscriptions changed).
  void count_subscriptions() noexcept;
  pubsub_counters& counters() noexcept { return _n; }
  const pubsub_counters& counters() const noexcept { return _n; }

 private:
  conn_ops* _ops = nullptr;
  topic_registry _registry;
  std::vector<std::uint64_t> _fanned;  // per history part
  inbox<event> _inbox;
  pubsub_counters _n;
};

}  // namespace wspush::server::pubsub
