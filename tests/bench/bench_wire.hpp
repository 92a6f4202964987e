#pragma once
/// \file bench_wire.hpp
/// Wire pieces of ws_bench_client that never touch a socket: the upgrade request and response
/// check, the benchmark payload (sequence number + send timestamp), a streaming reader for
/// server frames that keeps only a few bytes per connection, and per-connection sequence
/// accounting with fixed memory.

#include "proto/ws_frame.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace wspush::bench {

// ---------------------------------------------------------------------------------------------
// Random numbers: xorshift64*, seeded per process. Masks and keys need no cryptographic quality.

/// Small fast PRNG for mask keys and Sec-WebSocket-Key values.
struct xorshift {
    std::uint64_t state;
    std::uint64_t next() noexcept {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 0x2545F4914F6CDD1DULL;
    }
    std::array<std::uint8_t, 4> mask() noexcept {
        const auto v = static_cast<std::uint32_t>(next() >> 32);
        return {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8),
                static_cast<std::uint8_t>(v >> 16), static_cast<std::uint8_t>(v >> 24)};
    }
};

// ---------------------------------------------------------------------------------------------
// Upgrade

/// Standard base64 of `in` (used for the 16-byte key and to check the accept value).
inline std::string base64(std::span<const std::uint8_t> in) {
    static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (std::size_t i = 0; i < in.size(); i += 3) {
        const std::size_t n = std::min<std::size_t>(3, in.size() - i);
        std::uint32_t v = std::uint32_t{in[i]} << 16;
        if (n > 1) v |= std::uint32_t{in[i + 1]} << 8;
        if (n > 2) v |= in[i + 2];
        out += alphabet[(v >> 18) & 63];
        out += alphabet[(v >> 12) & 63];
        out += n > 1 ? alphabet[(v >> 6) & 63] : '=';
        out += n > 2 ? alphabet[v & 63] : '=';
    }
    return out;
}

/// A fresh random Sec-WebSocket-Key (24 characters).
inline std::string make_key(xorshift& rng) {
    std::array<std::uint8_t, 16> raw{};
    for (std::size_t i = 0; i < raw.size(); i += 8) {
        const std::uint64_t v = rng.next();
        std::memcpy(raw.data() + i, &v, 8);
    }
    return base64(raw);
}

/// Sec-WebSocket-Accept for a key (RFC 6455 section 4.2.2): base64(SHA-1(key + GUID)).
inline std::string expected_accept(std::string_view key) {
    std::string input(key);
    input += "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    std::array<std::uint8_t, EVP_MAX_MD_SIZE> digest{};
    unsigned int len = 0;
    EVP_Digest(input.data(), input.size(), digest.data(), &len, EVP_sha1(), nullptr);
    return base64(std::span<const std::uint8_t>(digest.data(), len));
}

inline std::string make_upgrade_request(std::string_view path, std::string_view host, std::string_view key) {
    std::string r;
    r.reserve(256);
    r.append("GET ").append(path).append(" HTTP/1.1\r\nHost: ").append(host);
    r.append("\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ").append(key);
    r.append("\r\nSec-WebSocket-Version: 13\r\n\r\n");
    return r;
}

enum class upgrade_check : std::uint8_t { ok, bad_status, bad_accept };

inline bool iequals(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return (x | 0x20) == (y | 0x20);
           });
}

/// Checks a complete response head (through the blank line): status 101 and the right accept.
inline upgrade_check check_upgrade_response(std::string_view head, std::string_view accept) noexcept {
    if (head.substr(0, 13) != "HTTP/1.1 101 " && head.substr(0, 13) != "HTTP/1.1 101\r") {
        return upgrade_check::bad_status;
    }
    constexpr std::string_view name = "sec-websocket-accept:";
    for (std::size_t pos = head.find("\r\n"); pos != std::string_view::npos; pos = head.find("\r\n", pos + 2)) {
        const std::string_view line = head.substr(pos + 2, head.find("\r\n", pos + 2) - pos - 2);
        if (line.size() < name.size() || !iequals(line.substr(0, name.size()), name)) continue;
        std::string_view v = line.substr(name.size());
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
        return v == accept ? upgrade_check::ok : upgrade_check::bad_accept;
    }
    return upgrade_check::bad_accept;
}

// ---------------------------------------------------------------------------------------------
// Payload: 8 hex digits of sequence number, 16 hex digits of CLOCK_MONOTONIC ns, then padding.
// Text, so it is valid UTF-8 and a broadcast server relays it.

inline constexpr std::size_t payload_prefix = 24;

inline void write_payload(std::span<std::uint8_t> out, std::uint32_t seq, std::uint64_t send_ns) noexcept {
    static constexpr char hex[] = "0123456789abcdef";
    for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(hex[(seq >> (28 - 4 * i)) & 15]);
    for (int i = 0; i < 16; ++i) out[8 + i] = static_cast<std::uint8_t>(hex[(send_ns >> (60 - 4 * i)) & 15]);
    std::memset(out.data() + payload_prefix, '.', out.size() - payload_prefix);
}

struct payload_fields {
    bool ok;
    std::uint32_t seq;
    std::uint64_t send_ns;
};

inline payload_fields read_payload(std::span<const std::uint8_t> prefix) noexcept {
    if (prefix.size() < payload_prefix) return {false, 0, 0};
    std::uint64_t v[2] = {0, 0};
    for (std::size_t i = 0; i < payload_prefix; ++i) {
        const std::uint8_t c = prefix[i];
        unsigned d = 0;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return {false, 0, 0};
        std::uint64_t& slot = v[i < 8 ? 0 : 1];
        slot = (slot << 4) | d;
    }
    return {true, static_cast<std::uint32_t>(v[0]), v[1]};
}

// ---------------------------------------------------------------------------------------------
// Streaming reader for server frames (unmasked). Several frames per read, and a frame split over
// any number of reads, with at most a header and a few payload bytes kept between reads.

/// What the reader reports. Implemented by the client's connection loop.
template <class Handler>
concept frame_handler = requires(Handler h, std::span<const std::uint8_t> s, std::uint8_t op) {
    h.on_message(s, op);      // a complete data message: its first bytes (up to keep_bytes)
    h.on_ping(s);             // a ping and its payload
    h.on_close(s);            // a close frame and its payload
};

class frame_reader {
public:
    static constexpr std::size_t keep_bytes = 125;   ///< control payload limit; also data prefix

    /// Feeds bytes; returns false on a protocol violation (the caller drops the connection).
    template <frame_handler Handler>
    bool consume(std::span<const std::uint8_t> in, Handler& h) noexcept {
        while (!in.empty()) {
            if (_in_header) {
                if (!take_header(in)) return false;
                if (_in_header) return true;      // header still incomplete, all input taken
                if (_remaining == 0 && !finish_frame(h)) return false;
                continue;
            }
            const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(_remaining, in.size()));
            keep(in.first(n));
            in = in.subspan(n);
            _remaining -= n;
            if (_remaining == 0 && !finish_frame(h)) return false;
        }
        return true;
    }

private:
    bool take_header(std::span<const std::uint8_t>& in) noexcept;
    void keep(std::span<const std::uint8_t> bytes) noexcept {
        std::uint8_t& len = _control ? _ctrl_len : _data_len;
        std::uint8_t* dst = _control ? _ctrl.data() : _data.data();
        const std::size_t room = keep_bytes - len;
        const std::size_t n = std::min(room, bytes.size());
        std::memcpy(dst + len, bytes.data(), n);
        len = static_cast<std::uint8_t>(len + n);
    }
    template <frame_handler Handler>
    bool finish_frame(Handler& h) noexcept;

    std::uint64_t _remaining = 0;            ///< payload bytes left in the current frame
    std::array<std::uint8_t, proto::max_frame_header_size> _hdr{};
    std::array<std::uint8_t, keep_bytes> _data{};   ///< first bytes of the data message
    std::array<std::uint8_t, keep_bytes> _ctrl{};   ///< payload of the control frame
    std::uint8_t _hdr_len = 0;
    std::uint8_t _data_len = 0;
    std::uint8_t _ctrl_len = 0;
    std::uint8_t _op = 0;                    ///< opcode of the current frame
    std::uint8_t _msg_op = 0;                ///< opcode of the data message in progress (0: none)
    bool _fin = false;
    bool _control = false;
    bool _in_header = true;
};

inline bool frame_reader::take_header(std::span<const std::uint8_t>& in) noexcept {
    proto::header_result r{};
    std::size_t used = 0;
    if (_hdr_len == 0) {
        r = proto::parse_frame_header(in);
        used = r.status == proto::parse_status::done ? r.header.size : 0;
    } else {
        const std::size_t add = std::min(_hdr.size() - _hdr_len, in.size());
        std::memcpy(_hdr.data() + _hdr_len, in.data(), add);
        r = proto::parse_frame_header(std::span<const std::uint8_t>(_hdr.data(), _hdr_len + add));
        used = r.status == proto::parse_status::done ? r.header.size - _hdr_len : add;
        if (r.status == proto::parse_status::need_more) _hdr_len = static_cast<std::uint8_t>(_hdr_len + add);
    }
    if (r.status == proto::parse_status::error) return false;
    if (r.status == proto::parse_status::need_more) {
        if (_hdr_len == 0) {     // the first attempt parsed straight from the input: stash it
            std::memcpy(_hdr.data(), in.data(), in.size());
            _hdr_len = static_cast<std::uint8_t>(in.size());
        }
        in = {};
        return true;
    }
    in = in.subspan(used);
    _hdr_len = 0;
    const auto& fh = r.header;
    if (fh.masked || fh.rsv != 0) return false;        // server frames are never masked
    _op = fh.raw_opcode;
    _fin = fh.fin;
    _control = (_op & 0x8) != 0;
    if (_control && (!_fin || fh.payload_len > keep_bytes)) return false;
    if (!_control) {
        const bool continuation = _op == 0;
        if (continuation != (_msg_op != 0)) return false;   // continuation without start, or vice versa
        if (!continuation) { _msg_op = _op; _data_len = 0; }
    }
    _ctrl_len = 0;
    _remaining = fh.payload_len;
    _in_header = false;
    return true;
}

template <frame_handler Handler>
bool frame_reader::finish_frame(Handler& h) noexcept {
    _in_header = true;
    if (_control) {
        const std::span<const std::uint8_t> payload(_ctrl.data(), _ctrl_len);
        if (_op == static_cast<std::uint8_t>(proto::opcode::ping)) h.on_ping(payload);
        else if (_op == static_cast<std::uint8_t>(proto::opcode::close)) h.on_close(payload);
        else if (_op != static_cast<std::uint8_t>(proto::opcode::pong)) return false;
        return true;
    }
    if (_fin) {
        h.on_message(std::span<const std::uint8_t>(_data.data(), _data_len), _msg_op);
        _msg_op = 0;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Sequence accounting per receiving connection: next expected number plus a 64-wide window of
// what arrived below it, so duplicates and late (reordered) arrivals are told apart exactly
// within the window, with 16 bytes per connection whatever the message count.

struct seq_counters {
    std::uint64_t unique = 0;      ///< distinct sequence numbers received
    std::uint64_t duplicates = 0;  ///< a number received again (within the window)
    std::uint64_t gaps = 0;        ///< times a number arrived ahead of the next expected one
    std::uint64_t reordered = 0;   ///< a number that filled an earlier gap
    std::uint64_t stale = 0;       ///< below the window: a duplicate or very late, cannot tell
};

class seq_tracker {
public:
    /// Accounts for one received sequence number.
    void on_seq(std::uint32_t s, seq_counters& c) noexcept {
        if (s >= _next) {
            if (s > _next) ++c.gaps;
            const std::uint64_t shift = std::uint64_t{s} - _next + 1;
            _window = shift >= 64 ? 0 : _window << shift;
            _window |= 1;
            _next = s + 1;
            ++c.unique;
            return;
        }
        const std::uint32_t d = _next - 1 - s;
        if (d >= 64) { ++c.stale; return; }
        const std::uint64_t bit = std::uint64_t{1} << d;
        if (_window & bit) { ++c.duplicates; return; }
        _window |= bit;
        ++c.unique;
        ++c.reordered;
    }

private:
    std::uint64_t _window = 0;   ///< bit i: number _next-1-i was received
    std::uint32_t _next = 0;
};

static_assert(sizeof(seq_tracker) == 16, "per-connection accounting stays small");

}  // namespace wspush::bench
