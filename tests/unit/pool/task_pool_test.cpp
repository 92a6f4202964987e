#include "pool/task_pool.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <latch>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "await.hpp"
#include "tests/support/counting_alloc.hpp"

using namespace std::chrono_literals;
using wspush::pool::pool_stats;
using wspush::pool::shutdown_mode;
using wspush::pool::task_pool;
using wspush::pool::task_pool_options;
using wspush::test::allocation_count;
using wspush::pool::test::eventually;

namespace {

task_pool_options fixed_workers(std::uint32_t n, std::uint32_t queue = 4096) {
  task_pool_options o;
  o.initial_workers = n;
  o.max_workers = n;
  o.queue_capacity = queue;
  return o;
}

/// What a long-running task shares with the test. Held through a shared_ptr so that it
/// outlives the pool when a hard shutdown detaches the worker.
struct probe {
  std::latch release{1};
  std::atomic<bool> started{false};
  std::atomic<bool> done{false};
  std::atomic<bool> saw_stop{false};
};

/// A task that blocks its worker until the test opens `release`.
task_pool::task blocker(const std::shared_ptr<probe>& p) {
  return [p] {
    p->started = true;
    p->release.wait();
    p->saw_stop = task_pool::this_worker_stop_requested();
    p->done = true;
  };
}

/// Counts live copies of a captured object: 0 means every task holding one is destroyed.
struct tracked {
  explicit tracked(std::atomic<int>* live) noexcept : live(live) { ++*live; }
  tracked(const tracked& o) noexcept : live(o.live) { ++*live; }
  ~tracked() { --*live; }
  std::atomic<int>* live;
};

std::uint64_t hist_sum(const pool_stats& s) {
  return std::accumulate(s.duration_hist.begin(), s.duration_hist.end(), std::uint64_t{0});
}

}  // namespace

TEST_CASE("task_pool: runs every scheduled task", "[task_pool]") {
  task_pool pool(fixed_workers(2));
  std::atomic<int> n{0};
  for (int i = 0; i < 1000; ++i) REQUIRE(pool.schedule([&n] { n.fetch_add(1); }));
  REQUIRE(eventually([&] { return pool.stats().completed == 1000; }));
  CHECK(n == 1000);
  CHECK(pool.stats().rejected == 0);
}

TEST_CASE("task_pool: options are normalised", "[task_pool]") {
  task_pool_options o;
  o.initial_workers = 3;
  o.max_workers = 1;
  o.queue_capacity = 1000;
  task_pool pool(o);
  CHECK(pool.options().max_workers == 3);
  CHECK(pool.options().queue_capacity == 1024);
  CHECK(pool.stats().workers == 3);
  task_pool hw(task_pool_options{});
  CHECK(hw.options().max_workers == std::max(1u, std::thread::hardware_concurrency()));

  task_pool_options extreme;
  extreme.idle_timeout = std::chrono::milliseconds::max();
  extreme.shutdown_timeout = std::chrono::milliseconds(-5);
  task_pool clamped(extreme);
  CHECK(clamped.options().idle_timeout == std::chrono::hours(24));
  CHECK(clamped.options().shutdown_timeout == 0ms);
  std::atomic<bool> ran{false};
  REQUIRE(clamped.schedule([&ran] { ran = true; }));
  REQUIRE(eventually([&] { return ran.load(); }));
}

TEST_CASE("task_pool: a zero idle timeout retires extra workers, never the initial ones",
          "[task_pool]") {
  task_pool_options o;
  o.initial_workers = 1;
  o.max_workers = 2;
  o.idle_timeout = 0ms;
  task_pool pool(o);
  auto p = std::make_shared<probe>();
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i) {
    REQUIRE(pool.schedule([p, &started] {
      ++started;
      p->release.wait();
    }));
  }
  REQUIRE(eventually([&] { return started == 2; }));
  CHECK(pool.stats().workers == 2);
  p->release.count_down();
  REQUIRE(eventually([&] { return pool.stats().workers == 1; }));
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) REQUIRE(pool.schedule([&ran] { ++ran; }));
  REQUIRE(eventually([&] { return ran == 100; }));
}

TEST_CASE("task_pool: grows to max_workers under load, retires down to initial when idle",
          "[task_pool]") {
  task_pool_options o;
  o.initial_workers = 1;
  o.max_workers = 4;
  o.idle_timeout = 30ms;
  task_pool pool(o);
  CHECK(pool.stats().workers == 1);

  auto p = std::make_shared<probe>();
  std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i) {
    REQUIRE(pool.schedule([p, &started] {
      ++started;
      p->release.wait();
    }));
  }
  REQUIRE(eventually([&] { return started == 4; }));  // needs four workers at once
  auto s = pool.stats();
  CHECK(s.workers == 4);
  CHECK(s.busy_workers == 4);

  // At the bound: the next task waits in the queue instead of starting a fifth worker.
  REQUIRE(pool.schedule([&started] { ++started; }));
  s = pool.stats();
  CHECK(s.workers == 4);
  CHECK(s.queue_length == 1);

  p->release.count_down();
  REQUIRE(eventually([&] { return pool.stats().completed == 5; }));
  REQUIRE(eventually([&] { return pool.stats().workers == 1; }));
  REQUIRE(eventually([&] { return pool.stats().busy_workers == 0; }));

  // And it grows again on demand.
  auto q = std::make_shared<probe>();
  std::atomic<int> again{0};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(pool.schedule([q, &again] {
      ++again;
      q->release.wait();
    }));
  }
  REQUIRE(eventually([&] { return again == 3; }));
  // Three at once take three workers. A growth decision may start one worker too many (a worker
  // leaves the idle count before it pops, so a push can miss it), never one too few, and never
  // past max_workers.
  const auto grown = pool.stats().workers;
  CHECK(grown >= 3);
  CHECK(grown <= 4);
  q->release.count_down();
}

TEST_CASE("task_pool: the queue is bounded", "[task_pool]") {
  task_pool pool(fixed_workers(1, 4));
  auto p = std::make_shared<probe>();
  REQUIRE(pool.schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));

  std::atomic<int> ran{0};
  auto count = [&ran] { ++ran; };
  for (int i = 0; i < 4; ++i) CHECK(pool.try_schedule(count));
  CHECK_FALSE(pool.try_schedule(count));
  CHECK(pool.stats().rejected == 1);
  CHECK(pool.stats().queue_length == 4);
  // A refused try_schedule_from leaves the task with the caller, intact: it runs later.
  auto kept = std::make_unique<int>(7);
  std::atomic<int> kept_ran{0};
  task_pool::task held([&kept_ran, k = std::move(kept)] { kept_ran += *k; });
  CHECK_FALSE(pool.try_schedule_from(held));
  REQUIRE(held);
  held();
  CHECK(kept_ran == 7);
  CHECK(pool.stats().rejected == 2);
  CHECK_FALSE(pool.schedule_for(count, 2ms));
  CHECK_FALSE(pool.schedule_for(count, 0ns));
  CHECK(pool.stats().rejected == 4);

  // schedule() and a long schedule_for() wait for room, and proceed once there is some.
  std::atomic<int> returned{0};
  bool r1 = false, r2 = false;
  std::thread t1([&] {
    r1 = pool.schedule(count);
    ++returned;
  });
  std::thread t2([&] {
    r2 = pool.schedule_for(count, std::chrono::minutes(10));
    ++returned;
  });
  REQUIRE(eventually([&] { return pool.stats().waiting_schedulers == 2; }));
  CHECK(returned == 0);  // queue full, worker held: neither can have returned
  p->release.count_down();
  t1.join();
  t2.join();
  CHECK(r1);
  CHECK(r2);
  REQUIRE(eventually([&] { return pool.stats().completed == 7; }));
  CHECK(ran == 6);
  CHECK(pool.stats().waiting_schedulers == 0);
  CHECK(pool.stats().rejected == 4);
}

TEST_CASE("task_pool: schedule_for takes the first free cell and schedule waits for a burst",
          "[task_pool]") {
  task_pool pool(fixed_workers(1, 4));
  auto p1 = std::make_shared<probe>();
  auto p2 = std::make_shared<probe>();
  REQUIRE(pool.schedule(blocker(p1)));
  REQUIRE(eventually([&] { return p1->started.load(); }));
  REQUIRE(pool.try_schedule(blocker(p2)));
  for (int i = 0; i < 3; ++i) REQUIRE(pool.try_schedule([] {}));

  std::atomic<int> burst_done{0}, cell_done{0};
  std::thread burst([&] { burst_done = pool.schedule([] {}) ? 1 : -1; });
  std::thread cell([&] { cell_done = pool.schedule_for([] {}, std::chrono::minutes(10)) ? 1 : -1; });
  REQUIRE(eventually([&] { return pool.stats().waiting_schedulers == 2; }));
  p1->release.count_down();  // the worker takes p2's blocker and holds again: one cell frees
  REQUIRE(eventually([&] { return cell_done != 0; }));
  CHECK(cell_done == 1);
  CHECK(pool.stats().queue_length == 4);
  CHECK(burst_done == 0);  // schedule() waits for the queue to drain to half
  p2->release.count_down();
  burst.join();
  cell.join();
  CHECK(burst_done == 1);
  REQUIRE(eventually([&] { return pool.stats().completed == 7; }));
}

TEST_CASE("task_pool: a throwing task is contained and counted and its worker survives",
          "[task_pool]") {
  task_pool pool(fixed_workers(1));
  std::atomic<bool> ran{false};
  REQUIRE(pool.schedule([] { throw std::runtime_error("expected by the test"); }));
  REQUIRE(pool.schedule([] { throw 42; }));
  REQUIRE(pool.schedule([&ran] { ran = true; }));
  REQUIRE(eventually([&] { return pool.stats().completed == 3; }));
  auto s = pool.stats();
  CHECK(s.failed == 2);
  CHECK(s.workers == 1);
  CHECK(ran);
}

TEST_CASE("task_pool: light shutdown runs queued and running work, accepts nothing",
          "[task_pool][shutdown]") {
  task_pool pool(fixed_workers(1));
  auto p = std::make_shared<probe>();
  REQUIRE(pool.schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) REQUIRE(pool.schedule([&ran] { ++ran; }));

  std::thread closer([&] { pool.shutdown(shutdown_mode::light); });
  REQUIRE(eventually([&] { return !pool.accepting(); }));
  CHECK_FALSE(pool.try_schedule([&ran] { ++ran; }));
  CHECK(ran == 0);  // still queued behind the held worker
  p->release.count_down();
  closer.join();  // light: returns once everything ran
  CHECK(ran == 4);
  CHECK(p->done);
  auto s = pool.stats();
  CHECK(s.completed == 5);
  CHECK(s.cancelled == 0);
  CHECK(s.workers == 0);
  CHECK(s.rejected == 1);
  CHECK_FALSE(pool.schedule([] {}));
  CHECK_FALSE(pool.stop_requested());
  pool.shutdown(shutdown_mode::hard);  // idempotent: nothing changes
  CHECK_FALSE(pool.stop_requested());
}

TEST_CASE("task_pool: soft shutdown cancels queued work and lets running work finish",
          "[task_pool][shutdown]") {
  task_pool pool(fixed_workers(1));
  auto p = std::make_shared<probe>();
  REQUIRE(pool.schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));
  std::atomic<int> ran{0};
  std::atomic<int> live{0};
  for (int i = 0; i < 4; ++i) REQUIRE(pool.schedule([&ran, t = tracked(&live)] { ++ran; }));
  CHECK(live == 4);

  std::thread closer([&] { pool.shutdown(shutdown_mode::soft); });
  REQUIRE(eventually([&] { return live == 0; }));  // cancelled tasks were destroyed unrun
  REQUIRE(eventually([&] { return pool.stats().cancelled == 4; }));
  CHECK_FALSE(p->done);  // running work is still running
  p->release.count_down();
  closer.join();
  CHECK(p->done);  // ...and soft waited for it
  CHECK_FALSE(p->saw_stop);
  CHECK(ran == 0);
  CHECK(pool.stats().completed == 1);
}

TEST_CASE("task_pool: soft_timeout waits for running work that finishes in time",
          "[task_pool][shutdown]") {
  auto o = fixed_workers(1);
  o.shutdown_timeout = std::chrono::minutes(10);
  task_pool pool(o);
  auto p = std::make_shared<probe>();
  REQUIRE(pool.schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));
  std::atomic<int> live{0};
  REQUIRE(pool.schedule([t = tracked(&live)] {}));

  std::thread closer([&] { pool.shutdown(shutdown_mode::soft_timeout); });
  REQUIRE(eventually([&] { return !pool.accepting(); }));
  p->release.count_down();
  closer.join();
  CHECK(p->done);
  CHECK_FALSE(p->saw_stop);
  CHECK_FALSE(pool.stop_requested());
  CHECK(live == 0);
  CHECK(pool.stats().cancelled == 1);
}

TEST_CASE("task_pool: soft_timeout turns hard when running work overstays",
          "[task_pool][shutdown]") {
  auto o = fixed_workers(1);
  o.shutdown_timeout = 20ms;
  auto pool = std::make_unique<task_pool>(o);
  auto p = std::make_shared<probe>();
  REQUIRE(pool->schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));
  std::atomic<int> live{0};
  REQUIRE(pool->schedule([t = tracked(&live)] {}));

  pool->shutdown(shutdown_mode::soft_timeout);  // the blocker cannot finish: gives up
  CHECK_FALSE(p->done);
  CHECK(pool->stop_requested());
  REQUIRE(eventually([&] { return live == 0; }));
  CHECK(pool->stats().cancelled == 1);
  pool.reset();  // the detached worker outlives the pool object
  p->release.count_down();
  REQUIRE(eventually([&] { return p->done.load(); }));
  CHECK(p->saw_stop);
}

TEST_CASE("task_pool: hard shutdown cancels queued work and does not wait",
          "[task_pool][shutdown]") {
  auto pool = std::make_unique<task_pool>(fixed_workers(2));
  auto p1 = std::make_shared<probe>();
  auto p2 = std::make_shared<probe>();
  REQUIRE(pool->schedule(blocker(p1)));
  REQUIRE(pool->schedule(blocker(p2)));
  REQUIRE(eventually([&] { return p1->started && p2->started; }));
  std::atomic<int> live{0};
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) REQUIRE(pool->schedule([&ran, t = tracked(&live)] { ++ran; }));

  pool->shutdown(shutdown_mode::hard);
  CHECK(pool->stop_requested());
  CHECK_FALSE(p1->done);
  CHECK_FALSE(p2->done);
  REQUIRE(eventually([&] { return live == 0; }));
  REQUIRE(eventually([&] { return pool->stats().cancelled == 8; }));
  CHECK_FALSE(pool->schedule([] {}));
  pool.reset();
  p1->release.count_down();
  p2->release.count_down();
  REQUIRE(eventually([&] { return p1->done && p2->done; }));
  CHECK(p1->saw_stop);
  CHECK(p2->saw_stop);
  CHECK(ran == 0);
}

TEST_CASE("task_pool: schedulers waiting for room are woken by shutdown", "[task_pool][shutdown]") {
  auto pool = std::make_unique<task_pool>(fixed_workers(1, 2));
  auto p = std::make_shared<probe>();
  REQUIRE(pool->schedule(blocker(p)));
  REQUIRE(eventually([&] { return p->started.load(); }));
  REQUIRE(pool->try_schedule([] {}));
  REQUIRE(pool->try_schedule([] {}));

  std::atomic<int> results{0};  // bit 0: schedule() succeeded, bit 1: schedule_for() did
  std::thread a([&] { results |= pool->schedule([] {}) ? 1 : 0; });
  std::thread b([&] { results |= pool->schedule_for([] {}, std::chrono::minutes(10)) ? 2 : 0; });
  REQUIRE(eventually([&] { return pool->stats().waiting_schedulers == 2; }));
  pool->shutdown(shutdown_mode::hard);
  a.join();
  b.join();
  CHECK(results == 0);
  auto s = pool->stats();
  CHECK(s.rejected == 2);
  CHECK(s.waiting_schedulers == 0);
  CHECK(s.cancelled == 2);
  pool.reset();
  p->release.count_down();
  REQUIRE(eventually([&] { return p->done.load(); }));
}

TEST_CASE("task_pool: duration histogram counts every completed task", "[task_pool][stats]") {
  task_pool pool(fixed_workers(2));
  for (int i = 0; i < 100; ++i) REQUIRE(pool.schedule([] {}));
  REQUIRE(pool.schedule([] { std::this_thread::sleep_for(2ms); }));  // the workload, not a wait
  REQUIRE(eventually([&] { return pool.stats().completed == 101; }));
  auto s = pool.stats();
  CHECK(hist_sum(s) == s.completed);
  // The sleeping task lasted more than 1 ms: it is in a bucket above le=1ms.
  CHECK(s.duration_hist[4] + s.duration_hist[5] + s.duration_hist[6] + s.duration_hist[7] >= 1);
  CHECK(s.duration_sum_seconds >= 0.002);
  CHECK(s.failed == 0);
  CHECK(s.queue_length == 0);
}

TEST_CASE("task_pool: no heap allocation per task in steady state", "[task_pool][alloc]") {
  task_pool pool(fixed_workers(2, 256));
  std::atomic<std::uint64_t> done{0};
  auto run = [&](std::uint64_t n) {
    std::uint64_t target = done.load() + n;
    for (std::uint64_t i = 0; i < n; ++i) {
      (void)pool.schedule([&done] { done.fetch_add(1, std::memory_order_relaxed); });
    }
    while (done.load() < target) std::this_thread::yield();
  };
  run(10'000);  // warm-up: thread-locals, first parks and wake-ups
  auto before = allocation_count();
  run(100'000);
  auto after = allocation_count();
  CHECK(after - before == 0);
  // `done` counts from inside the tasks; `completed` is bumped just after each returns.
  CHECK(eventually([&] { return pool.stats().completed == 110'000; }));
}

TEST_CASE("task_pool: parked workers are always woken (no lost wake-up)", "[task_pool]") {
  auto o = fixed_workers(2);
  o.idle_timeout = std::chrono::minutes(10);  // a parked worker's only other way out
  task_pool pool(o);
  std::atomic<int> ran{0};
  bool all_woken = true;
  for (int i = 1; i <= 500 && all_woken; ++i) {
    // Between two tasks the workers run dry and park (their spin lasts a few us): each
    // task needs a wake-up. The pause shapes the workload; it synchronises nothing.
    std::this_thread::sleep_for(20us);
    REQUIRE(pool.schedule([&ran] { ++ran; }));
    all_woken = eventually([&] { return ran == i; });
  }
  CHECK(all_woken);
}

TEST_CASE("task_pool: many producers, small queue, growing pool: nothing lost", "[task_pool]") {
  task_pool_options o;
  o.initial_workers = 1;
  o.max_workers = 3;
  o.queue_capacity = 16;
  o.idle_timeout = 5ms;
  task_pool pool(o);
  constexpr int producers = 4, per_producer = 5'000;
  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&pool, &ran, p] {
      for (int i = 0; i < per_producer; ++i) {
        auto t = [&ran] { ran.fetch_add(1, std::memory_order_relaxed); };
        bool ok = (p % 2 == 0) ? pool.schedule(t) : pool.schedule_for(t, std::chrono::minutes(10));
        if (!ok) std::abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(eventually([&] { return pool.stats().completed == producers * per_producer; }));
  CHECK(ran == producers * per_producer);
  CHECK(pool.stats().rejected == 0);
  CHECK(pool.stats().workers <= 3);
}

TEST_CASE("task_pool: tasks may schedule tasks", "[task_pool]") {
  task_pool pool(fixed_workers(2));
  std::atomic<int> leaves{0};
  for (int i = 0; i < 10; ++i) {
    REQUIRE(pool.schedule([&pool, &leaves] {
      for (int j = 0; j < 10; ++j) {
        while (!pool.try_schedule([&leaves] { ++leaves; })) std::this_thread::yield();
      }
    }));
  }
  REQUIRE(eventually([&] { return leaves == 100; }));
}

TEST_CASE("task_pool: stop is not requested outside workers or before shutdown", "[task_pool]") {
  CHECK_FALSE(task_pool::this_worker_stop_requested());
  task_pool pool(fixed_workers(1));
  std::atomic<int> seen{-1};
  REQUIRE(pool.schedule([&seen] { seen = task_pool::this_worker_stop_requested() ? 1 : 0; }));
  REQUIRE(eventually([&] { return seen != -1; }));
  CHECK(seen == 0);
  CHECK_FALSE(pool.stop_requested());
  CHECK(pool.accepting());
}

TEST_CASE("task_pool: destruction cancels what is still queued", "[task_pool][shutdown]") {
  std::atomic<int> live{0};
  std::atomic<int> ran{0};
  {
    task_pool pool(fixed_workers(1));
    auto p = std::make_shared<probe>();
    REQUIRE(pool.schedule(blocker(p)));
    REQUIRE(eventually([&] { return p->started.load(); }));
    for (int i = 0; i < 3; ++i) REQUIRE(pool.schedule([&ran, t = tracked(&live)] { ++ran; }));
    p->release.count_down();  // may or may not start the queued ones before the destructor
  }
  CHECK(live == 0);
  CHECK(ran <= 3);
}
