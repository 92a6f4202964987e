#include "loadgen/histogram.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <vector>

using wspush::loadgen::histogram;

TEST_CASE("histogram: empty answers zero") {
  auto h = std::make_unique<histogram>();
  CHECK(h->total() == 0);
  CHECK(h->quantile(0.5) == 0);
  CHECK(h->max() == 0);
  CHECK(h->min() == 0);
}

TEST_CASE("histogram: small values are exact, quantiles pick the right rank") {
  auto h = std::make_unique<histogram>();
  for (std::uint64_t v = 1; v <= 100; ++v) h->record(v);
  CHECK(h->quantile(0.5) == 50);
  CHECK(h->quantile(0.9) == 90);
  CHECK(h->quantile(0.99) == 99);
  CHECK(h->quantile(1.0) == 100);
  CHECK(h->min() == 1);
  CHECK(h->mean() == Approx(50.5));
}

TEST_CASE("histogram: relative error stays under 1/128 over the whole range") {
  for (std::uint64_t v : {257ull, 1000ull, 123'456ull, 9'999'999ull, 1ull << 40, (1ull << 63) + 12345}) {
    const std::size_t i = histogram::index_of(v);
    CHECK(histogram::lower_of(i) <= v);
    if (i + 1 < histogram::bucket_count) CHECK(histogram::lower_of(i + 1) > v);
    const double err = std::abs(static_cast<double>(histogram::midpoint_of(i)) - static_cast<double>(v)) / static_cast<double>(v);
    CHECK(err <= 1.0 / 128);
  }
}

TEST_CASE("histogram: quantiles of a known distribution") {
  auto h = std::make_unique<histogram>();
  std::vector<std::uint64_t> values;
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(13.0, 1.0);   // ~0.5 ms median in ns
  for (int i = 0; i < 100'000; ++i) values.push_back(static_cast<std::uint64_t>(dist(rng)) + 1);
  for (auto v : values) h->record(v);
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const auto exact = static_cast<double>(values[static_cast<std::size_t>(q * values.size()) - 1]);
    CHECK(static_cast<double>(h->quantile(q)) == Approx(exact).epsilon(0.01));
  }
  CHECK(h->max() == values.back());
}

TEST_CASE("histogram: merge equals recording everything in one") {
  auto a = std::make_unique<histogram>(), b = std::make_unique<histogram>(), all = std::make_unique<histogram>();
  for (std::uint64_t v = 1; v < 50'000; v += 7) {
    ((v / 7) % 2 ? a : b)->record(v * 13);
    all->record(v * 13);
  }
  a->merge(*b);
  CHECK(a->total() == all->total());
  for (double q : {0.1, 0.5, 0.9, 0.99, 1.0}) CHECK(a->quantile(q) == all->quantile(q));
  CHECK(a->min() == all->min());
  CHECK(a->mean() == Approx(all->mean()));
}

TEST_CASE("histogram: the sparse wire form round-trips and rejects damage") {
  auto h = std::make_unique<histogram>();
  for (std::uint64_t v : {5ull, 5ull, 300ull, 1'000'000ull, 77'000'000'000ull}) h->record(v);
  std::string wire;
  h->encode(wire);
  CHECK(wire.size() < 200);   // five values: a few pairs, not 7,424 counters
  auto back = std::make_unique<histogram>();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(wire.data());
  CHECK(back->merge_encoded({bytes, wire.size()}) == wire.size());
  CHECK(back->total() == 5);
  CHECK(back->quantile(0.5) == h->quantile(0.5));
  CHECK(back->max() == 77'000'000'000ull);
  CHECK(back->min() == 5);

  auto untouched = std::make_unique<histogram>();
  CHECK(untouched->merge_encoded({bytes, wire.size() - 1}) == 0);   // truncated
  std::string bad = wire;
  bad[0] = 9;   // the total no longer matches the pairs' counts
  CHECK(untouched->merge_encoded({reinterpret_cast<const std::uint8_t*>(bad.data()), bad.size()}) == 0);
  CHECK(untouched->total() == 0);
}
