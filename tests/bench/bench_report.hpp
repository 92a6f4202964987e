#pragma once
/// \file bench_report.hpp
/// What a worker process tells the parent (plain structs sent over a pipe), and how the parent
/// sums them up and prints the result (readable text or one JSON object).

#include "bench_histogram.hpp"
#include "bench_options.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace wspush::bench {

/// Why a connection did not get through its upgrade (or was lost later).
enum class conn_error : std::uint8_t {
    refused,            ///< ECONNREFUSED
    timed_out,          ///< ETIMEDOUT from the kernel
    addr_not_avail,     ///< EADDRNOTAVAIL / EADDRINUSE: out of source ports
    reset,              ///< ECONNRESET / EPIPE during the upgrade
    too_many_files,     ///< EMFILE / ENFILE on socket()
    other_errno,        ///< anything else; the first such errno is reported
    closed_in_upgrade,  ///< EOF before a complete response
    bad_status,         ///< a response other than 101
    bad_accept,         ///< 101 without the right Sec-WebSocket-Accept
    response_too_big,   ///< no end of the response head within 4 KiB
    deadline,           ///< still not upgraded when the connect phase ended
    count
};

inline constexpr std::string_view conn_error_names[] = {
    "refused", "timed_out", "addr_not_avail", "reset", "too_many_files", "other_errno",
    "closed_in_upgrade", "bad_status", "bad_accept", "response_too_big", "deadline"};
static_assert(std::size(conn_error_names) == static_cast<std::size_t>(conn_error::count));

inline conn_error classify_errno(int e) noexcept {
    switch (e) {
        case ECONNREFUSED: return conn_error::refused;
        case ETIMEDOUT: return conn_error::timed_out;
        case EADDRNOTAVAIL:
        case EADDRINUSE: return conn_error::addr_not_avail;
        case ECONNRESET:
        case EPIPE: return conn_error::reset;
        case EMFILE:
        case ENFILE: return conn_error::too_many_files;
        default: return conn_error::other_errno;
    }
}

enum class report_kind : std::uint32_t { connected = 1, final_result = 2 };

/// One worker's numbers. Sent twice: after its connect phase (`connected`), and at the end
/// (`final_result`, followed on the pipe by its latency_histogram).
struct child_report {
    report_kind kind = report_kind::connected;
    std::uint32_t child = 0;
    std::uint64_t assigned = 0;          ///< connections this worker was asked to open
    std::uint64_t connected = 0;         ///< upgraded successfully
    std::uint64_t errors[static_cast<std::size_t>(conn_error::count)] = {};
    std::int64_t first_other_errno = 0;
    std::uint64_t connect_done_ns = 0;   ///< CLOCK_MONOTONIC when its connect phase ended
    // run phase
    std::uint64_t sent = 0;              ///< messages sent (designated sender only)
    std::uint64_t first_send_ns = 0;
    std::uint64_t last_send_ns = 0;
    std::uint64_t expected = 0;          ///< messages this worker's connections should receive
    std::uint64_t deliveries = 0;        ///< benchmark messages received, duplicates included
    std::uint64_t unique = 0;
    std::uint64_t duplicates = 0;
    std::uint64_t gaps = 0;
    std::uint64_t reordered = 0;
    std::uint64_t stale = 0;
    std::uint64_t foreign = 0;           ///< data messages that were not ours
    std::uint64_t complete_conns = 0;    ///< connections that received every message
    std::uint64_t last_delivery_ns = 0;
    // trouble after the upgrade
    std::uint64_t disconnects = 0;       ///< EOF or reset on an upgraded connection
    std::uint64_t server_closes = 0;     ///< close frames received
    std::uint64_t protocol_errors = 0;   ///< malformed server frames
    std::uint64_t pings = 0;             ///< pings answered
    std::uint64_t send_errors = 0;
    std::uint32_t open_at_end = 0;       ///< upgraded connections still open when reporting
    std::uint32_t timed_out = 0;         ///< 1: the run phase hit --timeout
};

/// The parent's sum over all workers.
struct run_summary {
    child_report total{};
    latency_histogram latency{};
    std::uint32_t children_lost = 0;     ///< workers that died or never reported
    std::uint64_t server_cpu_ns = 0;     ///< --server-pid utime+stime over the run window
    bool server_cpu_valid = false;

    void add(const child_report& r) noexcept;
    [[nodiscard]] std::uint64_t loss() const noexcept {
        return total.expected > total.unique ? total.expected - total.unique : 0;
    }
    [[nodiscard]] double elapsed_s() const noexcept {
        if (total.first_send_ns == 0 || total.last_delivery_ns < total.first_send_ns) return 0;
        return static_cast<double>(total.last_delivery_ns - total.first_send_ns) / 1e9;
    }
};

inline void run_summary::add(const child_report& r) noexcept {
    child_report& t = total;
    t.assigned += r.assigned;
    t.connected += r.connected;
    for (std::size_t i = 0; i < std::size(r.errors); ++i) t.errors[i] += r.errors[i];
    if (t.first_other_errno == 0) t.first_other_errno = r.first_other_errno;
    t.sent += r.sent;
    if (r.first_send_ns && (t.first_send_ns == 0 || r.first_send_ns < t.first_send_ns)) t.first_send_ns = r.first_send_ns;
    if (r.last_send_ns > t.last_send_ns) t.last_send_ns = r.last_send_ns;
    if (r.last_delivery_ns > t.last_delivery_ns) t.last_delivery_ns = r.last_delivery_ns;
    if (r.connect_done_ns > t.connect_done_ns) t.connect_done_ns = r.connect_done_ns;
    t.expected += r.expected;
    t.deliveries += r.deliveries;
    t.unique += r.unique;
    t.duplicates += r.duplicates;
    t.gaps += r.gaps;
    t.reordered += r.reordered;
    t.stale += r.stale;
    t.foreign += r.foreign;
    t.complete_conns += r.complete_conns;
    t.disconnects += r.disconnects;
    t.server_closes += r.server_closes;
    t.protocol_errors += r.protocol_errors;
    t.pings += r.pings;
    t.send_errors += r.send_errors;
    t.open_at_end += r.open_at_end;
    t.timed_out |= r.timed_out;
}

inline constexpr std::string_view mode_name(bench_mode m) noexcept {
    return m == bench_mode::hold ? "hold" : (m == bench_mode::fanout ? "fanout" : "rate");
}

/// `"refused":3,"deadline":1` for the non-zero error counters.
inline std::string error_list(const child_report& t, std::string_view sep, bool quote) {
    std::string out;
    for (std::size_t i = 0; i < std::size(t.errors); ++i) {
        if (t.errors[i] == 0) continue;
        if (!out.empty()) out += ", ";
        out += quote ? "\"" + std::string(conn_error_names[i]) + "\"" : std::string(conn_error_names[i]);
        out += sep;
        out += std::to_string(t.errors[i]);
    }
    return out;
}

inline void print_json(const bench_options& o, const run_summary& s, bool ok) {
    const child_report& t = s.total;
    const latency_histogram& h = s.latency;
    const double elapsed = s.elapsed_s();
    const double rate = elapsed > 0 ? static_cast<double>(t.unique) / elapsed : 0;
    std::printf("{\"mode\":\"%s\",\"url\":\"%s\",\"ok\":%s,\"connections\":%u,\"procs\":%u,"
                "\"connected\":%llu,\"connect_errors\":{%s},\"first_other_errno\":%lld,",
                std::string(mode_name(o.mode)).c_str(), o.url.c_str(), ok ? "true" : "false",
                o.connections, o.procs, static_cast<unsigned long long>(t.connected),
                error_list(t, ":", true).c_str(), static_cast<long long>(t.first_other_errno));
    std::printf("\"size\":%u,\"sent\":%llu,\"expected\":%llu,\"deliveries\":%llu,\"unique\":%llu,"
                "\"loss\":%llu,\"duplicates\":%llu,\"gaps\":%llu,\"reordered\":%llu,\"stale\":%llu,"
                "\"foreign\":%llu,\"elapsed_s\":%.6f,\"deliveries_per_s\":%.1f,",
                o.size, static_cast<unsigned long long>(t.sent), static_cast<unsigned long long>(t.expected),
                static_cast<unsigned long long>(t.deliveries), static_cast<unsigned long long>(t.unique),
                static_cast<unsigned long long>(s.loss()), static_cast<unsigned long long>(t.duplicates),
                static_cast<unsigned long long>(t.gaps), static_cast<unsigned long long>(t.reordered),
                static_cast<unsigned long long>(t.stale), static_cast<unsigned long long>(t.foreign), elapsed, rate);
    std::printf("\"latency_us\":{\"count\":%llu,\"mean\":%.1f,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,"
                "\"p999\":%.1f,\"max\":%.1f},",
                static_cast<unsigned long long>(h.total()), h.mean() / 1e3, h.quantile(0.5) / 1e3,
                h.quantile(0.9) / 1e3, h.quantile(0.99) / 1e3, h.quantile(0.999) / 1e3, h.max() / 1e3);
    std::printf("\"disconnects\":%llu,\"server_closes\":%llu,\"protocol_errors\":%llu,\"pings\":%llu,"
                "\"send_errors\":%llu,\"open_at_end\":%u,\"timed_out\":%s,\"children_lost\":%u",
                static_cast<unsigned long long>(t.disconnects), static_cast<unsigned long long>(t.server_closes),
                static_cast<unsigned long long>(t.protocol_errors), static_cast<unsigned long long>(t.pings),
                static_cast<unsigned long long>(t.send_errors), t.open_at_end, t.timed_out ? "true" : "false",
                s.children_lost);
    if (s.server_cpu_valid) {
        const double per = t.unique ? static_cast<double>(s.server_cpu_ns) / static_cast<double>(t.unique) / 1e3 : 0;
        std::printf(",\"server_cpu_s\":%.4f,\"server_cpu_per_delivery_us\":%.4f", s.server_cpu_ns / 1e9, per);
    }
    std::printf("}\n");
}

inline void print_text(const bench_options& o, const run_summary& s, bool ok) {
    const child_report& t = s.total;
    std::printf("%s %s: %s\n", std::string(mode_name(o.mode)).c_str(), o.url.c_str(), ok ? "ok" : "FAILED");
    std::printf("  connected %llu / %u over %u procs", static_cast<unsigned long long>(t.connected),
                o.connections, o.procs);
    const std::string errs = error_list(t, "=", false);
    if (!errs.empty()) std::printf("; connect errors: %s", errs.c_str());
    if (t.first_other_errno) std::printf(" (first other errno %lld)", static_cast<long long>(t.first_other_errno));
    std::printf("\n  disconnects %llu, server closes %llu, protocol errors %llu, pings %llu, open at end %u\n",
                static_cast<unsigned long long>(t.disconnects), static_cast<unsigned long long>(t.server_closes),
                static_cast<unsigned long long>(t.protocol_errors), static_cast<unsigned long long>(t.pings),
                t.open_at_end);
    if (s.children_lost) std::printf("  %u worker processes died or never reported\n", s.children_lost);
    if (o.mode == bench_mode::hold) return;
    const double elapsed = s.elapsed_s();
    std::printf("  sent %llu x %u B; delivered %llu of %llu (loss %llu, duplicates %llu, gaps %llu, "
                "reordered %llu, stale %llu, foreign %llu)%s\n",
                static_cast<unsigned long long>(t.sent), o.size, static_cast<unsigned long long>(t.unique),
                static_cast<unsigned long long>(t.expected), static_cast<unsigned long long>(s.loss()),
                static_cast<unsigned long long>(t.duplicates), static_cast<unsigned long long>(t.gaps),
                static_cast<unsigned long long>(t.reordered), static_cast<unsigned long long>(t.stale),
                static_cast<unsigned long long>(t.foreign), t.timed_out ? " TIMED OUT" : "");
    std::printf("  elapsed %.3f s, %.0f deliveries/s\n", elapsed,
                elapsed > 0 ? static_cast<double>(t.unique) / elapsed : 0.0);
    const latency_histogram& h = s.latency;
    std::printf("  latency us: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  mean %.1f\n",
                h.quantile(0.5) / 1e3, h.quantile(0.9) / 1e3, h.quantile(0.99) / 1e3,
                h.quantile(0.999) / 1e3, h.max() / 1e3, h.mean() / 1e3);
    if (s.server_cpu_valid && t.unique) {
        std::printf("  server cpu %.3f s, %.3f us per delivery\n", s.server_cpu_ns / 1e9,
                    static_cast<double>(s.server_cpu_ns) / static_cast<double>(t.unique) / 1e3);
    }
}

}  // namespace wspush::bench
