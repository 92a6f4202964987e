#include <catch2/catch.hpp>

#include <stdexcept>

#include "server/bus/redis_url.hpp"

using namespace wspush::server::bus;

TEST_CASE("bus: redis URLs in every documented shape") {
  auto t = parse_redis_url("redis://127.0.0.1:6379");
  CHECK(t.host == "127.0.0.1");
  CHECK(t.port == 6379);
  CHECK(t.db == 0);
  CHECK(t.password.empty());
  t = parse_redis_url("redis://:s3cret@redis.internal:7000/3");
  CHECK(t.host == "redis.internal");
  CHECK(t.port == 7000);
  CHECK(t.db == 3);
  CHECK(t.password == "s3cret");
  CHECK(t.describe() == "redis://:***@redis.internal:7000/3");  // the password never shows
  t = parse_redis_url("redis://[::1]:6380/");
  CHECK(t.host == "::1");
  CHECK(t.port == 6380);
  CHECK(parse_redis_url("redis://localhost").port == 6379);
  // ACL users, TLS, and credentials with the URL's own characters escaped.
  t = parse_redis_url("rediss://wspush:p%40ss%3Aw%2Fd@redis.internal:6380");
  CHECK(t.tls);
  CHECK(t.user == "wspush");
  CHECK(t.password == "p@ss:w/d");
  CHECK(t.describe() == "rediss://wspush:***@redis.internal:6380/0");
  t = parse_redis_url("redis://wspush@h:1");  // the password from --redis-password-file
  CHECK(t.user == "wspush");
  CHECK(t.password.empty());
  CHECK(!t.tls);
  CHECK(t.describe() == "redis://wspush@h:1/0");
}

TEST_CASE("bus: bad redis URLs are refused with what was expected") {
  for (const char* bad : {"", "redis://", "http://127.0.0.1:6379", "rediss:/h:1", "redis://h:0", "redis://h:65536",
                          "redis://h:port", "redis://:@h", "redis://@h", "redis://u:p%4@h", "redis://u:p%zz@h",
                          "redis://h:1/16", "redis://h:1/x", "redis://[::1:6379", "redis://h h:1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_redis_url(bad), Catch::Contains("redis[s]://[[user]:password@]host:port[/db]"));
  }
}

TEST_CASE("bus: a list of redis URLs is isolated shards, redis-cluster:// names seed nodes") {
  bus_spec one = parse_bus_spec("redis://127.0.0.1:6379");
  CHECK(one.kind == bus_spec::single);
  CHECK(one.targets.size() == 1);
  bus_spec three = parse_bus_spec("redis://a:6379,redis://:pw@b:6380/2,redis://a:6379/1");
  CHECK(three.kind == bus_spec::shards);
  REQUIRE(three.targets.size() == 3);
  CHECK(three.targets[1].describe() == "redis://:***@b:6380/2");
  CHECK(three.targets[2].db == 1);  // the same server, another database: another shard
  bus_spec c = parse_bus_spec("redis-cluster://:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002");
  CHECK(c.kind == bus_spec::cluster);
  REQUIRE(c.targets.size() == 3);
  for (const redis_target& t : c.targets) CHECK(t.password == "pw");
  CHECK(c.targets[2].host == "::1");
  CHECK(c.targets[2].port == 7002);
  bus_spec tc = parse_bus_spec("rediss-cluster://app:pw@10.0.0.1:7000,10.0.0.2:7001");
  CHECK(tc.kind == bus_spec::cluster);
  REQUIRE(tc.targets.size() == 2);
  for (const redis_target& t : tc.targets) CHECK((t.tls && t.user == "app" && t.password == "pw"));
  CHECK(tc.any_tls());
  CHECK(!c.any_tls());
}

TEST_CASE("bus: redis-sentinel:// names the Sentinels and the master's name") {
  bus_spec s = parse_bus_spec("redis-sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26380,sentinel-c/mymaster");
  CHECK(s.kind == bus_spec::sentinel);
  CHECK(s.master_name == "mymaster");
  REQUIRE(s.sentinels.size() == 3);
  CHECK(s.sentinels[1].port == 26380);
  CHECK(s.sentinels[2].port == 26379);  // Sentinel's port when none is given
  for (const redis_target& t : s.sentinels) CHECK(t.password.empty());  // the credentials are the master's
  REQUIRE(s.targets.size() == 1);
  CHECK(s.targets[0].user == "app");
  CHECK(s.targets[0].password == "pw");
  CHECK(s.targets[0].host.empty());
  CHECK(parse_bus_spec("rediss-sentinel://h:1/m").targets[0].tls);
  CHECK(parse_bus_spec("redis-sentinel://[::1]/m").sentinels[0].port == 26379);
  CHECK(parse_bus_spec("redis-sentinel://h:1/name@with@ats").master_name == "name@with@ats");
  CHECK(parse_bus_spec("redis-sentinel://:p%2Fw@h:1/m").targets[0].password == "p/w");
  CHECK_THROWS_WITH(parse_bus_spec("redis-sentinel://h:26379"), Catch::Contains("MASTER_NAME"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-sentinel://h:26379/"), Catch::Contains("MASTER_NAME"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-sentinel:///m"), Catch::Contains("at least one Sentinel"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-sentinel://a:1,,b:2/m"), Catch::Contains("a comma too many"));
}

TEST_CASE("bus: bad bus lists are refused with why") {
  CHECK_THROWS_WITH(parse_bus_spec("redis://a:1,redis://a:1/0"), Catch::Contains("named twice"));
  CHECK_THROWS_WITH(parse_bus_spec("redis://a:1,"), Catch::Contains("a comma too many"));
  CHECK_THROWS_WITH(parse_bus_spec("redis://a:1,,redis://b:1"), Catch::Contains("a comma too many"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-cluster://a:7000,"), Catch::Contains("a comma too many"));
  CHECK_THROWS_WITH(parse_bus_spec(""), Catch::Contains("the scheme must be redis://"));
  CHECK_THROWS_WITH(parse_bus_spec("redis://a:1,http://b:2"), Catch::Contains("the scheme must be redis://"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-cluster://"), Catch::Contains("at least one seed"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-cluster://a:7000/1"), Catch::Contains("no databases"));
  CHECK_THROWS_WITH(parse_bus_spec("redis-cluster://a:7000,a:7000"), Catch::Contains("named twice"));
}
