// The per-connection session side table: grants inline and on the heap, expiry, reuse.

#include <catch2/catch.hpp>

#include <string>

#include "proto/jwt.hpp"
#include "server/pubsub/session_table.hpp"

using namespace wspush;
using namespace wspush::server::pubsub;

namespace {
std::string grants(std::initializer_list<std::string_view> patterns) {
  std::vector<std::string_view> v(patterns);
  char buf[4096];
  std::size_t n = proto::encode_grants(v, buf);
  REQUIRE((n > 0 || v.empty()));
  return std::string(buf, n);
}
}  // namespace

TEST_CASE("session table: a mailbox token's grants fit in the record and long ones go to the heap") {
  session_table t;
  CHECK(t.get(5).exp == 0);  // never set: empty, no grants
  CHECK_FALSE(proto::grants_match(t.get(5).topics(), "mailbox:1"));

  std::string mailbox = grants({"mailbox:1234567"});
  REQUIRE(t.set(5, 1'900'000'000, mailbox, ""));
  CHECK_FALSE(t.get(5).on_heap());
  CHECK(t.get(5).exp == 1'900'000'000u);
  CHECK(proto::grants_match(t.get(5).topics(), "mailbox:1234567"));
  CHECK_FALSE(proto::grants_match(t.get(5).topics(), "mailbox:7"));
  CHECK_FALSE(proto::grants_match(t.get(5).pub(), "mailbox:1234567"));

  std::string many = grants({"team:alpha:*", "user:0123456789abcdef", "mailbox:99"});
  std::string pub = grants({"team:alpha:chat"});
  REQUIRE(t.set(9000, 42, many, pub));  // past the first chunk: the table grows
  CHECK(t.get(9000).on_heap());
  CHECK(proto::grants_match(t.get(9000).topics(), "team:alpha:x"));
  CHECK(proto::grants_match(t.get(9000).topics(), "mailbox:99"));
  CHECK(proto::grants_match(t.get(9000).pub(), "team:alpha:chat"));
  CHECK_FALSE(proto::grants_match(t.get(9000).pub(), "team:alpha:x"));

  // A reused slot starts over: the old grants are gone (and their heap block freed; ASan checks).
  REQUIRE(t.set(9000, 7, mailbox, ""));
  CHECK_FALSE(t.get(9000).on_heap());
  CHECK_FALSE(proto::grants_match(t.get(9000).topics(), "team:alpha:x"));
  t.clear(9000);
  CHECK(t.get(9000).exp == 0);
  CHECK_FALSE(proto::grants_match(t.get(9000).topics(), "mailbox:1234567"));
  REQUIRE(t.set(1, 1, many, pub));  // left set: the destructor frees it
}

TEST_CASE("session table: an exp past 2106 or before 1970 is clamped, not wrapped") {
  session_table t;
  REQUIRE(t.set(0, INT64_C(1) << 40, "", ""));
  CHECK(t.get(0).exp == 0xFFFFFFFFu);
  REQUIRE(t.set(0, -5, "", ""));
  CHECK(t.get(0).exp == 0);
}
