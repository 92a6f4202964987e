#include "pool/task_pool.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "pool/detail/parking.hpp"
#include "pool/detail/spin.hpp"
#include "pool/detail/task_ring.hpp"
#include "pool/detail/tick_clock.hpp"

namespace wspush::pool {

namespace detail {

using task = task_pool::task;
using clock = std::chrono::steady_clock;

/// How long a worker (or a scheduler) spins before it parks. Short: the machine is
/// shared, and a parked thread costs a futex wake only when someone needs it.
constexpr int worker_spins = 128;
constexpr int scheduler_polls = 8;         // a scheduler waiting for room checks 8 times,
constexpr int scheduler_poll_pauses = 16;  // 16 pauses apart (~2 us in all here)

/// Counters of one worker. Written only by the worker occupying the slot (owner_add, no
/// locked RMW), read by stats(). Slots are reused after a worker retires, so the
/// counters accumulate over the pool's lifetime.
struct alignas(cache_line) worker_slot {
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> ticks_sum{0};
  std::array<std::atomic<std::uint64_t>, pool_stats::duration_buckets> hist{};
  // Guarded by pool_control::lifecycle.
  std::thread thread;
  bool occupied = false;
};
static_assert(sizeof(worker_slot) <= 2 * cache_line, "worker_slot budget: two cache lines");

/// Everything the workers touch. Reference counted: the task_pool and every worker hold
/// a shared_ptr, so workers detached by a hard shutdown never touch freed memory.
struct pool_control {
  explicit pool_control(const task_pool_options& o);

  enum class next : std::uint8_t { pop, retire, exit };
  bool worker_loop(worker_slot& slot) noexcept;
  next await_work() noexcept;
  bool try_retire() noexcept;
  void run_one(task& t, worker_slot& slot) noexcept;
  std::uint64_t record(worker_slot& slot, std::uint64_t t0) noexcept;
  void on_failure(worker_slot& slot, const char* what) noexcept;
  bool spawn(const std::shared_ptr<pool_control>& self) noexcept;
  void on_worker_exit(std::uint32_t slot_index, bool retired) noexcept;
  bool await_room(clock::time_point deadline, bool burst) noexcept;
  void cancel_queued() noexcept;
  bool wait_for_workers(clock::time_point deadline) noexcept;
  void run_leftovers() noexcept;
  void detach_all() noexcept;
  void join_all() noexcept;

  task_ring<task> ring;

  // Read-mostly: checked on every push/pop, written a handful of times per lifetime.
  alignas(cache_line) const task_pool_options opts;
  std::array<std::uint64_t, pool_stats::duration_buckets - 1> bucket_limits{};  // in ticks
  double ticks_per_ns;
  std::atomic<std::uint32_t> workers{0};  // written under `lifecycle`
  std::atomic<bool> drop_queued{false};
  std::atomic<bool> stop{false};
  std::atomic<bool> shutdown_started{false};

  // Workers that found no work (spinning or parked). A worker leaves this count
  // *before* it tries to pop, so the count never over-reports idle workers: growth
  // decisions may spawn one worker too many, never one too few.
  alignas(cache_line) std::atomic<std::uint32_t> idle{0};
  parking work_park;

  // Schedulers waiting for room: schedule() waits for the queue to drain to half
  // (burst_park), schedule_for() for any free cell (cell_park, its timeout counts).
  alignas(cache_line) parking burst_park;
  parking cell_park;
  std::atomic<std::uint32_t> sched_waiting{0};

  // Failure counters on their own line: a producer hammering a full queue with
  // try_schedule() must not slow the workers' reads of the parkings.
  alignas(cache_line) std::atomic<std::uint64_t> rejected{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::int64_t> last_log_ns{std::numeric_limits<std::int64_t>::min() / 2};
  std::atomic<std::uint64_t> unlogged_failures{0};

  alignas(cache_line) std::mutex lifecycle;
  std::condition_variable exited;  // signalled under `lifecycle` when a worker exits
  std::uint32_t live_threads = 0;  // guarded by `lifecycle`
  std::unique_ptr<worker_slot[]> slots;
};

namespace {
/// The control block of the pool whose worker runs on this thread.
thread_local const pool_control* t_current = nullptr;

void worker_main(std::shared_ptr<pool_control> ctl, std::uint32_t slot_index) noexcept {
  t_current = ctl.get();
  bool retired = ctl->worker_loop(ctl->slots[slot_index]);
  t_current = nullptr;
  ctl->on_worker_exit(slot_index, retired);
  // `ctl` is released here, after on_worker_exit dropped the lifecycle mutex: the last
  // reference may be ours (hard shutdown), and it destroys that mutex.
}
}  // namespace

pool_control::pool_control(const task_pool_options& o)
    : ring(o.queue_capacity), opts(o), slots(new worker_slot[o.max_workers]) {
  ticks_per_ns = tick_clock::get().ticks_per_ns;
  double limit_ns = 1'000.0;
  for (auto& limit : bucket_limits) {
    limit = std::uint64_t(limit_ns * ticks_per_ns);
    limit_ns *= 10.0;
  }
}

/// Pops and runs until told to leave; returns true if the worker retired (idle timeout).
bool pool_control::worker_loop(worker_slot& slot) noexcept {
  task t;
  std::uint64_t t0 = tick_clock::now();
  for (;;) {
    if (ring.try_pop(t)) {
      // A cell just became free. Parked schedule() callers are woken once the queue
      // has drained to half (or runs dry, in await_work): one wake-up then buys them a
      // burst of pushes. schedule_for() callers want any cell before their deadline.
      store_load_fence();
      cell_park.wake_one();
      if (burst_park.needs_wake() && ring.size_approx() <= ring.capacity() / 2) burst_park.wake_one();
      if (drop_queued.load(std::memory_order_relaxed)) {
        t.reset();  // popped after shutdown began: cancelled, not started
        cancelled.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      run_one(t, slot);
      t0 = record(slot, t0);
      continue;
    }
    next n = await_work();
    if (n != next::pop) return n == next::retire;
    t0 = tick_clock::now();
  }
}

void pool_control::run_one(task& t, worker_slot& slot) noexcept {
  try {
    t();
  } catch (const std::exception& e) {
    on_failure(slot, e.what());
  } catch (...) {
    on_failure(slot, "exception not derived from std::exception");
  }
  t.reset();
}

std::uint64_t pool_control::record(worker_slot& slot, std::uint64_t t0) noexcept {
  std::uint64_t t1 = tick_clock::now();
  std::uint64_t d = t1 > t0 ? t1 - t0 : 0;
  std::size_t b = 0;
  while (b < bucket_limits.size() && d > bucket_limits[b]) ++b;
  owner_add(slot.hist[b]);
  owner_add(slot.ticks_sum, d);
  owner_add(slot.completed);
  return t1;
}

/// Logged once per second at most, with the number of failures not logged since.
void pool_control::on_failure(worker_slot& slot, const char* what) noexcept {
  owner_add(slot.failed);
  auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    clock::now().time_since_epoch()).count();
  auto last = last_log_ns.load(std::memory_order_relaxed);
  if (now_ns - last < 1'000'000'000 ||
      !last_log_ns.compare_exchange_strong(last, now_ns, std::memory_order_relaxed)) {
    unlogged_failures.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto skipped = unlogged_failures.exchange(0, std::memory_order_relaxed);
  std::fprintf(stderr, "wspush pool: task threw: %s (%llu more not logged)\n", what,
               static_cast<unsigned long long>(skipped));
}

/// Called when a pop found nothing: spin, then park, until there may be work to pop,
/// the idle timeout retires this worker, or shutdown tells it to exit.
pool_control::next pool_control::await_work() noexcept {
  idle.fetch_add(1, std::memory_order_seq_cst);
  burst_park.wake_one();  // the queue ran dry: nobody may stay parked for room
  cell_park.wake_one();
  for (;;) {
    for (int i = 0; i < worker_spins && !ring.has_ready() && !ring.closed(); ++i) cpu_relax();
    if (ring.has_ready()) break;
    if (ring.closed()) {
      if (drop_queued.load(std::memory_order_relaxed) || ring.drained()) {
        idle.fetch_sub(1, std::memory_order_seq_cst);
        return next::exit;
      }
      std::this_thread::yield();  // a push that claimed its cell before close is finishing
      break;
    }
    // Only workers above `initial` can retire; the others sleep long (a zero
    // idle_timeout must not turn them into spinners).
    bool may_retire = workers.load(std::memory_order_relaxed) > opts.initial_workers;
    auto deadline = clock::now() + (may_retire ? clock::duration(opts.idle_timeout) : std::chrono::hours(1));
    bool woken = work_park.park_until([this] { return ring.has_ready() || ring.closed(); }, deadline);
    if (!woken && try_retire()) return next::retire;
  }
  idle.fetch_sub(1, std::memory_order_seq_cst);
  return next::pop;
}

/// A worker above `initial_workers` idle for `idle_timeout` leaves. It drops out of
/// `idle` and `workers` first and then looks at the queue once more, so a push that
/// counted it as idle (and so did not grow the pool) is not stranded.
bool pool_control::try_retire() noexcept {
  std::lock_guard lock(lifecycle);
  auto w = workers.load(std::memory_order_relaxed);
  if (w <= opts.initial_workers) return false;
  workers.store(w - 1, std::memory_order_relaxed);
  idle.fetch_sub(1, std::memory_order_seq_cst);
  store_load_fence();
  if (ring.has_ready() || ring.closed()) {
    workers.store(w, std::memory_order_relaxed);
    idle.fetch_add(1, std::memory_order_seq_cst);
    return false;
  }
  return true;
}

bool pool_control::spawn(const std::shared_ptr<pool_control>& self) noexcept {
  std::lock_guard lock(lifecycle);
  auto w = workers.load(std::memory_order_relaxed);
  if (w >= opts.max_workers || ring.closed()) return false;
  std::uint32_t i = 0;
  while (slots[i].occupied) ++i;  // w < max_workers, so a free slot exists
  worker_slot& slot = slots[i];
  if (slot.thread.joinable()) slot.thread.join();  // a retired worker, already past its exit
  try {
    slot.thread = std::thread(worker_main, self, i);
  } catch (const std::system_error&) {
    return false;
  }
  slot.occupied = true;
  workers.store(w + 1, std::memory_order_relaxed);
  ++live_threads;
  return true;
}

void pool_control::on_worker_exit(std::uint32_t slot_index, bool retired) noexcept {
  std::lock_guard lock(lifecycle);
  // A retired worker already left `workers` in try_retire; one leaving at shutdown not.
  if (!retired) workers.store(workers.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  slots[slot_index].occupied = false;
  --live_threads;
  exited.notify_all();
}

/// A scheduler found the queue full. With `burst` (schedule()), wait until the workers
/// have drained it to half, so that the scheduler then pushes a burst instead of
/// fighting the workers for every freed cell (its polls would steal the very cache
/// lines they write); FIFO order means its task starts no later for it. Without
/// (schedule_for(): its deadline must see every chance), any free cell will do.
/// Polls sparsely for a few microseconds, then parks; workers wake the parkers (see
/// worker_loop, await_work). False once `deadline` has passed.
bool pool_control::await_room(clock::time_point deadline, bool burst) noexcept {
  const std::uint64_t low_water = burst ? ring.capacity() / 2 : ring.capacity() - 1;
  auto ready = [this, low_water] { return ring.closed() || ring.size_approx() <= low_water; };
  for (int poll = 0; poll < scheduler_polls; ++poll) {
    for (int i = 0; i < scheduler_poll_pauses; ++i) cpu_relax();
    if (ready()) return true;
  }
  auto now = clock::now();
  if (now >= deadline) return false;
  auto park_deadline = deadline - now > std::chrono::hours(1) ? now + std::chrono::hours(1) : deadline;
  (burst ? burst_park : cell_park).park_until(ready, park_deadline);
  return true;  // try again; a timeout shows up on the next call
}

void pool_control::cancel_queued() noexcept {
  task t;
  while (!ring.drained()) {
    if (ring.try_pop(t)) {
      t.reset();
      cancelled.fetch_add(1, std::memory_order_relaxed);
    } else {
      std::this_thread::yield();
    }
  }
}

/// False if `deadline` passed with workers still running.
bool pool_control::wait_for_workers(clock::time_point deadline) noexcept {
  std::unique_lock lock(lifecycle);
  return exited.wait_until(lock, deadline, [this] { return live_threads == 0; });
}

/// Light shutdown with no worker left (none could be started): run what is queued here.
void pool_control::run_leftovers() noexcept {
  task t;
  worker_slot& slot = slots[0];
  while (!ring.drained()) {
    if (ring.try_pop(t)) {
      std::uint64_t t0 = tick_clock::now();
      run_one(t, slot);
      record(slot, t0);
    } else {
      std::this_thread::yield();
    }
  }
}

void pool_control::detach_all() noexcept {
  std::lock_guard lock(lifecycle);
  for (std::uint32_t i = 0; i < opts.max_workers; ++i) {
    if (slots[i].thread.joinable()) slots[i].thread.detach();
  }
}

void pool_control::join_all() noexcept {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(lifecycle);
    for (std::uint32_t i = 0; i < opts.max_workers; ++i) {
      if (slots[i].thread.joinable()) {
        try {
          threads.push_back(std::move(slots[i].thread));
        } catch (const std::bad_alloc&) {
          slots[i].thread.detach();  // it has exited already (live_threads == 0)
        }
      }
    }
  }
  for (auto& th : threads) th.join();
}

}  // namespace detail

namespace {
task_pool_options normalise(task_pool_options o) {
  if (o.max_workers == 0) o.max_workers = std::max(1u, std::thread::hardware_concurrency());
  o.max_workers = std::max(o.max_workers, std::max(o.initial_workers, 1u));
  std::uint32_t cap = 2;
  while (cap < o.queue_capacity && cap < (1u << 31)) cap <<= 1;
  o.queue_capacity = cap;
  // Bounded so that `now + timeout` cannot overflow; a day is "never" for both.
  constexpr std::chrono::milliseconds day = std::chrono::hours(24);
  o.idle_timeout = std::clamp(o.idle_timeout, std::chrono::milliseconds(0), day);
  o.shutdown_timeout = std::clamp(o.shutdown_timeout, std::chrono::milliseconds(0), day);
  return o;
}
}  // namespace

task_pool::task_pool(task_pool_options opts)
    : _opts(normalise(opts)), _ctl(std::make_shared<detail::pool_control>(_opts)) {
  for (std::uint32_t i = 0; i < _opts.initial_workers; ++i) {
    if (!_ctl->spawn(_ctl)) {
      shutdown(shutdown_mode::light);
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "task_pool: cannot start initial workers");
    }
  }
}

task_pool::~task_pool() { shutdown(shutdown_mode::soft_timeout); }

bool task_pool::schedule(task t) noexcept {
  switch (_ctl->ring.try_push(t)) {
    case detail::push_result::ok:
      after_push();
      return true;
    case detail::push_result::closed:
      return reject();
    case detail::push_result::full:
      break;
  }
  return schedule_until(t, detail::clock::time_point::max());
}

bool task_pool::try_schedule(task t) noexcept { return try_schedule_from(t); }

bool task_pool::try_schedule_from(task& t) noexcept {
  if (_ctl->ring.try_push(t) != detail::push_result::ok) return reject();
  after_push();
  return true;
}

bool task_pool::schedule_for(task t, std::chrono::nanoseconds timeout) noexcept {
  if (_ctl->ring.try_push(t) == detail::push_result::ok) {
    after_push();
    return true;
  }
  if (timeout <= timeout.zero() || _ctl->ring.closed()) return reject();
  auto now = detail::clock::now();
  auto room = detail::clock::time_point::max() - now;
  auto deadline = timeout >= room ? detail::clock::time_point::max()
                                  : now + std::chrono::duration_cast<detail::clock::duration>(timeout);
  return schedule_until(t, deadline);
}

/// Slow path: the queue was full. Wait for room (see pool_control::await_room) and
/// retry until the push succeeds, the deadline passes (time_point::max() = never), or
/// the pool shuts down.
bool task_pool::schedule_until(task& t, std::chrono::steady_clock::time_point deadline) noexcept {
  auto& c = *_ctl;
  c.sched_waiting.fetch_add(1, std::memory_order_relaxed);
  detail::push_result r;
  const bool burst = deadline == detail::clock::time_point::max();  // schedule(), not _for
  while ((r = c.ring.try_push(t)) == detail::push_result::full && c.await_room(deadline, burst)) {
  }
  c.sched_waiting.fetch_sub(1, std::memory_order_relaxed);
  if (r != detail::push_result::ok) return reject();
  after_push();
  return true;
}

/// After a successful push: wake a parked worker if one sleeps without a pending
/// wake-up, and grow the pool if more tasks are queued than idle workers can take.
void task_pool::after_push() noexcept {
  auto& c = *_ctl;
  detail::store_load_fence();
  c.work_park.wake_one();
  if (c.workers.load(std::memory_order_relaxed) < _opts.max_workers &&
      c.ring.size_approx() > c.idle.load(std::memory_order_relaxed)) {
    c.spawn(_ctl);
  }
}

bool task_pool::reject() noexcept {
  _ctl->rejected.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void task_pool::shutdown(shutdown_mode mode) noexcept {
  auto& c = *_ctl;
  if (c.shutdown_started.exchange(true, std::memory_order_acq_rel)) return;
  bool drop = mode != shutdown_mode::light;
  if (drop) c.drop_queued.store(true, std::memory_order_seq_cst);
  if (mode == shutdown_mode::hard) c.stop.store(true, std::memory_order_seq_cst);
  c.ring.close();
  c.work_park.wake_all();
  c.burst_park.wake_all();
  c.cell_park.wake_all();
  if (drop) c.cancel_queued();
  if (mode == shutdown_mode::hard) {
    c.detach_all();
    return;
  }
  auto deadline = mode == shutdown_mode::soft_timeout ? detail::clock::now() + _opts.shutdown_timeout
                                                      : detail::clock::time_point::max();
  if (!c.wait_for_workers(deadline)) {
    c.stop.store(true, std::memory_order_seq_cst);  // soft_timeout expired: behave as hard
    c.detach_all();
    return;
  }
  c.join_all();
  if (!drop) c.run_leftovers();
}

bool task_pool::accepting() const noexcept { return !_ctl->ring.closed(); }

bool task_pool::stop_requested() const noexcept { return _ctl->stop.load(std::memory_order_relaxed); }

bool task_pool::this_worker_stop_requested() noexcept {
  return detail::t_current != nullptr && detail::t_current->stop.load(std::memory_order_relaxed);
}

pool_stats task_pool::stats() const noexcept {
  const auto& c = *_ctl;
  pool_stats s{};
  s.workers = c.workers.load(std::memory_order_relaxed);
  auto idle = c.idle.load(std::memory_order_relaxed);
  s.busy_workers = s.workers > idle ? s.workers - idle : 0;
  s.queue_length = std::uint32_t(c.ring.size_approx());
  s.waiting_schedulers = c.sched_waiting.load(std::memory_order_relaxed);
  s.rejected = c.rejected.load(std::memory_order_relaxed);
  s.cancelled = c.cancelled.load(std::memory_order_relaxed);
  std::uint64_t ticks = 0;
  for (std::uint32_t i = 0; i < _opts.max_workers; ++i) {
    const auto& slot = c.slots[i];
    s.completed += slot.completed.load(std::memory_order_relaxed);
    s.failed += slot.failed.load(std::memory_order_relaxed);
    ticks += slot.ticks_sum.load(std::memory_order_relaxed);
    for (std::size_t b = 0; b < s.duration_hist.size(); ++b) {
      s.duration_hist[b] += slot.hist[b].load(std::memory_order_relaxed);
    }
  }
  s.duration_sum_seconds = double(ticks) / c.ticks_per_ns * 1e-9;
  return s;
}

}  // namespace wspush::pool
