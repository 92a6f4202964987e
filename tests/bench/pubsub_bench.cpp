// Micro-benchmarks of server/pubsub/: the topic registry (subscribe/unsubscribe, lookup and
// iteration of a 1- and a 19,000-subscriber topic, memory per subscription at a million
// single-subscriber topics) and the history (append, replay). Google Benchmark; links
// wspush_server. Run on a quiet machine, e.g.
//   nice -n 19 pubsub_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/pubsub/history.hpp"
#include "server/pubsub/topic_registry.hpp"

namespace {

using wspush::pool::buffer_pool;
using wspush::pool::frame_ref;
using wspush::server::pubsub::history;
using wspush::server::pubsub::history_options;
using wspush::server::pubsub::sub_result;
using wspush::server::pubsub::topic_registry;

std::vector<std::string> mailboxes(std::uint32_t n) {
  std::vector<std::string> v;
  v.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) v.push_back("mailbox:" + std::to_string(1000000 + i));
  return v;
}

/// Resident set size of the process, from /proc/self/statm.
std::size_t rss_bytes() {
  long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return std::size_t(pages_resident) * std::size_t(sysconf(_SC_PAGESIZE));
}

/// A connection joins and leaves its own mailbox topic (created and destroyed each time)
/// in a registry holding 100,000 other mailboxes.
void BM_subscribe_unsubscribe_new_topic(benchmark::State& state) {
  auto names = mailboxes(100000 + 1024);
  topic_registry r;
  for (std::uint32_t c = 0; c < 100000; ++c) r.subscribe(c, names[c]);
  std::uint32_t k = 0;
  for (auto _ : state) {
    std::uint32_t c = 100000 + (k++ & 1023);
    benchmark::DoNotOptimize(r.subscribe(c, names[c]));
    benchmark::DoNotOptimize(r.unsubscribe(c, names[c]));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_subscribe_unsubscribe_new_topic);

/// A second tab joins and leaves an existing mailbox topic (1 → 2 → 1 subscribers).
void BM_subscribe_unsubscribe_existing_topic(benchmark::State& state) {
  auto names = mailboxes(100000);
  topic_registry r;
  for (std::uint32_t c = 0; c < 100000; ++c) r.subscribe(c, names[c]);
  std::uint32_t k = 0;
  for (auto _ : state) {
    std::uint32_t t = (k++ * 7919) % 100000;
    benchmark::DoNotOptimize(r.subscribe(200000 + t, names[t]));
    benchmark::DoNotOptimize(r.unsubscribe(200000 + t, names[t]));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_subscribe_unsubscribe_existing_topic);

/// A connection joins and leaves a topic that 19,000 others are on (O(1) removal: the last
/// subscriber moves into the hole).
void BM_subscribe_unsubscribe_big_topic(benchmark::State& state) {
  topic_registry r;
  for (std::uint32_t c = 0; c < 19000; ++c) r.subscribe(c, "everyone");
  std::uint32_t k = 0;
  for (auto _ : state) {
    std::uint32_t c = (k++ * 7919) % 19000;
    benchmark::DoNotOptimize(r.unsubscribe(c, "everyone"));
    benchmark::DoNotOptimize(r.subscribe(c, "everyone"));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_subscribe_unsubscribe_big_topic);

/// Publish-side work of a shard: find the topic and visit every subscriber. Arg: subscribers.
void BM_lookup_and_iterate(benchmark::State& state) {
  const auto subs = std::uint32_t(state.range(0));
  auto names = mailboxes(100000);
  topic_registry r;
  for (std::uint32_t c = 0; c < 100000; ++c) r.subscribe(c, names[c]);  // a populated table
  for (std::uint32_t c = 0; c < subs; ++c) r.subscribe(200000 + c, "everyone");
  std::uint32_t k = 0;
  for (auto _ : state) {
    std::string_view topic = subs == 1 ? std::string_view(names[(k++ * 7919) % 100000]) : "everyone";
    std::uint64_t sum = 0;
    r.for_each_subscriber(topic, [&](std::uint32_t c) { sum += c; });
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * std::int64_t(subs == 1 ? 1 : subs));
  state.counters["ns_per_subscriber"] = benchmark::Counter(
      double(state.iterations()) * double(subs), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_lookup_and_iterate)->Arg(1)->Arg(19000);

/// Memory: a registry of N single-subscriber mailbox topics (names "mailbox:<7 digits>",
/// 15 bytes, the webmail shape), one connection each. Reports the registry's own accounting
/// and the process RSS delta, both per subscription. Arg: N.
void BM_bytes_per_subscription(benchmark::State& state) {
  const auto n = std::uint32_t(state.range(0));
  auto names = mailboxes(n);
  for (auto _ : state) {
    std::size_t rss0 = rss_bytes();
    auto r = std::make_unique<topic_registry>();
    for (std::uint32_t c = 0; c < n; ++c)
      if (r->subscribe(c, names[c]) != sub_result::added) state.SkipWithError("subscribe failed");
    std::size_t rss1 = rss_bytes();
    state.counters["accounted_B_per_sub"] = double(r->memory().total()) / n;
    state.counters["rss_B_per_sub"] = double(rss1 - rss0) / n;
    state.counters["table_B_per_sub"] = double(r->memory().hash_table) / n;
    state.PauseTiming();
    r.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);  // subscribes per second while filling
}
BENCHMARK(BM_bytes_per_subscription)->Arg(1000000)->Iterations(1)->Unit(benchmark::kMillisecond);

frame_ref make_frame(buffer_pool& pool, std::string_view id, std::size_t bytes) {
  auto l = pool.acquire(bytes);
  std::memset(l.data(), 'x', bytes);
  std::memcpy(l.data(), id.data(), id.size());
  l.set_size(bytes);
  return frame_ref::adopt(std::move(l));
}

/// One publish appended to the history (lock, seq, id, frame maker, eviction at the size
/// limit) over 100,000 topics, each at its limit of 8 after warm-up.
void BM_history_append(benchmark::State& state) {
  buffer_pool pool;
  history_options o;
  o.size_per_topic = 8;
  o.ttl_ns = 0;
  history h(o);
  auto names = mailboxes(100000);
  std::uint64_t k = 0;
  auto one = [&] {
    auto& t = names[(k++ * 7919) % names.size()];
    return h.append(t, k, [&](std::string_view id, std::uint64_t) { return make_frame(pool, id, 128); });
  };
  for (int i = 0; i < 900000; ++i) one();
  for (auto _ : state) benchmark::DoNotOptimize(one());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_history_append);

/// Resume: replay the 8 retained entries of a topic after since (refcount bumps).
void BM_history_replay8(benchmark::State& state) {
  buffer_pool pool;
  history_options o;
  o.size_per_topic = 8;
  o.ttl_ns = 0;
  o.epoch = "e";
  history h(o);
  auto names = mailboxes(10000);
  for (int round = 0; round < 8; ++round)
    for (auto& t : names) h.append(t, 0, [&](std::string_view id, std::uint64_t) { return make_frame(pool, id, 128); });
  std::vector<frame_ref> out;
  out.reserve(8);
  std::uint64_t k = 0;
  for (auto _ : state) {
    out.clear();
    auto r = h.replay(names[(k++ * 7919) % names.size()], "e:0", UINT64_MAX, 0,
                      [&](std::uint64_t, const frame_ref& f) { out.push_back(f); });
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * 8);
}
BENCHMARK(BM_history_replay8);

}  // namespace
