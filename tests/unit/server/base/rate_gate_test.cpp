#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "server/base/rate_gate.hpp"

using wspush::server::rate_gate;

namespace {
constexpr std::int64_t s = 1'000'000'000;
}

TEST_CASE("rate_gate: a burst goes at once, then the rate") {
  rate_gate g(10, 5);
  const std::int64_t t0 = 100 * s;
  int admitted = 0;
  for (int k = 0; k < 50; ++k) admitted += g.admit(t0);
  CHECK(admitted == 5);  // the burst
  // One more every 100 ms from then on, and none in between.
  CHECK_FALSE(g.admit(t0 + s / 20));
  CHECK(g.admit(t0 + s / 10 + 1));
  CHECK_FALSE(g.admit(t0 + s / 10 + 2));
  admitted = 0;
  for (std::int64_t t = t0 + s; t < t0 + 3 * s; t += s / 100) admitted += g.admit(t);
  CHECK(admitted >= 24);  // a burst again after the quiet second, then 10 a second for 2 s
  CHECK(admitted <= 26);
}

TEST_CASE("rate_gate: a quiet spell lets only one burst through, not the rate of the whole spell") {
  rate_gate g(100, 10);
  const std::int64_t t0 = 5 * s;
  CHECK(g.admit(t0));
  int admitted = 0;
  for (int k = 0; k < 1000; ++k) admitted += g.admit(t0 + 60 * s);
  CHECK(admitted == 10);
}

TEST_CASE("rate_gate: without a rate everything goes through") {
  rate_gate g;
  CHECK_FALSE(g.limits());
  for (int k = 0; k < 1000; ++k) CHECK(g.admit(0));
}

TEST_CASE("rate_gate: Retry-After spreads the refused over the time the gate needs for them") {
  rate_gate g(10, 1);
  const std::int64_t t0 = 7 * s;
  CHECK(g.admit(t0));
  for (int k = 0; k < 300; ++k) CHECK_FALSE(g.admit(t0));  // 300 refused: 30 s of the gate's time
  std::uint32_t lo = 1000, hi = 0;
  for (std::uint64_t r = 0; r < 1000; ++r) {
    const std::uint32_t a = g.retry_after(r * 2654435761u);
    lo = std::min(lo, a), hi = std::max(hi, a);
  }
  CHECK(lo == 1);
  CHECK(hi == 30);
  // A new second starts the count again: few refusals, a short spread (at least 2 s).
  CHECK(g.admit(t0 + s + s / 2));
  CHECK_FALSE(g.admit(t0 + s + s / 2));
  for (std::uint64_t r = 0; r < 100; ++r) CHECK(g.retry_after(r) <= 2);
}

TEST_CASE("rate_gate: threads that race admit exactly the burst") {
  rate_gate g(1, 64);
  std::atomic<int> admitted{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int k = 0; k < 1000; ++k) admitted += g.admit(3 * s);
    });
  for (auto& t : ts) t.join();
  CHECK(admitted == 64);
}

TEST_CASE("rate_gate: configured again while in use (SIGHUP), it keeps to the new rate at once") {
  rate_gate g;
  const std::int64_t t0 = 3 * s;
  CHECK(g.admit(t0));
  g.configure(10, 2);  // a rate where there was none
  CHECK(g.limits());
  CHECK(g.admit(t0));
  CHECK(g.admit(t0));
  CHECK_FALSE(g.admit(t0));  // past the burst of 2
  g.configure(1000, 1000);   // raised: the new burst goes through
  int admitted = 0;
  for (int k = 0; k < 2000; ++k) admitted += g.admit(t0 + s / 10);
  CHECK(admitted >= 850);  // the gate was booked 100 ms ahead: that much of the burst is spent
  CHECK(admitted <= 1100);
  g.configure(1, 1);  // lowered: one a second from where the gate is booked
  int later = 0;
  for (int k = 0; k < 100; ++k) later += g.admit(t0 + 5 * s);
  CHECK(later == 1);
  g.configure(0, 0);  // lifted
  CHECK_FALSE(g.limits());
  for (int k = 0; k < 100; ++k) CHECK(g.admit(t0 + 5 * s));
}
