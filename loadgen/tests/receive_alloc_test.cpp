// The load generator's receive path (frame reader → delivery memo and parse → topic check →
// sequence accounting → latency histogram) allocates nothing per message, so at millions of
// deliveries per second the client measures the server, not its own allocator. The same for an
// event stream's (event-stream reader → the same).
#include "loadgen/event_stream.hpp"
#include "loadgen/histogram.hpp"
#include "loadgen/options.hpp"
#include "loadgen/wire.hpp"
#include "tests/support/counting_alloc.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace wspush::loadgen;

namespace {

struct counting_sink {
  const options& o;
  delivery_memo& memo;
  seq_tracker& seq;
  seq_counters& counters;
  histogram& latency;
  std::uint64_t matched = 0;
  void on_message(std::span<const std::uint8_t> m, std::uint8_t) noexcept {
    const delivery d = memo.read(std::string_view(reinterpret_cast<const char*>(m.data()), m.size()), seq.next());
    if (!d.ok || !o.topic_matches(12345, d.topic)) return;
    ++matched;
    if (seq.on_seq(static_cast<std::uint32_t>(d.seq), counters)) latency.record(1000 + d.seq);
  }
  void on_ping(std::span<const std::uint8_t>) noexcept {}
  void on_close(std::span<const std::uint8_t>) noexcept {}
  // an event stream's events, as the worker's stream_sink takes them
  void on_event(const sse_event& e) noexcept {
    on_message({reinterpret_cast<const std::uint8_t*>(e.data.data()), e.data.size()}, 1);
  }
  void on_comment() noexcept {}
  void on_retry(std::string_view) noexcept {}
};

/// The event JSON of mailbox 12345's message k, as the server sends it.
std::string event_json(const options& o, std::uint64_t k) {
  std::vector<char> payload(128);
  const std::size_t len = write_payload(payload, 64, k, 42);
  return R"({"topic":")" + o.topic_of(12345) + R"(","id":"e:)" + std::to_string(k) + R"(","data":)" +
         std::string(payload.data(), len) + "}";
}

/// Server frames carrying pub/sub events for mailbox 12345, seq first..first+n-1.
std::string events(const options& o, std::uint64_t first, std::uint64_t n) {
  std::string out;
  for (std::uint64_t k = first; k < first + n; ++k) {
    const std::string ev = event_json(o, k);
    out += static_cast<char>(0x81);
    if (ev.size() < 126) {
      out += static_cast<char>(ev.size());
    } else {
      out += static_cast<char>(126);
      out += static_cast<char>(ev.size() >> 8);
      out += static_cast<char>(ev.size() & 0xff);
    }
    out += ev;
  }
  return out;
}

/// The same events on an event stream, with a keepalive comment now and then; every eighth
/// event's data in two lines (joined in a spill), CRLF line ends on every third.
std::string stream_events(const options& o, std::uint64_t first, std::uint64_t n) {
  std::string out;
  for (std::uint64_t k = first; k < first + n; ++k) {
    const std::string_view end = k % 3 == 0 ? "\r\n" : "\n";
    std::string ev = event_json(o, k);
    if (k % 8 == 0) ev.insert(ev.find(R"("data":)"), std::string("\n"));
    out.append("id: e:").append(std::to_string(k)).append(end);
    for (std::size_t from = 0;;) {
      const std::size_t lf = ev.find('\n', from);
      out.append("data: ").append(ev, from, lf - from).append(end);
      if (lf == std::string::npos) break;
      from = lf + 1;
    }
    out.append(end);
    if (k % 10 == 0) out.append(":").append(end).append(end);
  }
  return out;
}

}  // namespace

TEST_CASE("receive path: no allocation per message once warm") {
  options o;
  o.sc = scenario::mailboxes;
  o.topic_prefix = "a-rather-long-mailbox-prefix-";   // past any small-string buffer
  const std::string warm = events(o, 0, 100);
  const std::string steady = events(o, 100, 2000);
  auto latency = std::make_unique<histogram>();
  seq_tracker seq;
  seq_counters counters;
  frame_reader reader;
  spill_pool spills;
  auto memo = std::make_unique<delivery_memo>();
  counting_sink sink{o, *memo, seq, counters, *latency};
  const auto* w = reinterpret_cast<const std::uint8_t*>(warm.data());
  for (std::size_t at = 0; at < warm.size(); at += 1000) {   // the spill pool grows here, once
    REQUIRE(reader.consume({w + at, std::min<std::size_t>(1000, warm.size() - at)}, sink, spills));
  }
  const std::uint64_t before = wspush::test::thread_allocation_count();
  const auto* s = reinterpret_cast<const std::uint8_t*>(steady.data());
  for (std::size_t at = 0; at < steady.size(); at += 1000) {   // split reads, frames across them
    REQUIRE(reader.consume({s + at, std::min<std::size_t>(1000, steady.size() - at)}, sink, spills));
  }
  CHECK(wspush::test::thread_allocation_count() == before);
  CHECK(sink.matched == 2100);
  CHECK(counters.unique == 2100);
  CHECK(latency->total() == 2100);
}

TEST_CASE("receive path: an event stream's, no allocation per message once warm") {
  options o;
  o.sc = scenario::mailboxes;
  o.topic_prefix = "a-rather-long-mailbox-prefix-";
  const std::string warm = stream_events(o, 0, 100);
  const std::string steady = stream_events(o, 100, 2000);
  auto latency = std::make_unique<histogram>();
  seq_tracker seq;
  seq_counters counters;
  sse_reader reader;
  sse_spill_pool spills;
  auto memo = std::make_unique<delivery_memo>();
  counting_sink sink{o, *memo, seq, counters, *latency};
  const auto* w = reinterpret_cast<const std::uint8_t*>(warm.data());
  for (std::size_t at = 0; at < warm.size(); at += 1000) {   // the spill pool grows here, once
    reader.consume({w + at, std::min<std::size_t>(1000, warm.size() - at)}, sink, spills);
  }
  const std::uint64_t before = wspush::test::thread_allocation_count();
  const auto* s = reinterpret_cast<const std::uint8_t*>(steady.data());
  for (std::size_t at = 0; at < steady.size(); at += 1000) {   // split reads, events and lines across them
    reader.consume({s + at, std::min<std::size_t>(1000, steady.size() - at)}, sink, spills);
  }
  CHECK(wspush::test::thread_allocation_count() == before);
  CHECK(sink.matched == 2100);
  CHECK(counters.unique == 2100);
  CHECK(latency->total() == 2100);
  CHECK(spills.leased() == 0);
}
