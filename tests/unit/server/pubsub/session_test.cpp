// The pub/sub session over a fake connection layer (no sockets, no loop thread): the protocol's
// replies and their order, grants, resume with its seam, lost, abuse, and cleanup on close.
// Events go from the real hub through a port that hands them straight to the shard's fanout.

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/jwt.hpp"
#include "proto/ws_frame.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/session.hpp"
#include "server/reactor/loop.hpp"
#include "tests/unit/server/pubsub/fake_conns.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::pubsub;

namespace {

using testing::fake_conns;

/// The hub's port of the one shard: the event goes to the fanout at once.
struct direct_port final : event_port {
  fanout* f = nullptr;
  bool offer(event&& e, bool) noexcept override {
    f->on_item(std::move(e));
    f->on_pass_end();  // each event its own pass: delivered at once
    return true;
  }
  void wake() noexcept override {}
  bool crowded() const noexcept override { return false; }
};

struct fixture {
  pool::buffer_pool buffers;
  session_options opts;
  loop l{loop_options{}};  // hosts the fanout's inbox; never run here
  hub h{history_options{.size_per_topic = 3, .epoch = "ep"}, buffers};
  fanout f{l, 64, h.events().part_count(), registry_options{8, 128, 1}};
  direct_port port;
  fake_conns conns{buffers};
  proto::jwt_verifier verifier{"session-test-secret"};
  session s;

  explicit fixture(bool tokens, session_options o = {})
      : opts(o), s(opts, tokens ? &verifier : nullptr, h, f, 64 * 1024, true) {
    port.f = &f;
    h.attach({&port});
    s.bind(conns);
  }
  void open(conn_id c, std::string_view topics = {}, std::string_view pub = {}, std::int64_t exp = 0) {
    REQUIRE(s.on_open(c, open_info{exp, topics, pub}));
  }
  void say(conn_id c, std::string text) {
    message m{proto::opcode::text, {reinterpret_cast<std::uint8_t*>(text.data()), text.size()}, text.size(), nullptr};
    s.on_message(c, m);
  }
  std::string publish(std::string_view topic, std::string_view data) {
    history_id id;
    REQUIRE(h.publish(topic, data, id, true) == publish_status::ok);
    return std::string(id.view());
  }
  std::vector<std::string>& got(conn_id c) { return conns.sent[c]; }
};

std::string compact(std::initializer_list<std::string_view> patterns) {
  std::string out;
  for (std::string_view p : patterns) out.append(1, char(p.size())).append(p);
  return out;
}

}  // namespace

TEST_CASE("session: sub is answered subbed, then events reach exactly the subscribers, data byte for byte") {
  fixture x(false);
  x.open(1);
  x.open(2);
  x.say(1, R"({"op":"sub","topics":["mailbox:42"]})");
  REQUIRE(x.got(1) == std::vector<std::string>{R"({"op":"subbed","topics":["mailbox:42"],"lost":[],"at":{"mailbox:42":"ep:0"}})"});
  std::string id = x.publish("mailbox:42", R"({ "subject" : "hi" })");
  x.publish("mailbox:43", "1");
  REQUIRE(x.got(1).size() == 2);
  CHECK(x.got(1)[1] == R"({"topic":"mailbox:42","id":")" + id + R"(","data":{ "subject" : "hi" }})");
  CHECK(x.got(2).empty());
  x.say(1, R"({"op":"unsub","topics":["mailbox:42"]})");
  CHECK(x.got(1).back() == R"({"op":"unsubbed","topics":["mailbox:42"]})");
  x.publish("mailbox:42", "2");
  CHECK(x.got(1).size() == 3);
}

TEST_CASE("session: sub with since replays what was missed after subbed, and says lost where history ends") {
  fixture x(false);
  x.open(1);
  std::string first = x.publish("t", "1");
  x.publish("t", "2");
  x.publish("t", "3");
  x.say(1, R"({"op":"sub","topics":["t","u"],"since":{"t":")" + first + R"(","u":"other:5"}})");
  auto& g = x.got(1);
  REQUIRE(g.size() == 3);
  // `u`: a foreign epoch. Positions: the seam of each topic's part (the replay of `t` reaches it).
  CHECK(g[0] == R"({"op":"subbed","topics":["t","u"],"lost":["u"],"at":{"t":"ep:3","u":"ep:0"}})");
  CHECK(g[1].find(R"("data":2})") != std::string::npos);
  CHECK(g[2].find(R"("data":3})") != std::string::npos);
  x.publish("t", "4");  // live after the replay, no gap, no duplicate
  REQUIRE(g.size() == 4);
  CHECK(g[3].find(R"("data":4})") != std::string::npos);
  // Past the history's reach (3 per topic): lost, and what it still holds is replayed.
  x.open(2);
  for (int k = 5; k < 9; ++k) x.publish("t", std::to_string(k));
  x.say(2, R"({"op":"sub","topics":["t"],"since":{"t":")" + first + R"("}})");
  REQUIRE(x.got(2).size() == 4);
  CHECK(x.got(2)[0] == R"({"op":"subbed","topics":["t"],"lost":["t"],"at":{"t":"ep:8"}})");
}

TEST_CASE("session: with tokens, grants decide sub and pub, all or nothing, and the token's exp is the expiry") {
  fixture x(true);
  x.open(1, compact({"mailbox:42", "team:*"}), compact({"team:*"}), 4'000'000'000);
  CHECK(x.s.expiry(1) == 4'000'000'000u);
  x.say(1, R"({"op":"sub","topics":["team:a","mailbox:43"]})");
  CHECK(x.got(1).back() == R"({"op":"error","code":"forbidden","topic":"mailbox:43"})");
  CHECK(x.f.registry().subscription_count() == 0);  // nothing of it took
  x.say(1, R"({"op":"sub","topics":["team:a","mailbox:42"]})");
  CHECK(x.f.registry().subscription_count() == 2);
  x.say(1, R"({"op":"pub","topic":"mailbox:42","data":1})");
  CHECK(x.got(1).back() == R"({"op":"error","code":"forbidden","topic":"mailbox:42","of":"pub"})");
  x.say(1, R"({"op":"pub","topic":"team:a","data":{"x":1}})");
  CHECK(x.got(1).back().find(R"("topic":"team:a")") != std::string::npos);  // its own publish came back
  x.s.on_expired(1);
  CHECK(x.conns.closed[1] == 1008);
}

TEST_CASE("session: without tokens clients publish only when allowed") {
  fixture closed_pub(false);
  closed_pub.open(1);
  closed_pub.say(1, R"({"op":"pub","topic":"t","data":1})");
  CHECK(closed_pub.got(1).back() == R"({"op":"error","code":"forbidden","topic":"t","of":"pub"})");
  fixture open_pub(false, session_options{.allow_client_publish = true});
  open_pub.open(1);
  open_pub.say(1, R"({"op":"pub","topic":"t","data":1})");
  CHECK(open_pub.h.events().stats().entries == 1);
}

TEST_CASE("session: refusals in a row close with 1008, a good message resets the count and binary is 1003") {
  fixture x(false);
  x.open(1);
  for (int k = 0; k < 7; ++k) x.say(1, "nope");
  CHECK(x.conns.closed.empty());
  x.say(1, R"({"op":"sub","topics":["t"]})");
  for (int k = 0; k < 7; ++k) x.say(1, R"({"op":"what"})");
  CHECK(x.conns.closed.empty());
  x.say(1, "[]");
  CHECK(x.conns.closed[1] == 1008);
  x.open(2);
  std::string b = "x";
  message m{proto::opcode::binary, {reinterpret_cast<std::uint8_t*>(b.data()), 1}, 1, nullptr};
  x.s.on_message(2, m);
  CHECK(x.conns.closed[2] == 1003);
}

TEST_CASE("session: a closed connection leaves no subscription behind and its slot starts clean") {
  fixture x(true);
  x.open(1, compact({"*"}), {});
  x.say(1, R"({"op":"sub","topics":["a","b","c"]})");
  CHECK(x.f.counters().subscriptions.get() == 3);
  x.s.on_close(1);
  CHECK(x.f.registry().subscription_count() == 0);
  CHECK(x.f.counters().subscriptions.get() == 0);
  CHECK(x.s.expiry(1) == 0);
  x.publish("a", "1");
  CHECK(x.got(1).size() == 1);  // only the subbed from before
}

namespace {
std::string mint(proto::jwt_verifier& v, const std::string& claims) {
  char buf[4096];
  std::size_t n = v.mint(claims, buf);
  REQUIRE(n > 0);
  return {buf, n};
}
TEST_CASE("session: each topic new to the connection gets its position, and a resume from it misses nothing after it") {
  fixture x(false);
  x.open(1);
  x.publish("t", "1");
  x.publish("u", "1");
  // All three are new to the connection; `v` resumes from a since its history no longer
  // reaches (lost): its position is where it stands now, told once.
  x.say(1, R"({"op":"sub","topics":["t","u","v"],"since":{"v":"zz:0"}})");
  const std::string& subbed = x.got(1).at(0);
  INFO(subbed);
  simdjson::dom::parser p;
  simdjson::dom::element root, at;
  REQUIRE(p.parse(subbed).get(root) == simdjson::SUCCESS);
  REQUIRE(root["at"].get(at) == simdjson::SUCCESS);
  std::string_view at_t, at_u, at_v;
  REQUIRE(at["t"].get(at_t) == simdjson::SUCCESS);
  REQUIRE(at["u"].get(at_u) == simdjson::SUCCESS);
  REQUIRE(at["v"].get(at_v) == simdjson::SUCCESS);
  CHECK(subbed.find(R"("lost":["v"])") != std::string::npos);
  // Named again while subscribed: no position (the connection has the topic live already).
  x.say(1, R"({"op":"sub","topics":["t"]})");
  CHECK(x.got(1).back() == R"({"op":"subbed","topics":["t"],"lost":[]})");
  // The connection goes before anything else comes; a resume from the positions brings what was
  // published meanwhile, and nothing from before the first sub.
  x.s.on_close(1);
  const std::string t2 = x.publish("t", "2");
  x.open(2);
  x.say(2, R"({"op":"sub","topics":["t","u","v"],"since":{"t":")" + std::string(at_t) + R"(","u":")" +
               std::string(at_u) + R"(","v":")" + std::string(at_v) + R"("}})");
  REQUIRE(x.got(2).size() == 2);
  CHECK(x.got(2)[0].rfind(R"({"op":"subbed","topics":["t","u","v"],"lost":[],"at":{)", 0) == 0);
  CHECK(x.got(2)[1] == R"({"topic":"t","id":")" + t2 + R"(","data":2})");
}

std::int64_t now_s() { return std::int64_t(std::time(nullptr)); }
}  // namespace

TEST_CASE("session: auth replaces grants and expiry in-band and unsubscribes what they no longer allow") {
  fixture x(true);
  x.open(1, compact({"mailbox:42", "team:*"}), {}, now_s() + 60);
  x.say(1, R"({"op":"sub","topics":["mailbox:42","team:a","team:b"]})");
  REQUIRE(x.f.registry().subscription_count() == 3);
  const std::int64_t exp = now_s() + 3600;
  x.say(1, R"({"op":"auth","token":")" + mint(x.verifier, R"({"exp":)" + std::to_string(exp) +
                                                              R"(,"topics":["team:a","news:*"]})") + "\"}");
  const std::string& reply = x.got(1).back();
  CHECK(reply.rfind(R"({"op":"authed","exp":)" + std::to_string(exp) + R"(,"unsubbed":[)", 0) == 0);
  CHECK(reply.find(R"("mailbox:42")") != std::string::npos);
  CHECK(reply.find(R"("team:b")") != std::string::npos);
  CHECK(reply.find(R"("team:a")") == std::string::npos);
  CHECK(x.f.registry().subscription_count() == 1);
  CHECK(x.s.expiry(1) == std::uint32_t(exp));
  CHECK(x.conns.expiry_changes == 1);  // the connection's deadline follows the new exp
  x.say(1, R"({"op":"sub","topics":["news:x"]})");  // granted now
  const std::string subbed = R"({"op":"subbed","topics":["news:x"],"lost":[],"at":{"news:x":"ep:0"}})";
  CHECK(x.got(1).back() == subbed);
  x.publish("team:b", "1");
  CHECK(x.got(1).back() == subbed);  // no longer subscribed
}

TEST_CASE("session: a refused auth changes nothing and without tokens auth is a bad request") {
  fixture x(true);
  x.open(1, compact({"mailbox:42"}), {}, now_s() + 60);
  x.say(1, R"({"op":"sub","topics":["mailbox:42"]})");
  proto::jwt_verifier other("another secret");
  for (std::string token : {std::string("not.a.jwt"), mint(other, R"({"exp":4000000000,"topics":["*"]})"),
                            mint(x.verifier, R"({"exp":1000,"topics":["*"]})"),  // expired
                            mint(x.verifier, R"({"exp":4000000000,"nbf":)" + std::to_string(now_s() + 500) +
                                                 R"(,"topics":["*"]})")}) {  // not valid yet
    x.say(1, R"({"op":"auth","token":")" + token + "\"}");
    CHECK(x.got(1).back() == R"({"op":"error","code":"unauthorized"})");
  }
  CHECK(x.f.registry().subscription_count() == 1);
  CHECK(x.s.expiry(1) == std::uint32_t(now_s() + 60));
  CHECK(x.conns.expiry_changes == 0);
  x.say(1, R"({"op":"sub","topics":["other"]})");
  CHECK(x.got(1).back() == R"({"op":"error","code":"forbidden","topic":"other"})");

  fixture open(false);
  open.open(2);
  open.say(2, R"({"op":"auth","token":"a.b.c"})");
  CHECK(open.got(2).back() == R"({"op":"error","code":"bad_request"})");
  const std::size_t before = open.got(2).size();
  open.say(2, R"({"op":"pong"})");  // the heartbeat's answer: no reply
  CHECK(open.got(2).size() == before);
}
