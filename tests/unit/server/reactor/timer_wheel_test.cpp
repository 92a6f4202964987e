#include <catch2/catch.hpp>

#include <vector>

#include "server/reactor/timer_wheel.hpp"

using namespace wspush::server;

namespace {
struct fixture {
  std::vector<timer_links> links = std::vector<timer_links>(64);
  struct accessor {
    std::vector<timer_links>* v;
    timer_links& operator()(std::uint32_t i) const { return (*v)[i]; }
  };
  timer_wheel<accessor> wheel{16, accessor{&links}};
  std::vector<std::uint32_t> fired;
  void advance(std::uint32_t to) {
    wheel.advance(to, [&](std::uint32_t i) { fired.push_back(i); });
  }
};
}  // namespace

TEST_CASE("timer wheel fires each deadline once, at its tick") {
  fixture f;
  f.wheel.arm(1, 3);
  f.wheel.arm(2, 1);
  f.wheel.arm(3, 3);
  f.advance(2);
  CHECK(f.fired == std::vector<std::uint32_t>{2});
  f.advance(3);
  CHECK(f.fired == std::vector<std::uint32_t>{2});
  f.advance(4);
  REQUIRE(f.fired.size() == 3);
  CHECK(!f.wheel.armed(1));
  f.advance(40);
  CHECK(f.fired.size() == 3);
}

TEST_CASE("timer wheel: cancel and re-arm move the deadline") {
  fixture f;
  f.wheel.arm(5, 2);
  f.wheel.cancel(5);
  f.wheel.arm(6, 2);
  f.wheel.arm(6, 5);  // moved
  f.advance(4);
  CHECK(f.fired.empty());
  f.advance(6);
  CHECK(f.fired == std::vector<std::uint32_t>{6});
}

TEST_CASE("timer wheel: deadlines beyond one turn wait for their round") {
  fixture f;  // 16 slots
  f.wheel.arm(7, 20);
  f.wheel.arm(8, 4);  // same slot as 7 (20 % 16 == 4), due a turn earlier
  f.advance(5);
  CHECK(f.fired == std::vector<std::uint32_t>{8});
  f.advance(20);
  CHECK(f.fired == std::vector<std::uint32_t>{8});
  f.advance(21);
  CHECK(f.fired == std::vector<std::uint32_t>{8, 7});
}

TEST_CASE("timer wheel: a fire callback may cancel or re-arm others due in the same tick") {
  fixture f;
  for (std::uint32_t i = 10; i < 20; ++i) f.wheel.arm(i, 2);
  f.wheel.advance(3, [&](std::uint32_t i) {
    f.fired.push_back(i);
    f.wheel.arm(i + 20, 1);  // arming from inside fire lands in a later tick
  });
  CHECK(f.fired.size() == 10);
  f.fired.clear();
  f.advance(4);
  CHECK(f.fired.size() == 10);
}
