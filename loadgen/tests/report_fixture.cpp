/// Writes an HTML report from synthetic results (a ramp to 2,000 connections, then a minute of
/// deliveries with a latency spike), so the screenshot test needs no server.
///   loadgen_report_fixture OUT.html
#include "loadgen/report.hpp"

#include <cmath>
#include <cstdio>
#include <memory>

using namespace wspush::loadgen;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: loadgen_report_fixture OUT.html\n");
    return 2;
  }
  static options o;
  o.sc = scenario::fanout;
  o.url = "ws://127.0.0.1:8080/ws";
  o.connections = 2000;
  o.procs = 2;
  auto latency = std::make_unique<histogram>();
  auto connect = std::make_unique<histogram>();
  run_result r;
  r.o = &o;
  r.started_utc = "2026-11-21 00:00:00 UTC";
  for (int k = 0; k < 60; ++k) {
    timeline_point p;
    p.t_s = k + 1;
    p.open = p.ready = std::min(2000, 200 * (k + 1));
    p.deliveries = 2000ull * k;
    const double base = 1e6 * (1 + 0.5 * std::sin(k / 5.0)) * (k == 40 ? 20 : 1);
    p.lat_count = 2000;
    p.p50 = static_cast<std::uint64_t>(base);
    p.p90 = static_cast<std::uint64_t>(base * 2);
    p.p99 = static_cast<std::uint64_t>(base * 4);
    p.max = static_cast<std::uint64_t>(base * 9);
    r.timeline.push_back(p);
    for (int i = 0; i < 2000; ++i) latency->record(static_cast<std::uint64_t>(base * (0.5 + (i % 97) / 20.0)));
  }
  for (int i = 0; i < 2000; ++i) connect->record(200'000 + 1000 * (i % 300));
  r.latency = latency.get();
  r.connect = connect.get();
  r.totals[ctr::connected] = 2000;
  r.totals[ctr::sent] = 60;
  r.totals[ctr::expected] = r.totals[ctr::unique] = r.totals[ctr::deliveries] = 120'000;
  r.publish_s = 60;
  return write_html(argv[1], r) ? 0 : 1;
}
