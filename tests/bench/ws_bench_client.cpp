/// \file ws_bench_client.cpp
/// Multi-process WebSocket client for whole-system benchmarks (memory per idle connection,
/// broadcast fan-out). The parent forks --procs workers (open files are capped per process),
/// each opening its share of the connections from its own source addresses; the parent keeps
/// them in step over pipes, merges their counters and histograms, and prints the result.
///
///   ws_bench_client hold   --url ws://127.0.0.1:PORT/ --connections N [--rate R] [--hold-seconds S]
///   ws_bench_client fanout --url ... --connections N --burst B --size BYTES
///   ws_bench_client rate   --url ... --connections N --rate M --seconds S --size BYTES
///
/// stdout: `connected N` once all are upgraded (or `connect_failed X/N`), then the result (text,
/// or one JSON object with --json). Exit status 0 only when every connection came up and, in the
/// run modes, every message reached every connection.

#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_worker.hpp"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace wspush::bench {
namespace {

struct child_proc {
    pid_t pid = -1;
    int ctrl = -1;       ///< parent → child commands
    int report = -1;     ///< child → parent reports
    bool connected_seen = false;
    bool final_seen = false;
    bool gone = false;   ///< EOF on its report pipe
};

/// utime + stime of a process in ns, from /proc/PID/stat (fields 14 and 15); false if unreadable.
bool read_cpu_ns(int pid, std::uint64_t& out) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (!std::getline(in, text)) return false;
    const auto paren = text.rfind(')');   // the command name may contain spaces
    if (paren == std::string::npos) return false;
    std::istringstream fields(text.substr(paren + 2));
    std::string skip;
    for (int f = 3; f < 14; ++f) fields >> skip;
    unsigned long long utime = 0, stime = 0;
    if (!(fields >> utime >> stime)) return false;
    out = (utime + stime) * (1'000'000'000ull / static_cast<unsigned long long>(sysconf(_SC_CLK_TCK)));
    return true;
}

class parent {
public:
    explicit parent(const bench_options& o) : _o(o), _hist(std::make_unique<latency_histogram>()) {}
    int run();

private:
    bool spawn();
    void command(char c);
    /// Polls reports (and stdin / signals when asked) until every live child has sent `kind`,
    /// `deadline` passes or `stop_early` says so. Returns false on deadline or signal.
    bool collect(report_kind kind, std::uint64_t deadline, bool watch_stdin);
    void read_report(child_proc& c);
    bool all_seen(report_kind kind) const;
    int finish(bool all_up);

    const bench_options& _o;
    std::vector<child_proc> _children;
    run_summary _sum{};
    std::unique_ptr<latency_histogram> _hist;
    std::uint64_t _connected = 0;
    int _sigfd = -1;
    bool _signalled = false;
    bool _stdin_closed = false;
};

bool parent::spawn() {
    const std::uint32_t n = _o.connections;
    std::uint32_t first = 0;
    for (std::uint32_t k = 0; k < _o.procs; ++k) {
        const std::uint32_t count = n / _o.procs + (k < n % _o.procs ? 1 : 0);
        int ctrl[2], rep[2];
        if (pipe2(ctrl, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0) return false;
        const pid_t pid = fork();
        if (pid < 0) return false;
        if (pid == 0) {
            // Child: ignore terminal signals (the parent stops us over the pipe), die with the parent.
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, nullptr);
            std::signal(SIGINT, SIG_IGN);
            std::signal(SIGTERM, SIG_IGN);
            std::signal(SIGPIPE, SIG_IGN);
            if (getppid() == 1) _exit(2);
            for (const child_proc& c : _children) { ::close(c.ctrl); ::close(c.report); }
            ::close(ctrl[1]);
            ::close(rep[0]);
            int code = 2;
            {
                worker w(_o, k, first, count, ctrl[0], rep[1]);
                code = w.run();
            }
            _exit(code);
        }
        ::close(ctrl[0]);
        ::close(rep[1]);
        _children.push_back(child_proc{pid, ctrl[1], rep[0]});
        first += count;
    }
    return true;
}

void parent::command(char c) {
    for (child_proc& ch : _children) {
        if (!ch.gone && ::write(ch.ctrl, &c, 1) != 1) ch.gone = true;
    }
}

bool parent::all_seen(report_kind kind) const {
    for (const child_proc& c : _children) {
        const bool seen = kind == report_kind::connected ? c.connected_seen : c.final_seen;
        if (!seen && !c.gone) return false;
    }
    return true;
}

void parent::read_report(child_proc& c) {
    child_report r{};
    if (!read_all(c.report, &r, sizeof(r))) {
        c.gone = true;
        return;
    }
    if (r.kind == report_kind::connected) {
        c.connected_seen = true;
        _connected += r.connected;
        return;
    }
    if (!read_all(c.report, _hist.get(), sizeof(latency_histogram))) {
        c.gone = true;
        return;
    }
    c.final_seen = true;
    _sum.add(r);
    _sum.latency.merge(*_hist);
}

bool parent::collect(report_kind kind, std::uint64_t deadline, bool watch_stdin) {
    while (!all_seen(kind)) {
        const std::uint64_t now = now_ns();
        if (now >= deadline || _signalled || (watch_stdin && _stdin_closed)) return false;
        std::vector<pollfd> fds;
        fds.push_back({_sigfd, POLLIN, 0});
        fds.push_back({watch_stdin ? STDIN_FILENO : -1, POLLIN, 0});
        for (const child_proc& c : _children) fds.push_back({c.gone ? -1 : c.report, POLLIN, 0});
        const int timeout = static_cast<int>(std::min<std::uint64_t>((deadline - now) / 1'000'000 + 1, 1000));
        if (poll(fds.data(), fds.size(), timeout) <= 0) continue;
        if (fds[0].revents) {
            signalfd_siginfo info{};
            if (::read(_sigfd, &info, sizeof(info)) > 0) _signalled = true;   // consume it
        }
        if (fds[1].revents) {
            char buf[4096];
            if (::read(STDIN_FILENO, buf, sizeof(buf)) <= 0) _stdin_closed = true;
        }
        for (std::size_t k = 0; k < _children.size(); ++k) {
            if (fds[k + 2].revents) read_report(_children[k]);
        }
    }
    return true;
}

int parent::run() {
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    sigprocmask(SIG_BLOCK, &term, nullptr);
    _sigfd = signalfd(-1, &term, SFD_CLOEXEC);
    std::signal(SIGPIPE, SIG_IGN);
    if (!spawn()) {
        std::fprintf(stderr, "ws_bench_client: cannot start workers: %s\n", std::strerror(errno));
        command('q');
        return 2;
    }
    const std::uint64_t connect_deadline = now_ns() + seconds_to_ns(_o.connect_timeout + 10);
    collect(report_kind::connected, connect_deadline, false);
    const bool all_up = _connected == _o.connections && !_signalled;
    if (all_up) std::printf("connected %llu\n", static_cast<unsigned long long>(_connected));
    else std::printf("connect_failed %llu/%u\n", static_cast<unsigned long long>(_connected), _o.connections);
    std::fflush(stdout);

    std::uint64_t cpu_start = 0;
    bool cpu_ok = false;
    if (all_up && _o.mode == bench_mode::hold) {
        // The only event here is the end; a "report" that never comes just marks the hold's end.
        collect(report_kind::final_result, now_ns() + seconds_to_ns(_o.hold_seconds), true);
        command('r');
    } else if (all_up) {
        cpu_ok = _o.server_pid != 0 && read_cpu_ns(_o.server_pid, cpu_start);
        command('g');
    } else {
        command('r');
    }
    const double run_limit = _o.mode == bench_mode::hold ? 0 : _o.timeout + _o.drain_timeout + _o.seconds;
    if (!collect(report_kind::final_result, now_ns() + seconds_to_ns(run_limit + 30), false)) {
        command('r');   // deadline or signal: ask for what they have
        _signalled = false;
        collect(report_kind::final_result, now_ns() + seconds_to_ns(30), false);
    }
    std::uint64_t cpu_end = 0;
    if (cpu_ok && read_cpu_ns(_o.server_pid, cpu_end)) {
        _sum.server_cpu_ns = cpu_end - cpu_start;
        _sum.server_cpu_valid = true;
    }
    command('q');
    return finish(all_up);
}

/// Waits (bounded) for every worker to exit, then prints the result and picks the exit status.
int parent::finish(bool all_up) {
    const std::uint64_t deadline = now_ns() + seconds_to_ns(10);
    for (child_proc& c : _children) {
        // The report pipe reaches EOF when the worker exits; that is the event to wait for.
        char sink[256];
        for (;;) {
            const std::uint64_t now = now_ns();
            pollfd p{c.report, POLLIN, 0};
            if (now >= deadline || poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000 + 1)) <= 0) {
                kill(c.pid, SIGKILL);   // our own worker, stuck: end it
                break;
            }
            if (::read(c.report, sink, sizeof(sink)) <= 0) break;
        }
        int status = 0;
        waitpid(c.pid, &status, 0);
        ::close(c.report);
        ::close(c.ctrl);
        if (!c.final_seen) ++_sum.children_lost;
    }
    const child_report& t = _sum.total;
    bool ok = all_up && _sum.children_lost == 0;
    if (_o.mode == bench_mode::hold) ok = ok && t.open_at_end == _o.connections;
    else ok = ok && _sum.loss() == 0 && !t.timed_out && t.protocol_errors == 0;
    if (_o.json) print_json(_o, _sum, ok);
    else print_text(_o, _sum, ok);
    std::fflush(stdout);
    return ok ? 0 : 1;
}

}  // namespace
}  // namespace wspush::bench

int main(int argc, char** argv) {
    using namespace wspush::bench;
    for (int i = 1; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
            std::fputs(usage_text.data(), stdout);
            return 0;
        }
    }
    bench_options o;
    try {
        o = parse_options(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ws_bench_client: %s\n%s", e.what(), usage_text.data());
        return 2;
    }
    parent p(o);
    return p.run();
}
