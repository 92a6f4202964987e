#pragma once
/// \file bench_worker_run.hpp
/// The worker's receive path (frames → sequence accounting and latency) and its run phase (the
/// designated sender's burst or fixed-rate schedule, and the end-of-run rules). Included by
/// bench_worker.hpp only.

#include "bench_worker.hpp"

namespace wspush::bench {

/// Routes the frame reader's events of one connection back into the worker.
struct worker::message_sink {
    worker& w;
    bench_conn& c;
    bool closed = false;

    void on_message(std::span<const std::uint8_t> prefix, std::uint8_t /*op*/) noexcept {
        w.on_message(c, prefix);
    }
    void on_ping(std::span<const std::uint8_t> payload) noexcept {
        ++w._r.pings;
        w.send_control(c, proto::opcode::pong, payload);
    }
    void on_close(std::span<const std::uint8_t> payload) noexcept {
        // Answer with the same code (RFC 6455 5.5.1), then we are done with this connection.
        if (!closed) w.send_control(c, proto::opcode::close, payload.first(std::min<std::size_t>(payload.size(), 2)));
        closed = true;
    }
};

inline void worker::on_message(bench_conn& c, std::span<const std::uint8_t> prefix) noexcept {
    const payload_fields f = read_payload(prefix);
    if (!f.ok) {
        ++_r.foreign;
        return;
    }
    ++_r.deliveries;
    const std::uint64_t before = _seq.unique;
    c.seq.on_seq(f.seq, _seq);
    if (_seq.unique == before) return;   // duplicate or stale: counted, no latency sample
    _latency->record(_recv_ns > f.send_ns ? _recv_ns - f.send_ns : 0);
    _r.last_delivery_ns = _recv_ns;
    _last_progress = _recv_ns;
    if (++c.received == _expected_per_conn && _pending > 0) --_pending;
}

inline void worker::on_readable(std::uint32_t i) noexcept {
    bench_conn& c = _conns[i];
    const ssize_t n = ::recv(c.fd, _rbuf.data(), _rbuf.size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        ++_r.disconnects;
        return drop(i, false);
    }
    _recv_ns = now_ns();
    feed(i, std::span<const std::uint8_t>(_rbuf.data(), static_cast<std::size_t>(n)));
}

inline void worker::feed(std::uint32_t i, std::span<const std::uint8_t> bytes) noexcept {
    bench_conn& c = _conns[i];
    message_sink sink{*this, c};
    if (!c.reader.consume(bytes, sink)) {
        ++_r.protocol_errors;
        return drop(i, false);
    }
    if (sink.closed) {
        ++_r.server_closes;
        drop(i, true);
    }
}

/// Closes an upgraded connection; it no longer counts as waiting for messages.
inline void worker::drop(std::uint32_t i, bool /*server_close*/) noexcept {
    bench_conn& c = _conns[i];
    if (c.state != conn_state::open) return;
    ::close(c.fd);
    c.fd = -1;
    c.state = conn_state::closed;
    if (_run_start != 0 && c.received < _expected_per_conn && _pending > 0) --_pending;
    if (i == 0 && _is_sender) _sender_done = true;
}

/// A small masked control frame, sent straight away. A full socket buffer loses it (counted):
/// pongs and close answers are best effort in a benchmark client.
inline void worker::send_control(bench_conn& c, proto::opcode op, std::span<const std::uint8_t> payload) noexcept {
    std::array<std::uint8_t, proto::max_frame_header_size + frame_reader::keep_bytes> frame{};
    const auto mask = _rng.mask();
    const std::size_t h = proto::encode_masked_frame_header(
        std::span<std::uint8_t, proto::max_frame_header_size>(frame.data(), proto::max_frame_header_size), op,
        true, payload.size(), mask);
    std::memcpy(frame.data() + h, payload.data(), payload.size());
    proto::apply_mask(std::span<std::uint8_t>(frame.data() + h, payload.size()), mask, 0);
    const ssize_t n = ::send(c.fd, frame.data(), h + payload.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(h + payload.size())) ++_r.send_errors;
}

// ---------------------------------------------------------------------------------------------
// Run phase

inline void worker::run_phase() noexcept {
    const bool rate_mode = _o.mode == bench_mode::rate;
    _total_msgs = rate_mode ? std::max<std::uint64_t>(1, std::llround(_o.rate * _o.seconds)) : _o.burst;
    _expected_per_conn = _total_msgs;
    _run_start = now_ns();
    _last_progress = _run_start;
    for (const bench_conn& c : _conns) _pending += c.state == conn_state::open ? 1 : 0;
    _r.expected = std::uint64_t{_pending} * _total_msgs;
    _is_sender = _is_sender && _conns[0].state == conn_state::open;
    _sender_done = !_is_sender;
    const std::uint64_t deadline = _run_start + seconds_to_ns(_o.timeout);
    _command = 0;
    while (_command == 0) {
        std::uint64_t now = now_ns();
        if (_is_sender && !_sender_done && !_want_out) pump_sender(now);
        now = now_ns();
        if (run_finished(now)) break;
        if (now >= deadline) {
            _r.timed_out = 1;
            break;
        }
        std::uint64_t wake = std::min<std::uint64_t>(deadline, now + 1'000'000'000ull);
        if (_is_sender && !_sender_done && rate_mode) {
            const auto due = _run_start + static_cast<std::uint64_t>(static_cast<double>(_next_seq) * 1e9 / _o.rate);
            wake = std::min(wake, std::max(due, now));
        } else if (_is_sender && !_sender_done && !_want_out) {
            wake = now;   // burst: keep sending while the socket takes it
        }
        wait(static_cast<int>((wake - now + 999'999) / 1'000'000));
    }
}

/// Done when every open connection has everything, or when nothing has arrived for
/// --drain-timeout after the sender finished (losses: waiting longer would not help).
inline bool worker::run_finished(std::uint64_t now) noexcept {
    if (_is_sender && !_sender_done) return false;
    if (_pending == 0) return true;
    std::uint64_t quiet_from = std::max(_last_progress, _r.last_send_ns);
    double drain = _o.drain_timeout;
    if (_o.mode == bench_mode::rate) {
        // Receivers in other workers do not see the sender; they know its schedule instead.
        quiet_from = std::max(quiet_from, _run_start + seconds_to_ns(_o.seconds));
        drain = std::max(drain, 3.0 / _o.rate);
    }
    return now > quiet_from + seconds_to_ns(drain);
}

/// Encodes the messages that are due into _out (at most ~16 KiB, so each timestamp is taken just
/// before its bytes go out) and returns how many bytes were added.
inline std::size_t worker::fill_out(std::uint64_t now) noexcept {
    std::uint64_t due = _total_msgs;
    if (_o.mode == bench_mode::rate) {
        due = std::min<std::uint64_t>(
            _total_msgs, static_cast<std::uint64_t>(static_cast<double>(now - _run_start) / 1e9 * _o.rate) + 1);
    }
    const std::size_t start = _out.size();
    while (_next_seq < due && _out.size() - start < 16 * 1024) {
        const std::size_t at = _out.size();
        _out.resize(at + proto::max_frame_header_size + _o.size);
        const auto mask = _rng.mask();
        const std::size_t h = proto::encode_masked_frame_header(
            std::span<std::uint8_t, proto::max_frame_header_size>(_out.data() + at, proto::max_frame_header_size),
            proto::opcode::text, true, _o.size, mask);
        const std::span<std::uint8_t> payload(_out.data() + at + h, _o.size);
        const std::uint64_t stamp = now_ns();
        if (_r.first_send_ns == 0) _r.first_send_ns = stamp;
        write_payload(payload, _next_seq++, stamp);
        proto::apply_mask(payload, mask, 0);
        _out.resize(at + h + _o.size);
    }
    return _out.size() - start;
}

/// Writes what is queued and what is due on the designated connection until the socket is full
/// or nothing is due; EPOLLOUT resumes it.
inline void worker::pump_sender(std::uint64_t now) noexcept {
    bench_conn& c = _conns[0];
    if (c.state != conn_state::open) {
        _sender_done = true;
        return;
    }
    for (int rounds = 0; rounds < 64; ++rounds) {   // bounded: let the receive side run too
        if (_out_off == _out.size()) {
            _out.clear();
            _out_off = 0;
            if (fill_out(now) == 0) break;
        }
        const ssize_t n = ::send(c.fd, _out.data() + _out_off, _out.size() - _out_off, MSG_NOSIGNAL);
        if (n > 0) {
            _out_off += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return set_want_out(true);
        ++_r.send_errors;
        _sender_done = true;
        return;
    }
    set_want_out(false);
    _r.sent = _next_seq;
    if (_next_seq == _total_msgs && _out_off == _out.size()) {
        _sender_done = true;
        _r.last_send_ns = now_ns();
    }
}

inline void worker::set_want_out(bool want) noexcept {
    if (want == _want_out) return;
    _want_out = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
    ev.data.u64 = 0;
    epoll_ctl(_ep, EPOLL_CTL_MOD, _conns[0].fd, &ev);
}

}  // namespace wspush::bench
