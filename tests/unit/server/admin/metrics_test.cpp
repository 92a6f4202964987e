#include "server/admin/metrics.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "prom_check.hpp"

using namespace wspush::server;
using wspush::test::check_prometheus_text;

namespace {

std::string render(const metrics_registry& r) {
  std::string out;
  r.render(out);
  return out;
}

}  // namespace

TEST_CASE("metrics: the checker rejects what Prometheus would", "[metrics]") {
  const char* bad[] = {
      "a 1",                                                    // no final LF
      "1a 1\n",                                                 // bad name
      "a{b=\"x\" 1\n",                                          // unterminated labels
      "a{b=\"x\\q\"} 1\n",                                      // bad escape
      "a{b=\"x\",b=\"y\"} 1\n",                                 // repeated label
      "a one\n",                                                // bad value
      "a 1\na 2\n",                                             // repeated sample
      "a 1\nb 1\na{x=\"1\"} 1\n",                               // family not contiguous
      "a 1\n# TYPE a counter\n",                                // TYPE after samples
      "# TYPE a counter\n# TYPE a counter\na 1\n",              // second TYPE
      "# TYPE a widget\na 1\n",                                 // unknown type
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  // no +Inf
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
      "# HELP a x\\y\na 1\n",                                   // bad HELP escape
  };
  for (const char* text : bad) {
    INFO(text);
    CHECK_FALSE(check_prometheus_text(text).error.empty());
  }
  const auto ok = check_prometheus_text(
      "# HELP a A thing \\\\ with\\nlines.\n# TYPE a counter\na{x=\"q\\\"\\\\\\n\"} 3 1700000000000\n");
  CHECK(ok.error.empty());
  CHECK(ok.samples.at("a{x=\"q\\\"\\\\\\n\"}") == 3);
}

TEST_CASE("metrics: counters, gauges, label sets and escaping render as text format 0.0.4", "[metrics]") {
  metrics_registry r;
  counter& ok = r.add_counter("wspush_upgrades_total", {}, {{"result", "ok"}});
  counter& bad = r.add_counter("wspush_upgrades_total", {}, {{"result", "bad_request"}});
  gauge& g = r.add_gauge("test_gauge", "A gauge with \\ and\nnewline.", {{"path", "C:\\x \"q\"\n"}});
  ok.inc();
  ok.inc(41);
  bad.inc();
  g.set(-2.5);
  g.add(1);
  const std::string text = render(r);
  const auto p = check_prometheus_text(text);
  INFO(text);
  REQUIRE(p.error.empty());
  CHECK(p.types.at("wspush_upgrades_total") == "counter");
  CHECK(p.types.at("test_gauge") == "gauge");
  CHECK(p.samples.at("wspush_upgrades_total{result=\"ok\"}") == 42);
  CHECK(p.samples.at("wspush_upgrades_total{result=\"bad_request\"}") == 1);
  CHECK(p.samples.at("test_gauge{path=\"C:\\\\x \\\"q\\\"\\n\"}") == -1.5);
  // one HELP/TYPE for the family, the standard help text filled in
  CHECK(text.find("# HELP wspush_upgrades_total WebSocket upgrades by result") != std::string::npos);
  CHECK(text.find("# HELP test_gauge A gauge with \\\\ and\\nnewline.\n") != std::string::npos);
}

TEST_CASE("metrics: callbacks are evaluated at scrape time", "[metrics]") {
  metrics_registry r;
  double v = 1;
  std::uint64_t c = 7;
  r.add_gauge_fn("wspush_pool_queue_length", [&] { return v; });
  r.add_counter_fn("wspush_messages_in_total", [&] { return double(c); });
  r.add_gauge_fn("odd_values", [] { return std::nan(""); }, "NaN renders", {{"k", "nan"}});
  r.add_gauge_fn("odd_values", [] { return HUGE_VAL; }, "", {{"k", "inf"}});
  r.add_gauge_fn("odd_values", [] { return 1e300; }, "", {{"k", "big"}});
  auto p = check_prometheus_text(render(r));
  REQUIRE(p.error.empty());
  CHECK(p.samples.at("wspush_pool_queue_length") == 1);
  CHECK(p.samples.at("wspush_messages_in_total") == 7);
  CHECK(std::isnan(p.samples.at("odd_values{k=\"nan\"}")));
  CHECK(std::isinf(p.samples.at("odd_values{k=\"inf\"}")));
  CHECK(p.samples.at("odd_values{k=\"big\"}") == 1e300);
  v = 12.25;
  c = 9;
  p = check_prometheus_text(render(r));
  CHECK(p.samples.at("wspush_pool_queue_length") == 12.25);
  CHECK(p.samples.at("wspush_messages_in_total") == 9);
}

TEST_CASE("metrics: histograms, owned and by snapshot", "[metrics]") {
  metrics_registry r;
  const double bounds[] = {0.001, 0.01, 0.1, 1};
  histogram& h = r.add_histogram("wspush_reactor_loop_lag_seconds", bounds, {}, {{"shard", "0"}});
  for (double x : {0.0005, 0.001, 0.002, 0.5, 3.0, 7.0}) h.observe(x);
  h.observe(std::nan(""));  // ignored
  r.add_histogram_fn("wspush_pool_task_duration_seconds", [] {
    return histogram_snapshot{{1e-6, 1e-5}, {4, 0, 2}, 0.25};
  });
  const std::string text = render(r);
  INFO(text);
  const auto p = check_prometheus_text(text);
  REQUIRE(p.error.empty());
  CHECK(p.types.at("wspush_reactor_loop_lag_seconds") == "histogram");
  const std::string lag = "wspush_reactor_loop_lag_seconds";
  CHECK(p.samples.at(lag + "_bucket{shard=\"0\",le=\"0.001\"}") == 2);  // le is inclusive
  CHECK(p.samples.at(lag + "_bucket{shard=\"0\",le=\"0.01\"}") == 3);
  CHECK(p.samples.at(lag + "_bucket{shard=\"0\",le=\"0.1\"}") == 3);
  CHECK(p.samples.at(lag + "_bucket{shard=\"0\",le=\"1\"}") == 4);
  CHECK(p.samples.at(lag + "_bucket{shard=\"0\",le=\"+Inf\"}") == 6);
  CHECK(p.samples.at(lag + "_count{shard=\"0\"}") == 6);
  CHECK(p.samples.at(lag + "_sum{shard=\"0\"}") == Approx(10.5035));
  const std::string pool = "wspush_pool_task_duration_seconds";
  CHECK(p.samples.at(pool + "_bucket{le=\"1e-06\"}") == 4);
  CHECK(p.samples.at(pool + "_bucket{le=\"+Inf\"}") == 6);
  CHECK(p.samples.at(pool + "_count") == 6);
  CHECK(p.samples.at(pool + "_sum") == 0.25);
}

TEST_CASE("metrics: registration errors are caught at start-up", "[metrics]") {
  metrics_registry r;
  r.add_counter("a_total", "x", {{"k", "1"}});
  CHECK_THROWS_AS(r.add_counter("a_total", "x", {{"k", "1"}}), std::invalid_argument);  // same series
  CHECK_THROWS_AS(r.add_gauge("a_total", "x", {{"k", "2"}}), std::invalid_argument);    // other type
  CHECK_THROWS_AS(r.add_counter("1bad"), std::invalid_argument);
  CHECK_THROWS_AS(r.add_counter("ok_total", "", {{"__reserved", "x"}}), std::invalid_argument);
  CHECK_THROWS_AS(r.add_counter("ok_total", "", {{"a", "x"}, {"a", "y"}}), std::invalid_argument);
  const double bad_bounds[] = {1, 1};
  CHECK_THROWS_AS(r.add_histogram("h", bad_bounds), std::invalid_argument);
  const double bounds[] = {1};
  CHECK_THROWS_AS(r.add_histogram("h2", bounds, "", {{"le", "x"}}), std::invalid_argument);
  r.add_counter("a_total", "x", {{"k", "2"}});  // a new label set is fine
  CHECK(check_prometheus_text(render(r)).error.empty());
}

TEST_CASE("metrics: updates from many threads while scraping", "[metrics]") {
  metrics_registry r;
  counter& c = r.add_counter("hits_total", "h");
  const double bounds[] = {0.5};
  histogram& h = r.add_histogram("obs", bounds, "o");
  constexpr int threads = 4, per_thread = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        c.inc();
        h.observe(i % 2 ? 1.0 : 0.0);
      }
    });
  for (int i = 0; i < 20; ++i) CHECK(check_prometheus_text(render(r)).error.empty());  // consistent mid-flight
  for (auto& t : ts) t.join();
  const auto p = check_prometheus_text(render(r));
  CHECK(p.samples.at("hits_total") == threads * per_thread);
  CHECK(p.samples.at("obs_count") == threads * per_thread);
  CHECK(p.samples.at("obs_bucket{le=\"0.5\"}") == threads * per_thread / 2);
  CHECK(p.samples.at("obs_sum") == threads * per_thread / 2);
}

TEST_CASE("metrics: the standard list is well formed and documented in docs/METRICS.md", "[metrics]") {
  std::ifstream f(WSPUSH_SOURCE_DIR "/docs/METRICS.md");
  REQUIRE(f.good());
  std::stringstream doc;
  doc << f.rdbuf();
  metrics_registry r;
  for (const metric_info& m : standard_metrics()) {
    INFO(m.name);
    CHECK(find_standard_metric(m.name) == &m);
    CHECK(doc.str().find("`" + std::string(m.name) + "`") != std::string::npos);
    CHECK_FALSE(m.help.empty());
    if (m.type == metric_type::counter) CHECK(m.name.substr(m.name.size() - 6) == "_total");
    // registers under its own name (with its documented labels set to "x")
    std::vector<std::string> names;
    for (std::string_view rest = m.labels; !rest.empty();) {
      const std::size_t comma = rest.find(',');
      names.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    REQUIRE(names.size() <= 2);
    const std::string a = names.size() > 0 ? names[0] : "", b = names.size() > 1 ? names[1] : "";
    const auto fn = [] { return 0.0; };
    if (m.type == metric_type::histogram) {
      r.add_histogram_fn(m.name, [] { return histogram_snapshot{{1}, {0, 0}, 0}; });
    } else if (names.empty()) {
      m.type == metric_type::counter ? r.add_counter_fn(m.name, fn) : r.add_gauge_fn(m.name, fn);
    } else if (names.size() == 1) {
      m.type == metric_type::counter ? r.add_counter_fn(m.name, fn, {}, {{a, "x"}})
                                     : r.add_gauge_fn(m.name, fn, {}, {{a, "x"}});
    } else {
      r.add_counter_fn(m.name, fn, {}, {{a, "x"}, {b, "y"}});
    }
  }
  const auto p = check_prometheus_text(render(r));
  CHECK(p.error.empty());
  CHECK(p.types.size() == standard_metrics().size());
}
