// Revokes (POST /disconnect): the revocation list, and a shard's session closing a revoked
// user's connections when its share of the order comes through the event inbox. The last case
// measures that pass at 100k connections on one shard (docs/OPERATIONS.md quotes it).

#include <catch2/catch.hpp>

#include <ctime>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "pool/buffer_pool.hpp"
#include "proto/jwt.hpp"
#include "server/base/revocation_list.hpp"
#include "server/base/user_table.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/revoke.hpp"
#include "server/pubsub/session.hpp"
#include "server/reactor/loop.hpp"
#include "tests/unit/server/pubsub/fake_conns.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::pubsub;

TEST_CASE("revocation_list: a revoked sub's tokens issued no later than the revoke are refused, later ones are not") {
  revocation_list l(3600, 10);
  CHECK_FALSE(l.revoked("u1", 0, 1000));
  CHECK(l.record("u1", 1000, 1000));
  CHECK(l.revoked("u1", 0, 1000));     // no iat: refused
  CHECK(l.revoked("u1", 999, 1000));
  CHECK(l.revoked("u1", 1000, 1000));  // the second of the revoke itself
  CHECK_FALSE(l.revoked("u1", 1001, 1001));
  CHECK_FALSE(l.revoked("u2", 0, 1000));
  CHECK_FALSE(l.revoked("", 0, 1000));
  // The same revoke told again is no news; a later one is, and moves it.
  CHECK_FALSE(l.record("u1", 1000, 1001));
  CHECK_FALSE(l.record("u1", 900, 1001));
  CHECK(l.record("u1", 2000, 2000));
  CHECK(l.revoked("u1", 1500, 2000));
  // Forgotten once the ttl has passed.
  CHECK(l.revoked("u1", 0, 2000 + 3599));
  CHECK_FALSE(l.revoked("u1", 0, 2000 + 3600));
  CHECK(l.size(2000 + 3600) == 0);
  CHECK_FALSE(l.record("old", 100, 5000));  // already past the ttl: not kept
  // A time ahead of this node's clock counts as its now: tokens issued after that are taken, and
  // the largest time there is cannot overflow the ttl's arithmetic.
  CHECK(l.record("ahead", 9000, 6000));
  CHECK(l.revoked("ahead", 6000, 6000));
  CHECK_FALSE(l.revoked("ahead", 6001, 6001));
  CHECK(l.record("far", INT64_MAX, 6000));
  CHECK_FALSE(l.revoked("far", 6001, 6001));
  CHECK_FALSE(l.record("negative", -5, 6000));
}

TEST_CASE("revocation_list: bounded, the oldest revoke forgotten first, and off with a ttl of 0") {
  revocation_list l(3600, 3);
  l.record("a", 1003, 1010);
  l.record("b", 1001, 1010);  // heard late: older than a
  l.record("c", 1002, 1010);
  CHECK(l.size(1010) == 3);
  l.record("d", 1004, 1010);
  CHECK(l.size(1010) == 3);
  CHECK_FALSE(l.revoked("b", 0, 1010));  // the oldest revoke went
  CHECK(l.revoked("a", 0, 1010));
  CHECK(l.revoked("c", 0, 1010));
  CHECK(l.revoked("d", 0, 1010));
  revocation_list off(0, 3);
  CHECK_FALSE(off.enabled());
  CHECK_FALSE(off.record("a", 1000, 1000));
  CHECK_FALSE(off.revoked("a", 0, 1000));
}

namespace {

using testing::fake_conns;

struct direct_port final : event_port {
  fanout* f = nullptr;
  bool offer(event&& e, bool) noexcept override {
    f->on_item(std::move(e));
    f->on_pass_end();
    return true;
  }
  void wake() noexcept override {}
  bool crowded() const noexcept override { return false; }
};

struct fixture {
  pool::buffer_pool buffers;
  session_options opts;
  loop l{loop_options{}};
  hub h{history_options{.size_per_topic = 3, .epoch = "ep"}, buffers};
  fanout f{l, 64, h.events().part_count(), registry_options{8, 128, 1}};
  direct_port port;
  fake_conns conns{buffers};
  proto::jwt_verifier verifier{"revoke-test-secret"};
  user_table users;
  session s{opts, &verifier, h, f, 64 * 1024, true, &users};

  fixture() {
    port.f = &f;
    h.attach({&port});
    s.bind(conns);
  }
  void open(conn_id c, std::string_view sub) {
    std::uint32_t id = 0;
    REQUIRE(users.join(sub, id));
    REQUIRE(s.on_open(c, open_info{0, {}, {}, id}));
  }
  /// What the revoker does for one shard: an order, its share through the port.
  std::uint32_t revoke(std::string_view sub) {
    auto order = std::make_shared<revoke_order>(std::string(sub), users.id_of(sub), 1);
    event e;
    e.reply = std::make_unique<bus_reply>();
    e.reply->kind = bus_reply::revoke;
    e.reply->revoked = revoke_share(order);
    REQUIRE(port.offer(std::move(e), true));
    REQUIRE(order->wait(std::chrono::milliseconds(0)));  // the share is done once taken
    return order->closed.load();
  }
};

}  // namespace

TEST_CASE("session: a revoke closes the user's connections on the shard with 4403, and no one else's") {
  fixture x;
  x.open(1, "alice");
  x.open(2, "bob");
  x.open(3, "alice");
  x.open(7, "alice");
  x.conns.closed[7] = 1000;  // closing already: not counted again
  CHECK(x.revoke("alice") == 2);
  CHECK(x.conns.closed.at(1) == 4403);
  CHECK(x.conns.closed.at(3) == 4403);
  CHECK(x.conns.closed.at(7) == 1000);
  CHECK(x.conns.closed.count(2) == 0);
  CHECK(x.f.counters().revoked_closes.get() == 2);
  CHECK(x.revoke("carol") == 0);  // no connection: nothing
  // A number freed and taken by another user since the order was made closes nothing.
  auto stale = std::make_shared<revoke_order>("bob", x.users.id_of("bob"), 1);
  x.s.on_close(2);
  x.open(2, "dave");  // dave takes bob's number
  {
    event e;
    e.reply = std::make_unique<bus_reply>();
    e.reply->kind = bus_reply::revoke;
    e.reply->revoked = revoke_share(stale);
    x.port.offer(std::move(e), true);
  }
  CHECK(stale->closed.load() == 0);
  CHECK(x.conns.closed.count(2) == 0);
}

TEST_CASE("session: a connection whose user was revoked while its token was checked is refused at its open") {
  fixture x;
  revocation_list list(3600, 10);
  x.s.use_revocations(&list);
  const auto now = std::int64_t(std::time(nullptr));
  std::uint32_t id = 0;
  REQUIRE(x.users.join("erin", id));
  open_info before{0, {}, {}, id, now - 10};
  CHECK(x.s.on_open(4, before));  // nothing revoked yet
  CHECK_FALSE(before.revoked);
  x.s.on_close(4);
  REQUIRE(x.users.join("erin", id));
  list.record("erin", now, now);  // the revoke came after the token was checked, before the open
  open_info late{0, {}, {}, id, now - 10};
  CHECK_FALSE(x.s.on_open(5, late));
  CHECK(late.revoked);
  open_info fresh{0, {}, {}, id, now + 1};  // a token issued after the revoke
  CHECK(x.s.on_open(6, fresh));
  CHECK_FALSE(fresh.revoked);
  open_info other{0, {}, {}, 0, now - 10};  // no user: nothing to ask
  CHECK(x.s.on_open(7, other));
}

TEST_CASE("session: a revoke at 100k connections on one shard (timed)", "[revoke][bench]") {
  fixture x;
  constexpr conn_id n = 100'000;
  for (conn_id c = 0; c < n; ++c) x.open(c, "user" + std::to_string(c % 50'000));  // two connections a user
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint32_t closed = x.revoke("user123");
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(closed == 2);
  std::printf("revoke at %u connections on one shard: %lld us (a pass over its session records)\n", unsigned(n),
              static_cast<long long>(us));
  CHECK(us < 200'000);  // a loose bound (sanitizer builds are slow): the pass is a few hundred us
}
