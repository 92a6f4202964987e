#include "pool/mpsc_queue.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

using wspush::pool::mpsc_queue;

TEST_CASE("mpsc_queue: capacity is rounded up to a power of two", "[mpsc_queue]") {
  CHECK(mpsc_queue<int>(0).capacity() == 2);
  CHECK(mpsc_queue<int>(5).capacity() == 8);
  CHECK(mpsc_queue<int>(1024).capacity() == 1024);
}

TEST_CASE("mpsc_queue: FIFO, bounded, and reusable across many laps", "[mpsc_queue]") {
  mpsc_queue<int> q(4);
  int out = -1;
  CHECK_FALSE(q.try_pop(out));
  int next_in = 0, next_out = 0;
  for (int lap = 0; lap < 10; ++lap) {
    while (q.try_push(next_in)) ++next_in;
    CHECK(q.size_approx() == 4);
    CHECK_FALSE(q.try_push(999));
    REQUIRE(q.try_pop(out));
    CHECK(out == next_out++);
    CHECK(q.try_push(next_in++));  // one freed cell is one push
    while (q.try_pop(out)) CHECK(out == next_out++);
    CHECK(q.size_approx() == 0);
  }
  CHECK(next_in == next_out);
  CHECK(next_in == 50);
}

TEST_CASE("mpsc_queue: carries small structs and raw pointers", "[mpsc_queue]") {
  struct item {
    std::uint32_t a;
    std::uint16_t b;
    void* p;
  };
  mpsc_queue<item> q(8);
  int x = 0;
  REQUIRE(q.try_push({7, 9, &x}));
  item got{};
  REQUIRE(q.try_pop(got));
  CHECK(got.a == 7);
  CHECK(got.b == 9);
  CHECK(got.p == &x);

  mpsc_queue<void*> ptrs(2);
  REQUIRE(ptrs.try_push(&x));
  void* p = nullptr;
  REQUIRE(ptrs.try_pop(p));
  CHECK(p == &x);
}

TEST_CASE("mpsc_queue: several producers, one consumer, nothing lost or reordered per producer",
          "[mpsc_queue]") {
  constexpr std::uint32_t producers = 4;
  constexpr std::uint32_t per_producer = 50'000;
  mpsc_queue<std::uint64_t> q(64);  // small: producers hit "full" often
  std::vector<std::thread> threads;
  for (std::uint32_t p = 0; p < producers; ++p) {
    threads.emplace_back([&q, p] {
      for (std::uint32_t i = 0; i < per_producer; ++i) {
        std::uint64_t v = (std::uint64_t(p) << 32) | i;
        while (!q.try_push(v)) std::this_thread::yield();
      }
    });
  }
  std::vector<std::int64_t> last(producers, -1);
  std::uint64_t received = 0;
  bool in_order = true;
  while (received < std::uint64_t(producers) * per_producer) {
    std::uint64_t v;
    if (!q.try_pop(v)) {
      std::this_thread::yield();
      continue;
    }
    auto p = std::uint32_t(v >> 32);
    auto i = std::int64_t(v & 0xffffffffu);
    if (p >= producers || i != last[p] + 1) in_order = false;
    if (p < producers) last[p] = i;
    ++received;
  }
  for (auto& t : threads) t.join();
  CHECK(in_order);
  for (auto l : last) CHECK(l == per_producer - 1);
  std::uint64_t extra;
  CHECK_FALSE(q.try_pop(extra));
}

TEST_CASE("mpsc_queue: move-only items own what they carry and a full queue leaves the item with the caller",
          "[mpsc_queue]") {
  auto live = std::make_shared<int>(0);
  {
    mpsc_queue<std::unique_ptr<std::shared_ptr<int>>> q(2);
    auto make = [&] { return std::make_unique<std::shared_ptr<int>>(live); };
    auto a = make(), b = make(), c = make();
    REQUIRE(q.try_push(std::move(a)));
    REQUIRE(q.try_push(std::move(b)));
    CHECK_FALSE(q.try_push(std::move(c)));
    REQUIRE(c != nullptr);  // refused: still ours
    CHECK(live.use_count() == 4);
    std::unique_ptr<std::shared_ptr<int>> out;
    REQUIRE(q.try_pop(out));
    CHECK(*out == live);
    out.reset();
    CHECK(live.use_count() == 3);  // c, and the one still queued
  }
  CHECK(live.use_count() == 1);  // the queue destroyed what it still held
}
