#pragma once
/// \file task_pool.hpp
/// A bounded, goroutine-style task pool: a fixed-capacity queue of inline tasks and a
/// set of worker threads that grows from `initial_workers` to `max_workers` under load
/// and shrinks back after `idle_timeout`. Nothing here knows about sockets.
///
/// Cost model (see tests/bench/pool_bench.cpp): scheduling a task is a CAS and a copy of
/// the task into its queue cell; no allocation, and no syscall unless a worker sleeps.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "pool/inplace_task.hpp"

namespace wspush::pool {

/// How shutdown() treats queued and running work.
enum class shutdown_mode : std::uint8_t {
  light,         ///< accept nothing new; run everything queued and running; join
  soft,          ///< accept nothing new; cancel queued work; let running work finish; join
  soft_timeout,  ///< soft, but after `shutdown_timeout` behave as hard (the default)
  hard,          ///< cancel queued work, request stop, return without waiting
};

struct task_pool_options {
  std::uint32_t initial_workers = 1;  ///< started at construction, never retire below this
  std::uint32_t max_workers = 0;      ///< 0: std::thread::hardware_concurrency(); >= initial
  std::uint32_t queue_capacity = 4096;  ///< bounded; rounded up to a power of two (min 2)
  std::chrono::milliseconds idle_timeout{30'000};  ///< a worker above `initial` idle this long retires
  std::chrono::milliseconds shutdown_timeout{5'000};  ///< for soft_timeout
  // Both timeouts are clamped to [0, 24 h].
};

/// A consistent-enough snapshot: each field is read atomically, not all together.
struct pool_stats {
  std::uint32_t workers;             ///< live worker threads
  std::uint32_t busy_workers;        ///< workers not idle (running, or between two tasks)
  std::uint32_t queue_length;        ///< tasks queued, not yet picked up
  std::uint32_t waiting_schedulers;  ///< threads inside schedule()/schedule_for() waiting for room
  std::uint64_t completed;  ///< tasks that ran, including those that threw
  std::uint64_t failed;     ///< tasks that threw (a subset of completed)
  std::uint64_t rejected;   ///< schedule calls refused: queue full (try/for) or shut down
  std::uint64_t cancelled;  ///< tasks dropped unrun at shutdown (their destructors ran)
  /// Task durations, NOT cumulative: bucket i counts tasks with duration in
  /// (le[i-1], le[i]], le = 1us, 10us, 100us, 1ms, 10ms, 100ms, 1s, +Inf. The buckets sum
  /// to `completed`. A duration is measured with one clock read per task, from the end
  /// of the worker's previous task (or its wake-up) to the end of this one, so it
  /// includes the pop (tens of ns) and the task's destructor.
  static constexpr std::size_t duration_buckets = 8;
  std::array<std::uint64_t, duration_buckets> duration_hist;
  double duration_sum_seconds;
};

namespace detail {
struct pool_control;
}

/// The pool. All member functions are thread-safe; tasks may schedule more tasks (but a
/// task blocking in schedule() on a full queue can deadlock a pool whose every worker
/// does the same: tasks should prefer try_schedule()).
///
/// Shared state lives in a reference-counted control block that every worker thread
/// holds: after a hard shutdown, workers still running their task are detached and
/// outlive this object safely.
class task_pool {
 public:
  using task = inplace_task<64>;

  explicit task_pool(task_pool_options opts = {});
  /// shutdown(soft_timeout) unless already shut down.
  ~task_pool();

  task_pool(const task_pool&) = delete;
  task_pool& operator=(const task_pool&) = delete;

  /// Queues `t`, waiting while the queue is full. False once shut down (also when the
  /// shutdown happens while waiting); `t` is then destroyed unrun. A scheduler that
  /// finds the queue full waits until the workers have drained it to half (polling a
  /// few microseconds, then parked), and then retries: blocked producers push in bursts
  /// and sleep in between instead of contending for each freed cell.
  bool schedule(task t) noexcept;
  /// Queues `t` only if there is room right now.
  bool try_schedule(task t) noexcept;
  /// The same, but a refused `t` stays with the caller, intact (it is moved from only when
  /// queued): for work that must be retried rather than lost.
  bool try_schedule_from(task& t) noexcept;
  /// Waits at most `timeout` for a free cell (no drain-to-half: any chance counts).
  bool schedule_for(task t, std::chrono::nanoseconds timeout) noexcept;

  /// Stops the pool as `mode` says. Idempotent: the first call decides, later calls
  /// return at once. Must not be called from a task of this pool (it would wait for
  /// itself), except with `hard`.
  void shutdown(shutdown_mode mode) noexcept;

  /// False once shutdown has begun: from then on every schedule call returns false.
  bool accepting() const noexcept;

  /// Set by hard shutdown and by soft_timeout expiry. Long tasks may poll it.
  bool stop_requested() const noexcept;

  /// From inside a task: whether the pool running it has requested stop. Safe after the
  /// task_pool object is gone (it reads the control block the worker holds); false on
  /// threads that are not pool workers.
  static bool this_worker_stop_requested() noexcept;

  pool_stats stats() const noexcept;

  /// The effective options (max_workers resolved, capacity rounded).
  const task_pool_options& options() const noexcept { return _opts; }

 private:
  bool schedule_until(task& t, std::chrono::steady_clock::time_point deadline) noexcept;
  void after_push() noexcept;
  bool reject() noexcept;

  task_pool_options _opts;
  std::shared_ptr<detail::pool_control> _ctl;
};

}  // namespace wspush::pool
