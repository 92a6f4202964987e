#include <catch2/catch.hpp>

#include <set>

#include "server/conn/conn_table.hpp"

using namespace wspush::server;

TEST_CASE("conn table hands out slots, reuses them with a new generation") {
  conn_table t;
  std::uint32_t a = t.acquire(UINT32_MAX);
  REQUIRE(a != no_index);
  t.at(a).state = conn_state::open;
  conn_token ta = make_token(a, t.at(a).gen);
  CHECK(t.find(ta) == &t.at(a));
  t.release(a);
  CHECK(t.find(ta) == nullptr);
  std::uint32_t b = t.acquire(UINT32_MAX);
  CHECK(b == a);  // lowest free slot first
  t.at(b).state = conn_state::open;
  CHECK(t.find(ta) == nullptr);  // the stale token does not reach the new connection
  CHECK(t.find(make_token(b, t.at(b).gen)) == &t.at(b));
  CHECK(t.size() == 1);
}

TEST_CASE("conn table grows in chunks and honours its limit") {
  conn_table t;
  std::set<std::uint32_t> seen;
  for (std::uint32_t k = 0; k < conn_table::chunk_size + 10; ++k) {
    std::uint32_t i = t.acquire(UINT32_MAX);
    REQUIRE(i != no_index);
    t.at(i).state = conn_state::open;
    seen.insert(i);
  }
  CHECK(seen.size() == conn_table::chunk_size + 10);
  CHECK(t.capacity() == 2 * conn_table::chunk_size);
  CHECK(t.acquire(t.size()) == no_index);  // at the limit
}

TEST_CASE("connection record stays within its budget") {
  STATIC_REQUIRE(sizeof(connection) <= 48);
  CHECK(token_index(make_token(77, 5)) == 77);
  CHECK(token_gen(make_token(77, 5)) == 5);
}
