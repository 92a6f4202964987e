#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/pubsub/history.hpp"

using namespace wspush;
using namespace wspush::server::pubsub;

namespace {

constexpr std::uint64_t sec = 1'000'000'000ull;

/// Frames whose bytes are the event's id and topic, so a replay can be checked by content.
struct framer {
  pool::buffer_pool buffers;
  std::string topic;

  pool::frame_ref frame(std::string_view id, std::size_t pad = 0) {
    pool::lease l = buffers.acquire(topic.size() + id.size() + 1 + pad);
    std::string text = topic + "|" + std::string(id) + std::string(pad, '.');
    std::memcpy(l.data(), text.data(), text.size());
    l.set_size(text.size());
    return pool::frame_ref::adopt(std::move(l));
  }
};

std::string text_of(const pool::frame_ref& f) {
  auto b = f.bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

history_options opts(std::uint32_t size = 100, std::uint64_t ttl = 0, std::size_t max_bytes = 1 << 30) {
  history_options o;
  o.size_per_topic = size;
  o.ttl_ns = ttl;
  o.max_bytes = max_bytes;
  o.parts = 4;
  o.epoch = "k3f9";
  return o;
}

/// Appends one event to `topic` and returns its id string.
std::string publish(history& h, framer& f, std::string_view topic, std::uint64_t now = 0, std::size_t pad = 0) {
  f.topic = std::string(topic);
  std::string id;
  append_result r = h.append(topic, now, [&](std::string_view i, std::uint64_t) {
    id = std::string(i);
    return f.frame(i, pad);
  });
  REQUIRE(r.ok);
  REQUIRE(h.format_id(r.seq).view() == id);
  return id;
}

struct replayed {
  replay_result r;
  std::vector<std::string> ids;  // from the frames' bytes
};

replayed replay(history& h, std::string_view topic, std::string_view since, std::uint64_t until = UINT64_MAX,
                std::uint64_t now = 0) {
  replayed out;
  std::uint64_t prev = 0;
  out.r = h.replay(topic, since, until, now, [&](std::uint64_t seq, const pool::frame_ref& f) {
    CHECK(seq > prev);  // oldest first
    prev = seq;
    std::string t = text_of(f);
    std::size_t bar = t.find('|');
    out.ids.push_back(t.substr(bar + 1, t.find('.', bar) - bar - 1));  // without the padding
  });
  CHECK(out.r.replayed == out.ids.size());
  return out;
}

}  // namespace

TEST_CASE("history: ids carry the epoch and parse back") {
  history h(opts());
  CHECK(h.epoch() == "k3f9");
  CHECK(h.format_id(18).view() == "k3f9:18");
  CHECK(h.format_id(UINT64_MAX).view() == "k3f9:18446744073709551615");
  std::uint64_t s = 0;
  CHECK(h.parse_id("k3f9:18", s));
  CHECK(s == 18);
  CHECK(h.parse_id("k3f9:0", s));
  CHECK(s == 0);
  for (const char* bad : {"", "k3f9", "k3f9:", "k3f9:-1", "k3f9:+1", "k3f9:1x", "k3f9: 1", "x3f9:1", "k3f:91",
                          "k3f9:18446744073709551616", "17", "k3f9k:1"})
    CHECK_FALSE(h.parse_id(bad, s));
  history random_epoch(history_options{});
  CHECK(random_epoch.epoch().size() == 6);
  CHECK(random_epoch.epoch() != history(history_options{}).epoch());  // 36^6 tags: a clash is a bug
  CHECK_THROWS(history([] {
    auto o = opts();
    o.epoch = "UPPER";
    return o;
  }()));
}

TEST_CASE("history: replay returns the entries after since, in order, up to until") {
  history h(opts());
  framer f;
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(publish(h, f, "mailbox:1"));
  publish(h, f, "mailbox:2");  // another topic, possibly the same part
  auto all = replay(h, "mailbox:1", "k3f9:0");
  CHECK_FALSE(all.r.lost);
  CHECK(all.ids == ids);
  auto tail = replay(h, "mailbox:1", ids[1]);
  CHECK_FALSE(tail.r.lost);
  CHECK(tail.ids == std::vector<std::string>(ids.begin() + 2, ids.end()));
  std::uint64_t until = 0;
  REQUIRE(h.parse_id(ids[3], until));
  auto bounded = replay(h, "mailbox:1", ids[1], until);
  CHECK(bounded.ids == std::vector<std::string>{ids[2], ids[3]});
  auto none = replay(h, "mailbox:1", ids[4]);
  CHECK_FALSE(none.r.lost);
  CHECK(none.ids.empty());
  auto nothing_yet = replay(h, "mailbox:never", "k3f9:0");
  CHECK_FALSE(nothing_yet.r.lost);
  CHECK(nothing_yet.ids.empty());
}

TEST_CASE("history: ids increase per topic, and a failed frame uses no seq") {
  history h(opts());
  framer f;
  std::uint64_t prev = 0;
  for (int i = 0; i < 50; ++i) {
    std::string id = publish(h, f, "t" + std::to_string(i % 3));
    std::uint64_t s = 0;
    REQUIRE(h.parse_id(id, s));
    if (i % 3 == 0) {
      CHECK(s > prev);
      prev = s;
    }
  }
  std::uint64_t before = h.last_seq(h.part_of("t0"));
  append_result r = h.append("t0", 0, [](std::string_view, std::uint64_t) { return pool::frame_ref{}; });
  CHECK_FALSE(r.ok);
  CHECK(h.last_seq(h.part_of("t0")) == before);
  CHECK(h.stats().appends == 50);
}

TEST_CASE("history: per-topic size limit evicts the oldest and reports lost past it") {
  history h(opts(3));
  framer f;
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(publish(h, f, "m"));
  CHECK(h.stats().entries == 3);
  CHECK(h.stats().evicted_size == 2);
  auto from_start = replay(h, "m", "k3f9:0");
  CHECK(from_start.r.lost);
  CHECK(from_start.ids == std::vector<std::string>(ids.begin() + 2, ids.end()));  // lost still replays all
  auto edge = replay(h, "m", ids[1]);  // the last evicted one: nothing after it is missing
  CHECK_FALSE(edge.r.lost);
  CHECK(edge.ids.size() == 3);
  auto gap = replay(h, "m", ids[0]);
  CHECK(gap.r.lost);
  CHECK(gap.ids.size() == 3);
}

TEST_CASE("history: entries expire after the TTL, on replay, append and expire()") {
  history h(opts(100, 10 * sec));
  framer f;
  std::string a1 = publish(h, f, "a", 1 * sec);
  std::string a2 = publish(h, f, "a", 5 * sec);
  std::string b1 = publish(h, f, "b", 2 * sec);
  auto early = replay(h, "a", "k3f9:0", UINT64_MAX, 10 * sec);
  CHECK_FALSE(early.r.lost);
  CHECK(early.ids == std::vector<std::string>{a1, a2});
  auto later = replay(h, "a", "k3f9:0", UINT64_MAX, 11 * sec);  // a1 is 10 s old
  CHECK(later.r.lost);
  CHECK(later.ids == std::vector<std::string>{a2});
  CHECK(replay(h, "a", a1, UINT64_MAX, 11 * sec).r.lost == false);
  CHECK(h.stats().evicted_ttl == 1);
  h.expire(12 * sec);  // b1
  CHECK(h.stats().evicted_ttl == 2);
  CHECK(h.stats().topics == 1);
  std::string a3 = publish(h, f, "a", 15 * sec);  // append expires a2 of its own topic
  CHECK(h.stats().evicted_ttl == 3);
  CHECK(replay(h, "a", a2, UINT64_MAX, 15 * sec).ids == std::vector<std::string>{a3});
  // b's state went with its last entry: resuming right after b1 is fine, before it is lost.
  CHECK_FALSE(replay(h, "b", b1, UINT64_MAX, 15 * sec).r.lost);
  CHECK(replay(h, "b", "k3f9:0", UINT64_MAX, 15 * sec).r.lost);
}

TEST_CASE("history: the memory cap evicts the oldest entries across all topics first") {
  // Frames in 4 KiB blocks: the cap holds ten of them and half a block for the rest (four
  // topics' nodes, the parts' slots and buckets: about 1.5 KB), never eleven.
  const std::size_t block = pool::buffer_pool::block_footprint(4096);
  const std::uint64_t cap = 10 * block + block / 2;
  history h(opts(100, 0, cap));
  framer f;
  std::vector<std::pair<std::string, std::string>> order;  // (topic, id) in publish order
  for (int i = 0; i < 30; ++i) {
    std::string topic = "t0" + std::to_string(i % 4);
    order.emplace_back(topic, publish(h, f, topic, 0, 3000));
  }
  history_stats s = h.stats();
  CHECK(s.bytes <= cap);
  CHECK(s.entries == 10);
  CHECK(s.evicted_memory == 20);
  // Exactly the 10 newest survive.
  std::size_t kept = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    auto& [topic, id] = order[k];
    std::uint64_t seq = 0;
    REQUIRE(h.parse_id(id, seq));
    auto r = replay(h, topic, "k3f9:0", seq);  // entries up to this one
    bool present = !r.ids.empty() && r.ids.back() == id;
    CHECK(present == (k >= 20));
    kept += present;
  }
  CHECK(kept == 10);
}

namespace {

/// A frame of `used` bytes in a block of at least `capacity`: what an encoder sized for the
/// worst case hands the history.
pool::frame_ref roomy_frame(pool::buffer_pool& buffers, std::size_t used, std::size_t capacity) {
  pool::lease l = buffers.acquire(capacity);
  std::memset(l.data(), 'x', used);
  l.set_size(used);
  return pool::frame_ref::adopt(std::move(l));
}

}  // namespace

TEST_CASE("history: the bytes counted include the frame's whole block, not only its bytes") {
  history h(opts());
  pool::buffer_pool buffers;
  REQUIRE(h.append("a", 0, [&](std::string_view, std::uint64_t) { return roomy_frame(buffers, 10, 4096); }).ok);
  // 10 bytes used, but the history holds the 4 KiB block (and its header) until it evicts it.
  CHECK(h.stats().bytes >= 4096 + 32);
}

TEST_CASE("history: the memory cap evicts by what the blocks hold") {
  const std::size_t cap = 64 << 10;
  history h(opts(100, 0, cap));
  pool::buffer_pool buffers;
  for (int i = 0; i < 100; ++i) {
    std::string topic = "topic:" + std::to_string(i);
    REQUIRE(h.append(topic, 0, [&](std::string_view, std::uint64_t) { return roomy_frame(buffers, 10, 4096); }).ok);
  }
  history_stats s = h.stats();
  CHECK(s.bytes <= cap);
  CHECK(s.entries <= cap / 4096);  // each holds a 4 KiB block, whatever its 10 bytes say
  CHECK(s.evicted_memory == 100 - s.entries);
  // The blocks evicted went back to the pool: only the retained ones are out.
  CHECK(buffers.stats(pool::buffer_pool::class_index(4096)).leased == s.entries);
}

TEST_CASE("history: a frame's compressed twin is counted with it, and leaves with it") {
  pool::buffer_pool buffers;
  auto frame = [&](bool twin) {
    pool::frame_ref f = roomy_frame(buffers, 10, 4096);
    if (twin) REQUIRE(f.set_twin(roomy_frame(buffers, 10, 2048)));
    return f;
  };
  // The same appends to two histories of one event per topic, the first event twinned in one.
  history a(opts(1)), b(opts(1));
  REQUIRE(a.append("t", 0, [&](std::string_view, std::uint64_t) { return frame(true); }).ok);
  REQUIRE(b.append("t", 0, [&](std::string_view, std::uint64_t) { return frame(false); }).ok);
  CHECK(a.stats().bytes == b.stats().bytes + pool::buffer_pool::block_footprint(2048));
  REQUIRE(a.append("t", 0, [&](std::string_view, std::uint64_t) { return frame(false); }).ok);  // evicts it
  REQUIRE(b.append("t", 0, [&](std::string_view, std::uint64_t) { return frame(false); }).ok);
  CHECK(a.stats().bytes == b.stats().bytes);  // the twin's bytes left with it
  CHECK(buffers.stats(pool::buffer_pool::class_index(2048)).leased == 0);
}

TEST_CASE("history: an emptied history counts nothing") {
  history h(opts(100, 10 * sec));
  framer f;
  for (int i = 0; i < 1000; ++i) publish(h, f, "topic:" + std::to_string(i), 1 * sec);
  CHECK(h.stats().bytes > 1000 * 256);
  h.expire(20 * sec);
  history_stats s = h.stats();
  CHECK(s.entries == 0);
  CHECK(s.topics == 0);
  CHECK(s.bytes == 0);  // the entry slots and topic buckets went with the last entry
}

TEST_CASE("history: lost for foreign epochs, malformed ids and ids ahead of the topic") {
  history h(opts()), other([] {
    auto o = opts();
    o.epoch = "zz01";
    return o;
  }());
  framer f;
  std::string id = publish(h, f, "m");
  std::string foreign = publish(other, f, "m");
  CHECK(foreign.rfind("zz01:", 0) == 0);
  for (std::string since : {foreign, std::string("garbage"), std::string("k3f9:x"), std::string("")}) {
    auto r = replay(h, "m", since);
    CHECK(r.r.lost);
    CHECK(r.ids == std::vector<std::string>{id});  // what is retained still comes
  }
  CHECK(replay(h, "m", "k3f9:999").r.lost);        // ahead of anything the part issued
  CHECK(replay(h, "unknown", "k3f9:999").r.lost);  // ahead of anything issued
  CHECK(replay(h, "unknown", "zz01:1").r.lost);
  CHECK_FALSE(replay(h, "m", id).r.lost);
}

TEST_CASE("history: a position past the topic's last event that its part issued is not lost") {
  history h(opts());
  framer f;
  const std::string m1 = publish(h, f, "m");
  // Another topic of m's part takes the part's sequence past m's last event.
  std::string other;
  for (int k = 0; other.empty() && k < 1000; ++k)
    if (std::string t = "o" + std::to_string(k); h.part_of(t) == h.part_of("m")) other = t;
  REQUIRE(!other.empty());
  publish(h, f, other);
  const std::string position(h.format_id(h.last_seq(h.part_of("m"))).view());
  CHECK(position != m1);
  auto nothing = replay(h, "m", position);
  CHECK_FALSE(nothing.r.lost);
  CHECK(nothing.ids.empty());
  const std::string m2 = publish(h, f, "m");
  auto next = replay(h, "m", position);
  CHECK_FALSE(next.r.lost);
  CHECK(next.ids == std::vector<std::string>{m2});
}

TEST_CASE("history: size 0 keeps nothing, still issues ids, reports lost") {
  history h(opts(0));
  framer f;
  std::string a = publish(h, f, "m");
  std::string b = publish(h, f, "m");
  CHECK(a != b);
  CHECK(h.stats().entries == 0);
  CHECK(replay(h, "m", a).r.lost);
  CHECK_FALSE(replay(h, "m", b).r.lost);
}

TEST_CASE("history: replay up to what the reactor fanned out meets live delivery without gap or duplicate") {
  // A reactor simulated on one thread: the frame maker posts into its inbox (as the shard
  // will), the reactor drains part of it, a connection that saw up to seq 3 subscribes,
  // replays up to `fanned`, and then receives the rest live. Whatever the split, it gets
  // 4..20 exactly once, in order.
  for (int split = 0; split <= 17; ++split) {
    CAPTURE(split);
    history h(opts(1000));
    framer f;
    f.topic = "m";
    std::deque<std::uint64_t> inbox;
    auto pub = [&] {
      h.append("m", 0, [&](std::string_view id, std::uint64_t seq) {
        inbox.push_back(seq);
        return f.frame(id);
      });
    };
    std::vector<std::uint64_t> got;
    std::uint64_t fanned = 0;
    bool subscribed = false;
    auto drain_one = [&] {
      fanned = inbox.front();
      inbox.pop_front();
      if (subscribed) got.push_back(fanned);  // live
    };
    for (int i = 0; i < 20; ++i) pub();
    for (int i = 0; i < 3; ++i) drain_one();
    for (int i = 0; i < split; ++i) drain_one();
    subscribed = true;  // the registry first, then the replay
    auto r = h.replay("m", h.format_id(3).view(), fanned, 0,
                      [&](std::uint64_t seq, const pool::frame_ref&) { got.push_back(seq); });
    CHECK_FALSE(r.lost);
    while (!inbox.empty()) drain_one();
    std::vector<std::uint64_t> want;
    for (std::uint64_t s = 4; s <= 20; ++s) want.push_back(s);
    CHECK(got == want);
  }
}

TEST_CASE("history: concurrent appends and replays stay ordered and consistent") {
  history_options o = opts(16);
  // An entry here counts its 256-byte block (320 with header and allocator): 24 KiB holds
  // fewer than the 8 x 16 entries the per-topic limit allows, and topic 0 takes half the
  // appends, so both limits bite.
  o.max_bytes = 24 << 10;
  history h(o);
  const int writers = 4, per_writer = 3000, topics = 8;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bad{0};
  auto writer = [&](int w) {
    framer f;
    for (int i = 0; i < per_writer; ++i) {
      f.topic = "topic:" + std::to_string(i % 2 == 0 ? 0 : (i + w) % topics);
      auto r = h.append(f.topic, std::uint64_t(i), [&](std::string_view id, std::uint64_t) { return f.frame(id, 16); });
      if (!r.ok) bad.fetch_add(1);
    }
  };
  auto reader = [&](int rdr) {
    while (!stop.load()) {
      for (int t = 0; t < topics; ++t) {
        std::string topic = "topic:" + std::to_string(t);
        std::uint64_t prev = 0;
        h.replay(topic, "k3f9:0", UINT64_MAX, 0, [&](std::uint64_t seq, const pool::frame_ref& fr) {
          std::string text = text_of(fr);
          if (seq <= prev || text.rfind(topic + "|k3f9:" + std::to_string(seq), 0) != 0) bad.fetch_add(1);
          prev = seq;
        });
      }
      (void)h.stats();
      (void)rdr;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back(reader, r);
  for (int w = 0; w < writers; ++w) threads.emplace_back(writer, w);
  for (std::size_t k = 2; k < threads.size(); ++k) threads[k].join();
  stop.store(true);
  threads[0].join();
  threads[1].join();
  CHECK(bad.load() == 0);
  history_stats s = h.stats();
  CHECK(s.appends == std::uint64_t(writers * per_writer));
  CHECK(s.entries + s.evicted_size + s.evicted_memory == s.appends);
  CHECK(s.entries <= std::uint64_t(topics) * 16);
  CHECK(s.bytes <= o.max_bytes);
  CHECK(s.evicted_memory > 0);
  CHECK(s.evicted_size > 0);
}

namespace {

/// A keyed append at `now`: its seq, and whether it was a duplicate (then nothing was framed).
std::pair<std::uint64_t, bool> keyed(history& h, framer& f, std::string_view topic, std::string_view key,
                                     std::uint64_t now, int& made) {
  f.topic = topic;
  const append_result r = h.append(topic, now, [&](std::string_view id, std::uint64_t) {
    ++made;
    return f.frame(id);
  }, key);
  REQUIRE(r.ok);
  return {r.seq, r.duplicate};
}

}  // namespace

TEST_CASE("history: an idempotency key appends once per topic within the window") {
  history_options o = opts();
  o.idempotency_window_ns = 10 * sec;
  history h(o);
  framer f;
  int made = 0;
  const auto first = keyed(h, f, "t", "k", 1 * sec, made);
  CHECK_FALSE(first.second);
  CHECK(keyed(h, f, "t", "k", 5 * sec, made) == std::pair{first.first, true});  // within: the first's seq
  CHECK(made == 1);
  const auto other_topic = keyed(h, f, "u", "k", 5 * sec, made);  // the same key, another topic: its own
  CHECK_FALSE(other_topic.second);
  CHECK_FALSE(keyed(h, f, "t", "k2", 5 * sec, made).second);
  CHECK(keyed(h, f, "t", "", 5 * sec, made).second == false);  // no key: always published
  CHECK(keyed(h, f, "t", "", 5 * sec, made).second == false);
  CHECK(made == 5);
  // Out of the window (10 s after the first): published again, and remembered anew.
  const auto again = keyed(h, f, "t", "k", 11 * sec, made);
  CHECK_FALSE(again.second);
  CHECK(again.first > first.first);
  CHECK(keyed(h, f, "t", "k", 12 * sec, made) == std::pair{again.first, true});
  CHECK(h.stats().duplicates == 2);
  // Keys out of the window are forgotten by the next keyed append of their part.
  keyed(h, f, "t", "k3", 30 * sec, made);
  CHECK(h.stats().idempotency_keys <= 2);
}

TEST_CASE("history: idempotency keys are bounded: past a part's share the oldest is forgotten") {
  history_options o = opts();
  o.parts = 1;
  o.idempotency_keys = 4;
  history h(o);
  framer f;
  int made = 0;
  for (int k = 0; k < 10; ++k) keyed(h, f, "t", "k" + std::to_string(k), sec, made);
  CHECK(h.stats().idempotency_keys == 4);
  CHECK(keyed(h, f, "t", "k9", sec, made).second);        // among the newest: remembered
  CHECK_FALSE(keyed(h, f, "t", "k0", sec, made).second);  // forgotten: a retry this late publishes again
  CHECK(h.stats().idempotency_keys == 4);
}

TEST_CASE("history: one key from many threads at once appends once") {
  history h(opts());
  std::atomic<int> made{0};
  std::vector<std::uint64_t> seqs(8);
  std::vector<std::thread> threads;
  pool::buffer_pool buffers;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const append_result r = h.append("t", 0, [&](std::string_view, std::uint64_t) {
        ++made;
        pool::lease l = buffers.acquire(8);
        l.set_size(1);
        return pool::frame_ref::adopt(std::move(l));
      }, "same");
      seqs[t] = r.ok ? r.seq : 0;
    });
  for (auto& t : threads) t.join();
  CHECK(made == 1);
  for (std::uint64_t s : seqs) CHECK(s == seqs[0]);
}
