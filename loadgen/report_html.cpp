/// \file report_html.cpp
/// The HTML report: one file, no network. The numbers are embedded as a JSON object; a small
/// inline script draws three SVG plots from it. Series colours are fixed (the screenshot test
/// looks for them): connections #1f77b4, p50 #2ca02c, p99 #d62728, histogram bars #9467bd.
#include "loadgen/report.hpp"

#include <cerrno>
#include <cstdio>

namespace wspush::loadgen {
namespace {

std::string escape(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    switch (ch) {
      case '<': out += "\\u003c"; break;   // never close the script element from data
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

template <class F>
std::string series(const std::vector<timeline_point>& tl, F&& get) {
  std::string out = "[";
  for (std::size_t i = 0; i < tl.size(); ++i) out += (i ? "," : "") + num(get(tl[i]));
  return out + "]";
}

std::string summary_rows(const run_result& r) {
  const options& o = *r.o;
  const counters& t = r.totals;
  const histogram& h = *r.latency;
  auto row = [](std::string_view k, const std::string& v) {
    return "[\"" + escape(k) + "\",\"" + escape(v) + "\"],";
  };
  auto ms = [](std::uint64_t ns) { return num(static_cast<double>(ns) / 1e6) + " ms"; };
  std::string s = "[";
  s += row("result", r.ok() ? "ok" : "FAILED");
  for (const std::string& p : r.problems) s += row("problem", p);
  s += row("scenario", std::string(scenario_name(o.sc)) + (o.proto == protocol::pubsub ? " (pubsub" : " (broadcast") +
                           (o.transport == transport_kind::sse ? ", event streams)" : ")"));
  s += row("server", o.url);
  s += row("started", r.started_utc);
  s += row("connections", std::to_string(t[ctr::connected]) + " upgraded of " + std::to_string(o.connections) +
                              " in " + num(r.connect_s) + " s, " + std::to_string(o.procs) + " processes");
  s += row("connect errors", std::to_string(t.connect_errors()));
  s += row("connect time p50 / p99", ms(r.connect->quantile(0.5)) + " / " + ms(r.connect->quantile(0.99)));
  if (r.rss_per_conn() >= 0) s += row("server memory per connection", num(r.rss_per_conn()) + " B (kernel slab " + num(r.slab_per_conn()) + " B)");
  if (o.publishes()) {
    s += row("published", std::to_string(t[ctr::sent]) + " x " + std::to_string(o.size) + " B, errors " +
                              std::to_string(t[ctr::publish_errors]));
    s += row("delivered", std::to_string(t[ctr::unique]) + " of " + std::to_string(t[ctr::expected]) + ", loss " +
                              std::to_string(t.loss()) + ", duplicates " + std::to_string(t[ctr::duplicates]));
    s += row("deliveries/s", num(r.deliveries_per_s()));
    s += row("latency p50 / p90 / p99 / p99.9 / max", ms(h.quantile(0.5)) + " / " + ms(h.quantile(0.9)) + " / " +
                                                           ms(h.quantile(0.99)) + " / " + ms(h.quantile(0.999)) +
                                                           " / " + ms(h.max()));
  }
  if (r.storm_back_s >= 0) s += row("storm: all back after", num(r.storm_back_s) + " s");
  s.back() = ']';
  return s;
}

std::string data_json(const run_result& r) {
  const auto& tl = r.timeline;
  auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string d = "{\"title\":\"wspush-loadgen " + escape(scenario_name(r.o->sc)) + "\",\"summary\":" + summary_rows(r);
  d += ",\"t\":" + series(tl, [](const timeline_point& p) { return p.t_s; });
  d += ",\"open\":" + series(tl, [](const timeline_point& p) { return static_cast<double>(p.open); });
  d += ",\"ready\":" + series(tl, [](const timeline_point& p) { return static_cast<double>(p.ready); });
  d += ",\"errors\":" + series(tl, [](const timeline_point& p) { return static_cast<double>(p.connect_errors); });
  d += ",\"p50\":" + series(tl, [&](const timeline_point& p) { return ms(p.p50); });
  d += ",\"p90\":" + series(tl, [&](const timeline_point& p) { return ms(p.p90); });
  d += ",\"p99\":" + series(tl, [&](const timeline_point& p) { return ms(p.p99); });
  d += ",\"max\":" + series(tl, [&](const timeline_point& p) { return ms(p.max); });
  d += ",\"n\":" + series(tl, [](const timeline_point& p) { return static_cast<double>(p.lat_count); });
  d += ",\"hist\":[";
  const auto bins = histogram_bins(*r.latency, 60);
  for (std::size_t i = 0; i < bins.size(); ++i) {
    d += (i ? ",[" : "[") + num(ms(bins[i].first)) + "," + std::to_string(bins[i].second) + "]";
  }
  return d + "]}";
}

constexpr std::string_view page_head = R"HTML(<!doctype html>
<html><head><meta charset="utf-8"><title>wspush-loadgen report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 12px}
table{border-collapse:collapse;margin-bottom:16px}
td{padding:2px 10px;border-bottom:1px solid #eee;vertical-align:top}
td:first-child{color:#555}
.plots{display:flex;flex-wrap:wrap;gap:16px}
.plot{border:1px solid #ddd;padding:6px}
.plot h2{font-size:14px;margin:0 0 4px}
svg text{font:11px sans-serif;fill:#444}
</style></head><body>
<h1 id="title"></h1>
<table id="summary"></table>
<div class="plots">
<div class="plot"><h2>Connections over time</h2><svg id="conns" width="560" height="300"></svg></div>
<div class="plot"><h2>Latency percentiles over time (ms, log scale)</h2><svg id="lat" width="560" height="300"></svg></div>
<div class="plot"><h2>Latency histogram (ms, log scale)</h2><svg id="hist" width="560" height="300"></svg></div>
</div>
<script>
const D = )HTML";

constexpr std::string_view page_tail = R"HTML(;
const NS = "http://www.w3.org/2000/svg";
function el(parent, name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function fmt(v) { return Math.abs(v) >= 1000 ? v.toExponential(1) : +v.toPrecision(3); }
// A frame with axes; returns functions from data to pixels.
function frame(svg, xs, ys, logy, label, xfmt) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), L = 60, R = 110, T = 10, B = 30;
  const pos = ys.filter(v => v > 0);
  let y0 = logy ? Math.min(...pos) : 0, y1 = Math.max(...ys, 1e-9);
  if (logy) { y0 = Math.pow(10, Math.floor(Math.log10(y0 || 1e-3))); y1 = Math.pow(10, Math.ceil(Math.log10(y1))); }
  if (y1 <= y0) y1 = y0 * 10 || 1;
  const x0 = Math.min(...xs), x1 = Math.max(...xs) > x0 ? Math.max(...xs) : x0 + 1;
  const fx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const fy = y => logy ? H - B - (Math.log10(Math.max(y, y0)) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0)) * (H - T - B)
                       : H - B - (y - y0) / (y1 - y0) * (H - T - B);
  el(svg, "line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"});
  el(svg, "line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"});
  const yt = logy ? [] : [0, 0.25, 0.5, 0.75, 1].map(f => y0 + f * (y1 - y0));
  if (logy) for (let v = y0; v <= y1 * 1.0001; v *= 10) yt.push(v);
  for (const v of yt) {
    el(svg, "line", {x1: L, y1: fy(v), x2: W - R, y2: fy(v), stroke: "#eee"});
    el(svg, "text", {x: L - 4, y: fy(v) + 4, "text-anchor": "end"}, fmt(v));
  }
  for (let k = 0; k <= 4; k++) {
    const v = x0 + k / 4 * (x1 - x0);
    el(svg, "text", {x: fx(v), y: H - B + 14, "text-anchor": "middle"}, fmt(xfmt ? xfmt(v) : v));
  }
  el(svg, "text", {x: (W - R + L) / 2, y: H - 2, "text-anchor": "middle"}, label);
  return {fx, fy, W, R, T};
}
function lines(svg, xs, named, logy, label) {
  const all = [].concat(...named.map(s => s[2]));
  if (!xs.length || !all.length) { el(svg, "text", {x: 200, y: 150}, "no data"); return; }
  const f = frame(svg, xs, all, logy, label);
  named.forEach(([name, color, ys, width], i) => {
    const pts = xs.map((x, k) => [x, ys[k]]).filter(p => !logy || p[1] > 0);
    if (pts.length === 1) pts.push([pts[0][0], pts[0][1]]);
    el(svg, "polyline", {points: pts.map(p => f.fx(p[0]) + "," + f.fy(p[1])).join(" "), fill: "none", stroke: color,
                         "stroke-width": width || 3, "shape-rendering": "crispEdges"});
    el(svg, "rect", {x: f.W - f.R + 10, y: f.T + 16 * i, width: 12, height: 10, fill: color, "shape-rendering": "crispEdges"});
    el(svg, "text", {x: f.W - f.R + 26, y: f.T + 9 + 16 * i}, name);
  });
}
document.getElementById("title").textContent = D.title;
const table = document.getElementById("summary");
for (const [k, v] of D.summary) {
  const tr = table.insertRow();
  tr.insertCell().textContent = k;
  tr.insertCell().textContent = v;
}
// "ready" wide underneath, "open" narrow on top: both stay visible when they are equal.
lines(document.getElementById("conns"), D.t, [["ready", "#ff7f0e", D.ready, 7], ["open", "#1f77b4", D.open, 3],
      ["connect errors", "#7f7f7f", D.errors, 3]], false, "seconds");
const lt = [], lp = {p50: [], p90: [], p99: [], max: []};
D.t.forEach((t, k) => { if (D.n[k] > 0) { lt.push(t); for (const q in lp) lp[q].push(D[q][k]); } });
lines(document.getElementById("lat"), lt, [["p50", "#2ca02c", lp.p50], ["p90", "#17becf", lp.p90],
      ["p99", "#d62728", lp.p99], ["max", "#8c564b", lp.max]], true, "seconds");
(function () {
  const svg = document.getElementById("hist");
  if (!D.hist.length) { el(svg, "text", {x: 200, y: 150}, "no data"); return; }
  const xs = D.hist.map(b => Math.log10(Math.max(b[0], 1e-6))), ys = D.hist.map(b => b[1]);
  const f = frame(svg, xs.concat([xs[xs.length - 1] + (xs.length > 1 ? xs[1] - xs[0] : 1)]), ys, false, "ms (log scale)", v => Math.pow(10, v));
  const w = Math.max(2, (f.fx(xs[xs.length - 1]) - f.fx(xs[0])) / Math.max(xs.length - 1, 1) - 1);
  D.hist.forEach((b, k) => {
    if (b[1] > 0) el(svg, "rect", {x: f.fx(xs[k]), y: f.fy(b[1]), width: w, height: Math.max(f.fy(0) - f.fy(b[1]), 2),
                                   fill: "#9467bd", "shape-rendering": "crispEdges"});
  });
})();
</script></body></html>
)HTML";

}  // namespace

bool write_html(const std::string& path, const run_result& r) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const std::string data = data_json(r);
  std::fwrite(page_head.data(), 1, page_head.size(), f);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fwrite(page_tail.data(), 1, page_tail.size(), f);
  const bool ok = std::ferror(f) == 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace wspush::loadgen
