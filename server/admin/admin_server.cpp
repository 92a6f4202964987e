#include "server/admin/admin_server.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include "server/admin/metrics.hpp"
#include "server/base/heap.hpp"
#include "server/base/log.hpp"
#include "server/net/socket_ops.hpp"
#include "server/reactor/io_backend.hpp"

// One thread, one epoll backend, a fixed table of connection slots. Deadlines are kept per
// slot and scanned after every poll: there are at most a few hundred slots, and the scan is
// what lets poll sleep exactly until the nearest deadline.
//
// Publishes to a bus outside the process never make this thread wait: the sink hands them to
// the bus and answers `pending`; the bus thread puts each settled ticket on the settled queue
// and wakes the loop, which takes the outcomes (admin_api::settle) and answers the request.
// A connection goes on with its pipelined requests meanwhile, so that a publisher's pipeline
// reaches Redis as one batch rather than one round trip after another: each waiting request
// takes a wait slot (at most k_max_waits; past them its input is left in the kernel), and the
// answers ready at once behind it are held in that slot. Answers go out in request order: a
// settled wait is written, with what is held behind it, once every wait before it has been.
// The oldest wait's deadline is one more per-slot deadline (later ones end no sooner).

namespace wspush::server {
namespace {

constexpr std::size_t k_out_pause_bytes = 256 * 1024;  // stop reading pipelined requests past it
constexpr std::size_t k_padding = 64;                  // simdjson reads this far past a body
constexpr std::uint64_t k_index_bits = 20;             // token = gen << 20 | slot index
constexpr std::uint32_t k_no_slot = ~std::uint32_t{0};
// A waiting request's tag (admin_api) = its wait's sequence number << 48 | the token (48 bits).
constexpr std::uint64_t k_seq_shift = 48;
constexpr std::uint64_t k_token_mask = (std::uint64_t{1} << k_seq_shift) - 1;
// Requests of one connection waiting for the bus at once (a power of two dividing 2^16: the
// ring position is the sequence number's low bits). Past it the connection is not read.
constexpr std::uint16_t k_max_waits = 64;

std::int64_t now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

std::int64_t to_ms(double seconds) noexcept { return static_cast<std::int64_t>(seconds * 1000.0); }

enum class phase : std::uint8_t { free, active, lingering };

/// A request waiting for the bus, and the answers of the requests after it that were ready
/// at once: they go out after its own.
struct wait_slot {
  std::uint64_t tag = 0;
  std::int64_t until = 0;  // its answer goes out by then, whatever the bus says
  bool settled = false;    // every outcome is in: admin_api::answer has it all
  std::string after;
};

/// An admin connection. It owns its buffers (see the header): admin connections are few.
struct admin_conn {
  int fd = -1;
  std::uint32_t gen = 0;
  phase ph = phase::free;
  bool close_when_flushed = false;  // an answer that ends the connection is queued
  bool waiting_writable = false;
  bool continue_sent = false;       // `100 Continue` already sent for the current request
  bool screened = false;            // the current request's head passed admin_api::screen
  bool keyed = false;               // a request of this connection presented the API key
  std::int64_t request_start = 0;   // first byte of the request under way
  std::int64_t last_active = 0;     // last bytes in or out: the quietest unkeyed one is evicted first
  std::int64_t deadline = 0;
  bool read_stopped = false;        // requests wait and its input reached a bound: the kernel keeps the rest
  bool peer_done = false;           // the client ended its side while requests waited
  bool touched = false;             // a wait of it settled in this wake-up
  std::uint16_t waits = 0;          // requests waiting for the bus: slots[first ..] (mod k_max_waits)
  std::uint16_t first = 0;          // sequence number of the oldest
  std::size_t held = 0;             // bytes held in `after` of every wait but the newest
  std::string in, out;
  std::size_t out_sent = 0;
  proto::http_request_parser parser;
  std::vector<wait_slot> slots;     // k_max_waits of them from the first wait on; none while closed

  wait_slot& slot(std::uint16_t seq) noexcept { return slots[seq % k_max_waits]; }
  wait_slot& oldest() noexcept { return slot(first); }
  const wait_slot& oldest() const noexcept { return slots[first % k_max_waits]; }
  /// Where the next answer goes: behind the newest wait, or straight out.
  std::string& answers() noexcept { return waits ? slot(static_cast<std::uint16_t>(first + waits - 1)).after : out; }
  /// Output not yet taken by the client, held behind waits included.
  std::size_t unsent() noexcept { return out.size() - out_sent + held + (waits ? answers().size() : 0); }
};

/// Tickets the sink settled on other threads, for the admin thread. Shared with the sink's
/// notify, which publishes still held by the bus may keep after the loop is gone: `io` is
/// cleared then, and later tickets are dropped.
struct settled_queue {
  std::mutex m;
  std::vector<std::uint64_t> tickets;
  io_backend* io = nullptr;

  void push(std::span<const std::uint64_t> settled) noexcept {
    std::lock_guard lock(m);
    if (!io || settled.empty()) return;
    const bool was_empty = tickets.empty();
    try {
      tickets.insert(tickets.end(), settled.begin(), settled.end());
    } catch (...) {
      return;  // their requests are answered at their deadlines instead
    }
    if (was_empty) io->wake();  // else a wake-up is on its way: the loop takes them all
  }
};

}  // namespace

class admin_server::loop final : public io_handler {
 public:
  admin_api& api() noexcept { return _api; }
  loop(const admin_options& o, publish_sink& sink, metrics_registry* metrics, const std::atomic<bool>& draining,
       std::unique_ptr<io_backend> io, int listen_fd, std::shared_ptr<settled_queue> settled)
      : _opt(o),
        _sink(sink),
        _api(admin_api_options{o.api_key, o.max_waiting_publishes, o.presence, o.revoker}, sink, metrics, draining),
        _io(std::move(io)),
        _settled(std::move(settled)),
        _listen_fd(listen_fd),
        _conns(o.max_connections),
        _max_in(std::size_t{o.max_head_bytes} + o.max_body_bytes + 64 * 1024) {
    _touched.reserve(o.max_connections);
    if (metrics) {
      _conn_gauge = &metrics->add_gauge("wspush_admin_connections");
      _evictions = &metrics->add_counter("wspush_admin_connections_evicted_total");
    }
    for (admin_conn& c : _conns)
      c.parser = proto::http_request_parser({o.max_head_bytes, o.max_body_bytes});
    std::lock_guard lock(_settled->m);
    _settled->io = _io.get();
  }

  ~loop() override {
    {
      std::lock_guard lock(_settled->m);
      _settled->io = nullptr;
    }
    for (std::uint32_t i = 0; i < _conns.size(); ++i)
      if (_conns[i].ph != phase::free) close_conn(i);
    ::close(_listen_fd);
  }

  bool listen() noexcept { return _io->add_listener(_listen_fd, 0); }

  void run() noexcept {
    while (!_stop.load(std::memory_order_acquire)) {
      _io->poll(*this, poll_timeout(now_ms()));
      _sink.end_turn();
      expire(now_ms());
      heap_collect();  // the admin API's publishes are this thread's memory (server/base/heap.hpp)
    }
  }

  void request_stop() noexcept {
    _stop.store(true, std::memory_order_release);
    _io->wake();
  }

 private:
  // io_handler
  void on_accept(int, int fd) noexcept override;
  void on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept override;
  void on_read_end(conn_token t, int) noexcept override;
  void on_read_paused(conn_token t) noexcept override {
    if (const std::uint32_t i = lookup(t); i != k_no_slot) _io->start_reading(_conns[i].fd, t);
  }
  void on_send_done(conn_token, int) noexcept override {}  // epoll sends synchronously
  void on_writable(conn_token t) noexcept override;
  void on_wake() noexcept override;  // run() checks _stop

  conn_token token(std::uint32_t i) const noexcept { return (std::uint64_t{_conns[i].gen} << k_index_bits) | i; }
  std::uint32_t lookup(conn_token t) const noexcept {
    const auto i = static_cast<std::uint32_t>(t & ((std::uint64_t{1} << k_index_bits) - 1));
    if (i >= _conns.size() || _conns[i].ph == phase::free || token(i) != t) return k_no_slot;
    return i;
  }

  void refuse(int fd) noexcept;
  std::uint32_t take_slot() noexcept;
  void close_conn(std::uint32_t i) noexcept;
  void mark_keyed(admin_conn& c) noexcept;
  void process(std::uint32_t i, std::int64_t now) noexcept;
  /// The tag admin_api keeps a waiting request of slot i by: its wait's sequence number and the token.
  std::uint64_t wait_tag(std::uint32_t i) const noexcept {
    const admin_conn& c = _conns[i];
    return std::uint64_t{static_cast<std::uint16_t>(c.first + c.waits)} << k_seq_shift | token(i);
  }
  void open_wait(admin_conn& c, std::uint64_t tag, std::int64_t until) noexcept;
  bool write_answered(admin_conn& c, std::int64_t now) noexcept;
  void answered(std::uint32_t i, std::int64_t now) noexcept;
  bool pace_reading(std::uint32_t i) noexcept;
  bool holds_input(const admin_conn& c) const noexcept {
    return c.waits >= k_max_waits || (c.waits != 0 && c.in.size() >= _max_in);
  }
  bool flush(std::uint32_t i, std::int64_t now) noexcept;
  void start_linger(std::uint32_t i, std::int64_t now) noexcept;
  void rearm(admin_conn& c, std::int64_t now) noexcept;
  void expire(std::int64_t now) noexcept;
  int poll_timeout(std::int64_t now) const noexcept;

  const admin_options& _opt;
  publish_sink& _sink;
  admin_api _api;
  std::unique_ptr<io_backend> _io;
  std::shared_ptr<settled_queue> _settled;
  std::vector<std::uint64_t> _taking;  // settled tickets being handled (the queue's, swapped out)
  std::vector<std::uint32_t> _touched;  // connections with a wait settled by them
  int _listen_fd;
  std::vector<admin_conn> _conns;
  std::size_t _max_in;  // input held for one connection: one whole request and some pipelined bytes
  std::uint32_t _open = 0;
  std::uint32_t _unkeyed = 0;  // open connections that have not presented the key
  gauge* _conn_gauge = nullptr;
  counter* _evictions = nullptr;
  std::atomic<bool> _stop{false};
};

void admin_server::loop::refuse(int fd) noexcept {
  std::string r;
  append_http_response(r, 503, "application/json", "{\"error\":\"too_many_connections\"}", true,
                       "Retry-After: 1\r\n");
  [[maybe_unused]] const auto n = ::send(fd, r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::close(fd);
}

void admin_server::loop::on_accept(int, int fd) noexcept {
  if (fd < 0) {
    log_ratelimited(log_level::warn, "admin: accept failed: %s", std::strerror(-fd));
    return;
  }
  const std::uint32_t i = take_slot();
  if (i == k_no_slot) return refuse(fd);
  admin_conn& c = _conns[i];
  c.fd = fd;
  c.gen = (c.gen + 1) & 0xFFFFFFFu;  // 28 bits: token stays within the backend's 56
  if (c.gen == 0) c.gen = 1;
  c.ph = phase::active;
  c.close_when_flushed = c.waiting_writable = c.continue_sent = c.screened = c.keyed = false;
  c.read_stopped = c.peer_done = c.touched = false;
  c.waits = 0;
  c.held = 0;
  c.in.clear();
  c.out.clear();
  c.out_sent = 0;
  c.parser.reset();
  c.last_active = now_ms();
  c.deadline = c.last_active + to_ms(_opt.unkeyed_timeout);
  ++_open;
  ++_unkeyed;
  if (_conn_gauge) _conn_gauge->set(_open);
  if (!_io->start_reading(fd, token(i))) return close_conn(i);
}

/// A slot for a new connection: a free one while unkeyed connections hold less than their
/// share, else the slot of the unkeyed connection quiet the longest (it had its chance: a
/// client that means to publish sends its request at once). k_no_slot only when every slot is
/// held by a keyed connection or one whose publish waits for the bus.
std::uint32_t admin_server::loop::take_slot() noexcept {
  std::uint32_t free = k_no_slot, quietest = k_no_slot;
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    const admin_conn& c = _conns[i];
    if (c.ph == phase::free) {
      if (free == k_no_slot) free = i;
    } else if (!c.keyed && c.waits == 0 &&  // one whose publish waits for the bus is owed its answer
               (quietest == k_no_slot || c.last_active < _conns[quietest].last_active)) {
      quietest = i;
    }
  }
  if (free != k_no_slot && _unkeyed < _opt.unkeyed_share) return free;
  if (quietest == k_no_slot) return free;  // unkeyed: none left to give way; keyed: all slots
  close_conn(quietest);
  if (_evictions) _evictions->inc();
  log_ratelimited(log_level::info, "admin: %u connections without the API key; closed the quietest for a new one",
                  unsigned(_unkeyed + 1));
  return quietest;
}

void admin_server::loop::mark_keyed(admin_conn& c) noexcept {
  if (c.keyed) return;
  c.keyed = true;
  --_unkeyed;
}

void admin_server::loop::close_conn(std::uint32_t i) noexcept {
  admin_conn& c = _conns[i];
  if (c.ph == phase::free) return;
  for (; c.waits != 0; --c.waits, ++c.first) _api.forget(c.oldest().tag);  // nobody is left to answer
  _io->close(c.fd, token(i));
  c.fd = -1;
  c.ph = phase::free;
  if (!c.keyed) --_unkeyed;
  c.keyed = false;
  // Give back what a large request or response grew: a closed slot keeps nothing.
  std::string().swap(c.in);
  std::string().swap(c.out);
  std::vector<wait_slot>().swap(c.slots);
  c.held = 0;
  --_open;
  if (_conn_gauge) _conn_gauge->set(_open);
}

void admin_server::loop::on_data(conn_token t, std::span<std::uint8_t> bytes) noexcept {
  const std::uint32_t i = lookup(t);
  if (i == k_no_slot) return;
  admin_conn& c = _conns[i];
  if (c.ph == phase::lingering || c.close_when_flushed) return;  // the rest of a refused request
  if (c.in.size() + bytes.size() > _max_in && c.waits == 0) return close_conn(i);  // pipelining into a stuck output
  const std::int64_t now = now_ms();
  c.last_active = now;
  if (c.in.empty()) c.request_start = now;
  // Room for simdjson's padding after whatever body this completes: views stay put below.
  c.in.reserve(c.in.size() + bytes.size() + k_padding);
  c.in.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  process(i, now);
}

void admin_server::loop::on_read_end(conn_token t, int res) noexcept {
  const std::uint32_t i = lookup(t);
  if (i == k_no_slot) return;
  if (_conns[i].waits != 0 && res == 0) {  // only done sending: the answers it waits for, then the close
    _conns[i].peer_done = true;
    if (!_conns[i].read_stopped) _io->stop_reading(_conns[i].fd, t);  // the EOF is level-triggered
    _conns[i].read_stopped = true;
    return;
  }
  // The peer is done sending. What is queued gets one more try; then the slot is closed (a
  // level-triggered EOF would otherwise be reported on every poll while output waits).
  if (_conns[i].ph == phase::active && !flush(i, now_ms())) return;
  close_conn(i);
}

void admin_server::loop::on_writable(conn_token t) noexcept {
  const std::uint32_t i = lookup(t);
  if (i == k_no_slot) return;
  _conns[i].waiting_writable = false;
  const std::int64_t now = now_ms();
  if (_conns[i].ph == phase::active && flush(i, now)) process(i, now);  // requests held back by output
}

/// Handles every complete request in the input, in order (pipelining), up to one that ends
/// the connection, until too much output waits or as many requests wait for the bus as may;
/// then sends what it can. An answer behind a waiting request is held until that one's is out.
void admin_server::loop::process(std::uint32_t i, std::int64_t now) noexcept {
  admin_conn& c = _conns[i];
  while (!c.close_when_flushed && c.waits < k_max_waits && !c.in.empty() && c.unsent() < k_out_pause_bytes) {
    std::string& out = c.answers();
    proto::http_request req;
    const proto::http_request_result r = c.parser.parse(c.in, req);
    if (r.status != proto::parse_status::error && c.parser.head_complete() && !c.screened) {
      // The head is in: answer now what will be refused, before reading (let alone keeping) a body.
      log(log_level::debug, "admin: %.*s %.*s", int(req.method.size()), req.method.data(), int(req.path.size()),
          req.path.data());
      const admin_api::head_verdict v = _api.screen(req, out);
      if (v == admin_api::head_verdict::answered_close) {
        c.close_when_flushed = true;
        break;
      }
      if (v == admin_api::head_verdict::answered) {  // no body: this request is done
        c.in.erase(0, r.consumed);
        c.parser.reset();
        c.continue_sent = false;
        c.request_start = now;
        continue;
      }
      if (v == admin_api::head_verdict::read_body_keyed) mark_keyed(c);
      c.screened = true;
    }
    if (r.status == proto::parse_status::need_more) {
      if (c.parser.head_complete() && req.expect_continue && !c.continue_sent) {
        out += admin_api::continue_response;
        c.continue_sent = true;
      }
      break;
    }
    if (r.status == proto::parse_status::error) {
      _api.respond_error(r.http_status, r.reason, out);
      c.close_when_flushed = true;
      break;
    }
    const std::size_t body_at = req.body.empty() ? c.in.size() : static_cast<std::size_t>(req.body.data() - c.in.data());
    const std::uint64_t tag = wait_tag(i);
    const admin_api::respond_result a = _api.respond(req, c.in.capacity() - body_at, out, tag);
    if (a == admin_api::respond_result::pending) {
      open_wait(c, tag, now + to_ms(_opt.publish_timeout));
      c.close_when_flushed = !req.keep_alive;  // nothing after it is handled; the close follows its answer
    } else {
      c.close_when_flushed = a == admin_api::respond_result::close;
    }
    c.in.erase(0, r.consumed);
    c.parser.reset();
    c.continue_sent = c.screened = false;
    c.request_start = now;
  }
  if (flush(i, now) && pace_reading(i)) rearm(c, now);
}

/// While as many requests wait as may, or a full input waits behind them, the connection is
/// not read (the kernel keeps the rest); it is read again once answers went out. False when
/// the connection was closed.
bool admin_server::loop::pace_reading(std::uint32_t i) noexcept {
  admin_conn& c = _conns[i];
  if (c.ph != phase::active || c.peer_done || c.read_stopped == holds_input(c)) return true;
  c.read_stopped = !c.read_stopped;
  if (c.read_stopped) {
    _io->stop_reading(c.fd, token(i));
    return true;
  }
  if (!_io->start_reading(c.fd, token(i))) return close_conn(i), false;
  if (c.waiting_writable) _io->wait_writable(c.fd, token(i));  // stop_reading dropped that interest too
  return true;
}

/// A request waits for the bus from now until `until`: its wait slot, the newest.
void admin_server::loop::open_wait(admin_conn& c, std::uint64_t tag, std::int64_t until) noexcept {
  if (c.slots.empty()) c.slots.resize(k_max_waits);  // once per connection: kept until it closes
  if (c.waits != 0) c.held += c.answers().size();     // the newest's held answers are complete
  wait_slot& w = c.slot(static_cast<std::uint16_t>(c.first + c.waits));
  w.tag = tag;
  w.until = until;
  w.settled = false;
  ++c.waits;
}

/// Moves to the output, in order, the answers now known: the oldest waits that settled or
/// whose time is up, each with the answers held behind it. False when none was.
bool admin_server::loop::write_answered(admin_conn& c, std::int64_t now) noexcept {
  bool any = false;
  while (c.waits != 0 && (c.oldest().settled || c.oldest().until <= now)) {
    wait_slot& w = c.oldest();
    if (_api.answer(w.tag, c.out)) c.close_when_flushed = true;  // timeout if it is not settled
    c.out += w.after;
    if (c.waits > 1) c.held -= w.after.size();
    w.after.clear();
    w.tag = 0;
    ++c.first;
    --c.waits;
    any = true;
  }
  return any;
}

/// Waits of slot i settled, or the oldest one's time is up: what is answered goes out, and the
/// requests held back by the waits are handled on.
void admin_server::loop::answered(std::uint32_t i, std::int64_t now) noexcept {
  admin_conn& c = _conns[i];
  if (!write_answered(c, now)) return;  // the oldest still waits: nothing can go out before it
  c.last_active = c.request_start = now;
  process(i, now);
  // The client is done sending: once nothing waits, what it asked for got its one try, as on_read_end gives.
  if (c.peer_done && c.ph != phase::free && c.waits == 0 && flush(i, now)) close_conn(i);
}

/// Takes every settled ticket; each connection with an answer to give is served once, so that
/// the answers that settled together leave in one write.
void admin_server::loop::on_wake() noexcept {
  {
    std::lock_guard lock(_settled->m);
    _taking.swap(_settled->tickets);
  }
  const std::int64_t now = now_ms();
  for (const std::uint64_t ticket : _taking) {
    const std::uint64_t tag = _api.settle(ticket);
    if (tag == 0) continue;
    const std::uint32_t i = lookup(tag & k_token_mask);
    if (i == k_no_slot || _conns[i].waits == 0) continue;
    admin_conn& c = _conns[i];
    wait_slot& w = c.slot(static_cast<std::uint16_t>(tag >> k_seq_shift));
    if (w.tag != tag) continue;
    w.settled = true;
    if (!c.touched) _touched.push_back(i);
    c.touched = true;
  }
  _taking.clear();
  for (const std::uint32_t i : _touched) {
    _conns[i].touched = false;
    if (_conns[i].ph != phase::free) answered(i, now);
  }
  _touched.clear();
}

/// Sends queued output. Returns false when the connection was closed.
bool admin_server::loop::flush(std::uint32_t i, std::int64_t now) noexcept {
  admin_conn& c = _conns[i];
  while (c.out_sent < c.out.size()) {
    const iovec v{c.out.data() + c.out_sent, c.out.size() - c.out_sent};
    const send_result r = _io->send(c.fd, token(i), &v, 1);
    if (r.outcome != send_outcome::completed) return close_conn(i), false;  // epoll: never pending
    c.out_sent += r.bytes;
    if (c.out_sent < c.out.size()) {
      if (!c.waiting_writable) _io->wait_writable(c.fd, token(i));
      c.waiting_writable = true;
      c.deadline = now + to_ms(_opt.request_timeout);  // the client has this long to read on
      return true;
    }
  }
  c.out.clear();
  c.out_sent = 0;
  if (c.close_when_flushed && c.ph == phase::active && c.waits == 0) start_linger(i, now);  // the last answer is out
  return true;
}

/// The answer is out and the connection ends: shut our side, then read and drop what the
/// client still sends (a body we refused) until it closes or the linger time is up. Closing
/// at once could reset the connection before the client read our answer.
void admin_server::loop::start_linger(std::uint32_t i, std::int64_t now) noexcept {
  admin_conn& c = _conns[i];
  ::shutdown(c.fd, SHUT_WR);
  c.ph = phase::lingering;
  std::string().swap(c.in);
  c.deadline = now + to_ms(_opt.linger_timeout);
}

void admin_server::loop::rearm(admin_conn& c, std::int64_t now) noexcept {
  if (c.ph != phase::active || c.out_sent < c.out.size()) return;  // linger / write deadlines stand
  c.last_active = now;
  if (!c.keyed) {  // short: a head within it, and no longer an idle wait
    c.deadline = (c.in.empty() ? now : c.request_start) + to_ms(_opt.unkeyed_timeout);
    return;
  }
  c.deadline = c.in.empty() ? now + to_ms(_opt.idle_timeout) : c.request_start + to_ms(_opt.request_timeout);
}

void admin_server::loop::expire(std::int64_t now) noexcept {
  for (std::uint32_t i = 0; i < _conns.size(); ++i) {
    admin_conn& c = _conns[i];
    if (c.ph == phase::free) continue;
    if (c.waits != 0) {  // its other deadlines stand still while the bus has this long
      if (c.oldest().until <= now) answered(i, now);
      continue;
    }
    if (c.deadline > now) continue;
    if (c.ph == phase::lingering || c.out_sent < c.out.size() || c.in.empty() || c.close_when_flushed) {
      close_conn(i);  // linger over, output not taken, or idle
      continue;
    }
    // A request started and not finished in time (one byte a second, a body that stalls).
    _api.respond_error(408, "request not complete in time", c.out);
    c.close_when_flushed = true;
    if (flush(i, now) && c.ph == phase::active) c.deadline = now + to_ms(_opt.request_timeout);
  }
}

int admin_server::loop::poll_timeout(std::int64_t now) const noexcept {
  std::int64_t wait = 1000;  // also bounds how long a missed wake-up could delay stop()
  for (const admin_conn& c : _conns) {
    if (c.ph == phase::free) continue;
    const std::int64_t at = c.waits != 0 ? c.oldest().until : c.deadline;
    if (at - now < wait) wait = at - now;
  }
  return wait < 0 ? 0 : static_cast<int>(wait);
}

// ---- admin_server ---------------------------------------------------------------------------

admin_server::admin_server(admin_options o, publish_sink& sink, metrics_registry* metrics)
    : _opt(std::move(o)), _sink(sink), _metrics(metrics) {}

admin_server::~admin_server() { stop(); }

void admin_server::start() {
  if (_loop) throw std::logic_error("admin_server started twice");
  if (_opt.max_connections == 0 || _opt.max_connections >= (1u << k_index_bits))
    throw std::invalid_argument("admin max_connections out of range");
  _opt.unkeyed_share = std::clamp<std::uint32_t>(_opt.unkeyed_share, 1, _opt.max_connections);
  std::string why;
  std::unique_ptr<io_backend> io = make_epoll_backend({}, why);
  if (!io) throw std::runtime_error("admin listener: " + why);
  const int fd = make_listener(parse_endpoint(_opt.listen), 128);
  _local = local_name(fd);
  _port = static_cast<std::uint16_t>(std::stoul(_local.substr(_local.rfind(':') + 1)));
  if (_metrics) _metrics->add_gauge_fn("wspush_draining", [this] { return draining() ? 1.0 : 0.0; });
  auto settled = std::make_shared<settled_queue>();
  _loop = std::make_unique<loop>(_opt, _sink, _metrics, _draining, std::move(io), fd, settled);
  if (!_loop->listen()) {
    _loop.reset();
    throw std::runtime_error("admin listener: cannot watch the listening socket");
  }
  _sink.set_notify([settled](std::span<const std::uint64_t> tickets) { settled->push(tickets); });
  _thread = std::thread([l = _loop.get()] { l->run(); });
}

void admin_server::set_api_key(std::string key) {
  if (_loop) _loop->api().set_api_key(std::move(key));
  else _opt.api_key = std::move(key);
}

void admin_server::stop() noexcept {
  if (!_loop) return;
  _loop->request_stop();
  if (_thread.joinable()) _thread.join();
  _loop.reset();
  _sink.set_notify({});
}

}  // namespace wspush::server
