/// \file report.cpp
/// The human summary and the JSON object.
#include "loadgen/report.hpp"

#include <algorithm>
#include <cmath>

namespace wspush::loadgen {

double run_result::rss_per_conn() const noexcept {
  if (!before.ok || !loaded.ok || held == 0) return -1;
  return (static_cast<double>(loaded.vmrss) - static_cast<double>(before.vmrss)) / static_cast<double>(held);
}

double run_result::slab_per_conn() const noexcept {
  if (!before.ok || !loaded.ok || held == 0) return -1;
  return (static_cast<double>(loaded.slab) - static_cast<double>(before.slab)) / static_cast<double>(held);
}

double run_result::cpu_per_delivery_us() const noexcept {
  if (!loaded.ok || !end.ok || totals[ctr::deliveries] == 0) return -1;
  return static_cast<double>(end.cpu_ns - loaded.cpu_ns) / static_cast<double>(totals[ctr::deliveries]) / 1e3;
}

namespace {

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1e3; }

/// "refused=3, http_503=2" for the non-zero connect errors.
std::string error_list(const counters& t, const char* sep, bool quote) {
  std::string out;
  for (auto c = static_cast<std::size_t>(ctr::err_refused); c <= static_cast<std::size_t>(ctr::http_other); ++c) {
    if (t.v[c] == 0) continue;
    if (!out.empty()) out += quote ? "," : ", ";
    const std::string name(ctr_names[c]);
    out += (quote ? "\"" + name + "\"" : name) + sep + std::to_string(t.v[c]);
  }
  return out;
}

void latency_line(std::FILE* out, const char* what, const histogram& h) {
  std::fprintf(out, "  %s µs: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  (n=%llu)\n", what,
               us(h.quantile(0.5)), us(h.quantile(0.9)), us(h.quantile(0.99)), us(h.quantile(0.999)), us(h.max()),
               static_cast<unsigned long long>(h.total()));
}

}  // namespace

void print_text(std::FILE* out, const run_result& r) {
  const options& o = *r.o;
  const counters& t = r.totals;
  auto n = [&](ctr c) { return static_cast<unsigned long long>(t[c]); };
  std::fprintf(out, "%s %s (%s%s): %s\n", std::string(scenario_name(o.sc)).c_str(), o.url.c_str(),
               o.proto == protocol::pubsub ? "pubsub" : "broadcast",
               o.transport == transport_kind::sse ? ", event streams" : "", r.ok() ? "ok" : "FAILED");
  for (const std::string& p : r.problems) std::fprintf(out, "  problem: %s\n", p.c_str());
  std::fprintf(out, "  connections %u over %u procs: upgraded %llu, open at end %llu, in %.2f s", o.connections,
               o.procs, n(ctr::connected), n(ctr::open), r.connect_s);
  const std::string errs = error_list(t, "=", false);
  if (!errs.empty()) std::fprintf(out, "; errors: %s", errs.c_str());
  if (t.first_status != 0) std::fprintf(out, " (first refusal: HTTP %lld)", static_cast<long long>(t.first_status));
  if (t.first_errno != 0) std::fprintf(out, " (first other errno: %lld)", static_cast<long long>(t.first_errno));
  std::fprintf(out, "\n");
  latency_line(out, "connect", *r.connect);
  if (o.compression)
    std::fprintf(out, "  permessage-deflate: negotiated on %llu upgrades; %llu messages came compressed\n",
                 n(ctr::deflate_conns), n(ctr::compressed));
  if (o.tls)
    std::fprintf(out, "  TLS: %llu handshakes (%llu failed), %.0f handshakes/s over the connect phase\n",
                 n(ctr::tls_handshakes), n(ctr::err_tls),
                 r.connect_s > 0 ? static_cast<double>(n(ctr::tls_handshakes)) / r.connect_s : 0.0);
  std::fprintf(out, "  disconnects %llu, server closes %llu (1001: %llu, 1013: %llu), reconnects %llu, protocol errors %llu\n",
               n(ctr::disconnects), n(ctr::server_closes), n(ctr::close_1001), n(ctr::close_1013), n(ctr::reconnects),
               n(ctr::protocol_errors));
  if (r.rss_per_conn() >= 0) {
    std::fprintf(out, "  server memory: VmRSS %.1f → %.1f MiB, %.0f B per connection; kernel slab %.0f B per connection\n",
                 static_cast<double>(r.before.vmrss) / 1048576.0, static_cast<double>(r.loaded.vmrss) / 1048576.0,
                 r.rss_per_conn(), r.slab_per_conn());
  }
  if (!o.publishes()) return;
  std::fprintf(out, "  published %llu x %u B (errors %llu); delivered %llu of %llu expected: loss %llu, duplicates %llu, "
               "gaps %llu, reordered %llu, foreign %llu\n",
               n(ctr::sent), o.size, n(ctr::publish_errors), n(ctr::unique), n(ctr::expected),
               static_cast<unsigned long long>(t.loss()), n(ctr::duplicates), n(ctr::gaps), n(ctr::reordered),
               n(ctr::foreign));
  if (t.loss() > 0 || n(ctr::lost_notices) > 0)
    std::fprintf(out, "  told lost: %llu notices, %llu subbed; missing where nothing said so: %llu (publishes answered "
                 "504 and not sent again: %llu)\n",
                 n(ctr::lost_notices), n(ctr::lost_reported), n(ctr::untold_loss), n(ctr::publish_unknown));
  if (r.settle_s >= 0) std::fprintf(out, "  first publish %.3f s after the last connection was up\n", r.settle_s);
  std::fprintf(out, "  %.3f s from first publish to last delivery, %.0f deliveries/s\n", r.publish_s,
               r.deliveries_per_s());
  latency_line(out, "latency", *r.latency);
  if (r.cpu_per_delivery_us() >= 0) std::fprintf(out, "  server CPU %.3f µs per delivery\n", r.cpu_per_delivery_us());
  for (const step_result& st : r.steps) {
    std::fprintf(out, "  step %.0f/s: %llu sent in %.2f s, %llu of %llu delivered, loss %llu, duplicates %llu, latency p50 %.2f ms "
                 "p99 %.2f ms max %.2f ms\n", st.rate, static_cast<unsigned long long>(st.sent), st.publish_s(),
                 static_cast<unsigned long long>(st.delivered), static_cast<unsigned long long>(st.expected),
                 static_cast<unsigned long long>(st.loss()), static_cast<unsigned long long>(st.duplicates),
                 us(st.latency->quantile(0.5)) / 1e3,
                 us(st.latency->quantile(0.99)) / 1e3, us(st.latency->max()) / 1e3);
  }
  if (r.storm_back_s >= 0) {
    std::fprintf(out, "  storm: all back %.3f s after the first drop; subbed with lost topics: %llu\n", r.storm_back_s,
                 n(ctr::lost_reported));
  }
}

void print_json(std::FILE* out, const run_result& r) {
  const options& o = *r.o;
  const counters& t = r.totals;
  std::fprintf(out, "{\"scenario\":\"%s\",\"protocol\":\"%s\",\"transport\":\"%s\",\"url\":\"%s\",\"ok\":%s,\"started\":\"%s\",",
               std::string(scenario_name(o.sc)).c_str(), o.proto == protocol::pubsub ? "pubsub" : "broadcast",
               o.transport == transport_kind::sse ? "sse" : "ws", o.url.c_str(), r.ok() ? "true" : "false", r.started_utc.c_str());
  std::fprintf(out, "\"problems\":[");
  for (std::size_t i = 0; i < r.problems.size(); ++i) std::fprintf(out, "%s\"%s\"", i ? "," : "", r.problems[i].c_str());
  std::fprintf(out, "],\"connections\":%u,\"procs\":%u,\"size\":%u,\"connect_s\":%.3f,\"settle_s\":%.3f,\"publish_s\":%.6f,"
               "\"deliveries_per_s\":%.1f,\"loss\":%llu,\"connect_errors\":{%s},",
               o.connections, o.procs, o.size, r.connect_s, r.settle_s, r.publish_s, r.deliveries_per_s(),
               static_cast<unsigned long long>(t.loss()), error_list(t, ":", true).c_str());
  std::fprintf(out, "\"counters\":{");
  for (std::size_t c = 0; c < t.v.size(); ++c) {
    std::fprintf(out, "%s\"%s\":%llu", c ? "," : "", std::string(ctr_names[c]).c_str(),
                 static_cast<unsigned long long>(t.v[c]));
  }
  std::fprintf(out, "},");
  for (const auto& [name, h] : {std::pair{"latency_us", r.latency}, std::pair{"connect_us", r.connect}}) {
    std::fprintf(out, "\"%s\":{\"count\":%llu,\"mean\":%.1f,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"p999\":%.1f,"
                 "\"max\":%.1f},",
                 name, static_cast<unsigned long long>(h->total()), h->mean() / 1e3, us(h->quantile(0.5)),
                 us(h->quantile(0.9)), us(h->quantile(0.99)), us(h->quantile(0.999)), us(h->max()));
  }
  std::fprintf(out, "\"server\":{\"measured\":%s,\"rss_before\":%llu,\"rss_loaded\":%llu,\"held\":%llu,"
               "\"rss_per_conn\":%.1f,\"slab_per_conn\":%.1f,\"cpu_per_delivery_us\":%.4f},",
               r.rss_per_conn() >= 0 ? "true" : "false", static_cast<unsigned long long>(r.before.vmrss),
               static_cast<unsigned long long>(r.loaded.vmrss), static_cast<unsigned long long>(r.held),
               r.rss_per_conn(), r.slab_per_conn(), r.cpu_per_delivery_us());
  std::fprintf(out, "\"steps\":[");
  for (std::size_t k = 0; k < r.steps.size(); ++k) {
    const step_result& st = r.steps[k];
    std::fprintf(out, "%s{\"rate\":%.3f,\"messages\":%llu,\"sent\":%llu,\"expected\":%llu,\"delivered\":%llu,\"loss\":%llu,"
                 "\"duplicates\":%llu,\"publish_s\":%.3f,\"first_send_s\":%.6f,\"last_send_s\":%.6f,"
                 "\"latency_us\":{\"count\":%llu,\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f}}",
                 k ? "," : "", st.rate, static_cast<unsigned long long>(st.messages), static_cast<unsigned long long>(st.sent),
                 static_cast<unsigned long long>(st.expected), static_cast<unsigned long long>(st.delivered), static_cast<unsigned long long>(st.loss()),
                 static_cast<unsigned long long>(st.duplicates), st.publish_s(), static_cast<double>(st.first_send_ns) / 1e9,
                 static_cast<double>(st.last_send_ns) / 1e9, static_cast<unsigned long long>(st.latency->total()),
                 us(st.latency->quantile(0.5)), us(st.latency->quantile(0.99)), us(st.latency->max()));
  }
  std::fprintf(out, "],");
  std::fprintf(out, "\"storm_back_s\":%.3f,\"storm_left\":%llu,\"first_errno\":%lld,\"first_status\":%lld}\n",
               r.storm_back_s, static_cast<unsigned long long>(r.storm_left), static_cast<long long>(t.first_errno),
               static_cast<long long>(t.first_status));
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> histogram_bins(const histogram& h, std::size_t bins) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  if (h.total() == 0 || bins == 0) return out;
  const double lo = std::log(static_cast<double>(std::max<std::uint64_t>(h.min(), 1)));
  const double hi = std::log(static_cast<double>(std::max<std::uint64_t>(h.max(), 2))) + 1e-9;
  const double step = (hi - lo) / static_cast<double>(bins);
  out.resize(bins);
  for (std::size_t b = 0; b < bins; ++b) out[b].first = static_cast<std::uint64_t>(std::exp(lo + step * b));
  for (std::size_t i = 0; i < histogram::bucket_count; ++i) {
    const std::uint64_t n = h.count_at(i);
    if (n == 0) continue;
    const double v = std::log(static_cast<double>(std::max<std::uint64_t>(histogram::midpoint_of(i), 1)));
    auto b = static_cast<std::ptrdiff_t>((v - lo) / (step > 0 ? step : 1));
    b = std::clamp<std::ptrdiff_t>(b, 0, static_cast<std::ptrdiff_t>(bins) - 1);
    out[static_cast<std::size_t>(b)].second += n;
  }
  return out;
}

}  // namespace wspush::loadgen
