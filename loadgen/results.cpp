/// \file results.cpp
#include "loadgen/results.hpp"

#include "loadgen/options.hpp"

#include <cstring>

namespace wspush::loadgen {

void counters::add(const counters& o) noexcept {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
  auto min_set = [](std::uint64_t& a, std::uint64_t b) {
    if (b != 0 && (a == 0 || b < a)) a = b;
  };
  auto max_set = [](std::uint64_t& a, std::uint64_t b) {
    if (b > a) a = b;
  };
  min_set(first_send_ns, o.first_send_ns);
  max_set(last_send_ns, o.last_send_ns);
  max_set(last_delivery_ns, o.last_delivery_ns);
  max_set(connect_done_ns, o.connect_done_ns);
  min_set(storm_start_ns, o.storm_start_ns);
  max_set(storm_back_ns, o.storm_back_ns);
  if (first_errno == 0) first_errno = o.first_errno;
  if (first_status == 0) first_status = o.first_status;
}

std::uint64_t counters::connect_errors() const noexcept {
  std::uint64_t n = 0;
  for (auto c = static_cast<std::size_t>(ctr::err_refused); c <= static_cast<std::size_t>(ctr::http_other); ++c) {
    n += v[c];
  }
  return n;
}

namespace {
constexpr std::size_t head_words = 4;   // length, kind, child, interval
}

std::string encode_msg(msg_kind kind, std::uint32_t child, std::uint32_t interval, const counters& c,
                       const histogram& latency, const histogram& connect) {
  std::string out(head_words * sizeof(std::uint32_t), '\0');
  const std::uint32_t head[head_words] = {0, static_cast<std::uint32_t>(kind), child, interval};
  std::memcpy(out.data(), head, sizeof(head));
  out.append(reinterpret_cast<const char*>(&c), sizeof(c));
  latency.encode(out);
  connect.encode(out);
  const auto len = static_cast<std::uint32_t>(out.size() - sizeof(std::uint32_t));
  std::memcpy(out.data(), &len, sizeof(len));
  return out;
}

std::string encode_steps(std::uint32_t child, std::span<const step_total> steps) {
  static const histogram none;
  std::string out;
  for (std::size_t k = 0; k < steps.size(); ++k)
    out += encode_msg(msg_kind::step, child, static_cast<std::uint32_t>(k), steps[k].c, *steps[k].latency, none);
  return out;
}

std::size_t frame_size(std::span<const std::uint8_t> buffered) noexcept {
  std::uint32_t len = 0;
  if (buffered.size() < sizeof(len)) return 0;
  std::memcpy(&len, buffered.data(), sizeof(len));
  const std::size_t whole = sizeof(len) + std::size_t{len};
  return buffered.size() >= whole ? whole : 0;
}

bool decode_msg(std::span<const std::uint8_t> frame, child_msg& out) noexcept {
  std::uint32_t head[head_words];
  if (frame.size() < sizeof(head) + sizeof(counters) || frame_size(frame) != frame.size()) return false;
  std::memcpy(head, frame.data(), sizeof(head));
  if (head[1] != static_cast<std::uint32_t>(msg_kind::sample) &&
      head[1] != static_cast<std::uint32_t>(msg_kind::final_result) && head[1] != static_cast<std::uint32_t>(msg_kind::step)) {
    return false;
  }
  out.kind = static_cast<msg_kind>(head[1]);
  out.child = head[2];
  out.interval = head[3];
  std::memcpy(&out.c, frame.data() + sizeof(head), sizeof(counters));
  auto rest = frame.subspan(sizeof(head) + sizeof(counters));
  out.latency->reset();
  out.connect->reset();
  const std::size_t a = out.latency->merge_encoded(rest);
  if (a == 0) return false;
  rest = rest.subspan(a);
  const std::size_t b = out.connect->merge_encoded(rest);
  return b != 0 && b == rest.size();
}

void aggregate::on_msg(const child_msg& m) {
  if (m.child >= _children || _final[m.child]) return;
  if (m.kind == msg_kind::step) {
    if (m.interval >= max_publish_steps) return;
    if (_steps.size() <= m.interval) _steps.resize(m.interval + 1);
    _steps[m.interval].c.add(m.c);
    _steps[m.interval].latency->merge(*m.latency);
    return;
  }
  _latest[m.child] = m.c;
  _latency->merge(*m.latency);
  point& p = _points[m.interval];
  if (p.per_child.empty()) {
    p.per_child.resize(_children);
    p.seen.resize(_children);
  }
  p.per_child[m.child] = m.c;
  p.seen[m.child] = true;
  p.latency->merge(*m.latency);
  if (m.kind == msg_kind::final_result) {
    _final[m.child] = true;
    ++_finished;
    _connect->merge(*m.connect);
  }
}

counters aggregate::totals() const {
  counters t{};
  for (const counters& c : _latest) t.add(c);
  return t;
}

std::vector<timeline_point> aggregate::timeline() const {
  std::vector<timeline_point> out;
  std::vector<counters> carried(_children);   // a child without a sample here keeps its last one
  for (const auto& [k, p] : _points) {
    counters sum{};
    for (std::uint32_t c = 0; c < _children; ++c) {
      if (p.seen[c]) carried[c] = p.per_child[c];
      sum.add(carried[c]);
    }
    timeline_point tp;
    tp.t_s = static_cast<double>(k + 1) * _interval_s;
    tp.open = sum[ctr::open];
    tp.ready = sum[ctr::ready];
    tp.connect_errors = sum.connect_errors();
    tp.deliveries = sum[ctr::deliveries];
    tp.sent = sum[ctr::sent];
    const histogram& h = *p.latency;
    tp.lat_count = h.total();
    tp.p50 = h.quantile(0.5);
    tp.p90 = h.quantile(0.9);
    tp.p99 = h.quantile(0.99);
    tp.p999 = h.quantile(0.999);
    tp.max = h.max();
    out.push_back(tp);
  }
  return out;
}

}  // namespace wspush::loadgen
