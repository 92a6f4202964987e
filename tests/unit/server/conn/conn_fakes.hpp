#pragma once
// Fakes for testing the connection layer without sockets or a running loop: a loop whose time
// and flush list the test drives, a transport that keeps what is written per socket (and can
// play a full socket or an asynchronous send), an application that records what it sees, and
// an upgrade runner that does the worker's part inline.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/ws_frame.hpp"
#include "server/conn/app.hpp"
#include "server/conn/connections.hpp"
#include "server/conn/upgrade_runner.hpp"
#include "server/net/transport.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server::test {

class fake_loop final : public loop_ops {
 public:
  std::uint32_t now() const noexcept override { return _now; }
  std::uint32_t ticks_for(double seconds) const noexcept override {
    double t = seconds * 1000.0 / loop_tick_ms;
    return t < 1 ? 1 : std::uint32_t(t + 0.999);
  }
  std::uint64_t turn() const noexcept override { return _turn; }
  bool track(std::uint32_t) noexcept override { return true; }
  void arm(std::uint32_t slot, std::uint32_t ticks) noexcept override { deadlines[slot] = _now + std::max(ticks, 1u); }
  void cancel(std::uint32_t slot) noexcept override { deadlines.erase(slot); }
  void list(std::uint32_t slot) noexcept override {
    if (std::find(listed.begin(), listed.end(), slot) == listed.end()) listed.push_back(slot);
  }
  void pause_accepting(std::uint32_t) noexcept override { ++pauses; }
  void yield_inbox() noexcept override { ++yields; }
  io_backend& io() noexcept override { std::abort(); }  // the fakes never reach a backend

  /// The end of a loop iteration: every listed slot gets its flush, then the turn advances.
  void end_turn(loop_handler& h) {
    std::vector<std::uint32_t> now_listed;
    now_listed.swap(listed);
    for (std::uint32_t s : now_listed) h.on_flush(s);
    ++_turn;
  }
  /// Time passes: deadlines that come are fired, in slot order per tick.
  void advance(std::uint32_t ticks, loop_handler& h) {
    for (std::uint32_t k = 0; k < ticks; ++k) {
      ++_now;
      std::vector<std::uint32_t> due;
      for (auto [slot, at] : deadlines)
        if (at <= _now) due.push_back(slot);
      for (std::uint32_t s : due) {
        deadlines.erase(s);
        h.on_timer(s);
      }
    }
  }

  std::map<std::uint32_t, std::uint32_t> deadlines;
  std::vector<std::uint32_t> listed;
  int pauses = 0, yields = 0;

 private:
  std::uint32_t _now = 1;
  std::uint64_t _turn = 1;
};

class fake_transport final : public transport {
 public:
  enum class mode { take_all, take_room, async };
  struct socket {
    conn_token token = 0;
    std::string wire;             // everything written, in order
    std::size_t room = SIZE_MAX;  // take_room: bytes the kernel still takes
    mode how = mode::take_all;
    std::size_t in_flight = 0;    // async: bytes offered by the pending send
    std::string pending;          // async: those bytes
    bool wants_writable = false, shut = false, closed = false, aborted = false, reading = true;
  };

  const char* name() const noexcept override { return "fake"; }
  bool open(int fd, conn_token t) noexcept override {
    sockets[fd] = socket{};
    sockets[fd].token = t;
    sockets[fd].how = next_mode;
    sockets[fd].room = next_room;
    return true;
  }
  bool on_received(conn_token t, std::span<std::uint8_t> bytes, plaintext_sink& up) noexcept override {
    up.on_plaintext(t, bytes);
    return true;
  }
  void pause_reading(int fd, conn_token) noexcept override { sockets[fd].reading = false; }
  void resume_reading(int fd, conn_token) noexcept override { sockets[fd].reading = true; }
  send_result send(int fd, conn_token, const iovec* iov, int n) noexcept override {
    socket& s = sockets[fd];
    ++sends;
    std::string all;
    for (int k = 0; k < n; ++k) all.append(static_cast<const char*>(iov[k].iov_base), iov[k].iov_len);
    if (s.how == mode::async) {
      s.pending = all;
      s.in_flight = all.size();
      return {send_outcome::pending, 0, 0};
    }
    std::size_t take = s.how == mode::take_all ? all.size() : std::min(all.size(), s.room);
    if (s.how == mode::take_room) s.room -= take;
    s.wire += all.substr(0, take);
    return {send_outcome::completed, 0, take};
  }
  transport_event on_sent(conn_token, int res) noexcept override {
    if (res < 0) return {transport_event::failed, 0, res};
    return {transport_event::sent, std::size_t(res)};
  }
  void wait_writable(int fd, conn_token) noexcept override { sockets[fd].wants_writable = true; }
  void shutdown_write(int fd, conn_token) noexcept override { sockets[fd].shut = true; }
  void close(int fd, conn_token, bool abort) noexcept override {
    sockets[fd].closed = true;
    sockets[fd].aborted = abort;
  }

  /// Completes the async send of `fd`, `take` of its bytes (all by default).
  void complete(int fd, loop_handler& h, std::size_t take = SIZE_MAX) {
    socket& s = sockets[fd];
    take = std::min(take, s.in_flight);
    s.wire += s.pending.substr(0, take);
    s.in_flight = 0;
    h.on_send_done(s.token, int(take));
  }

  std::map<int, socket> sockets;
  mode next_mode = mode::take_all;
  std::size_t next_room = SIZE_MAX;
  int sends = 0;
};

/// What an application saw.
class recording_app final : public application {
 public:
  void bind(conn_ops& ops) noexcept override { this->ops = &ops; }
  bool on_open(conn_id c, const open_info&) noexcept override {
    opened.insert(c);
    return true;
  }
  void on_message(conn_id c, message& m) noexcept override {
    messages.emplace_back(c, std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    if (echo) ops->send(c, frame_message(ops->buffers(), m));
    if (hold_all || hold_on == messages.back().second) ops->hold(c);
  }
  void on_close(conn_id c) noexcept override { closed.push_back(c); }
  std::uint32_t expiry(conn_id) const noexcept override { return exp; }
  void on_expired(conn_id c) noexcept override {
    ++expired;
    ops->close(c, proto::close_code::policy_violation);
  }

  conn_ops* ops = nullptr;
  bool echo = false;
  std::string hold_on;  // a message with this payload makes the application hold the connection
  bool hold_all = false;  // every message does (pubs waiting for a bus, one at a time)
  std::uint32_t exp = 0;
  int expired = 0;
  std::set<conn_id> opened;
  std::vector<std::pair<conn_id, std::string>> messages;
  std::vector<conn_id> closed;
};

/// The worker's part, done at once (no token check).
class inline_runner final : public upgrade_runner {
 public:
  explicit inline_runner(inbox_consumer<upgrade_job_ref>& done) : _done(done) {}
  bool run(upgrade_job_ref&& job) noexcept override {
    if (busy) {
      held.push_back(std::move(job));
      return false;
    }
    finish_upgrade(nullptr, job);
    _done.on_item(std::move(job));
    return true;
  }
  bool retry() noexcept override {
    if (busy) return false;
    for (auto& j : held) run(std::move(j));
    held.clear();
    return true;
  }
  bool busy = false;
  std::vector<upgrade_job_ref> held;

 private:
  inbox_consumer<upgrade_job_ref>& _done;
};

/// A client's masked frame.
inline std::string client_frame(proto::opcode op, std::string_view payload, bool fin = true) {
  std::uint8_t hdr[proto::max_frame_header_size];
  std::array<std::uint8_t, 4> mask{0x11, 0x22, 0x33, 0x44};
  std::size_t hn = proto::encode_masked_frame_header(
      std::span<std::uint8_t, proto::max_frame_header_size>(hdr, proto::max_frame_header_size), op, fin,
      payload.size(), mask);
  std::string out(reinterpret_cast<const char*>(hdr), hn);
  std::string body(payload);
  proto::apply_mask({reinterpret_cast<std::uint8_t*>(body.data()), body.size()}, mask, 0);
  return out + body;
}

struct server_frame {
  int opcode;
  std::string payload;
};

/// The frames a server wrote after its HTTP response (which `wire` must start with).
inline std::vector<server_frame> frames_after_101(const std::string& wire) {
  std::vector<server_frame> out;
  std::size_t at = wire.find("\r\n\r\n");
  if (at == std::string::npos) return out;
  at += 4;
  while (at < wire.size()) {
    auto h = proto::parse_frame_header({reinterpret_cast<const std::uint8_t*>(wire.data()) + at, wire.size() - at});
    if (h.status != proto::parse_status::done || wire.size() - at < h.header.size + h.header.payload_len) break;
    out.push_back({h.header.raw_opcode, wire.substr(at + h.header.size, h.header.payload_len)});
    at += h.header.size + h.header.payload_len;
  }
  return out;
}

inline const std::string upgrade_request =
    "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// A connection layer over the fakes.
struct harness {
  conn_options opts;
  pool::buffer_pool buffers;
  fake_loop loop;
  fake_transport wire;
  recording_app app;
  std::atomic<std::uint32_t> open_count{0};
  connections conns;
  inline_runner runner{conns};
  int next_fd = 100;

  explicit harness(conn_options o = {}) : opts(o), conns(opts, loop, wire, app, buffers, open_count) {
    conns.set_upgrade_runner(runner);
  }

  /// Accepts a socket; returns its fd (the fake's key).
  int accept() {
    int fd = next_fd++;
    conns.on_accept(fd);
    return fd;
  }
  void feed(int fd, std::string bytes, std::size_t piece = SIZE_MAX) {
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      std::string part = bytes.substr(at, piece);
      conns.on_data(wire.sockets[fd].token, {reinterpret_cast<std::uint8_t*>(part.data()), part.size()});
    }
  }
  void turn() { loop.end_turn(conns); }
  /// Accepted, upgraded and written out: an open connection.
  int open() {
    int fd = accept();
    feed(fd, upgrade_request);
    turn();
    return fd;
  }
  std::uint32_t slot(int fd) { return token_index(wire.sockets[fd].token); }
  std::vector<server_frame> frames(int fd) { return frames_after_101(wire.sockets[fd].wire); }
};

}  // namespace wspush::server::test
