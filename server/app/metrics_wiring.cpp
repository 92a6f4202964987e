#include "server/app/metrics_wiring.hpp"

#include <ctime>

#include <functional>

namespace wspush::server {
namespace {

/// A scrape-time sum over the shards of what `pick` reads from each.
template <class Pick>
std::function<double()> sum_over(const std::vector<shard*>& shards, Pick pick) {
  return [shards, pick] {
    std::uint64_t total = 0;
    for (const shard* s : shards) total += pick(*s);
    return double(total);
  };
}

std::function<double()> conn_sum(const std::vector<shard*>& shards, relaxed_counter conn_counters::*member) {
  return sum_over(shards, [member](const shard& s) { return (s.conn_stats().*member).get(); });
}

std::function<double()> pubsub_sum(const std::vector<shard*>& shards, relaxed_counter pubsub::pubsub_counters::*member) {
  return sum_over(shards, [member](const shard& s) { return s.pubsub_stats() ? (s.pubsub_stats()->*member).get() : 0; });
}

std::function<double()> in_states(const std::vector<shard*>& shards, conn_state a, conn_state b) {
  return sum_over(shards, [a, b](const shard& s) {
    const conn_counters& n = s.conn_stats();
    return n.in_state[std::size_t(a)].get() + (a == b ? 0 : n.in_state[std::size_t(b)].get());
  });
}

void register_conn_series(metrics_registry& m, const std::vector<shard*>& shards) {
  // A pool worker's upgrade is still "upgrading" to an operator.
  m.add_gauge_fn("wspush_connections", in_states(shards, conn_state::upgrading, conn_state::upgrade_pending), {},
                 {{"state", "upgrading"}});
  m.add_gauge_fn("wspush_connections", in_states(shards, conn_state::open, conn_state::open), {}, {{"state", "open"}});
  m.add_gauge_fn("wspush_connections", in_states(shards, conn_state::closing, conn_state::dead), {},
                 {{"state", "closing"}});
  m.add_counter_fn("wspush_connections_accepted_total", conn_sum(shards, &conn_counters::accepted));
  m.add_gauge_fn("wspush_event_streams", conn_sum(shards, &conn_counters::streams_open));
  m.add_counter_fn("wspush_event_streams_opened_total", conn_sum(shards, &conn_counters::streams_opened));
  const std::pair<const char*, relaxed_counter conn_counters::*> upgrades[] = {
      {"ok", &conn_counters::upgrades_ok},
      {"bad_request", &conn_counters::upgrades_bad_request},
      {"unauthorized", &conn_counters::upgrades_unauthorized},
      {"over_capacity", &conn_counters::upgrades_over_capacity},
      {"timeout", &conn_counters::upgrades_timeout},
      {"error", &conn_counters::upgrades_error},
      {"rate_limited", &conn_counters::upgrades_rate_limited},
      {"user_limit", &conn_counters::upgrades_user_limit},
      {"revoked", &conn_counters::upgrades_revoked},
  };
  for (const auto& [result, member] : upgrades)
    m.add_counter_fn("wspush_upgrades_total", conn_sum(shards, member), {}, {{"result", result}});
  m.add_counter_fn("wspush_messages_in_total", conn_sum(shards, &conn_counters::messages_in));
  m.add_counter_fn("wspush_messages_out_total", conn_sum(shards, &conn_counters::messages_out));
  m.add_counter_fn("wspush_bytes_in_total", conn_sum(shards, &conn_counters::bytes_in));
  m.add_counter_fn("wspush_bytes_out_total", conn_sum(shards, &conn_counters::bytes_out));
  m.add_counter_fn("wspush_socket_sends_total", conn_sum(shards, &conn_counters::sends));
  m.add_counter_fn("wspush_slow_consumer_closes_total", conn_sum(shards, &conn_counters::slow_consumer_closes));
  m.add_counter_fn("wspush_lifetime_closes_total", conn_sum(shards, &conn_counters::lifetime_closes));
  m.add_counter_fn("wspush_held_input_bytes_total", conn_sum(shards, &conn_counters::held_input_bytes));
}

void register_pool_series(metrics_registry& m, pool::task_pool& tasks) {
  pool::task_pool* p = &tasks;
  m.add_gauge_fn("wspush_pool_workers", [p] { return double(p->stats().workers); });
  m.add_gauge_fn("wspush_pool_busy_workers", [p] { return double(p->stats().busy_workers); });
  m.add_gauge_fn("wspush_pool_queue_length", [p] { return double(p->stats().queue_length); });
  m.add_gauge_fn("wspush_pool_waiting_schedulers", [p] { return double(p->stats().waiting_schedulers); });
  m.add_counter_fn("wspush_pool_tasks_failed_total", [p] { return double(p->stats().failed); });
  m.add_histogram_fn("wspush_pool_task_duration_seconds", [p] {
    pool::pool_stats s = p->stats();
    histogram_snapshot h;
    h.bounds = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};  // pool_stats' buckets, the last is +Inf
    h.counts.assign(s.duration_hist.begin(), s.duration_hist.end());
    h.sum = s.duration_sum_seconds;
    return h;
  });
}

void register_lag_series(metrics_registry& m, const std::vector<shard*>& shards) {
  m.add_histogram_fn("wspush_reactor_loop_lag_seconds", [shards] {
    histogram_snapshot h;
    for (std::uint64_t b : loop_counters::lag_bounds_ns) h.bounds.push_back(double(b) / 1e9);
    h.counts.assign(std::size(loop_counters::lag_bounds_ns) + 1, 0);  // the last is +Inf
    std::uint64_t sum_ns = 0;
    for (const shard* s : shards) {
      for (std::size_t b = 0; b < h.counts.size(); ++b) h.counts[b] += s->loop_stats().lag_buckets[b].get();
      sum_ns += s->loop_stats().lag_sum_ns.get();
    }
    h.sum = double(sum_ns) / 1e9;
    return h;
  });
}

}  // namespace

void register_bus_metrics(metrics_registry& m, bus::redis_bus& b, const std::vector<shard*>& shards) {
  bus::redis_bus* p = &b;
  m.add_gauge_fn("wspush_bus_up", [p] { return p->up() ? 1.0 : 0.0; });
  m.add_gauge_fn("wspush_bus_stalled", [p] { return p->stalled() ? 1.0 : 0.0; });
  for (std::size_t k = 0; k < p->redis_count(); ++k) {
    const auto& t = p->target(k);
    m.add_gauge_fn("wspush_bus_redis_up", [p, k] { return p->up_at(k) ? 1.0 : 0.0; }, {},
                   {{"redis", (t.host.empty() ? std::string("sentinel") : t.host + ':' + std::to_string(t.port)) + '/' +
                                  std::to_string(t.db)}});
  }
  m.add_gauge_fn("wspush_bus_topics", [p] { return double(p->counters().topics.get()); });
  m.add_gauge_fn("wspush_bus_held_subs", [p] { return double(p->counters().held.get()); });
  m.add_counter_fn("wspush_bus_lost_notices_total", [p] { return double(p->counters().lost_notices.get()); });
  m.add_counter_fn("wspush_bus_marks_total", [p] { return double(p->counters().marks.get()); });
  m.add_counter_fn("wspush_bus_pubs_refused_total", [p] { return double(p->counters().pubs_refused.get()); });
  m.add_counter_fn("wspush_bus_unreplicated_total", [p] { return double(p->counters().unreplicated.get()); });
  m.add_gauge_fn("wspush_bus_pending", [p] { return double(p->counters().pending.get()); });
  m.add_gauge_fn("wspush_bus_replays_paced", [p] { return double(p->counters().paced.get()); });
  m.add_gauge_fn("wspush_bus_waiting_topics", pubsub_sum(shards, &pubsub::pubsub_counters::waiting_topics));
  m.add_counter_fn("wspush_bus_events_total", [p] { return double(p->counters().events_in.get()); });
  m.add_counter_fn("wspush_bus_malformed_total", [p] { return double(p->counters().malformed.get()); });
  m.add_counter_fn("wspush_bus_protocol_errors_total", [p] { return double(p->counters().protocol_errors.get()); });
  m.add_counter_fn("wspush_bus_reconnects_total", [p] { return double(p->counters().reconnects.get()); });
  m.add_counter_fn("wspush_bus_commands_total", [p] { return double(p->counters().subscribes.get()); }, {},
                   {{"command", "subscribe"}});
  m.add_counter_fn("wspush_bus_commands_total", [p] { return double(p->counters().unsubscribes.get()); }, {},
                   {{"command", "unsubscribe"}});
  m.add_counter_fn("wspush_bus_commands_total", [p] { return double(p->counters().publish_calls.get()); }, {},
                   {{"command", "publish"}});
  m.add_counter_fn("wspush_bus_dropped_total", [p] { return double(p->counters().dropped.get()); });
  m.add_counter_fn("wspush_bus_catchup_events_total", [p] { return double(p->counters().catchup_events.get()); });
}

void register_tls_metrics(metrics_registry& m, const std::vector<shard*>& shards) {
  for (std::size_t k = 0; k < std::size_t(tls_result::count_); ++k) {
    const auto r = tls_result(k);
    m.add_counter_fn("wspush_tls_handshakes_total", sum_over(shards, [r](const shard& s) { return s.tls_stats().get(r); }),
                     {}, {{"result", tls_result_name(r)}});
  }
  m.add_counter_fn("wspush_tls_kernel_tx_total",
                   sum_over(shards, [](const shard& s) { return s.tls_stats().kernel_handed.get(); }), {},
                   {{"result", "handed"}});
  m.add_counter_fn("wspush_tls_kernel_tx_total",
                   sum_over(shards, [](const shard& s) { return s.tls_stats().kernel_fallback.get(); }), {},
                   {{"result", "fallback"}});
}

void register_pubsub_metrics(metrics_registry& m, const std::vector<shard*>& shards, pubsub::hub& hub) {
  using pc = pubsub::pubsub_counters;
  pubsub::hub* h = &hub;
  // The admin listener counts its own publishes (source="admin"); these are the clients' `pub`.
  const std::pair<const char*, relaxed_counter pc::*> client_pubs[] = {
      {"ok", &pc::client_pubs_ok},
      {"forbidden", &pc::client_pubs_forbidden},
      {"unavailable", &pc::client_pubs_unavailable},
      {"timeout", &pc::client_pubs_timeout},
  };
  for (const auto& [result, member] : client_pubs)
    m.add_counter_fn("wspush_publishes_total", pubsub_sum(shards, member), {}, {{"source", "client"}, {"result", result}});
  m.add_counter_fn("wspush_fanout_deliveries_total", pubsub_sum(shards, &pc::deliveries));
  m.add_counter_fn("wspush_messages_dropped_total", pubsub_sum(shards, &pc::drops_slow), {},
                   {{"reason", "slow_consumer"}});
  m.add_counter_fn("wspush_messages_dropped_total", pubsub_sum(shards, &pc::drops_closed), {}, {{"reason", "closed"}});
  m.add_counter_fn("wspush_messages_dropped_total", [h] { return double(h->dropped()); }, {},
                   {{"reason", "shard_unavailable"}});
  m.add_counter_fn("wspush_client_errors_total", pubsub_sum(shards, &pc::client_errors));
  m.add_counter_fn("wspush_client_messages_rate_limited_total", pubsub_sum(shards, &pc::client_rate_limited));
  m.add_counter_fn("wspush_token_expired_closes_total", pubsub_sum(shards, &pc::token_expired_closes));
  m.add_counter_fn("wspush_revoked_connections_total", pubsub_sum(shards, &pc::revoked_closes));
  m.add_gauge_fn("wspush_topics", pubsub_sum(shards, &pc::topics));
  m.add_gauge_fn("wspush_subscriptions", pubsub_sum(shards, &pc::subscriptions));
  m.add_gauge_fn("wspush_history_messages", [h] { return double(h->events().stats().entries); });
  m.add_gauge_fn("wspush_history_bytes", [h] { return double(h->events().stats().bytes); });
  m.add_gauge_fn("wspush_history_topics", [h] { return double(h->events().stats().topics); });
  m.add_gauge_fn("wspush_idempotency_keys", [h] { return double(h->events().stats().idempotency_keys); });
  m.add_counter_fn("wspush_idempotent_duplicates_total", [h] { return double(h->events().stats().duplicates); });
  m.add_counter_fn("wspush_history_evictions_total", [h] { return double(h->events().stats().evicted_size); }, {},
                   {{"cause", "size"}});
  m.add_counter_fn("wspush_history_evictions_total", [h] { return double(h->events().stats().evicted_ttl); }, {},
                   {{"cause", "ttl"}});
  m.add_counter_fn("wspush_history_evictions_total", [h] { return double(h->events().stats().evicted_memory); }, {},
                   {{"cause", "memory"}});
}

void register_compression_metrics(metrics_registry& m, const std::vector<shard*>& shards, const compression& z) {
  const compression* p = &z;
  m.add_gauge_fn("wspush_compression_connections", [p] { return double(p->users()); });
  m.add_counter_fn("wspush_compressed_events_total", [p] { return double(p->frames()); });
  m.add_counter_fn("wspush_compression_bytes_total", [p] { return double(p->bytes_in()); }, {}, {{"stage", "before"}});
  m.add_counter_fn("wspush_compression_bytes_total", [p] { return double(p->bytes_out()); }, {}, {{"stage", "after"}});
  m.add_counter_fn("wspush_messages_in_compressed_total", conn_sum(shards, &conn_counters::messages_in_compressed));
}

void register_process_metrics(metrics_registry& m, const std::vector<shard*>& shards, pool::task_pool& tasks) {
  register_conn_series(m, shards);
  register_lag_series(m, shards);
  register_pool_series(m, tasks);
}

void register_presence_metrics(metrics_registry& m, const std::vector<shard*>& shards,
                               const pubsub::presence_table& table, const bus::redis_bus* bus) {
  using pc = pubsub::pubsub_counters;
  const pubsub::presence_table* t = &table;
  m.add_gauge_fn("wspush_presence_topics", [t] { return double(t->topics()); });
  m.add_gauge_fn("wspush_presence_users", [t] { return double(t->entries()); });
  const auto events = [&](relaxed_counter pc::*embedded, relaxed_counter bus::redis_bus_counters::*redis) {
    return bus ? std::function<double()>([bus, redis] { return double((bus->counters().*redis).get()); })
               : std::function<double()>(pubsub_sum(shards, embedded));
  };
  m.add_counter_fn("wspush_presence_events_total", events(&pc::joins, &bus::redis_bus_counters::joins), {},
                   {{"kind", "join"}});
  m.add_counter_fn("wspush_presence_events_total", events(&pc::leaves, &bus::redis_bus_counters::leaves), {},
                   {{"kind", "leave"}});
  m.add_counter_fn("wspush_presence_failures_total", pubsub_sum(shards, &pc::presence_failures));
}

void register_revoke_metrics(metrics_registry& m, revocation_list& list) {
  m.add_gauge_fn("wspush_revocations", [&list] { return double(list.size(std::int64_t(std::time(nullptr)))); });
}

}  // namespace wspush::server
