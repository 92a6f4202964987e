#include "server/pubsub/presence.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "server/base/user_table.hpp"
#include "server/pubsub/namespaces.hpp"

using wspush::server::user_table;
using wspush::server::pubsub::presence_table;
using change = presence_table::change;

namespace {

std::map<std::uint32_t, std::uint32_t> users_of(const presence_table& t, std::string_view topic, std::size_t max = 100) {
  presence_table::reading r;
  t.read(topic, max, r);
  return {r.users.begin(), r.users.end()};
}

}  // namespace

TEST_CASE("presence: a user's first connection joins, its last leaves, tabs in between change nothing") {
  presence_table t;
  std::uint32_t now = 0;
  CHECK(t.add("room:1", 7, &now) == change::first);
  CHECK(now == 1);
  CHECK(t.add("room:1", 7, &now) == change::more);
  CHECK(now == 2);
  CHECK(t.add("room:1", 8) == change::first);  // a second user: the table's own map
  CHECK(t.add("room:1", 9) == change::first);
  CHECK(t.add("room:1", 0) == change::more);   // no user: counted, never announced
  CHECK(users_of(t, "room:1") == std::map<std::uint32_t, std::uint32_t>{{7, 2}, {8, 1}, {9, 1}});
  presence_table::reading r;
  t.read("room:1", 1, r);
  CHECK(r.users.size() == 1);
  CHECK(r.user_count == 3);
  CHECK(r.connections == 5);
  CHECK(t.topics() == 1);
  CHECK(t.entries() == 3);

  CHECK(t.remove("room:1", 7, &now) == change::more);
  CHECK(now == 1);
  CHECK(t.remove("room:1", 7, &now) == change::last);
  CHECK(now == 0);
  CHECK(t.add("room:1", 10) == change::first);  // takes the place user 7 left
  CHECK(t.remove("room:1", 8) == change::last);
  CHECK(t.remove("room:1", 8) == change::more);  // never added (again): ignored
  CHECK(t.remove("room:1", 9) == change::last);
  CHECK(t.remove("room:1", 10) == change::last);
  CHECK(t.topics() == 1);  // the connection without a user is still there
  CHECK(t.remove("room:1", 0) == change::more);
  CHECK(t.topics() == 0);
  CHECK(t.entries() == 0);
  t.read("room:1", 100, r);
  CHECK(r.user_count == 0);
  CHECK(r.connections == 0);
}

TEST_CASE("presence: topics are apart, and visit sees every (topic, user)") {
  presence_table t(4);
  for (std::uint32_t k = 1; k <= 1000; ++k) REQUIRE(t.add("mailbox:" + std::to_string(k), k) == change::first);
  CHECK(t.add("mailbox:1", 2) == change::first);
  CHECK(t.topics() == 1000);
  CHECK(t.entries() == 1001);
  std::size_t seen = 0;
  std::uint64_t connections = 0;
  for (std::uint32_t p = 0; p < t.parts(); ++p)
    t.visit(p, [&](std::string_view topic, std::uint32_t user, std::uint32_t n) {
      CHECK(topic.starts_with("mailbox:"));
      CHECK(user >= 1);
      ++seen;
      connections += n;
    });
  CHECK(seen == 1001);
  CHECK(connections == 1001);
  for (std::uint32_t k = 1; k <= 1000; ++k) CHECK(t.remove("mailbox:" + std::to_string(k), k) == change::last);
  CHECK(t.topics() == 1);
  CHECK(users_of(t, "mailbox:1") == std::map<std::uint32_t, std::uint32_t>{{2, 1}});
}

TEST_CASE("presence: GET /presence's body names users, and not_enabled where the namespace keeps none") {
  using namespace wspush::server;
  topic_options none;
  topic_options kept;
  kept.presence = true;
  const pubsub::namespaces spaces(none, {{"room:", kept, "test:1"}});
  user_table users;
  std::uint32_t alice = 0, bob = 0;
  REQUIRE(users.join("alice", alice));
  REQUIRE(users.join("b\"ob", bob));
  presence_table t;
  t.add("room:1", alice);
  t.add("room:1", alice);
  t.add("room:1", bob);
  std::string body;
  CHECK(pubsub::render_presence(t, spaces, &users, "room:1", true, body) == 200);
  CHECK(body == R"({"topic":"room:1","user_count":2,"connections":3})");
  CHECK(pubsub::render_presence(t, spaces, &users, "room:1", false, body) == 200);
  const bool either = body == R"({"topic":"room:1","users":{"alice":2,"b\"ob":1},"user_count":2,"connections":3})" ||
                      body == R"({"topic":"room:1","users":{"b\"ob":1,"alice":2},"user_count":2,"connections":3})";
  CHECK(either);
  CHECK(pubsub::render_presence(t, spaces, &users, "news:1", false, body) == 404);
  CHECK(body.find("not_enabled") != std::string::npos);
}
