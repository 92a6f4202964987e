#pragma once
/// \file bench_worker.hpp
/// One worker process of ws_bench_client: opens its share of the connections on one epoll,
/// reports to the parent, then holds them or takes part in a fan-out run (the first worker's
/// first connection is the designated sender) and reports again. Talks to the parent over two
/// pipes: one-byte commands in ('g' go, 'r' report now, 'q' or EOF quit), child_report out.
///
/// Every loop in here waits with a deadline; the parent bounds the whole run on top of that.

#include "bench_histogram.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_wire.hpp"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

namespace wspush::bench {

inline std::uint64_t now_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline std::uint64_t seconds_to_ns(double s) noexcept { return static_cast<std::uint64_t>(s * 1e9); }

/// Blocking write of all bytes (pipes to the parent); false if the other end is gone.
inline bool write_all(int fd, const void* data, std::size_t len) noexcept {
    const auto* p = static_cast<const std::uint8_t*>(data);
    while (len > 0) {
        const ssize_t n = ::write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return true;
}

/// Blocking read of exactly len bytes; false on EOF or error.
inline bool read_all(int fd, void* data, std::size_t len) noexcept {
    auto* p = static_cast<std::uint8_t*>(data);
    while (len > 0) {
        const ssize_t n = ::read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return true;
}

enum class conn_state : std::uint8_t { unopened, connecting, upgrading, open, closed };

/// Upgrade bookkeeping, allocated only while a connection is between connect() and 101.
struct upgrade_state {
    std::string accept;     ///< the Sec-WebSocket-Accept we expect
    std::string response;   ///< response bytes so far
};

/// One client connection. The frame reader keeps the partial header and the first payload bytes.
struct bench_conn {
    frame_reader reader;
    seq_tracker seq;
    std::unique_ptr<upgrade_state> upgrade;
    std::uint32_t received = 0;   ///< distinct benchmark messages received
    int fd = -1;
    conn_state state = conn_state::unopened;
};

class worker {
public:
    /// Worker `index` opens connections [first, first + count) of the global numbering.
    worker(const bench_options& o, std::uint32_t index, std::uint32_t first, std::uint32_t count,
           int ctrl_fd, int report_fd);
    ~worker();
    worker(const worker&) = delete;
    worker& operator=(const worker&) = delete;

    /// Runs every phase; returns the process exit code.
    int run() noexcept;

private:
    static constexpr std::uint64_t ctrl_tag = ~std::uint64_t{0};

    // connect phase
    void connect_phase() noexcept;
    void open_next() noexcept;
    void fail(std::uint32_t i, conn_error e, int err = 0) noexcept;
    void on_connecting(std::uint32_t i) noexcept;
    void on_upgrading(std::uint32_t i) noexcept;
    bool finish_upgrade(std::uint32_t i, std::size_t head_len) noexcept;
    // every phase
    int wait(int timeout_ms) noexcept;              ///< epoll_wait + dispatch; returns events seen
    void dispatch(std::uint64_t tag, std::uint32_t events) noexcept;
    void on_readable(std::uint32_t i) noexcept;
    void feed(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept;
    void on_message(bench_conn& c, std::span<const std::uint8_t> prefix) noexcept;
    void drop(std::uint32_t i, bool server_close) noexcept;
    void send_control(bench_conn& c, proto::opcode op, std::span<const std::uint8_t> payload) noexcept;
    void read_command() noexcept;
    // run phase
    void run_phase() noexcept;
    bool run_finished(std::uint64_t now) noexcept;
    void pump_sender(std::uint64_t now) noexcept;
    std::size_t fill_out(std::uint64_t now) noexcept;
    void set_want_out(bool want) noexcept;
    void report(report_kind kind) noexcept;

    struct message_sink;   // frame_handler for on_readable

    const bench_options& _o;
    std::vector<bench_conn> _conns;
    std::vector<std::uint8_t> _rbuf;
    std::vector<std::uint8_t> _out;
    std::unique_ptr<latency_histogram> _latency;
    child_report _r{};
    seq_counters _seq{};
    xorshift _rng{};
    std::uint64_t _recv_ns = 0;       ///< timestamp of the read being parsed
    std::uint64_t _last_progress = 0;
    std::uint64_t _expected_per_conn = 0;
    std::uint64_t _total_msgs = 0;
    std::uint64_t _run_start = 0;
    std::size_t _out_off = 0;
    std::uint32_t _first = 0;
    std::uint32_t _next_open = 0;
    std::uint32_t _in_progress = 0;
    std::uint32_t _settled = 0;       ///< connected + failed
    std::uint32_t _pending = 0;       ///< open connections still missing messages
    std::uint32_t _next_seq = 0;
    int _ep = -1;
    int _ctrl = -1;
    int _report = -1;
    char _command = 0;                ///< last command from the parent (0: none yet)
    bool _is_sender = false;
    bool _sender_done = true;
    bool _want_out = false;
};

// ---------------------------------------------------------------------------------------------
// Set-up and phases

inline worker::worker(const bench_options& o, std::uint32_t index, std::uint32_t first, std::uint32_t count,
                      int ctrl_fd, int report_fd)
    : _o(o), _conns(count), _rbuf(64 * 1024), _latency(std::make_unique<latency_histogram>()),
      _first(first), _ctrl(ctrl_fd), _report(report_fd) {
    _r.child = index;
    _r.assigned = count;
    _rng.state = (now_ns() ^ (std::uint64_t{index} << 40) ^ static_cast<std::uint64_t>(getpid())) | 1;
    _is_sender = index == 0;
    _out.reserve(64 * 1024);
}

inline worker::~worker() {
    for (bench_conn& c : _conns) {
        if (c.fd >= 0) ::close(c.fd);
    }
    if (_ep >= 0) ::close(_ep);
}

inline int worker::run() noexcept {
    _ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = ctrl_tag;
    if (_ep < 0 || epoll_ctl(_ep, EPOLL_CTL_ADD, _ctrl, &ev) != 0) return 2;
    connect_phase();
    report(report_kind::connected);
    // Hold (or wait for the go): answer pings, notice closes, until the parent says something.
    while (_command == 0) wait(1000);
    if (_command == 'g' && _o.mode != bench_mode::hold) run_phase();
    for (bench_conn& c : _conns) _r.open_at_end += c.state == conn_state::open ? 1 : 0;
    report(report_kind::final_result);
    // Keep the sockets open until the parent has taken its last server sample.
    while (_command != 'q') {
        _command = 0;
        while (_command == 0) wait(1000);
    }
    return 0;
}

inline void worker::report(report_kind kind) noexcept {
    _r.kind = kind;
    _r.unique = _seq.unique;
    _r.duplicates = _seq.duplicates;
    _r.gaps = _seq.gaps;
    _r.reordered = _seq.reordered;
    _r.stale = _seq.stale;
    if (!write_all(_report, &_r, sizeof(_r))) _exit(3);
    if (kind == report_kind::final_result && !write_all(_report, _latency.get(), sizeof(latency_histogram))) {
        _exit(3);
    }
}

inline void worker::read_command() noexcept {
    char c = 0;
    const ssize_t n = ::read(_ctrl, &c, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    _command = n == 1 ? c : 'q';   // EOF or error: the parent is gone or done
    if (_command == 'q') {
        epoll_ctl(_ep, EPOLL_CTL_DEL, _ctrl, nullptr);   // EOF stays readable; stop polling it
    }
}

inline int worker::wait(int timeout_ms) noexcept {
    epoll_event events[256];
    const int n = epoll_wait(_ep, events, 256, timeout_ms);
    if (n <= 0) return 0;
    for (int k = 0; k < n; ++k) dispatch(events[k].data.u64, events[k].events);
    return n;
}

inline void worker::dispatch(std::uint64_t tag, std::uint32_t events) noexcept {
    if (tag == ctrl_tag) return read_command();
    const auto i = static_cast<std::uint32_t>(tag);
    switch (_conns[i].state) {
        case conn_state::connecting: return on_connecting(i);
        case conn_state::upgrading: return on_upgrading(i);
        case conn_state::open:
            if ((events & EPOLLOUT) && i == 0 && _want_out) pump_sender(now_ns());
            if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(i);
            return;
        default: return;
    }
}

// ---------------------------------------------------------------------------------------------
// Connect phase: open at --rate (split over workers) or with at most --inflight upgrades pending.

inline void worker::connect_phase() noexcept {
    const auto count = static_cast<std::uint32_t>(_conns.size());
    const std::uint64_t start = now_ns();
    const std::uint64_t deadline = start + seconds_to_ns(_o.connect_timeout);
    const double per_worker_rate = _o.connect_rate / _o.procs;
    const std::uint32_t limit = per_worker_rate > 0 ? 65536 : _o.inflight;
    while (_settled < count && _command == 0) {
        const std::uint64_t now = now_ns();
        if (now >= deadline) break;
        std::uint64_t allowed = count;
        if (per_worker_rate > 0) {
            allowed = static_cast<std::uint64_t>(static_cast<double>(now - start) / 1e9 * per_worker_rate) + 1;
        }
        while (_next_open < count && _next_open < allowed && _in_progress < limit) open_next();
        int timeout = static_cast<int>((deadline - now) / 1'000'000 + 1);
        if (per_worker_rate > 0 && _next_open < count) timeout = std::min(timeout, 1 + static_cast<int>(1000 / per_worker_rate));
        wait(std::min(timeout, 1000));
    }
    for (std::uint32_t i = 0; i < count; ++i) {
        const conn_state s = _conns[i].state;
        if (s == conn_state::unopened || s == conn_state::connecting || s == conn_state::upgrading) {
            fail(i, conn_error::deadline);
        }
    }
    _r.connect_done_ns = now_ns();
}

inline void worker::fail(std::uint32_t i, conn_error e, int err) noexcept {
    bench_conn& c = _conns[i];
    if (c.state == conn_state::connecting || c.state == conn_state::upgrading) --_in_progress;
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.upgrade.reset();
    c.state = conn_state::closed;
    ++_r.errors[static_cast<std::size_t>(e)];
    if (e == conn_error::other_errno && _r.first_other_errno == 0) _r.first_other_errno = err;
    ++_settled;
}

inline void worker::open_next() noexcept {
    const std::uint32_t i = _next_open++;
    bench_conn& c = _conns[i];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c.state = conn_state::connecting;
    ++_in_progress;
    if (c.fd < 0) return fail(i, classify_errno(errno), errno);
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!_o.sources.empty()) {
        // Pick the port at connect() time, per 4-tuple, so source ports never run out.
        setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
        sockaddr_in src{};
        src.sin_family = AF_INET;
        src.sin_addr = _o.sources[(_first + i) % _o.sources.size()];
        if (::bind(c.fd, reinterpret_cast<const sockaddr*>(&src), sizeof(src)) != 0) {
            return fail(i, classify_errno(errno), errno);
        }
    }
    const int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&_o.server), sizeof(_o.server));
    if (rc != 0 && errno != EINPROGRESS) return fail(i, classify_errno(errno), errno);
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(_ep, EPOLL_CTL_ADD, c.fd, &ev);
}

inline void worker::on_connecting(std::uint32_t i) noexcept {
    bench_conn& c = _conns[i];
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) return fail(i, classify_errno(err), err);
    const std::string key = make_key(_rng);
    const std::string request = make_upgrade_request(_o.path, _o.host_header, key);
    const ssize_t n = ::send(c.fd, request.data(), request.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(request.size())) {   // a fresh socket takes 200 bytes at once
        return fail(i, n < 0 ? classify_errno(errno) : conn_error::other_errno, n < 0 ? errno : EAGAIN);
    }
    c.upgrade = std::make_unique<upgrade_state>();
    c.upgrade->accept = expected_accept(key);
    c.state = conn_state::upgrading;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(_ep, EPOLL_CTL_MOD, c.fd, &ev);
}

inline void worker::on_upgrading(std::uint32_t i) noexcept {
    bench_conn& c = _conns[i];
    std::string& resp = c.upgrade->response;
    char buf[4096];
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) return fail(i, classify_errno(errno), errno);
    if (n == 0) return fail(i, conn_error::closed_in_upgrade);
    const std::size_t before = resp.size();
    resp.append(buf, static_cast<std::size_t>(n));
    const std::size_t from = before >= 3 ? before - 3 : 0;
    const std::size_t end = resp.find("\r\n\r\n", from);
    if (end == std::string::npos) {
        if (resp.size() > 4096) fail(i, conn_error::response_too_big);
        return;
    }
    finish_upgrade(i, end + 4);
}

/// The response head is complete: check it, then hand any bytes behind it to the frame reader.
inline bool worker::finish_upgrade(std::uint32_t i, std::size_t head_len) noexcept {
    bench_conn& c = _conns[i];
    const std::string resp = std::move(c.upgrade->response);
    const upgrade_check check = check_upgrade_response(std::string_view(resp).substr(0, head_len), c.upgrade->accept);
    if (check != upgrade_check::ok) {
        fail(i, check == upgrade_check::bad_status ? conn_error::bad_status : conn_error::bad_accept);
        return false;
    }
    c.upgrade.reset();
    c.state = conn_state::open;
    --_in_progress;
    ++_settled;
    ++_r.connected;
    if (resp.size() > head_len) {   // frames right behind the 101 in the same read
        _recv_ns = now_ns();
        const auto* rest = reinterpret_cast<const std::uint8_t*>(resp.data()) + head_len;
        feed(i, std::span<const std::uint8_t>(rest, resp.size() - head_len));
    }
    return true;
}

}  // namespace wspush::bench

#include "bench_worker_run.hpp"
