#pragma once
/// \file bench_options.hpp
/// Command line of ws_bench_client. Parsing may throw std::runtime_error (start-up only).

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::bench {

enum class bench_mode : std::uint8_t { hold, fanout, rate };

/// Everything the parent and its children need; children inherit it across fork().
struct bench_options {
    bench_mode mode = bench_mode::hold;
    std::string url;
    std::string host_header;            ///< "host:port" for the Host header
    std::string path = "/";
    sockaddr_in server{};
    std::uint32_t connections = 1000;
    std::uint32_t procs = 0;            ///< 0: ceil(connections / 4800)
    double connect_rate = 0;            ///< connections per second over all procs; 0: unthrottled
    std::uint32_t inflight = 64;        ///< upgrades in progress per process when unthrottled
    double hold_seconds = 3600;
    std::uint32_t burst = 200;
    std::uint32_t size = 64;
    double rate = 2;                    ///< messages per second (rate mode)
    double seconds = 30;                ///< rate mode duration
    std::vector<in_addr> sources;       ///< source addresses to bind, round robin; empty: none
    bool sources_given = false;
    double connect_timeout = 120;       ///< whole connect phase
    double timeout = 120;               ///< whole run phase after the first send
    double drain_timeout = 5;           ///< stop once the sender is done and nothing came for this long
    int server_pid = 0;                 ///< sample this PID's CPU time over the run window
    bool json = false;
};

inline constexpr std::string_view usage_text =
    "usage: ws_bench_client hold|fanout|rate --url ws://127.0.0.1:PORT/ [options]\n"
    "  --connections N        connections in total (default 1000)\n"
    "  --procs P              worker processes (default: one per 4,800 connections)\n"
    "  --rate R               hold: connections/s over all procs; rate: messages/s (default 2)\n"
    "  --inflight K           upgrades in flight per process when not rate limited (default 64)\n"
    "  --hold-seconds S       hold: end after S seconds (default 3600; stdin EOF or SIGTERM end sooner)\n"
    "  --burst B              fanout: messages the designated connection sends (default 200)\n"
    "  --size BYTES           message size, at least 24 (default 64)\n"
    "  --seconds S            rate: how long to send (default 30)\n"
    "  --source A-B|A|none    source addresses to bind round robin (default 127.0.0.2-127.0.0.250\n"
    "                         when the server is on 127.0.0.0/8)\n"
    "  --connect-timeout S    deadline for the connect phase (default 120)\n"
    "  --timeout S            deadline for the run phase (default 120)\n"
    "  --drain-timeout S      after the last send, stop when nothing arrived for S (default 5)\n"
    "  --server-pid PID       report that process's CPU time (utime+stime) over the run window\n"
    "  --json                 print the final result as one JSON object\n";

namespace detail {

inline double parse_number(std::string_view name, std::string_view text, double lo, double hi) {
    double value = 0;
    const auto* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec != std::errc{} || ptr != end || !(value >= lo && value <= hi)) {
        throw std::runtime_error("bad value for " + std::string(name) + ": '" + std::string(text) + "'");
    }
    return value;
}

inline in_addr parse_ipv4(std::string_view text) {
    in_addr a{};
    if (inet_pton(AF_INET, std::string(text).c_str(), &a) != 1) {
        throw std::runtime_error("not an IPv4 address: '" + std::string(text) + "'");
    }
    return a;
}

/// "127.0.0.2-127.0.0.250" (inclusive), one address, or "none".
inline std::vector<in_addr> parse_sources(std::string_view text) {
    std::vector<in_addr> out;
    if (text == "none") return out;
    const auto dash = text.find('-');
    const in_addr first = parse_ipv4(text.substr(0, dash));
    const in_addr last = dash == std::string_view::npos ? first : parse_ipv4(text.substr(dash + 1));
    const std::uint32_t lo = ntohl(first.s_addr);
    const std::uint32_t hi = ntohl(last.s_addr);
    if (hi < lo || hi - lo > 65535) throw std::runtime_error("bad --source range");
    for (std::uint32_t a = lo; a <= hi; ++a) out.push_back(in_addr{htonl(a)});
    return out;
}

/// ws://HOST:PORT/PATH with HOST an IPv4 literal or "localhost".
inline void parse_url(bench_options& o, std::string_view url) {
    constexpr std::string_view scheme = "ws://";
    if (url.substr(0, scheme.size()) != scheme) throw std::runtime_error("--url must start with ws://");
    std::string_view rest = url.substr(scheme.size());
    const auto slash = rest.find('/');
    o.path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
    const std::string_view authority = rest.substr(0, slash);
    const auto colon = authority.rfind(':');
    if (colon == std::string_view::npos) throw std::runtime_error("--url needs an explicit port");
    std::string_view host = authority.substr(0, colon);
    const double port = parse_number("port", authority.substr(colon + 1), 1, 65535);
    if (host == "localhost") host = "127.0.0.1";
    o.server.sin_family = AF_INET;
    o.server.sin_port = htons(static_cast<std::uint16_t>(port));
    o.server.sin_addr = parse_ipv4(host);
    o.host_header = std::string(authority);
    o.url = std::string(url);
}

inline void apply_defaults(bench_options& o, bool rate_given, double rate_value) {
    if (o.mode == bench_mode::hold) o.connect_rate = rate_given ? rate_value : 0;
    if (o.mode == bench_mode::rate && rate_given) o.rate = rate_value;
    if (o.procs == 0) o.procs = (o.connections + 4799) / 4800;
    if (o.procs > o.connections) o.procs = o.connections;
    const bool loopback = (ntohl(o.server.sin_addr.s_addr) >> 24) == 127;
    if (!o.sources_given && loopback) o.sources = parse_sources("127.0.0.2-127.0.0.250");
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    const std::uint64_t per_proc = (o.connections + o.procs - 1) / o.procs;
    if (per_proc + 32 > lim.rlim_cur) {
        throw std::runtime_error("too many connections per process for RLIMIT_NOFILE=" +
                                 std::to_string(lim.rlim_cur) + ": raise --procs");
    }
}

}  // namespace detail

/// Parses argv (each option as `--opt VALUE` or `--opt=VALUE`). Throws std::runtime_error.
inline bench_options parse_options(int argc, char** argv) {
    if (argc < 2) throw std::runtime_error("missing subcommand");
    bench_options o;
    const std::string_view sub = argv[1];
    if (sub == "hold") o.mode = bench_mode::hold;
    else if (sub == "fanout") o.mode = bench_mode::fanout;
    else if (sub == "rate") o.mode = bench_mode::rate;
    else throw std::runtime_error("unknown subcommand '" + std::string(sub) + "'");
    bool rate_given = false;
    double rate_value = 0;
    for (int i = 2; i < argc; ++i) {
        std::string_view arg = argv[i];
        std::string_view value;
        const auto eq = arg.find('=');
        const bool inline_value = eq != std::string_view::npos;
        if (inline_value) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
        }
        auto take = [&]() -> std::string_view {
            if (inline_value) return value;
            if (i + 1 >= argc) throw std::runtime_error(std::string(arg) + " needs a value");
            return argv[++i];
        };
        auto num = [&](double lo, double hi) { return detail::parse_number(arg, take(), lo, hi); };
        if (arg == "--json") o.json = true;
        else if (arg == "--url") detail::parse_url(o, take());
        else if (arg == "--connections") o.connections = static_cast<std::uint32_t>(num(1, 1e7));
        else if (arg == "--procs") o.procs = static_cast<std::uint32_t>(num(1, 1024));
        else if (arg == "--rate") { rate_value = num(1e-3, 1e7); rate_given = true; }
        else if (arg == "--inflight") o.inflight = static_cast<std::uint32_t>(num(1, 65536));
        else if (arg == "--hold-seconds") o.hold_seconds = num(0, 1e7);
        else if (arg == "--burst") o.burst = static_cast<std::uint32_t>(num(1, 1e9));
        else if (arg == "--size") o.size = static_cast<std::uint32_t>(num(24, 1 << 26));
        else if (arg == "--seconds") o.seconds = num(0.001, 1e6);
        else if (arg == "--source") { o.sources = detail::parse_sources(take()); o.sources_given = true; }
        else if (arg == "--connect-timeout") o.connect_timeout = num(0.001, 1e6);
        else if (arg == "--timeout") o.timeout = num(0.001, 1e6);
        else if (arg == "--drain-timeout") o.drain_timeout = num(0.001, 1e6);
        else if (arg == "--server-pid") o.server_pid = static_cast<int>(num(1, 1 << 30));
        else throw std::runtime_error("unknown option '" + std::string(arg) + "'");
    }
    if (o.url.empty()) throw std::runtime_error("--url is required");
    detail::apply_defaults(o, rate_given, rate_value);
    return o;
}

}  // namespace wspush::bench
