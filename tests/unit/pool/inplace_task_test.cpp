#include "pool/inplace_task.hpp"

#include <array>
#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <type_traits>

using wspush::pool::inplace_task;
using task64 = inplace_task<64>;

namespace {

/// Counts live instances, so tests can see every destructor run exactly once.
struct tracked {
  explicit tracked(int* live) noexcept : live(live) { ++*live; }
  tracked(const tracked& o) noexcept : live(o.live) { ++*live; }
  tracked(tracked&& o) noexcept : live(o.live) { ++*live; }
  ~tracked() { --*live; }
  int* live;
};

}  // namespace

static_assert(!std::is_copy_constructible_v<task64>);
static_assert(!std::is_copy_assignable_v<task64>);
static_assert(std::is_nothrow_move_constructible_v<task64>);
static_assert(std::is_nothrow_move_assignable_v<task64>);
static_assert(std::is_convertible_v<void (*)(), task64>);

TEST_CASE("inplace_task: default is empty", "[inplace_task]") {
  task64 t;
  CHECK_FALSE(t);
  task64 u = [] {};
  CHECK(u);
}

TEST_CASE("inplace_task: runs the callable, keeping its state between calls", "[inplace_task]") {
  int calls = 0;
  task64 t = [&calls, n = 0]() mutable { calls += ++n; };
  t();
  t();
  CHECK(calls == 3);
}

TEST_CASE("inplace_task: move transfers the callable and empties the source", "[inplace_task]") {
  int hits = 0;
  task64 a = [&hits] { ++hits; };
  task64 b = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): documented state
  REQUIRE(b);
  b();
  task64 c;
  c = std::move(b);
  CHECK_FALSE(b);  // NOLINT
  c();
  CHECK(hits == 2);
}

TEST_CASE("inplace_task: an unrun task destroys its callable exactly once", "[inplace_task]") {
  int live = 0;
  {
    task64 t = [obj = tracked(&live)] { (void)obj; };
    CHECK(live == 1);
    task64 moved = std::move(t);  // non-trivial relocation: still one live instance
    CHECK(live == 1);
  }
  CHECK(live == 0);

  task64 r = [obj = tracked(&live)] { (void)obj; };
  r.reset();
  CHECK(live == 0);
  CHECK_FALSE(r);
}

TEST_CASE("inplace_task: assigning over a task destroys the old callable", "[inplace_task]") {
  int live = 0;
  task64 t = [obj = tracked(&live)] { (void)obj; };
  int hits = 0;
  t = task64([&hits] { ++hits; });
  CHECK(live == 0);
  t();
  CHECK(hits == 1);
  auto& self = t;
  t = std::move(self);  // self-move leaves it intact
  REQUIRE(t);
  t();
  CHECK(hits == 2);
}

TEST_CASE("inplace_task: move-only captures and callables of exactly Capacity bytes", "[inplace_task]") {
  auto p = std::make_unique<int>(41);
  int seen = 0;
  task64 t = [p = std::move(p), &seen] { seen = *p + 1; };
  task64 u = std::move(t);
  u();
  CHECK(seen == 42);

  std::array<unsigned char, 64> payload{};
  payload[63] = 7;
  auto fill = [payload]() mutable { payload[0] = payload[63]; };
  static_assert(sizeof(fill) == 64);
  task64 full = fill;  // fits exactly; a 65-byte capture would be a compile error
  full();
  task64 moved = std::move(full);
  moved();
}

TEST_CASE("inplace_task: exceptions from the callable propagate to the caller", "[inplace_task]") {
  task64 t = [] { throw std::runtime_error("boom"); };
  CHECK_THROWS_AS(t(), std::runtime_error);
  CHECK(t);  // still holds the callable
}
