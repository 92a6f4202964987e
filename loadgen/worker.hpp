#pragma once
/// \file worker.hpp
/// One worker process: holds its share of the connections on one epoll loop (the server's
/// reactor style: one loop, a slab of fixed records, a handle packed into epoll's data), opens
/// them at its share of --rate, subscribes, accounts for every delivery, and sends the parent a
/// sample each interval. Commands come over a pipe, one byte each: 'g' publishing has started
/// (churn and storm timers start), 'r' report the final numbers, 'q' or EOF quit.
///
/// Every wait has a deadline; the parent bounds the whole run on top of that.

#include "loadgen/event_stream.hpp"
#include "loadgen/histogram.hpp"
#include "loadgen/options.hpp"
#include "loadgen/rate_limiter.hpp"
#include "loadgen/results.hpp"
#include "loadgen/sys.hpp"
#include "loadgen/wire.hpp"

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

struct ssl_st;
struct ssl_ctx_st;

namespace wspush::loadgen {

enum class conn_state : std::uint8_t { waiting, connecting, handshaking, upgrading, subscribing, ready, paused, closed };

/// Upgrade bookkeeping, allocated only between connect() and the 101.
struct upgrade_state {
  std::string accept;     ///< the Sec-WebSocket-Accept we expect
  std::string response;   ///< response bytes so far
};

/// One client connection (its index in the worker's slab is its handle). Budget: one cache
/// line; nothing in it grows with the traffic (cut frames lease a spill from the worker). An
/// event stream (--transport sse) reads with the worker's sse_reader of its index instead of
/// `reader`.
struct lg_conn {
  frame_reader reader;
  seq_tracker seq;
  std::unique_ptr<upgrade_state> upgrade;
  std::uint64_t started_ns = 0;   ///< when this connect attempt began (connect-time histogram)
  std::uint32_t received = 0;     ///< distinct payloads received
  int fd = -1;
  conn_state state = conn_state::waiting;
  bool checked = false;   ///< counts toward expected / loss
  bool slow = false;
  bool churner = false;
  bool storm_wait = false;   ///< dropped in the storm, not back yet
  bool deflate = false;      ///< its 101 accepted permessage-deflate
  bool told = false;         ///< heard its topic lost (a notice, or a `subbed` that listed it)
};

static_assert(sizeof(lg_conn) <= 64, "a connection's record fits a cache line");

/// Id of the newest event a connection saw (before the first, the position its `subbed` gave),
/// for `since` when it reconnects (kept only in the scenarios that reconnect). Room for the
/// longest Redis bus id: a 16-character epoch, ':', two 20-digit numbers and '-'.
struct last_event_id {
  std::array<char, 58> bytes{};
  std::uint8_t len = 0;
};

class worker {
public:
  /// Worker `index` holds connections [first, first + count) of the global numbering.
  worker(const options& o, std::uint32_t index, std::uint32_t first, std::uint32_t count, int ctrl_fd, int report_fd);
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Runs until told to quit; returns the process exit code.
  int run() noexcept;

private:
  static constexpr std::uint64_t ctrl_tag = ~std::uint64_t{0};
  struct sink;          // frame_handler of one connection
  struct stream_sink;   // event_handler of one event stream

  // opening and upgrading (worker.cpp)
  void open_due(std::uint64_t now) noexcept;
  void open_one(std::uint32_t i, std::uint64_t now) noexcept;
  void fail(std::uint32_t i, ctr why, int err = 0) noexcept;
  void on_connected(std::uint32_t i) noexcept;
  void on_handshake(std::uint32_t i) noexcept;
  void send_upgrade(std::uint32_t i) noexcept;
  void send_stream_request(std::uint32_t i) noexcept;
  void on_upgrade_bytes(std::uint32_t i) noexcept;
  // the socket, or with wss:// its TLS (worker.cpp)
  ssize_t io_send(std::uint32_t i, const void* data, std::size_t len) noexcept;
  /// Bytes read (> 0); 0 at the end of the stream; -1 when nothing is there now; -2 on an error.
  ssize_t io_recv(std::uint32_t i, void* buf, std::size_t len) noexcept;
  void io_close(std::uint32_t i) noexcept;
  void tls_write_failed(std::uint32_t i) noexcept;
  void watch(std::uint32_t i, std::uint32_t events) noexcept;
  std::uint32_t index_of(const lg_conn& c) const noexcept { return static_cast<std::uint32_t>(&c - _conns.data()); }
  void finish_upgrade(std::uint32_t i, std::size_t head_len) noexcept;
  void finish_stream_head(std::uint32_t i, std::size_t head_len) noexcept;
  /// The id to resume from (empty: none yet, or the scenario does not reconnect).
  [[nodiscard]] std::string_view resume_id(std::uint32_t i) const noexcept {
    return _last_ids.empty() ? std::string_view{} : std::string_view(_last_ids[i].bytes.data(), _last_ids[i].len);
  }
  /// The user connection `i`'s token names: "u<index over all processes>" with --own-users,
  /// else empty (one shared by all).
  [[nodiscard]] std::string user_of(std::uint32_t i) const {
    return _o.own_users ? "u" + std::to_string(_first + i) : std::string();
  }
  void become_ready(std::uint32_t i) noexcept;
  bool send_text(lg_conn& c, std::string_view text) noexcept;
  void send_control(lg_conn& c, proto::opcode op, std::span<const std::uint8_t> payload) noexcept;
  void expire_upgrades(std::uint64_t now) noexcept;
  // receiving (worker_run.cpp)
  void dispatch(std::uint64_t tag, std::uint32_t events) noexcept;
  void on_readable(std::uint32_t i) noexcept;
  void feed(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept;
  void feed_stream(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept;
  void on_reply(std::uint32_t i, std::string_view msg) noexcept;
  void on_payload(lg_conn& c, std::uint32_t i, const delivery& d) noexcept;
  void keep_id(std::uint32_t i, std::string_view id) noexcept;
  void on_complete() noexcept;
  void drop(std::uint32_t i, bool reconnect, std::uint64_t delay_ns) noexcept;
  // the run (worker_run.cpp)
  void start_go(std::uint64_t now) noexcept;
  void churn_tick(std::uint64_t now) noexcept;
  void storm_tick(std::uint64_t now) noexcept;
  void read_command() noexcept;
  int wait(int timeout_ms) noexcept;
  int next_timeout(std::uint64_t now) const noexcept;
  void send_sample(msg_kind kind) noexcept;
  void check_connect_phase(std::uint64_t now) noexcept;
  [[nodiscard]] bool reconnects() const noexcept;
  /// Messages connection i should get: one topic's share in mailboxes, all of them otherwise.
  [[nodiscard]] std::uint64_t wanted(std::uint32_t i) const noexcept {
    return _o.sc == scenario::mailboxes ? _o.messages_for(_first + i) : _want_each;
  }

  const options& _o;
  std::vector<lg_conn> _conns;
  std::vector<last_event_id> _last_ids;   ///< per connection when the scenario reconnects, else empty
  spill_pool _spills;                     ///< for frames cut by the end of a read
  std::vector<sse_reader> _streams;       ///< --transport sse: each connection's reader, by index, else empty
  sse_spill_pool _stream_spills;          ///< for events cut by the end of a read
  std::unique_ptr<head_inflater> _inflater;  ///< --compression: compressed messages' heads
  ssl_ctx_st* _tls = nullptr;             ///< wss://: the client context
  std::vector<ssl_st*> _ssl;              ///< wss://: each connection's TLS, by index (null when closed)
  std::deque<std::pair<std::uint64_t, std::uint32_t>> _to_open;   ///< (due ns, index), due roughly ascending
  std::vector<std::uint32_t> _churners;
  std::vector<std::uint8_t> _rbuf;
  std::unique_ptr<histogram> _interval = std::make_unique<histogram>();
  std::unique_ptr<histogram> _connect = std::make_unique<histogram>();
  std::unique_ptr<histogram> _empty = std::make_unique<histogram>();
  std::unique_ptr<delivery_memo> _memo;   ///< serves the topic all connections share (none in mailboxes)
  std::vector<step_total> _steps;         ///< --publish-steps: per step, unique, duplicates, latency
  counters _c{};
  seq_counters _seq{};       ///< checked connections
  seq_counters _scratch{};   ///< the others (duplicates there are not the server's fault to count)
  rate_limiter _open_limit;
  rate_limiter _churn_limit{0, 0};
  xorshift _rng{};
  std::uint64_t _start_ns = 0;
  std::uint64_t _next_sample_ns = 0;
  std::uint64_t _connect_deadline = 0;
  std::uint64_t _go_ns = 0;
  std::uint64_t _storm_due_ns = 0;   ///< client storm: when to drop everything (0: not pending)
  std::uint64_t _recv_ns = 0;        ///< timestamp of the read being parsed
  std::uint64_t _pending_checked = 0;   ///< checked connections still missing messages
  std::uint64_t _want_each = 0;         ///< messages each connection gets (all but mailboxes)
  std::uint32_t _index;
  std::uint32_t _first;
  std::uint32_t _in_progress = 0;   ///< connecting or upgrading
  std::uint32_t _settled = 0;       ///< initial attempts that ended (ready or failed)
  std::uint32_t _interval_no = 0;
  std::uint32_t _storm_waiting = 0;
  std::size_t _churn_next = 0;
  int _ep = -1;
  int _ctrl = -1;
  int _report = -1;
  commands _cmd;  ///< what the parent asked for so far
  bool _initial = true;      ///< still in the first connect phase
  bool _go = false;
};

}  // namespace wspush::loadgen
