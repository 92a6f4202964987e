#include "loadgen/results.hpp"

#include <catch2/catch.hpp>

using namespace wspush::loadgen;

namespace {

child_msg decode(const std::string& wire) {
  child_msg m;
  REQUIRE(frame_size({reinterpret_cast<const std::uint8_t*>(wire.data()), wire.size()}) == wire.size());
  REQUIRE(decode_msg({reinterpret_cast<const std::uint8_t*>(wire.data()), wire.size()}, m));
  return m;
}

counters make(std::uint64_t open, std::uint64_t unique, std::uint64_t expected, std::uint64_t first_send) {
  counters c;
  c[ctr::open] = open;
  c[ctr::unique] = unique;
  c[ctr::expected] = expected;
  c.first_send_ns = first_send;
  return c;
}

}  // namespace

TEST_CASE("results: a message survives the pipe encoding") {
  counters c = make(10, 20, 30, 555);
  c.first_errno = 99;
  histogram lat, con;
  lat.record(1000);
  lat.record(2000);
  con.record(7);
  const std::string wire = encode_msg(msg_kind::final_result, 3, 12, c, lat, con);
  const child_msg m = decode(wire);
  CHECK(m.kind == msg_kind::final_result);
  CHECK(m.child == 3);
  CHECK(m.interval == 12);
  CHECK(m.c[ctr::unique] == 20);
  CHECK(m.c.first_errno == 99);
  CHECK(m.latency->total() == 2);
  CHECK(m.latency->max() == 2000);
  CHECK(m.connect->total() == 1);
}

TEST_CASE("results: frames are found in a stream that arrives in pieces") {
  histogram empty;
  const std::string a = encode_msg(msg_kind::sample, 0, 0, make(1, 0, 0, 0), empty, empty);
  const std::string b = encode_msg(msg_kind::sample, 1, 0, make(2, 0, 0, 0), empty, empty);
  const std::string stream = a + b;
  const auto* p = reinterpret_cast<const std::uint8_t*>(stream.data());
  for (std::size_t cut = 0; cut < a.size(); ++cut) CHECK(frame_size({p, cut}) == 0);
  CHECK(frame_size({p, stream.size()}) == a.size());
  CHECK(frame_size({p + a.size(), b.size()}) == b.size());
  child_msg m;
  CHECK_FALSE(decode_msg({p, a.size() - 1}, m));   // a truncated frame is refused
}

TEST_CASE("results: totals sum the children's latest counters, extremes by min and max") {
  aggregate agg(2, 1.0);
  histogram empty;
  agg.on_msg(decode(encode_msg(msg_kind::sample, 0, 0, make(100, 5, 10, 900), empty, empty)));
  agg.on_msg(decode(encode_msg(msg_kind::sample, 0, 1, make(100, 10, 10, 900), empty, empty)));   // replaces
  agg.on_msg(decode(encode_msg(msg_kind::sample, 1, 0, make(50, 7, 10, 300), empty, empty)));
  const counters t = agg.totals();
  CHECK(t[ctr::open] == 150);
  CHECK(t[ctr::unique] == 17);
  CHECK(t[ctr::expected] == 20);
  CHECK(t.loss() == 3);
  CHECK(t.first_send_ns == 300);   // earliest over processes
  CHECK(agg.finished() == 0);
}

TEST_CASE("results: latency merges exactly across processes and intervals and final ends a child") {
  aggregate agg(2, 0.5);
  histogram a, b, empty;
  for (std::uint64_t v = 1; v <= 100; ++v) (v % 2 ? a : b).record(v * 1000);
  agg.on_msg(decode(encode_msg(msg_kind::sample, 0, 0, make(1, 0, 0, 0), a, empty)));
  agg.on_msg(decode(encode_msg(msg_kind::sample, 1, 0, make(1, 0, 0, 0), b, empty)));
  histogram con;
  con.record(42);
  agg.on_msg(decode(encode_msg(msg_kind::final_result, 1, 1, make(0, 0, 0, 0), empty, con)));
  agg.on_msg(decode(encode_msg(msg_kind::sample, 1, 2, make(9, 0, 0, 0), a, empty)));   // after final: ignored
  CHECK(agg.latency().total() == 100);
  CHECK(agg.latency().quantile(0.5) == Approx(50'000).epsilon(1.0 / 128));
  CHECK(agg.connect().total() == 1);
  CHECK(agg.finished() == 1);
  CHECK(agg.is_final(1));
  CHECK(agg.totals()[ctr::open] == 1);   // child 1's final said 0 open

  const auto tl = agg.timeline();
  REQUIRE(tl.size() == 2);
  CHECK(tl[0].t_s == Approx(0.5));
  CHECK(tl[0].open == 2);
  CHECK(tl[0].lat_count == 100);
  CHECK(tl[0].p50 == agg.latency().quantile(0.5));
  CHECK(tl[0].max == 100'000);
  CHECK(tl[1].open == 1);   // child 0 carried forward from interval 0, child 1 final
  CHECK(tl[1].lat_count == 0);
}

TEST_CASE("results: each step of --publish-steps sums over processes, apart from the totals") {
  aggregate agg(3, 1);
  histogram fast, slow, empty;
  for (int k = 0; k < 10; ++k) fast.record(100'000);
  for (int k = 0; k < 10; ++k) slow.record(90'000'000);
  counters w0 = make(0, 10, 0, 0), w1 = make(0, 9, 0, 0);
  w1[ctr::duplicates] = 1;
  counters pub{};
  pub[ctr::sent] = 20;
  pub.first_send_ns = 1'000;
  pub.last_send_ns = 9'000;
  agg.on_msg(decode(encode_msg(msg_kind::step, 0, 0, w0, fast, empty)));
  agg.on_msg(decode(encode_msg(msg_kind::step, 1, 0, w1, fast, empty)));
  agg.on_msg(decode(encode_msg(msg_kind::step, 2, 0, pub, empty, empty)));
  agg.on_msg(decode(encode_msg(msg_kind::step, 0, 1, w0, slow, empty)));
  REQUIRE(agg.steps().size() == 2);
  const step_total& s0 = agg.steps()[0];
  CHECK(s0.c[ctr::unique] == 19);
  CHECK(s0.c[ctr::duplicates] == 1);
  CHECK(s0.c[ctr::sent] == 20);
  CHECK(s0.c.first_send_ns == 1'000);
  CHECK(s0.c.last_send_ns == 9'000);
  CHECK(s0.latency->total() == 20);
  CHECK(agg.steps()[1].latency->quantile(0.99) == Approx(90'000'000).epsilon(1.0 / 128));
  // Steps are not samples: the totals, the time series and the whole run's latency are untouched.
  CHECK(agg.totals()[ctr::unique] == 0);
  CHECK(agg.timeline().empty());
  CHECK(agg.latency().total() == 0);
  // An index past what --publish-steps allows is refused, not grown into.
  agg.on_msg(decode(encode_msg(msg_kind::step, 0, 1000, w0, fast, empty)));
  CHECK(agg.steps().size() == 2);
}
