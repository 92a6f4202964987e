#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/pubsub/topic_registry.hpp"

using namespace wspush::server::pubsub;

namespace {

std::vector<std::uint32_t> sorted_subs(const topic_registry& r, std::string_view topic) {
  auto s = r.subscribers(topic);
  std::vector<std::uint32_t> v(s.begin(), s.end());
  std::sort(v.begin(), v.end());
  return v;
}

std::set<std::string> topics_of(const topic_registry& r, std::uint32_t conn) {
  std::set<std::string> out;
  std::uint32_t n = r.topics_of(conn, [&](std::string_view t) { out.emplace(t); });
  CHECK(n == out.size());  // no topic twice in a chain
  return out;
}

/// The reference: two ordered maps, obviously right.
struct model {
  std::map<std::string, std::set<std::uint32_t>> by_topic;
  std::map<std::uint32_t, std::set<std::string>> by_conn;
  std::uint32_t max_topics;

  sub_result subscribe(std::uint32_t c, const std::string& t) {
    auto& mine = by_conn[c];
    if (mine.count(t) != 0) return sub_result::already;
    if (mine.size() >= max_topics) return sub_result::too_many_topics;
    mine.insert(t);
    by_topic[t].insert(c);
    return sub_result::added;
  }
  bool unsubscribe(std::uint32_t c, const std::string& t) {
    if (by_conn[c].erase(t) == 0) return false;
    by_topic[t].erase(c);
    if (by_topic[t].empty()) by_topic.erase(t);
    return true;
  }
  std::uint32_t unsubscribe_all(std::uint32_t c) {
    auto mine = by_conn[c];
    for (auto& t : mine) unsubscribe(c, t);
    return std::uint32_t(mine.size());
  }
};

void check_equal(const topic_registry& r, const model& m, const std::vector<std::string>& names, std::uint32_t conns) {
  REQUIRE(r.topic_count() == m.by_topic.size());
  std::uint64_t subs = 0;
  for (auto& name : names) {
    auto it = m.by_topic.find(name);
    std::vector<std::uint32_t> want;
    if (it != m.by_topic.end()) want.assign(it->second.begin(), it->second.end());
    REQUIRE(sorted_subs(r, name) == want);
    REQUIRE(r.subscriber_count(name) == want.size());
    subs += want.size();
  }
  REQUIRE(r.subscription_count() == subs);
  for (std::uint32_t c = 0; c < conns; ++c) {
    auto it = m.by_conn.find(c);
    std::set<std::string> want = it != m.by_conn.end() ? it->second : std::set<std::string>{};
    REQUIRE(topics_of(r, c) == want);
  }
}

std::vector<std::string> topic_names(std::size_t n) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < n; ++i) {
    // Short and long (over the 30 inline bytes) names, some sharing long prefixes.
    if (i % 3 == 0) names.push_back("mailbox:" + std::to_string(i));
    else if (i % 3 == 1) names.push_back("a-rather-long-topic-name-prefix/shared/" + std::to_string(i));
    else names.push_back(std::string(1 + i % 7, char('a' + i % 26)) + std::to_string(i));
  }
  return names;
}

}  // namespace

TEST_CASE("registry: subscribe, already, unsubscribe, counts") {
  topic_registry r;
  CHECK(r.subscribe(7, "mailbox:42") == sub_result::added);
  CHECK(r.subscribe(7, "mailbox:42") == sub_result::already);
  CHECK(r.subscribe(9, "mailbox:42") == sub_result::added);
  CHECK(r.subscribe(9, "news") == sub_result::added);
  CHECK(r.topic_count() == 2);
  CHECK(r.subscription_count() == 3);
  CHECK(sorted_subs(r, "mailbox:42") == std::vector<std::uint32_t>{7, 9});
  CHECK(r.subscriber_count("nobody") == 0);
  CHECK(topics_of(r, 9) == std::set<std::string>{"mailbox:42", "news"});
  CHECK(r.unsubscribe(7, "mailbox:42"));
  CHECK_FALSE(r.unsubscribe(7, "mailbox:42"));
  CHECK_FALSE(r.unsubscribe(7, "news"));
  CHECK_FALSE(r.unsubscribe(7, "never"));
  CHECK(sorted_subs(r, "mailbox:42") == std::vector<std::uint32_t>{9});
  CHECK(r.unsubscribe_all(9) == 2);
  CHECK(r.topic_count() == 0);
  CHECK(r.subscription_count() == 0);
  CHECK(r.subscribers("news").empty());
  CHECK(r.unsubscribe_all(12345678) == 0);  // never seen
}

TEST_CASE("registry: limits on topics per connection and topic names") {
  registry_options o;
  o.max_topics_per_conn = 3;
  o.max_topic_bytes = 40;
  topic_registry r(o);
  CHECK(r.subscribe(1, "a") == sub_result::added);
  CHECK(r.subscribe(1, "b") == sub_result::added);
  CHECK(r.subscribe(1, "c") == sub_result::added);
  CHECK(r.subscribe(1, "d") == sub_result::too_many_topics);
  CHECK(r.subscribe(1, "c") == sub_result::already);  // at the limit, a repeat is still `already`
  CHECK(r.subscriber_count("d") == 0);
  CHECK(r.topic_count() == 3);
  CHECK(r.subscribe(2, "d") == sub_result::added);  // the limit is per connection
  CHECK(r.subscribe(1, "") == sub_result::bad_topic);
  CHECK(r.subscribe(2, std::string(41, 'x')) == sub_result::bad_topic);
  CHECK(r.subscribe(2, std::string(40, 'x')) == sub_result::added);
  CHECK(r.subscribe(no_slot, "e") == sub_result::bad_topic);
  CHECK(r.unsubscribe(1, "b"));
  CHECK(r.subscribe(1, "d") == sub_result::added);  // room again
}

TEST_CASE("registry: names are stored whole, inline or not, with binary bytes") {
  topic_registry r;
  std::string with_nul("ab\0cd", 5);
  std::string exact30(30, 'q'), long31(31, 'q');
  CHECK(r.subscribe(1, with_nul) == sub_result::added);
  CHECK(r.subscribe(1, exact30) == sub_result::added);
  CHECK(r.subscribe(1, long31) == sub_result::added);
  CHECK(r.subscriber_count("ab") == 0);
  CHECK(r.subscriber_count(with_nul) == 1);
  CHECK(r.subscriber_count(std::string(29, 'q')) == 0);
  CHECK(topics_of(r, 1) == std::set<std::string>{with_nul, exact30, long31});
  CHECK(r.memory().long_names == 31);
  r.unsubscribe_all(1);
  CHECK(r.memory().long_names == 0);
}

TEST_CASE("registry: matches a reference model under random operations") {
  for (std::uint32_t seed : {1u, 2u, 3u, 42u, 2024u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    const std::uint32_t conns = 40;
    auto names = topic_names(60);
    registry_options o;
    o.max_topics_per_conn = 8;
    o.seed = seed;  // also vary the table layout
    topic_registry r(o);
    model m{{}, {}, o.max_topics_per_conn};
    for (int step = 0; step < 20000; ++step) {
      std::uint32_t c = rng() % conns;
      // Skewed choice: a few topics get many subscribers (spilled arrays), most few.
      const std::string& t = names[rng() % 4 == 0 ? rng() % 3 : rng() % names.size()];
      unsigned op = rng() % 100;
      if (op < 55) {
        REQUIRE(r.subscribe(c, t) == m.subscribe(c, t));
      } else if (op < 97) {
        REQUIRE(r.unsubscribe(c, t) == m.unsubscribe(c, t));
      } else {
        REQUIRE(r.unsubscribe_all(c) == m.unsubscribe_all(c));
      }
      if (step % 500 == 0) check_equal(r, m, names, conns);
    }
    check_equal(r, m, names, conns);
    for (std::uint32_t c = 0; c < conns; ++c) r.unsubscribe_all(c);
    CHECK(r.topic_count() == 0);
    CHECK(r.memory().spills == 0);
    CHECK(r.memory().long_names == 0);
  }
}

TEST_CASE("registry: one topic with 19,000 subscribers") {
  topic_registry r;
  const std::uint32_t n = 19000;
  for (std::uint32_t c = 0; c < n; ++c) REQUIRE(r.subscribe(c, "all") == sub_result::added);
  CHECK(r.subscriber_count("all") == n);
  CHECK(r.memory().spills >= n * sizeof(std::uint32_t));
  // Remove every other one, in an order that moves subscribers around in the array.
  std::vector<std::uint32_t> order;
  for (std::uint32_t c = 0; c < n; c += 2) order.push_back(c);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (std::uint32_t c : order) REQUIRE(r.unsubscribe(c, "all"));
  auto left = sorted_subs(r, "all");
  REQUIRE(left.size() == n / 2);
  for (std::uint32_t k = 0; k < left.size(); ++k) REQUIRE(left[k] == 2 * k + 1);
  // Every survivor's node still knows its position: removing all of them works.
  for (std::uint32_t c = 1; c < n; c += 2) REQUIRE(r.unsubscribe_all(c) == 1);
  CHECK(r.topic_count() == 0);
  CHECK(r.memory().spills == 0);
}

TEST_CASE("registry: spilled arrays shrink as subscribers leave and go back inline") {
  topic_registry r;
  for (std::uint32_t c = 0; c < 1024; ++c) r.subscribe(c, "t");
  std::size_t full = r.memory().spills;
  CHECK(full == (1024 + 1) * sizeof(std::uint32_t));
  for (std::uint32_t c = 0; c < 1000; ++c) r.unsubscribe(c, "t");
  CHECK(r.memory().spills < full / 8);
  for (std::uint32_t c = 1000; c < 1023; ++c) r.unsubscribe(c, "t");
  CHECK(r.memory().spills == 0);  // one left: inline again
  CHECK(sorted_subs(r, "t") == std::vector<std::uint32_t>{1023});
}

TEST_CASE("registry: many single-subscriber topics, table grows and shrinks") {
  topic_registry r;
  const std::uint32_t n = 100000;
  for (std::uint32_t c = 0; c < n; ++c)
    REQUIRE(r.subscribe(c, "mailbox:" + std::to_string(c)) == sub_result::added);
  CHECK(r.topic_count() == n);
  for (std::uint32_t c = 0; c < n; c += 997)
    REQUIRE(sorted_subs(r, "mailbox:" + std::to_string(c)) == std::vector<std::uint32_t>{c});
  registry_memory m = r.memory();
  CHECK(m.spills == 0);
  // Per subscription: entry 48 + node 12 + head 4 + table 8/load, plus < one chunk of slack.
  double per_sub = double(m.total()) / n;
  CAPTURE(per_sub);
  CHECK(per_sub < 100);
  std::size_t table_full = m.hash_table;
  for (std::uint32_t c = 0; c < n; ++c) REQUIRE(r.unsubscribe_all(c) == 1);
  CHECK(r.topic_count() == 0);
  CHECK(r.memory().hash_table < table_full / 64);
  // Entries and nodes are recycled: the same load again needs no new chunks.
  std::size_t entries = r.memory().topic_entries, nodes = r.memory().sub_nodes;
  for (std::uint32_t c = 0; c < n; ++c) r.subscribe(c, "box" + std::to_string(c));
  CHECK(r.memory().topic_entries == entries);
  CHECK(r.memory().sub_nodes == nodes);
}

TEST_CASE("registry: hash seeds change the layout, never the answers") {
  auto names = topic_names(2000);
  registry_options a, b;
  a.seed = 1;
  b.seed = 0xdeadbeef;
  topic_registry ra(a), rb(b), rrandom;
  for (std::uint32_t i = 0; i < names.size(); ++i) {
    for (topic_registry* r : {&ra, &rb, &rrandom}) REQUIRE(r->subscribe(i % 50, names[i]) == sub_result::added);
  }
  for (auto& name : names) {
    REQUIRE(sorted_subs(ra, name) == sorted_subs(rb, name));
    REQUIRE(sorted_subs(ra, name) == sorted_subs(rrandom, name));
  }
}
