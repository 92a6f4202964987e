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
}

TEST_CASE("bus: bad redis URLs are refused with what was expected") {
  for (const char* bad : {"", "redis://", "http://127.0.0.1:6379", "rediss://h:1", "redis://h:0", "redis://h:65536",
                          "redis://h:port", "redis://:@h", "redis://user:pw@h", "redis://h:1/16", "redis://h:1/x",
                          "redis://[::1:6379", "redis://h h:1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_redis_url(bad), Catch::Contains("redis://[:password@]host:port[/db]"));
  }
}
