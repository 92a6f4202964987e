/// \file bench_client_test.cpp
/// The benchmark client's numbers are only as good as its pure parts: the histogram, the
/// sequence accounting, the payload format, the streaming frame reader and the upgrade check.

#include "bench_histogram.hpp"
#include "bench_wire.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace wspush::bench;

TEST_CASE("histogram quantiles stay within half a percent") {
    latency_histogram h;
    for (std::uint64_t v = 1; v <= 100'000; ++v) h.record(v * 1000);   // 1 us .. 100 ms
    REQUIRE(h.total() == 100'000);
    REQUIRE(h.max() == 100'000'000);
    REQUIRE(h.min() == 1000);
    for (const double q : {0.5, 0.9, 0.99, 0.999}) {
        const double exact = q * 100'000'000.0;
        REQUIRE(static_cast<double>(h.quantile(q)) == Approx(exact).epsilon(0.005));
    }
    REQUIRE(h.quantile(1.0) == h.max());
}

TEST_CASE("histogram buckets are contiguous and merge adds counts") {
    for (std::size_t i = 1; i < latency_histogram::bucket_count; ++i) {
        const std::uint64_t lo = latency_histogram::lower_of(i);
        REQUIRE(latency_histogram::index_of(lo) == i);
        REQUIRE(latency_histogram::index_of(lo - 1) == i - 1);
    }
    latency_histogram a, b;
    a.record(10);
    b.record(5'000'000);
    b.record(7);
    a.merge(b);
    REQUIRE(a.total() == 3);
    REQUIRE(a.min() == 7);
    REQUIRE(a.max() == 5'000'000);
    REQUIRE(a.quantile(0.5) == 10);
}

TEST_CASE("sequence tracker tells gaps, late arrivals and duplicates apart") {
    seq_tracker t;
    seq_counters c;
    for (std::uint32_t s : {0u, 1u, 2u, 5u, 3u, 3u, 6u, 1u}) t.on_seq(s, c);
    REQUIRE(c.unique == 6);       // 0 1 2 5 3 6
    REQUIRE(c.gaps == 1);         // 5 skipped 3 and 4
    REQUIRE(c.reordered == 1);    // 3 came late
    REQUIRE(c.duplicates == 2);   // 3 and 1 again
    t.on_seq(200, c);
    t.on_seq(4, c);               // far below the window now
    REQUIRE(c.stale == 1);
    REQUIRE(c.unique == 7);
}

TEST_CASE("payload carries sequence and timestamp") {
    std::vector<std::uint8_t> buf(64);
    write_payload(buf, 0xdeadbeef, 0x0123456789abcdefULL);
    const payload_fields f = read_payload(buf);
    REQUIRE(f.ok);
    REQUIRE(f.seq == 0xdeadbeef);
    REQUIRE(f.send_ns == 0x0123456789abcdefULL);
    REQUIRE(buf.back() == '.');
    buf[3] = 'g';
    REQUIRE_FALSE(read_payload(buf).ok);
    REQUIRE_FALSE(read_payload(std::span<const std::uint8_t>(buf.data(), 23)).ok);
}

namespace {

struct recording_sink {
    std::vector<std::uint32_t> seqs;
    std::vector<std::vector<std::uint8_t>> pings;
    int closes = 0;
    void on_message(std::span<const std::uint8_t> prefix, std::uint8_t) {
        const payload_fields f = read_payload(prefix);
        seqs.push_back(f.ok ? f.seq : 0xffffffffu);
    }
    void on_ping(std::span<const std::uint8_t> p) { pings.emplace_back(p.begin(), p.end()); }
    void on_close(std::span<const std::uint8_t>) { ++closes; }
};

/// An unmasked server frame.
void append_frame(std::vector<std::uint8_t>& out, std::uint8_t op, bool fin, std::span<const std::uint8_t> payload) {
    out.push_back(static_cast<std::uint8_t>((fin ? 0x80 : 0) | op));
    if (payload.size() < 126) {
        out.push_back(static_cast<std::uint8_t>(payload.size()));
    } else {
        out.push_back(126);
        out.push_back(static_cast<std::uint8_t>(payload.size() >> 8));
        out.push_back(static_cast<std::uint8_t>(payload.size()));
    }
    out.insert(out.end(), payload.begin(), payload.end());
}

std::vector<std::uint8_t> sample_stream() {
    std::vector<std::uint8_t> out, p(300);
    write_payload(p, 1, 42);
    append_frame(out, 1, true, p);                                          // 300 B, 16-bit length
    write_payload(std::span<std::uint8_t>(p.data(), 64), 2, 43);
    append_frame(out, 1, false, std::span<const std::uint8_t>(p.data(), 10));   // fragmented...
    const std::uint8_t ping[] = {'h', 'i'};
    append_frame(out, 9, true, ping);                                       // ...control in between
    append_frame(out, 0, true, std::span<const std::uint8_t>(p.data() + 10, 54));
    append_frame(out, 8, true, std::span<const std::uint8_t>(ping, 0));
    return out;
}

}  // namespace

TEST_CASE("frame reader handles whole input, every split point and single bytes") {
    const std::vector<std::uint8_t> stream = sample_stream();
    auto check = [](const recording_sink& s) {
        REQUIRE(s.seqs == std::vector<std::uint32_t>{1, 2});
        REQUIRE(s.pings.size() == 1);
        REQUIRE(s.pings[0] == std::vector<std::uint8_t>{'h', 'i'});
        REQUIRE(s.closes == 1);
    };
    {
        frame_reader r;
        recording_sink s;
        REQUIRE(r.consume(stream, s));
        check(s);
    }
    for (std::size_t cut = 1; cut < stream.size(); ++cut) {
        frame_reader r;
        recording_sink s;
        REQUIRE(r.consume(std::span<const std::uint8_t>(stream.data(), cut), s));
        REQUIRE(r.consume(std::span<const std::uint8_t>(stream.data() + cut, stream.size() - cut), s));
        check(s);
    }
    frame_reader r;
    recording_sink s;
    for (std::uint8_t b : stream) REQUIRE(r.consume(std::span<const std::uint8_t>(&b, 1), s));
    check(s);
}

TEST_CASE("frame reader rejects masked server frames and stray continuations") {
    recording_sink s;
    frame_reader masked;
    const std::uint8_t m[] = {0x81, 0x81, 1, 2, 3, 4, 'x'};
    REQUIRE_FALSE(masked.consume(m, s));
    frame_reader stray;
    const std::uint8_t c[] = {0x80, 0x00};
    REQUIRE_FALSE(stray.consume(c, s));
}

TEST_CASE("upgrade response check wants 101 and the RFC accept value") {
    // The worked example of RFC 6455 section 1.3.
    const std::string accept = expected_accept("dGhlIHNhbXBsZSBub25jZQ==");
    REQUIRE(accept == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    const std::string good =
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "sec-websocket-accept:  s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    REQUIRE(check_upgrade_response(good, accept) == upgrade_check::ok);
    REQUIRE(check_upgrade_response("HTTP/1.1 426 Upgrade Required\r\n\r\n", accept) == upgrade_check::bad_status);
    std::string wrong = good;
    wrong.replace(wrong.find("s3pP"), 4, "AAAA");
    REQUIRE(check_upgrade_response(wrong, accept) == upgrade_check::bad_accept);
    xorshift rng{12345};
    REQUIRE(make_key(rng).size() == 24);
}
