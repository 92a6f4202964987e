#pragma once
/// \file fanout.hpp
/// One shard's end of the pub/sub path: its event port (an inbox the hub posts to), its topic
/// registry, and the walk that hands each event's shared frame to the subscribers of its topic
/// on this shard. The pub/sub session and the broadcast application both deliver this way:
/// there is one fan-out path.
///
/// Consecutive events of one topic taken in one pass over the inbox (a burst) form a run, and
/// a run goes to each subscriber as one block: its frames copied back to back once per shard
/// (up to max_run_bytes), so a subscriber costs one queue slot, one reference and one iovec per
/// run instead of per event. Only consecutive events of the same topic are joined, so every
/// connection still receives events in the order the hub handed them over.

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
  relaxed_counter client_pubs_timeout;  // Redis bus: sent, no answer (the link broke): may have been published
  relaxed_counter client_errors, token_expired_closes;
  relaxed_counter revoked_closes;  // connections closed 4403: their user was revoked (POST /disconnect)
  relaxed_counter client_rate_limited;  // messages refused past --client-message-rate
  relaxed_counter joins, leaves;        // join/leave events announced
  relaxed_counter presence_failures;    // presence not counted, or join/leave not announced (no memory, crowded)
  relaxed_counter topics, subscriptions;  // gauges: this shard's registry
  relaxed_counter waiting_topics;         // gauge (Redis bus): topics held for subs not yet answered
};

class fanout final : public event_port, public inbox_consumer<event> {
 public:
  /// Events come through an inbox of `l` holding `inbox_capacity`; `parts` is the number of
  /// history parts (the resume seam keeps the last seq fanned out per part).
  fanout(loop& l, std::size_t inbox_capacity, std::uint32_t parts, registry_options o);
  /// The connection layer deliveries go to (before the first event).
  void bind(conn_ops& ops) noexcept { _ops = &ops; }
  /// Where a bus's replies go (with the Redis bus: the session).
  void set_reply_handler(bus_reply_handler& h) noexcept { _replies = &h; }

  // event_port: any thread
  bool offer(event&& e, bool wake) noexcept override { return _inbox.post(std::move(e), wake); }
  void wake() noexcept override { _inbox.wake(); }
  bool crowded() const noexcept override { return _inbox.crowded(); }

  /// The shard's thread: adds the event to the current run (delivering the run first when
  /// the event cannot join it). Returns its share of the loop's budget.
  std::uint64_t on_item(event&& e) noexcept override;
  /// The end of a pass over the inbox: the run goes out.
  void on_pass_end() noexcept override { deliver_run(); }
  /// Largest block a run is joined into.
  static constexpr std::size_t max_run_bytes = 64 * 1024;

  topic_registry& registry() noexcept { return _registry; }
  /// The last seq of history part `part` this shard has fanned out (history.hpp, "the seam").
  std::uint64_t fanned(std::uint32_t part) const noexcept { return part < _fanned.size() ? _fanned[part] : 0; }
  /// Keeps the registry gauges current (after subscriptions changed).
  void count_subscriptions() noexcept;
  pubsub_counters& counters() noexcept { return _n; }
  const pubsub_counters& counters() const noexcept { return _n; }

 private:
  void deliver_run() noexcept;
  pool::frame_ref join_run() noexcept;
  void count(const send_counts& n, std::uint64_t events) noexcept;

  conn_ops* _ops = nullptr;
  bus_reply_handler* _replies = nullptr;
  std::vector<event> _run;  // consecutive events of one topic, not yet delivered
  std::size_t _run_bytes = 0;
  std::span<const conn_id> _run_subs;  // the run's topic's subscribers (the registry does not change during a pass)
  topic_registry _registry;
  std::vector<std::uint64_t> _fanned;  // per history part
  inbox<event> _inbox;
  pubsub_counters _n;
};

}  // namespace wspush::server::pubsub
