// Micro-benchmarks of pool/: task scheduling and running, buffer leases, shared frames,
// the MPSC queue. Google Benchmark; main comes from benchmark::benchmark_main. Links only
// wspush_pool. Run pinned or at least on an otherwise quiet machine, e.g.
//   pool_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// "per task" figures are 1 / items_per_second: a batch of tasks is scheduled and the
// iteration ends when the workers have run all of it, so the time covers the producer's
// schedule, the queue hand-off, the worker's pop, run and bookkeeping (histogram clock
// read included), and any parking/wake-up the batch provoked.

#include <benchmark/benchmark.h>

#include "tests/bench/alloc_counter.hpp"

#include <sys/resource.h>

#include <atomic>
#include <thread>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "pool/mpsc_queue.hpp"
#include "pool/shared_frame.hpp"
#include "pool/task_pool.hpp"

namespace {

using wspush::pool::buffer_pool;
using wspush::pool::frame_ref;
using wspush::pool::lease;
using wspush::pool::mpsc_queue;
using wspush::pool::task_pool;
using wspush::pool::task_pool_options;

constexpr std::uint64_t batch = 1 << 16;

task_pool_options workers(std::uint32_t n) {
  task_pool_options o;
  o.initial_workers = n;
  o.max_workers = n;
  o.queue_capacity = 4096;
  return o;
}

/// Waits until the workers have run everything scheduled so far: a marker task goes in
/// last and the caller sleeps on it (not spinning, so the CPU figures stay the pool's).
/// With several workers the marker may finish a task or so before the others; over a
/// 64k batch that is noise.
void drain(task_pool& pool) {
  std::atomic<bool> done{false};
  pool.schedule([&done] {
    done.store(true);
    done.notify_one();
  });
  done.wait(false);
}

/// CPU time of the whole process (every thread, user + system) and its voluntary
/// context switches. On a shared machine wall time per task mostly measures the other
/// tenants; CPU time per task is what the pool itself costs.
struct process_usage {
  double cpu_ns;
  double voluntary_switches;
  static process_usage now() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto ns = [](const timeval& tv) { return double(tv.tv_sec) * 1e9 + double(tv.tv_usec) * 1e3; };
    return {ns(ru.ru_utime) + ns(ru.ru_stime), double(ru.ru_nvcsw)};
  }
};

/// Reports per-task figures for `tasks` run between `start` and now.
void report_per_task(benchmark::State& state, std::uint64_t tasks, const process_usage& start) {
  auto end = process_usage::now();
  state.SetItemsProcessed(std::int64_t(tasks));
  state.counters["ns_per_task"] = benchmark::Counter(
      double(tasks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["cpu_ns_per_task"] = (end.cpu_ns - start.cpu_ns) / double(tasks);
  state.counters["csw_per_ktask"] = (end.voluntary_switches - start.voluntary_switches) * 1e3 / double(tasks);
}

/// Same for items moved between threads: process CPU (all threads) per item.
void report_per_item(benchmark::State& state, std::uint64_t items, const process_usage& start) {
  auto end = process_usage::now();
  state.SetItemsProcessed(std::int64_t(items));
  state.counters["cpu_ns_per_item"] = (end.cpu_ns - start.cpu_ns) / double(items);
}

/// schedule() of an empty task, workers kept busy by a continuous stream.
void BM_schedule_run(benchmark::State& state) {
  task_pool pool(workers(std::uint32_t(state.range(0))));
  std::uint64_t target = 0;
  auto usage = process_usage::now();
  wspush::bench::alloc_probe allocs;
  for (auto _ : state) {
    allocs.begin();
    for (std::uint64_t i = 0; i < batch; ++i) pool.schedule([] {});
    target += batch + 1;
    drain(pool);
    allocs.end();
  }
  report_per_task(state, target, usage);
  state.counters["allocs_per_task"] = allocs.per(target);
}
BENCHMARK(BM_schedule_run)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

/// Same stream with a task that captures 48 bytes and does a little work, so the task
/// copy and a non-empty body are in the figure.
void BM_schedule_run_capture(benchmark::State& state) {
  task_pool pool(workers(std::uint32_t(state.range(0))));
  std::uint64_t target = 0;
  std::atomic<std::uint64_t> sink{0};
  auto usage = process_usage::now();
  for (auto _ : state) {
    for (std::uint64_t i = 0; i < batch; ++i) {
      std::uint64_t a = i, b = i * 3, c = i * 5, d = i * 7, e = i * 11;
      pool.schedule([&sink, a, b, c, d, e] {
        benchmark::DoNotOptimize(a + b + c + d + e);
        (void)sink;
      });
    }
    target += batch + 1;
    drain(pool);
  }
  report_per_task(state, target, usage);
}
BENCHMARK(BM_schedule_run_capture)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

/// try_schedule() of batches that fit the queue (it is drained in between), so every
/// call succeeds: the accept path's cost when the pool has room.
void BM_try_schedule_run(benchmark::State& state) {
  task_pool pool(workers(1));
  const std::uint64_t fits = pool.options().queue_capacity - 1;
  std::uint64_t target = 0;
  auto usage = process_usage::now();
  for (auto _ : state) {
    for (std::uint64_t i = 0; i < fits; ++i) {
      if (!pool.try_schedule([] {})) state.SkipWithError("try_schedule refused");
    }
    target += fits + 1;
    drain(pool);
  }
  report_per_task(state, target, usage);
}
BENCHMARK(BM_try_schedule_run)->UseRealTime()->Unit(benchmark::kMicrosecond);

/// The refusal path: queue full, worker held. What a saturated accept loop pays.
void BM_try_schedule_full(benchmark::State& state) {
  task_pool_options o = workers(1);
  o.queue_capacity = 2;
  task_pool pool(o);
  std::atomic<bool> release{false};
  pool.schedule([&release] {
    while (!release.load()) std::this_thread::yield();
  });
  while (pool.try_schedule([] {})) {
  }
  for (auto _ : state) benchmark::DoNotOptimize(pool.try_schedule([] {}));
  release = true;
}
BENCHMARK(BM_try_schedule_full);

/// Acquire + release of one block of a cached class (single thread).
void BM_lease_acquire_release(benchmark::State& state) {
  buffer_pool pool;
  auto size = std::size_t(state.range(0));
  pool.prefill(size, 4);
  for (auto _ : state) {
    lease l = pool.acquire(size);
    benchmark::DoNotOptimize(l.data());
  }
}
BENCHMARK(BM_lease_acquire_release)->Arg(256)->Arg(4096)->Arg(65536)->Arg(1 << 20)->Arg(32 << 20);

/// Same, with every thread hammering one class of one shared pool (lock contention).
void BM_lease_acquire_release_shared(benchmark::State& state) {
  static buffer_pool* pool = nullptr;
  if (state.thread_index() == 0) {
    pool = new buffer_pool();
    pool->prefill(4096, 16);
  }
  // Google Benchmark starts all threads' loops together after setup by thread 0.
  for (auto _ : state) {
    lease l = pool->acquire(4096);
    benchmark::DoNotOptimize(l.data());
  }
  if (state.thread_index() == 0) {
    delete pool;
    pool = nullptr;
  }
}
BENCHMARK(BM_lease_acquire_release_shared)->Threads(1)->Threads(2)->UseRealTime();

/// Acquire on one thread, release on another (handed over through an mpsc_queue): the
/// connection-writer pattern, where the block comes back on the completion thread. Both
/// sides yield instead of spinning when they must wait, so on a shared machine the
/// figure is not a measure of who else holds the CPU; cpu_ns_per_item is the honest one.
void BM_lease_cross_thread(benchmark::State& state) {
  buffer_pool pool;
  pool.prefill(4096, 1024);
  mpsc_queue<void*> q(256);
  std::atomic<bool> stop{false};
  std::thread releaser([&] {
    void* raw = nullptr;
    while (!stop.load(std::memory_order_relaxed)) {
      while (q.try_pop(raw)) frame_ref::from_raw(raw).reset();
      std::this_thread::yield();
    }
    while (q.try_pop(raw)) frame_ref::from_raw(raw).reset();
  });
  std::uint64_t items = 0;
  auto usage = process_usage::now();
  for (auto _ : state) {
    void* raw = frame_ref::adopt(pool.acquire(4096)).release_raw();
    while (!q.try_push(raw)) std::this_thread::yield();
    ++items;
  }
  stop = true;
  releaser.join();
  report_per_item(state, items, usage);
}
BENCHMARK(BM_lease_cross_thread)->UseRealTime();

/// Copy + destroy of a frame_ref (one atomic increment, one decrement).
void BM_frame_ref_copy_destroy(benchmark::State& state) {
  static buffer_pool pool;
  static frame_ref shared;
  if (state.thread_index() == 0) {
    lease l = pool.acquire(64);
    l.set_size(64);
    shared = frame_ref::adopt(std::move(l));
  }
  for (auto _ : state) {
    frame_ref copy = shared;
    benchmark::DoNotOptimize(copy.bytes().data());
  }
}
BENCHMARK(BM_frame_ref_copy_destroy)->Threads(1)->Threads(2)->UseRealTime();

/// Push + pop on one thread (the uncontended cost of the two halves).
void BM_mpsc_push_pop_same_thread(benchmark::State& state) {
  mpsc_queue<void*> q(1024);
  void* out = nullptr;
  for (auto _ : state) {
    q.try_push(&out);
    q.try_pop(out);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(BM_mpsc_push_pop_same_thread);

/// `range(0)` producer threads push, the benchmark thread pops: per-item throughput.
/// Waiting sides yield (see BM_lease_cross_thread).
void BM_mpsc_cross_thread(benchmark::State& state) {
  mpsc_queue<std::uint64_t> q(4096);
  std::atomic<bool> stop{false};
  std::vector<std::thread> producers;
  for (int p = 0; p < state.range(0); ++p) {
    producers.emplace_back([&q, &stop] {
      std::uint64_t v = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (q.try_push(v)) {
          ++v;
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  std::uint64_t got = 0, v = 0;
  auto usage = process_usage::now();
  for (auto _ : state) {
    while (!q.try_pop(v)) std::this_thread::yield();
    ++got;
  }
  report_per_item(state, got, usage);
  stop = true;
  for (auto& t : producers) t.join();
}
BENCHMARK(BM_mpsc_cross_thread)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
