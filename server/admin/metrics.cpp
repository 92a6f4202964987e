#include "server/admin/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace wspush::server {
namespace {

using mt = metric_type;

// The documented list (docs/METRICS.md mirrors it; a test checks that every name is there).
constexpr metric_info k_standard[] = {
    {"wspush_connections", mt::gauge, "state", "Open TCP connections by state (upgrading, open, closing)."},
    {"wspush_connections_accepted_total", mt::counter, "", "TCP connections accepted on the public listener."},
    {"wspush_upgrades_total", mt::counter, "result",
     "WebSocket upgrades by result (ok, bad_request, unauthorized, over_capacity, timeout)."},
    {"wspush_tls_handshakes_total", mt::counter, "result",
     "TLS handshakes on the public listener by result (ok, resumed, plain_http, bad_hello, failed, incomplete, "
     "timeout; after one: renegotiation, truncated, bad_record)."},
    {"wspush_tls_kernel_tx_total", mt::counter, "result",
     "TLS connections whose transmit side was handed to kernel TLS after the handshake (handed), or stayed in "
     "user space because the kernel refused it (fallback)."},
    {"wspush_bus_up", mt::gauge, "",
     "1 while the Redis bus is connected and ready on every Redis it spans, 0 while it is not (--bus=redis://...)."},
    {"wspush_bus_redis_up", mt::gauge, "redis",
     "Per Redis of the bus (host:port/db; isolated shards: one each): 1 while it is connected and ready, 0 while "
     "not. The topics of a Redis that is down are refused; the others go on."},
    {"wspush_bus_topics", mt::gauge, "", "Topic channels this node is subscribed to in Redis."},
    {"wspush_bus_waiting_topics", mt::gauge, "",
     "Topics the reactors hold for subs Redis has not answered yet, summed over the reactors."},
    {"wspush_bus_events_total", mt::counter, "", "Publishes this node received from Redis."},
    {"wspush_bus_malformed_total", mt::counter, "", "Messages found in Redis that were not a wspush event: counted and skipped."},
    {"wspush_bus_protocol_errors_total", mt::counter, "",
     "Replies from Redis that broke RESP, a bound or the order of replies: each dropped its link (reconnected)."},
    {"wspush_bus_stalled", mt::gauge, "",
     "1 while a command to Redis has waited longer than --redis-timeout for its answer, else 0."},
    {"wspush_bus_reconnects_total", mt::counter, "", "Connections to Redis made again after one was lost."},
    {"wspush_bus_commands_total", mt::counter, "command",
     "SUBSCRIBE and UNSUBSCRIBE commands sent to Redis (each carries up to 1000 channels)."},
    {"wspush_bus_dropped_total", mt::counter, "", "Events from Redis a shard's inbox could not take (its backlog full)."},
    {"wspush_bus_catchup_events_total", mt::counter, "",
     "Events replayed after a reconnect to the subscribers that stayed connected through a Redis outage."},
    {"wspush_messages_in_total", mt::counter, "", "WebSocket messages received from clients."},
    {"wspush_messages_out_total", mt::counter, "", "WebSocket messages queued to clients (one per receiver)."},
    {"wspush_bytes_in_total", mt::counter, "", "Bytes received on WebSocket connections (frames included)."},
    {"wspush_bytes_out_total", mt::counter, "", "Bytes sent on WebSocket connections (frames included)."},
    {"wspush_publishes_total", mt::counter, "source,result",
     "Publishes by source (admin, client) and result (ok, bad_request, forbidden, unavailable, timeout)."},
    {"wspush_fanout_deliveries_total", mt::counter, "", "Published events queued to a subscriber connection."},
    {"wspush_messages_dropped_total", mt::counter, "reason",
     "Events not delivered by reason (slow_consumer, closed, shard_unavailable)."},
    {"wspush_slow_consumer_closes_total", mt::counter, "",
     "Connections closed with 1013 because the output they left unread passed --max-pending-bytes."},
    {"wspush_held_input_bytes_total", mt::counter, "",
     "Bytes read from connections the application held (a sub or pubs waiting for the bus) and kept until it resumed them."},
    {"wspush_socket_sends_total", mt::counter, "",
     "Writes to client sockets (one per sendmsg or io_uring send); several queued frames leave in one."},
    {"wspush_client_errors_total", mt::counter, "", "Client messages refused with an error reply (bad_json, forbidden...)."},
    {"wspush_token_expired_closes_total", mt::counter, "", "Connections closed with 1008 because their token expired."},
    {"wspush_topics", mt::gauge, "",
     "Topics with at least one subscriber, summed over the reactors (a topic on two counts twice)."},
    {"wspush_subscriptions", mt::gauge, "", "Subscriptions (connection, topic) on this node."},
    {"wspush_history_messages", mt::gauge, "", "Messages held in the topic histories."},
    {"wspush_history_bytes", mt::gauge, "", "Bytes held in the topic histories."},
    {"wspush_history_topics", mt::gauge, "", "Topics with a non-empty history."},
    {"wspush_idempotency_keys", mt::gauge, "", "Idempotency keys the embedded bus remembers (within --idempotency-window)."},
    {"wspush_idempotent_duplicates_total", mt::counter, "",
     "Publishes the embedded bus answered with an earlier publish's id: their idempotency key was published within the window."},
    {"wspush_history_evictions_total", mt::counter, "cause",
     "Messages that left the history early, by cause (size, ttl, memory)."},
    {"wspush_pool_workers", mt::gauge, "", "Task pool worker threads alive."},
    {"wspush_pool_busy_workers", mt::gauge, "", "Task pool workers running a task."},
    {"wspush_pool_queue_length", mt::gauge, "", "Tasks queued in the pool, not yet picked up."},
    {"wspush_pool_waiting_schedulers", mt::gauge, "", "Threads waiting for room in the pool's queue."},
    {"wspush_pool_tasks_failed_total", mt::counter, "", "Pool tasks that threw (contained and logged)."},
    {"wspush_pool_task_duration_seconds", mt::histogram, "", "Time a pool worker spent on one task."},
    {"wspush_reactor_loop_lag_seconds", mt::histogram, "",
     "How long a reactor worked after each wake-up before it could wait again: how long a new event may wait for it."},
    {"wspush_admin_requests_total", mt::counter, "code", "Admin API requests answered, by status class (2xx, 4xx, 5xx)."},
    {"wspush_admin_connections", mt::gauge, "", "Open connections on the admin listener."},
    {"wspush_admin_connections_evicted_total", mt::counter, "",
     "Admin connections without the API key closed to make room for a new connection."},
    {"wspush_draining", mt::gauge, "", "1 while the server drains (readyz answers 503), else 0."},
    {"wspush_admin_publishes_waiting", mt::gauge, "", "Admin publishes handed to the bus and not yet answered."},
};

bool is_metric_name(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool is_label_name(std::string_view s) noexcept {
  return is_metric_name(s) && s.find(':') == std::string_view::npos && s.substr(0, 2) != "__";
}

/// Label values escape backslash, double quote and line feed; HELP text only the first and last.
void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
}

void append_double(std::string& out, double v) {
  if (std::isnan(v)) return void(out += "NaN");
  if (std::isinf(v)) return void(out += v > 0 ? "+Inf" : "-Inf");
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// `a="x",b="y"` for a label set, checked.
std::string render_labels(metric_labels labels, metric_type type) {
  std::string out;
  std::vector<std::string_view> seen;
  for (const auto& [name, value] : labels) {
    if (!is_label_name(name) || (type == metric_type::histogram && name == "le"))
      throw std::invalid_argument("bad metric label name: " + std::string(name));
    if (std::find(seen.begin(), seen.end(), name) != seen.end())
      throw std::invalid_argument("repeated metric label: " + std::string(name));
    seen.push_back(name);
    if (!out.empty()) out += ',';
    out.append(name);
    out += "=\"";
    append_escaped(out, value, true);
    out += '"';
  }
  return out;
}

const char* type_name(metric_type t) noexcept {
  switch (t) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

// ---- histogram ------------------------------------------------------------------------------

histogram::histogram(std::span<const double> bounds) : _bounds(bounds.begin(), bounds.end()) {
  for (std::size_t i = 0; i < _bounds.size(); ++i)
    if (!std::isfinite(_bounds[i]) || (i > 0 && _bounds[i] <= _bounds[i - 1]))
      throw std::invalid_argument("histogram bounds must be finite and ascending");
  _counts = std::make_unique<std::atomic<std::uint64_t>[]>(_bounds.size() + 1);
}

void histogram::observe(double v) noexcept {
  if (std::isnan(v)) return;  // no bucket can hold it, and it would poison the sum
  const auto at = std::lower_bound(_bounds.begin(), _bounds.end(), v) - _bounds.begin();
  _counts[static_cast<std::size_t>(at)].fetch_add(1, std::memory_order_relaxed);
  _sum.fetch_add(v, std::memory_order_relaxed);
}

histogram_snapshot histogram::snapshot() const {
  histogram_snapshot s{_bounds, std::vector<std::uint64_t>(_bounds.size() + 1), _sum.load(std::memory_order_relaxed)};
  for (std::size_t i = 0; i <= _bounds.size(); ++i) s.counts[i] = _counts[i].load(std::memory_order_relaxed);
  return s;
}

// ---- the list -------------------------------------------------------------------------------

std::span<const metric_info> standard_metrics() noexcept { return k_standard; }

const metric_info* find_standard_metric(std::string_view name) noexcept {
  for (const metric_info& m : k_standard)
    if (m.name == name) return &m;
  return nullptr;
}

// ---- registry -------------------------------------------------------------------------------

struct metrics_registry::series {
  std::string labels;  // rendered, empty for none
  std::unique_ptr<counter> owned_counter;
  std::unique_ptr<gauge> owned_gauge;
  std::unique_ptr<histogram> owned_histogram;
  std::function<double()> value_fn;
  std::function<histogram_snapshot()> histogram_fn;
};

struct metrics_registry::family {
  std::string name, help;
  metric_type type;
  std::vector<std::unique_ptr<series>> members;
};

metrics_registry::metrics_registry() = default;
metrics_registry::~metrics_registry() = default;

metrics_registry::series& metrics_registry::add_series(std::string_view name, metric_type type,
                                                       std::string_view help, metric_labels labels) {
  if (!is_metric_name(name)) throw std::invalid_argument("bad metric name: " + std::string(name));
  if (help.empty())
    if (const metric_info* m = find_standard_metric(name)) help = m->help;
  std::string rendered = render_labels(labels, type);
  std::lock_guard lock(_mu);
  auto it = std::find_if(_families.begin(), _families.end(), [&](const auto& f) { return f->name == name; });
  if (it == _families.end()) {
    _families.push_back(std::make_unique<family>(family{std::string(name), std::string(help), type, {}}));
    it = _families.end() - 1;
  }
  family& f = **it;
  if (f.type != type) throw std::invalid_argument("metric registered with two types: " + std::string(name));
  for (const auto& s : f.members)
    if (s->labels == rendered) throw std::invalid_argument("metric series registered twice: " + std::string(name));
  f.members.push_back(std::make_unique<series>());
  f.members.back()->labels = std::move(rendered);
  return *f.members.back();
}

counter& metrics_registry::add_counter(std::string_view name, std::string_view help, metric_labels labels) {
  series& s = add_series(name, metric_type::counter, help, labels);
  s.owned_counter = std::make_unique<counter>();
  return *s.owned_counter;
}

gauge& metrics_registry::add_gauge(std::string_view name, std::string_view help, metric_labels labels) {
  series& s = add_series(name, metric_type::gauge, help, labels);
  s.owned_gauge = std::make_unique<gauge>();
  return *s.owned_gauge;
}

histogram& metrics_registry::add_histogram(std::string_view name, std::span<const double> bounds,
                                           std::string_view help, metric_labels labels) {
  auto h = std::make_unique<histogram>(bounds);  // checks the bounds before anything is added
  series& s = add_series(name, metric_type::histogram, help, labels);
  s.owned_histogram = std::move(h);
  return *s.owned_histogram;
}

void metrics_registry::add_counter_fn(std::string_view name, std::function<double()> fn, std::string_view help,
                                      metric_labels labels) {
  add_series(name, metric_type::counter, help, labels).value_fn = std::move(fn);
}

void metrics_registry::add_gauge_fn(std::string_view name, std::function<double()> fn, std::string_view help,
                                    metric_labels labels) {
  add_series(name, metric_type::gauge, help, labels).value_fn = std::move(fn);
}

void metrics_registry::add_histogram_fn(std::string_view name, std::function<histogram_snapshot()> fn,
                                        std::string_view help, metric_labels labels) {
  add_series(name, metric_type::histogram, help, labels).histogram_fn = std::move(fn);
}

namespace {

/// `name{labels}` or `name{labels,extra}`, then a space.
void append_sample_start(std::string& out, std::string_view name, std::string_view suffix, std::string_view labels,
                         std::string_view extra = {}) {
  out.append(name);
  out.append(suffix);
  if (!labels.empty() || !extra.empty()) {
    out += '{';
    out.append(labels);
    if (!labels.empty() && !extra.empty()) out += ',';
    out.append(extra);
    out += '}';
  }
  out += ' ';
}

void render_histogram(std::string& out, std::string_view name, std::string_view labels, const histogram_snapshot& h) {
  if (h.counts.size() != h.bounds.size() + 1) return;  // a malformed snapshot: better absent than wrong
  std::uint64_t cumulative = 0;
  std::string le;
  for (std::size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    le = "le=\"";
    if (i < h.bounds.size()) append_double(le, h.bounds[i]);
    else le += "+Inf";
    le += '"';
    append_sample_start(out, name, "_bucket", labels, le);
    append_uint(out, cumulative);
    out += '\n';
  }
  append_sample_start(out, name, "_sum", labels);
  append_double(out, h.sum);
  out += '\n';
  append_sample_start(out, name, "_count", labels);
  append_uint(out, cumulative);  // equal to the +Inf bucket by construction
  out += '\n';
}

}  // namespace

void metrics_registry::render(std::string& out) const {
  std::lock_guard lock(_mu);
  for (const auto& f : _families) {
    if (!f->help.empty()) {
      out += "# HELP ";
      out += f->name;
      out += ' ';
      append_escaped(out, f->help, false);
      out += '\n';
    }
    out += "# TYPE ";
    out += f->name;
    out += ' ';
    out += type_name(f->type);
    out += '\n';
    for (const auto& s : f->members) {
      if (f->type == metric_type::histogram) {
        render_histogram(out, f->name, s->labels, s->owned_histogram ? s->owned_histogram->snapshot() : s->histogram_fn());
        continue;
      }
      append_sample_start(out, f->name, {}, s->labels);
      if (s->owned_counter) append_uint(out, s->owned_counter->value());
      else if (s->owned_gauge) append_double(out, s->owned_gauge->value());
      else append_double(out, s->value_fn());
      out += '\n';
    }
  }
}

}  // namespace wspush::server
