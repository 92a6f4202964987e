/// \file main.cpp
/// wspush-loadgen: the parent process. Checks what can be checked before starting (the server
/// answers, the open-files limit, the source addresses), forks --procs workers and a publisher,
/// drives the phases (connect → go → publish → drain → report) over pipes, merges the
/// children's samples into totals, histograms and a time series, and prints the result.

#include "loadgen/options.hpp"
#include "loadgen/probe.hpp"
#include "loadgen/publisher.hpp"
#include "loadgen/report.hpp"
#include "loadgen/results.hpp"
#include "loadgen/sys.hpp"
#include "loadgen/worker.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <stdexcept>

namespace wspush::loadgen {
namespace {

struct child_proc {
  pid_t pid = -1;
  int ctrl = -1;     ///< parent → child commands
  int report = -1;   ///< child → parent messages
  std::string buf;   ///< bytes of an incomplete message
  bool gone = false;
};

/// Blocking connect with a timeout; 0 or the errno.
int probe_connect(const sockaddr_in& to, int timeout_ms) {
  const int fd = start_connect(to, nullptr);
  if (fd < 0) return -fd;
  pollfd p{fd, POLLOUT, 0};
  int err = ETIMEDOUT;
  if (::poll(&p, 1, timeout_ms) > 0) {
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  }
  ::close(fd);
  return err;
}

std::string addr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

class parent {
public:
  explicit parent(const options& o)
      : _o(o), _nchildren(o.procs + (o.publishes() ? 1 : 0)), _agg(_nchildren, o.sample_interval) {}
  int run();

private:
  void preflight() const;
  void take_signals();
  void connect_phase(run_result& r);
  std::uint64_t publish_phase();
  bool spawn();
  void command(char c, bool workers, bool pub);
  void pump(int timeout_ms);
  void read_child(std::uint32_t k);
  bool wait_until(const std::function<bool()>& done, double seconds);
  [[nodiscard]] counters workers_total() const;
  void progress(bool last);
  void judge(run_result& r, std::uint64_t ready_at_go) const;
  int finish(run_result& r);

  const options& _o;
  std::uint32_t _nchildren;
  aggregate _agg;
  std::vector<child_proc> _children;
  std::uint64_t _start_ns = 0;
  std::uint64_t _last_progress_ns = 0;
  std::uint64_t _last_deliveries = 0;
  std::uint64_t _last_ready = 0;     ///< progress(): ready at the previous line, and when
  std::uint64_t _last_ready_ns = 0;
  std::uint64_t _last_change_ns = 0;
  int _sigfd = -1;
  bool _signalled = false;
  bool _live = false;
};

/// Fails early, with the fix, on what would otherwise show up as thousands of errors.
void parent::preflight() const {
  if (const int e = probe_connect(_o.server, 3000); e != 0) {
    throw std::runtime_error("server unreachable at " + addr_text(_o.server) + ": " + std::strerror(e) +
                             " (is it running? check --url)");
  }
  if (_o.publishes() && _o.via == publish_via::admin) {
    if (const int e = probe_connect(_o.admin, 3000); e != 0) {
      throw std::runtime_error("admin API unreachable at " + addr_text(_o.admin) + ": " + std::strerror(e) +
                               " (check --admin)");
    }
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  const std::uint64_t per_proc = (_o.connections + _o.procs - 1) / _o.procs + 64;
  if (per_proc > lim.rlim_cur && per_proc <= lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, per_proc + 1024);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (per_proc > lim.rlim_cur) {
    const std::uint64_t room = lim.rlim_max > 128 ? lim.rlim_max - 64 : 1;
    throw std::runtime_error("open-files limit: each worker would hold " + std::to_string(per_proc) +
                             " sockets but may open " + std::to_string(lim.rlim_cur) + " (hard limit " +
                             std::to_string(lim.rlim_max) + "); fix: --procs " +
                             std::to_string((_o.connections + room - 1) / room) + " or raise `ulimit -n`");
  }
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  std::uint64_t lo = 32768, hi = 60999;
  range >> lo >> hi;
  const std::uint64_t capacity = std::max<std::size_t>(_o.sources.size(), 1) * (hi - lo + 1);
  if (_o.connections > capacity) {
    throw std::runtime_error("address range exhausted: " + std::to_string(_o.connections) + " connections need more than " +
                             std::to_string(capacity) + " source ports (" + std::to_string(std::max<std::size_t>(_o.sources.size(), 1)) +
                             " addresses x " + std::to_string(hi - lo + 1) + " ports); fix: widen --source (e.g. 127.0.0.2-127.0.0.250)");
  }
}

bool parent::spawn() {
  std::uint32_t first = 0;
  for (std::uint32_t k = 0; k < _nchildren; ++k) {
    const bool is_pub = k == _o.procs;
    const std::uint32_t count = is_pub ? 0 : _o.connections / _o.procs + (k < _o.connections % _o.procs ? 1 : 0);
    int ctrl[2], rep[2];
    if (pipe2(ctrl, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0) return false;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      // Child: the parent stops us over the pipe; die with it; never on a terminal signal.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      std::signal(SIGINT, SIG_IGN);
      std::signal(SIGTERM, SIG_IGN);
      std::signal(SIGPIPE, SIG_IGN);
      if (getppid() == 1) _exit(2);
      for (const child_proc& c : _children) {
        ::close(c.ctrl);
        ::close(c.report);
      }
      ::close(ctrl[1]);
      ::close(rep[0]);
      int code = 2;
      if (is_pub) {
        publisher p(_o, k, ctrl[0], rep[1]);
        code = p.run();
      } else {
        worker w(_o, k, first, count, ctrl[0], rep[1]);
        code = w.run();
      }
      _exit(code);
    }
    ::close(ctrl[0]);
    ::close(rep[1]);
    fcntl(rep[0], F_SETFL, O_NONBLOCK);
    _children.push_back(child_proc{pid, ctrl[1], rep[0], {}, false});
    first += count;
  }
  return true;
}

void parent::command(char c, bool workers, bool pub) {
  for (std::uint32_t k = 0; k < _children.size(); ++k) {
    const bool is_pub = k == _o.procs;
    if ((is_pub ? pub : workers) && !_children[k].gone && ::write(_children[k].ctrl, &c, 1) != 1) {
      _children[k].gone = true;
    }
  }
}

void parent::read_child(std::uint32_t k) {
  child_proc& c = _children[k];
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(c.report, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      c.gone = true;
      break;
    }
    c.buf.append(buf, static_cast<std::size_t>(n));
  }
  child_msg m;
  std::size_t off = 0;
  for (;;) {
    const auto rest = std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(c.buf.data()) + off,
                                                    c.buf.size() - off);
    const std::size_t len = frame_size(rest);
    if (len == 0) break;
    if (decode_msg(rest.first(len), m)) _agg.on_msg(m);
    off += len;
  }
  c.buf.erase(0, off);
}

void parent::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({_sigfd, POLLIN, 0});
  for (const child_proc& c : _children) fds.push_back({c.gone ? -1 : c.report, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), timeout_ms) > 0) {
    if (fds[0].revents) {
      signalfd_siginfo info{};
      if (::read(_sigfd, &info, sizeof(info)) > 0) _signalled = true;
    }
    for (std::uint32_t k = 0; k < _children.size(); ++k) {
      if (fds[k + 1].revents) read_child(k);
    }
  }
  const std::uint64_t now = now_ns();
  const std::uint64_t delivered = _agg.totals()[ctr::deliveries];
  if (delivered != _last_deliveries) {
    _last_deliveries = delivered;
    _last_change_ns = now;
  }
  if (now - _last_progress_ns >= 1'000'000'000ull) progress(false);
}

/// Pumps until `done` says so, the time is up, a signal came, or every child is gone.
bool parent::wait_until(const std::function<bool()>& done, double seconds) {
  const std::uint64_t deadline = now_ns() + seconds_to_ns(seconds);
  while (!done()) {
    const std::uint64_t now = now_ns();
    bool any = false;
    for (const child_proc& c : _children) any = any || !c.gone;
    if (now >= deadline || _signalled || !any) return false;
    pump(static_cast<int>(std::min<std::uint64_t>((deadline - now) / 1'000'000 + 1, 250)));
  }
  return true;
}

counters parent::workers_total() const {
  counters t{};
  for (std::uint32_t k = 0; k < _o.procs; ++k) t.add(_agg.latest(k));
  return t;
}

void parent::progress(bool last) {
  _last_progress_ns = now_ns();
  if (!_live) return;
  const counters t = _agg.totals();
  const histogram& h = _agg.latency();
  const double el = static_cast<double>(_last_progress_ns - _start_ns) / 1e9;
  // Connections up per second since the last line, and the failures by cause (the counters'
  // names, without "err_"), so a stalled connect says why while it happens.
  const double dt = static_cast<double>(_last_progress_ns - _last_ready_ns) / 1e9;
  const double rate = _last_ready_ns != 0 && dt > 0 && t[ctr::ready] >= _last_ready
                          ? static_cast<double>(t[ctr::ready] - _last_ready) / dt : 0;
  _last_ready = t[ctr::ready];
  _last_ready_ns = _last_progress_ns;
  std::string causes;
  for (std::size_t k = static_cast<std::size_t>(ctr::err_refused); k <= static_cast<std::size_t>(ctr::http_other); ++k) {
    const std::uint64_t v = t.v[k];
    if (v == 0) continue;
    std::string_view name = ctr_names[k];
    if (name.substr(0, 4) == "err_") name.remove_prefix(4);
    causes += (causes.empty() ? " (" : ", ") + std::string(name) + " " + std::to_string(v);
  }
  if (!causes.empty()) causes += ")";
  std::fprintf(stderr, "\r[%6.1fs] open %llu/%u ready %llu (%.0f/s) errors %llu%s | sent %llu delivered %llu loss-so-far %llu | "
               "p50 %.2f p99 %.2f max %.2f ms   %s",
               el, static_cast<unsigned long long>(t[ctr::open]), _o.connections,
               static_cast<unsigned long long>(t[ctr::ready]), rate, static_cast<unsigned long long>(t.connect_errors()),
               causes.c_str(),
               static_cast<unsigned long long>(t[ctr::sent]), static_cast<unsigned long long>(t[ctr::deliveries]),
               static_cast<unsigned long long>(t[ctr::expected] > t[ctr::unique] && t[ctr::sent] >= _o.messages ? t.loss() : 0),
               static_cast<double>(h.quantile(0.5)) / 1e6, static_cast<double>(h.quantile(0.99)) / 1e6,
               static_cast<double>(h.max()) / 1e6, last ? "\n" : "");
  std::fflush(stderr);
}

/// Signals arrive on a signalfd (the loop waits on it with the pipes); SIGPIPE is ignored.
void parent::take_signals() {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGINT);
  sigprocmask(SIG_BLOCK, &term, nullptr);
  _sigfd = signalfd(-1, &term, SFD_CLOEXEC);
  std::signal(SIGPIPE, SIG_IGN);
}

/// Connect phase: every worker says when its connections are up (or failed); the publisher
/// when it is connected.
void parent::connect_phase(run_result& r) {
  wait_until([&] {
    for (std::uint32_t k = 0; k < _o.procs; ++k) {
      if (_agg.latest(k).connect_done_ns == 0 && !_children[k].gone) return false;
    }
    return !_o.publishes() || _agg.latest(_o.procs)[ctr::publisher_ready] != 0 || _agg.is_final(_o.procs);
  }, _o.connect_timeout + 10);
  const std::uint64_t connect_done = workers_total().connect_done_ns;
  r.connect_s = connect_done > _start_ns ? static_cast<double>(connect_done - _start_ns) / 1e9 : 0;
}

/// Publishing phase: workers go, then the publisher; then the drain, until every checked
/// connection has everything (and, in a storm, all are back), or nothing has arrived for
/// --drain-timeout. Returns how many connections were ready at the go.
std::uint64_t parent::publish_phase() {
  const std::uint64_t ready_at_go = workers_total()[ctr::ready];
  command('g', true, false);
  wait_until([&] { return workers_total()[ctr::going] == _o.procs; }, 10);
  command('g', false, true);
  wait_until([&] { return _agg.is_final(_o.procs); }, _o.timeout + 10);
  // The drain's quiet window starts when publishing ends at the latest: after a long connect
  // phase the last delivery (none yet) is long past, and the drain must not end at once.
  _last_change_ns = std::max(_last_change_ns, now_ns());
  const double storm_grace = _o.sc == scenario::reconnect_storm ? _o.connect_timeout : 0;
  wait_until([&] {
    const counters t = workers_total();
    const bool all = t[ctr::unique] >= t[ctr::expected] && (_o.sc != scenario::reconnect_storm || t[ctr::ready] >= ready_at_go);
    const bool quiet = now_ns() - _last_change_ns > seconds_to_ns(_o.drain_timeout + storm_grace);
    return all || quiet;
  }, _o.timeout);
  return ready_at_go;
}

int parent::run() {
  preflight();
  take_signals();
  _live = !_o.quiet && (_o.progress || isatty(STDERR_FILENO));
  run_result r;
  r.o = &_o;
  r.started_utc = utc_now();
  r.before = read_proc(_o.server_pid);
  _start_ns = now_ns();
  _last_change_ns = _start_ns;
  if (!spawn()) {
    command('q', true, true);
    throw std::runtime_error(std::string("cannot start worker processes: ") + std::strerror(errno));
  }
  connect_phase(r);
  if (_o.hold > 0) wait_until([] { return false; }, _o.hold);  // hold, then read the server's memory
  r.loaded = read_proc(_o.server_pid);
  r.held = workers_total()[ctr::open];
  const std::uint64_t ready_at_go = _o.publishes() ? publish_phase() : 0;
  r.end = read_proc(_o.server_pid);
  command('r', true, true);
  _signalled = false;
  wait_until([&] { return _agg.finished() == _nchildren; }, 30);
  progress(true);
  judge(r, ready_at_go);
  return finish(r);
}

/// Lists what makes the run fail, each with its likely cause.
void parent::judge(run_result& r, std::uint64_t ready_at_go) const {
  const counters t = _agg.totals();
  r.totals = t;
  auto& p = r.problems;
  const counters w = workers_total();
  if (_agg.finished() != _nchildren) p.push_back(std::to_string(_nchildren - _agg.finished()) + " processes never reported");
  const std::uint64_t initial_failures = ready_at_go ? _o.connections - std::min<std::uint64_t>(ready_at_go, _o.connections)
                                                     : _o.connections - std::min<std::uint64_t>(r.held, _o.connections);
  if (initial_failures > 0) {
    std::string why = std::to_string(initial_failures) + " of " + std::to_string(_o.connections) + " connections did not come up";
    if (t[ctr::err_refused]) why += "; connection refused: is the server running at " + _o.url + "?";
    if (t[ctr::err_too_many_files]) why += "; open-files limit hit: raise --procs (each process holds up to ~19,000) or ulimit -n";
    if (t[ctr::err_addr_not_avail]) why += "; source addresses exhausted: widen --source";
    if (t[ctr::http_401]) why += "; upgrades refused with 401: wrong or missing --jwt-secret";
    if (t[ctr::http_503]) why += "; upgrades refused with 503: server at --max-connections";
    if (t[ctr::http_other]) why += "; upgrade refused with HTTP " + std::to_string(t.first_status);
    if (t[ctr::err_deadline]) why += "; some not upgraded within --connect-timeout";
    if (_o.proto == protocol::pubsub && t[ctr::connected] > 0 && t[ctr::ready] == 0) {
      why += "; upgraded but never subscribed: is the server in pubsub mode? (--protocol broadcast for a broadcast server)";
    }
    p.push_back(why);
  }
  if (_o.publishes()) {
    const counters& pub = _agg.latest(_o.procs);
    if (pub[ctr::publisher_ready] == 0) p.push_back("the publisher could not connect (admin API or WebSocket refused it)");
    if (pub[ctr::sent] < _o.messages) p.push_back("published " + std::to_string(pub[ctr::sent]) + " of " + std::to_string(_o.messages) + " messages within --timeout");
    if (pub[ctr::publish_unknown]) {
      p.push_back(std::to_string(pub[ctr::publish_unknown]) +
                  " publishes answered 504: the bus took them and did not answer in time (they may or may not arrive)");
    }
    if (pub[ctr::publish_errors]) {
      std::string why = std::to_string(pub[ctr::publish_errors]) + " publishes refused or unanswered";
      if (pub.first_status != 0) why += " (first status " + std::to_string(pub.first_status) + ")";
      if (_o.via == publish_via::ws && _o.proto == protocol::pubsub) {
        why += "; over WebSocket the server needs --jwt-secret with a pub grant or --auth=none --allow-client-publish";
      }
      p.push_back(why);
    }
    if (w.loss()) p.push_back("loss: " + std::to_string(w.loss()) + " of " + std::to_string(w[ctr::expected]) + " deliveries missing");
    if (w[ctr::duplicates] || w[ctr::stale]) p.push_back("duplicates: " + std::to_string(w[ctr::duplicates] + w[ctr::stale]));
  }
  if (t[ctr::protocol_errors]) p.push_back(std::to_string(t[ctr::protocol_errors]) + " malformed frames from the server");
  if (_o.sc == scenario::reconnect_storm) {
    r.storm_left = ready_at_go > w[ctr::ready] ? ready_at_go - w[ctr::ready] : 0;
    if (w.storm_start_ns && w.storm_back_ns >= w.storm_start_ns && r.storm_left == 0) {
      r.storm_back_s = static_cast<double>(w.storm_back_ns - w.storm_start_ns) / 1e9;
    }
    if (w.storm_start_ns == 0) p.push_back("no storm happened (nothing dropped the connections)");
    if (r.storm_left) p.push_back(std::to_string(r.storm_left) + " connections not back after the storm");
  }
  const std::uint64_t first = w.first_send_ns ? w.first_send_ns : t.first_send_ns;
  if (first && t.last_delivery_ns > first) r.publish_s = static_cast<double>(t.last_delivery_ns - first) / 1e9;
  if (first && w.connect_done_ns && first >= w.connect_done_ns) r.settle_s = static_cast<double>(first - w.connect_done_ns) / 1e9;
}

int parent::finish(run_result& r) {
  r.latency = &_agg.latency();
  r.connect = &_agg.connect();
  r.timeline = _agg.timeline();
  static const histogram none;
  for (std::size_t k = 0; k < _o.step_rates.size(); ++k) {
    step_result st;
    st.rate = _o.step_rates[k];
    st.messages = _o.step_messages(k);
    st.latency = &none;
    if (k < _agg.steps().size()) {
      const step_total& t = _agg.steps()[k];
      st.sent = t.c[ctr::sent];
      st.expected = t.c[ctr::expected];
      st.delivered = t.c[ctr::unique];
      st.duplicates = t.c[ctr::duplicates];
      st.first_send_ns = t.c.first_send_ns;
      st.last_send_ns = t.c.last_send_ns;
      st.latency = t.latency.get();
    }
    r.steps.push_back(st);
  }
  command('q', true, true);
  const std::uint64_t deadline = now_ns() + seconds_to_ns(10);
  for (child_proc& c : _children) {
    int status = 0;
    while (waitpid(c.pid, &status, WNOHANG) == 0) {
      if (now_ns() >= deadline) {
        kill(c.pid, SIGKILL);   // our own child, stuck: end it
        waitpid(c.pid, &status, 0);
        break;
      }
      pollfd p{c.report, POLLIN, 0};
      ::poll(&p, 1, 20);
      char sink[4096];
      while (::read(c.report, sink, sizeof(sink)) > 0) {
      }
    }
    ::close(c.report);
    ::close(c.ctrl);
  }
  if (_o.json) print_json(stdout, r);
  else print_text(stdout, r);
  std::fflush(stdout);
  if (!_o.report.empty() && !write_html(_o.report, r)) {
    std::fprintf(stderr, "wspush-loadgen: cannot write %s: %s\n", _o.report.c_str(), std::strerror(errno));
    return 2;
  }
  return r.ok() ? 0 : 1;
}

}  // namespace
}  // namespace wspush::loadgen

int main(int argc, char** argv) {
  using namespace wspush::loadgen;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(usage_text.data(), stdout);
      return 0;
    }
  }
  try {
    const options o = parse_options(argc, argv);
    parent p(o);
    return p.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wspush-loadgen: %s\n", e.what());
    return 2;
  }
}
