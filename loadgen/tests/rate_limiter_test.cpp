#include "loadgen/rate_limiter.hpp"

#include <catch2/catch.hpp>

using wspush::loadgen::rate_limiter;

namespace {
constexpr std::uint64_t ms = 1'000'000;
}

TEST_CASE("rate_limiter: unlimited grants everything") {
  rate_limiter r(0, 0);
  CHECK(r.take(0, 1000) == 1000);
  CHECK(r.wait_ns(0) == 0);
}

TEST_CASE("rate_limiter: first event at start, then one per period") {
  rate_limiter r(100, 1000 * ms);   // one per 10 ms
  CHECK(r.take(999 * ms, 5) == 0);   // before the start
  CHECK(r.take(1000 * ms, 5) == 1);
  CHECK(r.take(1005 * ms, 5) == 0);
  CHECK(r.wait_ns(1005 * ms) == 5 * ms);
  CHECK(r.take(1010 * ms, 5) == 1);
  CHECK(r.take(1050 * ms, 100) == 4);   // 20, 30, 40, 50
  CHECK(r.taken() == 6);
}

TEST_CASE("rate_limiter: no drift over many late wake-ups") {
  rate_limiter r(1000, 0, 1'000'000);   // 1 per ms
  std::uint64_t got = 0;
  for (std::uint64_t t = 0; t <= 10'000 * ms; t += 3 * ms + 137) got += r.take(t, 1'000'000);
  // The schedule, not the wake-ups, decides: events 0..floor(t_last) are due.
  const std::uint64_t last = (10'000 * ms / (3 * ms + 137)) * (3 * ms + 137);
  CHECK(got == last / ms + 1);
}

TEST_CASE("rate_limiter: a stall releases at most the burst and drops the rest") {
  rate_limiter r(1000, 0, 10);
  CHECK(r.take(0, 100) == 1);
  CHECK(r.take(1000 * ms, 1000) == 10);   // 1000 were due; only the burst goes out
  CHECK(r.dropped() == 990);
  CHECK(r.take(1000 * ms, 1000) == 0);
  CHECK(r.wait_ns(1000 * ms) == 1 * ms);   // and the schedule carries on from there
  CHECK(r.take(1001 * ms, 1000) == 1);
}

TEST_CASE("rate_limiter: grants are capped by what is asked") {
  rate_limiter r(1000, 0, 1000);
  CHECK(r.take(100 * ms, 7) == 7);
  CHECK(r.take(100 * ms, 1000) == 101 - 7);
}
