// The reactor loop with a real backend and a handler that is not a connection layer: inboxes
// fed from other threads, deadlines, the flush list, drain pacing, and a stopped loop refusing
// posts (so nothing that posts to it ever waits on it).

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "server/reactor/inbox.hpp"
#include "server/reactor/loop.hpp"

using namespace wspush::server;

namespace {

struct counting_handler final : loop_handler, inbox_consumer<std::unique_ptr<int>> {
  loop* l = nullptr;
  std::atomic<std::uint64_t> items{0};  // read by the test's thread while the loop runs
  std::uint64_t sum = 0;
  std::vector<std::uint32_t> timers, flushed;
  std::uint64_t to_close = 0, closed = 0;
  bool drain_started = false;

  void on_accept(int) noexcept override {}
  void on_data(conn_token, std::span<std::uint8_t>) noexcept override {}
  void on_read_end(conn_token, int) noexcept override {}
  void on_read_paused(conn_token) noexcept override {}
  void on_send_done(conn_token, int) noexcept override {}
  void on_writable(conn_token) noexcept override {}
  void on_timer(std::uint32_t slot) noexcept override {
    timers.push_back(slot);
    if (slot == 1) l->list(7);  // output to write at the end of the iteration
  }
  void on_flush(std::uint32_t slot) noexcept override { flushed.push_back(slot); }
  std::uint64_t on_drain_begin() noexcept override {
    drain_started = true;
    to_close = 40;
    return to_close;
  }
  std::uint64_t close_some(std::uint64_t n) noexcept override {
    n = std::min(n, to_close - closed);
    closed += n;
    return n;
  }
  bool empty() const noexcept override { return drain_started && closed == to_close; }
  std::uint64_t on_item(std::unique_ptr<int>&& v) noexcept override {
    ++items;
    sum += std::uint64_t(*v);
    return 1;
  }
};

}  // namespace

TEST_CASE("loop: inboxes, deadlines, the flush list and a paced drain, then a stopped loop refuses posts") {
  for (bool uring : {false, true}) {
    loop l(loop_options{.drain_seconds = 0.5});
    counting_handler h;
    h.l = &l;
    inbox<std::unique_ptr<int>> in(l, 1024, h);
    std::string why;
    bool fell_back = false;
    std::atomic<int> started{0};
    std::thread t([&] {  // no Catch assertions off the test's thread: they are not thread-safe
      bool ok = l.start(uring, -1, why, fell_back) && l.track(7);
      if (ok) {
        l.arm(1, 2);
        l.arm(2, 1);
      }
      started = ok ? 1 : 2;
      if (ok) l.run(h);
    });
    while (started == 0) std::this_thread::yield();
    REQUIRE(started == 1);
    if (uring && fell_back) WARN("io_uring unavailable: epoll ran twice");
    // Producers on other threads; a full inbox refuses and the item stays with its producer.
    std::vector<std::thread> producers;
    std::atomic<int> lost{0};
    for (int p = 0; p < 3; ++p)
      producers.emplace_back([&] {
        for (int k = 1; k <= 1000; ++k) {
          auto v = std::make_unique<int>(k);
          while (!in.post(std::move(v)))
            if (!v) ++lost;  // a refused post must leave the item with us
        }
      });
    for (auto& p : producers) p.join();
    CHECK(lost == 0);
    l.request_drain();
    t.join();
    CHECK(h.items == 3000);
    CHECK(h.sum == 3 * 500500);
    CHECK(h.timers == std::vector<std::uint32_t>{2, 1});  // in deadline order
    CHECK(h.flushed == std::vector<std::uint32_t>{7});
    CHECK(h.closed == 40);  // all, spread over the drain window
    CHECK(l.stopped());
    auto late = std::make_unique<int>(1);
    CHECK_FALSE(in.post(std::move(late)));  // nobody will consume it: refused, not queued
    CHECK(late != nullptr);
  }
}

// Wakers race the loop taking its wake-up (one eventfd write stands for all the wakers until
// the loop has read it): whatever was posted is consumed without any further wake-up. Rounds
// of concurrent bursts, each checked before the next round posts anything.
TEST_CASE("loop: every post is consumed however its wake-up races the others") {
  for (bool uring : {false, true}) {
    loop l(loop_options{.drain_seconds = 0.5});
    counting_handler h;
    h.l = &l;
    inbox<std::unique_ptr<int>> in(l, 4096, h);
    std::string why;
    bool fell_back = false;
    std::atomic<int> started{0};
    std::thread t([&] {
      bool ok = l.start(uring, -1, why, fell_back);  // no timers armed: only wake-ups drain the inbox
      started = ok ? 1 : 2;
      if (ok) l.run(h);
    });
    while (started == 0) std::this_thread::yield();
    REQUIRE(started == 1);
    std::uint64_t posted = 0;
    int stranded_rounds = 0;
    for (int round = 0; round < 1000; ++round) {
      std::vector<std::thread> producers;
      // More producers than this machine has cores: they are preempted inside their post,
      // which is when one of them can race the loop taking its wake-up.
      for (int p = 0; p < 8; ++p)
        producers.emplace_back([&] {
          for (int k = 0; k < 8; ++k) {
            auto v = std::make_unique<int>(k);
            while (!in.post(std::move(v))) std::this_thread::yield();
          }
        });
      for (auto& p : producers) p.join();
      posted += 64;
      // Generous: only a lost wake-up leaves items here (the loop wakes for nothing else).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (h.items.load() < posted && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      if (h.items.load() < posted) {
        ++stranded_rounds;
        break;
      }
    }
    CHECK(stranded_rounds == 0);
    CHECK(h.items.load() == posted);
    l.request_drain();
    t.join();
  }
}
