#pragma once
// A shard: one thread, one io backend, one slab of connections, one timer wheel. It owns
// everything it touches; other threads (pool workers, other shards, main) reach it only
// through its inbox and a wake-up.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "pool/mpsc_queue.hpp"
#include "pool/shared_frame.hpp"
#include "pool/task_pool.hpp"
#include "proto/envelope.hpp"
#include "proto/jwt.hpp"
#include "proto/ws_close.hpp"
#include "proto/ws_frame.hpp"
#include "proto/ws_reader.hpp"
#include "server/app/config.hpp"
#include "server/conn/conn_table.hpp"
#include "server/conn/session_table.hpp"
#include "server/pubsub/topic_registry.hpp"
#include "server/reactor/io_backend.hpp"
#include "server/reactor/timer_wheel.hpp"

namespace wspush::server {

class shard;
class hub;

/// What a shard shares with its siblings: the pool, the list of shards (for broadcast),
/// the bus (pubsub mode) and the process-wide connection count.
struct shard_group {
  const config* cfg = nullptr;
  const proto::jwt_verifier* tokens = nullptr;  // null with --auth=none
  pool::task_pool* tasks = nullptr;
  pool::buffer_pool* buffers = nullptr;
  server::hub* hub = nullptr;                   // pubsub mode only
  std::vector<shard*> shards;
  std::atomic<std::uint32_t> connections{0};
};

/// Items posted to a shard from other threads. `ptr` is a raw leased block or frame. An
/// event (a publish) carries its history part and seq: the shard's resume seam (history.hpp).
struct inbox_item {
  enum kind_t : std::uint8_t { upgrade_done, broadcast, event, drain } kind;
  void* ptr;
  std::uint64_t seq = 0;
  std::uint32_t part = 0;
};

/// A counter written by one thread (its shard) and read by any (a metrics scrape): relaxed
/// load and store, so the hot path pays no locked instruction and readers see no torn value.
class shard_counter {
 public:
  void add(std::uint64_t n = 1) noexcept { _v.store(_v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  void sub(std::uint64_t n = 1) noexcept { _v.store(_v.load(std::memory_order_relaxed) - n, std::memory_order_relaxed); }
  void set(std::uint64_t v) noexcept { _v.store(v, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return _v.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> _v{0};
};

/// What a shard counts, for the log and /metrics (docs/METRICS.md).
struct shard_counters {
  shard_counter accepted, messages_in, messages_out, bytes_in, bytes_out;
  shard_counter slow_consumer_closes, timeouts, protocol_errors;
  // upgrades by result
  shard_counter upgrades_ok, upgrades_bad_request, upgrades_unauthorized, upgrades_over_capacity,
      upgrades_timeout, upgrades_error;
  shard_counter in_state[6];  // connections by conn_state (free is not counted)
  // pub/sub
  shard_counter deliveries;                  // events queued to subscribers
  shard_counter drops_slow, drops_closed;    // events not queued: backlog over the bound; closing
  shard_counter client_pubs_ok, client_pubs_forbidden, client_pubs_unavailable;
  shard_counter client_errors, token_expired_closes;
  shard_counter topics, subscriptions;  // gauges: this shard's registry
  // How long the loop works after each wake-up before it waits again (docs/METRICS.md).
  static constexpr std::uint64_t lag_bounds_ns[7] = {10'000, 100'000, 1'000'000, 5'000'000,
                                                    10'000'000, 50'000'000, 100'000'000};
  shard_counter lag_buckets[8];  // non-cumulative; the last is +Inf
  shard_counter lag_sum_ns;
};

class shard final : io_handler {
 public:
  shard(shard_group& group, int index, int listen_fd);
  ~shard() override;

  /// Creates the backend (on the shard's own thread: io_uring rings belong to one thread).
  bool start_backend(std::string& why, bool& fell_back) noexcept;
  const char* backend_name() const noexcept { return _io ? _io->name() : "none"; }
  /// Runs until drained. Called on the shard's thread.
  void run() noexcept;
  /// Thread-safe. With `wake` false the shard is woken only if its inbox is full: call
  /// wake() after a batch.
  void post(inbox_item item, bool wake = true) noexcept;
  void wake() noexcept;
  /// The inbox is over three quarters full (approximate; any thread). A shard must not post
  /// to a crowded sibling: post() waits for room, and two shards waiting on each other's
  /// full inbox would wait forever. Below the mark there is room for thousands more.
  bool inbox_crowded() const noexcept { return _inbox.size_approx() > _inbox.capacity() / 4 * 3; }
  const shard_counters& counters() const noexcept { return _n; }

 private:
  // io_handler
  void on_accept(int listener, int fd) noexcept override;
  void on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept override;
  void on_read_end(conn_token t, int res) noexcept override;
  void on_read_paused(conn_token t) noexcept override;
  void on_send_done(conn_token t, int res) noexcept override;
  void on_writable(conn_token t) noexcept override;
  void on_wake() noexcept override;
  void on_poll_woke() noexcept override;

  // upgrade phase (shard_http.cpp)
  void upgrade_read(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept;
  void upgrade_dispatch(std::uint32_t i) noexcept;
  void upgrade_done(void* job) noexcept;
  void answer_http(std::uint32_t i, std::uint16_t status, std::string_view body,
                   std::string_view extra_headers = {}) noexcept;
  bool schedule_upgrade(void* job) noexcept;
  void retry_upgrades() noexcept;

  // WebSocket phase (shard_ws.cpp)
  struct ws_events;
  void ws_read(std::uint32_t i, std::span<std::uint8_t> bytes) noexcept;
  bool ws_consume(std::uint32_t i, proto::ws_reader& r, std::span<std::uint8_t> bytes, std::size_t& used) noexcept;
  bool deliver(std::uint32_t i, proto::opcode op, pool::lease& msg, std::span<std::uint8_t> piece) noexcept;
  void broadcast_local(const pool::frame_ref& f) noexcept;
  void fail(std::uint32_t i, proto::close_code code) noexcept;
  void start_close(std::uint32_t i, proto::close_code code, bool linger) noexcept;
  void note_message_timer(std::uint32_t i, const proto::ws_reader& r) noexcept;
  void on_open_timer(std::uint32_t i) noexcept;

  // pub/sub (shard_pubsub.cpp)
  bool client_message(std::uint32_t i, proto::opcode op, std::string_view text, std::size_t readable) noexcept;
  void client_sub(std::uint32_t i) noexcept;
  void client_unsub(std::uint32_t i) noexcept;
  void client_pub(std::uint32_t i) noexcept;
  void client_error(std::uint32_t i, proto::client_error e, std::string_view topic) noexcept;
  template <class Encode>
  bool queue_json(std::uint32_t i, std::size_t bound, Encode&& encode) noexcept;
  std::uint32_t replay_since(std::uint32_t i, std::uint32_t added_mask, std::string_view* lost) noexcept;
  void on_event(pool::frame_ref f, std::uint64_t seq, std::uint32_t part) noexcept;
  void release_deferred() noexcept;
  void count_subscriptions() noexcept;
  proto::grants_view grants_of(std::uint32_t i, bool pub) const noexcept;
  void arm_open(std::uint32_t i, std::uint32_t ticks) noexcept;
  void on_expiry_timer(std::uint32_t i) noexcept;

  // output (shard_out.cpp)
  bool queue(std::uint32_t i, pool::frame_ref f, bool control = false) noexcept;
  bool queue_control(std::uint32_t i, proto::opcode op, std::span<const std::uint8_t> payload) noexcept;
  void list(std::uint32_t i) noexcept;
  void flush_listed() noexcept;
  void flush(std::uint32_t i) noexcept;
  void consume_output(std::uint32_t i, std::size_t bytes) noexcept;
  void output_drained(std::uint32_t i) noexcept;
  void close_now(std::uint32_t i) noexcept;
  void finish_dead(std::uint32_t i) noexcept;

  // loop (shard.cpp)
  void set_state(std::uint32_t i, conn_state s) noexcept;
  void on_timer(std::uint32_t i) noexcept;
  void begin_drain() noexcept;
  void drain_inbox() noexcept;
  void drain_step() noexcept;
  void pause_accepting(std::uint32_t ticks) noexcept;
  std::uint32_t ticks_for(double seconds) const noexcept;
  conn_token token_of(std::uint32_t i) noexcept { return make_token(i, _conns.at(i).gen); }
  std::uint32_t lookup(conn_token t) noexcept;

  struct links_of {
    conn_table* t;
    timer_links& operator()(std::uint32_t i) const noexcept { return t->at(i).timer; }
  };

  shard_group& _g;
  const config& _cfg;
  int _index;
  int _listen_fd;
  std::unique_ptr<io_backend> _io;
  conn_table _conns;
  timer_wheel<links_of> _wheel;
  pool::mpsc_queue<inbox_item> _inbox;
  std::uint32_t _flush_head = no_index, _flush_tail = no_index;  // FIFO
  std::vector<void*> _retry;          // upgrade jobs the pool had no room for
  std::vector<iovec> _iov;            // flush scratch
  std::uint32_t _accept_resume_tick = 0;
  bool _accept_paused = false;
  bool _draining = false;
  struct {
    std::uint32_t start = 0, ticks = 1, cursor = 0;
    std::uint64_t total = 0, done = 0;
  } _drain;                           // SIGTERM: 1001 closes spread over --drain-seconds
  std::uint64_t _start_ns = 0;
  std::uint64_t _woke_ns = 0;         // when the last poll's wait ended
  // pub/sub
  pubsub::topic_registry _topics;
  session_table _sessions;
  std::unique_ptr<proto::envelope_parser> _parser;
  std::unique_ptr<proto::envelope> _env;
  std::vector<std::uint64_t> _fanned;        // per history part: the last seq fanned out here
  std::vector<pool::frame_ref> _replay;      // scratch: a sub's replayed events
  std::vector<std::uint32_t> _release_later; // slots closed during a fan-out
  bool _fanning = false;
  bool _inbox_more = false;                  // drain_inbox stopped at its budget
  bool _inbox_turn_used = false;             // drain_inbox ran in this loop iteration
  shard_counters _n;
};

}  // namespace wspush::server
