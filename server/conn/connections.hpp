#pragma once
// A shard's connections: the records, their lifecycle from accept to release, and the way the
// loop's events reach them. Bytes go one way:
//
//   loop event ─▶ transport (plaintext) ─▶ http_phase (upgrade) ─▶ ws_phase (frames) ─▶ application
//   application ─▶ conn_ops::send ─▶ out_queue ─▶ flush list ─▶ transport ─▶ socket
//
// It implements the loop's handler and the application's conn_ops. The phases are classes of
// their own; this class holds what they share (records, states, the out queues and their
// bound, closing) and no protocol.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <sys/uio.h>

#include "pool/buffer_pool.hpp"
#include "pool/shared_frame.hpp"
#include "proto/jwt.hpp"
#include "server/base/options.hpp"
#include "server/base/rate_gate.hpp"
#include "server/conn/app.hpp"
#include "server/conn/compression.hpp"
#include "server/conn/conn_counters.hpp"
#include "server/conn/conn_table.hpp"
#include "server/conn/connection.hpp"
#include "server/conn/http_phase.hpp"
#include "server/conn/sse_phase.hpp"
#include "server/conn/ws_phase.hpp"
#include "server/net/transport.hpp"
#include "server/reactor/inbox.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server {

class upgrade_runner;

class connections final : public loop_handler,
                          public conn_ops,
                          public inbox_consumer<upgrade_job_ref>,
                          private plaintext_sink {
 public:
  /// Everything must outlive this object. `open_count` is the process-wide count of connections
  /// (--max-connections spans the shards).
  connections(const conn_options& o, loop_ops& l, transport& t, application& app, pool::buffer_pool& buffers,
              std::atomic<std::uint32_t>& open_count);
  ~connections() override;
  connections(const connections&) = delete;
  connections& operator=(const connections&) = delete;

  /// Where upgrades run (before the first connection).
  void set_upgrade_runner(upgrade_runner& r) noexcept { _http.set_runner(r); }
  /// The static files plain GETs get (the demo page, the client); without, they get 404.
  void set_static_site(const static_site& s) noexcept { _http.set_site(s); }
  /// permessage-deflate (without, no connection negotiates it).
  void set_compression(compression& z) noexcept { _compression = &z; }
  /// --upgrade-rate: upgrades (and event streams) past it are refused 503 (without: none are).
  void set_upgrade_gate(rate_gate& g) noexcept { _upgrade_gate = &g; }
  rate_gate* upgrade_gate() const noexcept { return _upgrade_gate; }
  /// --max-connections as it is now (SIGHUP may change it; without: the options' value).
  void set_connection_limit(const std::atomic<std::uint32_t>& limit) noexcept { _limit = &limit; }
  compression* compression_of() const noexcept { return _compression; }
  /// The upgrade of `slot` negotiated permessage-deflate.
  void negotiated_deflate(std::uint32_t slot) noexcept;
  const conn_counters& counters() const noexcept { return _n; }
  std::uint32_t size() const noexcept { return _table.size(); }

  // loop_handler
  void on_accept(int fd) noexcept override;
  void on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept override;
  void on_read_end(conn_token t, int res) noexcept override;
  void on_read_paused(conn_token t) noexcept override;
  void on_send_done(conn_token t, int res) noexcept override;
  void on_writable(conn_token t) noexcept override;
  void on_timer(std::uint32_t slot) noexcept override;
  void on_flush(std::uint32_t slot) noexcept override;
  void on_turn() noexcept override { _http.retry(); }
  void on_tick(std::uint32_t tick) noexcept override {
    judge_stalls(tick);
    _app.on_tick(tick);
  }
  std::uint64_t on_drain_begin() noexcept override;
  std::uint64_t close_some(std::uint64_t n) noexcept override;
  bool empty() const noexcept override { return _table.size() == 0; }

  // conn_ops
  bool send(conn_id c, pool::frame_ref f) noexcept override {
    if (!queue(c, std::move(f))) return false;
    _n.messages_out.add();
    return true;
  }
  send_counts send_all(std::span<const conn_id> cs, const pool::frame_ref& f,
                       std::uint32_t messages = 1) noexcept override;
  void close(conn_id c, proto::close_code code) noexcept override;
  bool is_open(conn_id c) const noexcept override;
  std::size_t unsent_bytes(conn_id c) const noexcept override;
  void expiry_changed(conn_id c) noexcept override { _ws.rearm(c); }
  // A stream's client sends nothing after its request: there is nothing to hold.
  void hold(conn_id c) noexcept override {
    if (!(_table.at(c).ext & ext_sse)) _ws.hold(c);
  }
  void resume(conn_id c) noexcept override {
    if (!(_table.at(c).ext & ext_sse)) _ws.resume(c);
  }
  pool::buffer_pool& buffers() noexcept override { return _buffers; }
  bool compresses(conn_id c) const noexcept override {
    return c < _table.capacity() && (_table.at(c).ext & ext_deflate) != 0;
  }
  std::uint8_t app_bits(conn_id c) const noexcept override {
    return std::uint8_t((_table.at(c).flags & flag_app_mask) >> flag_app_shift);
  }
  void set_app_bits(conn_id c, std::uint8_t bits) noexcept override {
    connection& r = _table.at(c);
    r.flags = std::uint16_t((r.flags & ~flag_app_mask) | ((bits & 7) << flag_app_shift));
  }

  // inbox_consumer: upgrades back from a worker
  std::uint64_t on_item(upgrade_job_ref&& job) noexcept override {
    _http.on_upgraded(std::move(job));
    return 1;
  }

  // ---- for the phases -------------------------------------------------------------------
  connection& at(std::uint32_t slot) noexcept { return _table.at(slot); }
  conn_token token_of(std::uint32_t slot) noexcept { return make_token(slot, _table.at(slot).gen); }
  /// The slot of a live token, or no_index.
  std::uint32_t lookup(conn_token t) noexcept { return _table.find(t) ? token_index(t) : no_index; }
  /// Every state change goes through here, so the per-state gauges stay exact.
  void set_state(std::uint32_t slot, conn_state s) noexcept;
  /// Queues a frame (the slow-consumer bound applies unless `control`: a close must get out).
  bool queue(std::uint32_t slot, pool::frame_ref f, bool control = false) noexcept;
  /// Queues the pong to a ping (at most one waits, see out_queue::push_pong).
  void queue_pong(std::uint32_t slot, std::span<const std::uint8_t> payload) noexcept;
  void list(std::uint32_t slot) noexcept;
  /// Closes the socket now; the slot is released once no send is in flight.
  void close_now(std::uint32_t slot) noexcept;
  /// Input has ended for good (after our close, a protocol error, or an HTTP error answer).
  void stop_reading(std::uint32_t slot) noexcept;
  /// No reading until the connection is open (its upgrade is with a worker): what the client
  /// sends meanwhile waits in the kernel. The first flush once it is open reads again.
  void pause_reading(std::uint32_t slot) noexcept;
  /// The application took the connection (after a successful on_open).
  void opened(std::uint32_t slot) noexcept;
  /// The connection is an event stream from here on (its 200 is queued).
  void stream_opened(std::uint32_t slot) noexcept;
  /// --max-connection-lifetime: the ticks `slot` has left to live (UINT32_MAX: no limit).
  std::uint32_t life_left(std::uint32_t slot) const noexcept;
  sse_phase& sse() noexcept { return _sse; }
  bool draining() const noexcept { return _draining; }
  /// A connection whose unsent output stays over --max-pending-bytes while the kernel takes none
  /// of it for this long is a slow consumer, whatever the size of the frames that fill it
  /// (checked every loop tick: closed at most two ticks later).
  static constexpr double stall_seconds = 1;

  const conn_options& options() const noexcept { return _o; }
  loop_ops& loop() noexcept { return _loop; }
  application& app() noexcept { return _app; }
  conn_counters& counters_mut() noexcept { return _n; }

 private:
  void on_plaintext(conn_token t, std::span<std::uint8_t> bytes) noexcept override;
  void flush(std::uint32_t slot) noexcept;
  void output_drained(std::uint32_t slot) noexcept;
  void send_ended(std::uint32_t slot, const transport_event& e) noexcept;
  bool stuck(const connection& c) const noexcept;
  void close_slow_consumer(std::uint32_t slot) noexcept;
  void watch_stall(std::uint32_t slot) noexcept;
  void judge_stalls(std::uint32_t tick) noexcept;
  void release(std::uint32_t slot) noexcept;
  void leave_count(connection& c) noexcept;
  void refuse_over_capacity(int fd) noexcept;

  const conn_options& _o;
  loop_ops& _loop;
  transport& _transport;
  application& _app;
  pool::buffer_pool& _buffers;
  std::atomic<std::uint32_t>& _open_count;
  compression* _compression = nullptr;
  rate_gate* _upgrade_gate = nullptr;
  const std::atomic<std::uint32_t>* _limit = nullptr;
  std::uint32_t _life_ticks = 0;          // --max-connection-lifetime (0: none)
  std::vector<std::uint32_t> _opened_at;  // with a lifetime: the tick each slot's connection opened
  static constexpr std::uint32_t no_lifetime = UINT32_MAX;  // a slot opened while _opened_at could not grow
  conn_table _table;
  http_phase _http;
  ws_phase _ws;
  sse_phase _sse;
  std::vector<iovec> _iov;                // flush scratch
  std::vector<std::uint32_t> _release_later;  // slots that died during a send_all
  /// A connection over the bound whose send the kernel did not finish, and since when (tick)
  /// the kernel has taken nothing more of its queue.
  struct stall {
    conn_token token;
    std::uint64_t taken;
    std::uint32_t since;
  };
  std::vector<stall> _stalls;
  bool _in_batch = false;
  bool _draining = false;
  std::uint32_t _drain_cursor = 0;
  conn_counters _n;
};

}  // namespace wspush::server
