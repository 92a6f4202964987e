/// \file options.cpp
#include "loadgen/options.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace wspush::loadgen {

const std::string_view usage_text =
    "usage: wspush-loadgen SCENARIO --url ws[s]://HOST:PORT/PATH [options]\n"
    "       wspush-loadgen SCENARIO --transport sse --url http[s]://HOST:PORT/sse [options]\n"
    "scenarios:\n"
    "  idle             hold N connections for --hold seconds; with --server-pid, its memory per connection\n"
    "  fanout           N subscribers of one topic; publish --messages, latency, loss, duplicates\n"
    "  mailboxes        one topic per connection; publishes spread round robin over them (pubsub only)\n"
    "  churn            fanout while --churn-fraction of the connections close and reopen at --churn-rate/s\n"
    "  reconnect-storm  fanout; mid-run every connection drops (--storm client) or the server is restarted\n"
    "                   by someone else (--storm server); all resume with since (sse: Last-Event-ID); time\n"
    "                   until all are back\n"
    "  slow-consumers   fanout while --slow-fraction of the connections stop reading\n"
    "options:\n"
    "  --protocol pubsub|broadcast  wspush pub/sub (default), or any server that broadcasts every text message\n"
    "  --transport ws|sse           ws (default): each connection upgrades and sends its sub; sse: each\n"
    "                               opens an event stream of its topic instead (GET PATH?topics=T, the\n"
    "                               token as for ws, Server-Sent Events; --url http[s]://HOST:PORT/sse),\n"
    "                               resumes with Last-Event-ID, and after the server's retry: comes back\n"
    "                               when it says (pubsub, publishing through the admin API)\n"
    "  --admin http://HOST:PORT     wspush admin listener, for publishing (pubsub)\n"
    "  --api-key K                  bearer key for the admin publish endpoints\n"
    "  --publish-via admin|ws       pubsub: admin POST /publish (default) or {\"op\":\"pub\"} over WebSocket\n"
    "  --jwt-secret S               mint an HS256 token per connection (topics: its topic; pub: the publisher's)\n"
    "  --connections N              connections in total (default 1000)\n"
    "  --procs P                    worker processes (default: one per 10,000 connections); open files are\n"
    "                               limited per process\n"
    "  --rate R                     connections opened per second over all processes (default: unpaced,\n"
    "                               --inflight upgrades at a time per process)\n"
    "  --inflight K                 upgrades in progress per process when unpaced (default 256)\n"
    "  --source A-B|A|none          source addresses, round robin (default 127.0.0.2-127.0.0.250 for a\n"
    "                               loopback server), so ephemeral ports do not run out\n"
    "  --messages M                 messages to publish (default 200, or publish-rate x seconds)\n"
    "  --publish-rate R             messages/s (default: as fast as the server takes them)\n"
    "  --seconds S                  publishing time with --publish-rate (default 10)\n"
    "  --publish-steps R1,R2,...    a capacity curve: publish R1 messages/s for --step-seconds, pause\n"
    "                               --step-pause seconds (what was sent is delivered meanwhile), then R2...;\n"
    "                               the result has each step's deliveries, loss, duplicates and latency\n"
    "                               (mailboxes only; replaces --publish-rate and --messages)\n"
    "  --step-seconds S, --step-pause S   each step's publishing time and the pause after it (10, 3)\n"
    "  --size BYTES                 payload size (default 64)\n"
    "  --topic T, --topic-prefix P  fanout topic (lg-fanout), mailbox topic prefix (lg-mb-)\n"
    "  --own-topics                 idle: each connection subscribes to its own topic (the topic prefix and\n"
    "                               its index), as in mailboxes\n"
    "  --own-users                  with --jwt-secret: each connection's token names its own user (sub\n"
    "                               \"u<index>\", the index its mailbox's number); without, one user for all\n"
    "  --pipeline K                 admin publish requests in flight (default 32)\n"
    "  --publish-batch B            admin: B messages per request, POST /publish/batch (default 1: POST /publish)\n"
    "  --hold S                     seconds to hold once all are up, before any publishing (default: idle 10,\n"
    "                               others 0.25: the set-up's TCP timers run out first, so the first\n"
    "                               publish does not share the server with them); an outside observer\n"
    "                               measures memory meanwhile\n"
    "  --churn-rate R, --churn-fraction F   churn (defaults 100/s, 0.5)\n"
    "  --slow-fraction F            slow-consumers (default 0.1)\n"
    "  --storm client|server, --storm-at S  reconnect-storm (default client, at half the publishing)\n"
    "  --connect-timeout S, --timeout S, --drain-timeout S   bounds (defaults 60, 120, 5)\n"    "  --attempt-timeout S          a reconnect (churn, storm) not upgraded and subscribed within S is\n"
    "                               abandoned and tried again (default 10; the first connects get\n"
    "                               --connect-timeout)\n"
    "  --server-pid PID             sample the server's memory and CPU time from /proc\n"
    "  --sample-interval S          time-series resolution (default 1)\n"
    "  --url wss://..., https://... each connection does a TLS handshake first (the certificate is not\n"
    "                               checked: it measures, it protects nothing); publish through the\n"
    "                               admin API\n"
    "  --compression                offer permessage-deflate as browsers do (client_max_window_bits) and\n"
    "                               inflate compressed messages (the head of each: what is checked)\n"
    "  --json                       print the result as one JSON object\n"
    "  --report FILE.html           write a self-contained HTML report with plots\n"
    "  --quiet, --progress          no live line / a live line even when stderr is not a terminal\n"
    "Exit status: 0 when every connection came up and nothing checked was lost or duplicated.\n";

std::string_view scenario_name(scenario s) noexcept {
  switch (s) {
    case scenario::idle: return "idle";
    case scenario::fanout: return "fanout";
    case scenario::mailboxes: return "mailboxes";
    case scenario::churn: return "churn";
    case scenario::reconnect_storm: return "reconnect-storm";
    case scenario::slow_consumers: return "slow-consumers";
  }
  return "?";
}

std::string options::topic_of(std::uint32_t global) const {
  return sc == scenario::mailboxes || own_topics ? topic_prefix + std::to_string(global) : topic;
}

bool options::topic_matches(std::uint32_t global, std::string_view t) const noexcept {
  if (sc != scenario::mailboxes && !own_topics) return t == topic;
  if (!t.starts_with(topic_prefix)) return false;
  const std::string_view digits = t.substr(topic_prefix.size());
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  return ec == std::errc{} && end == digits.data() + digits.size() && n == global;
}

namespace {

/// True for about `fraction` of all indexes, spread evenly.
bool picked(std::uint32_t global, double fraction) noexcept {
  return std::floor((global + 1) * fraction) > std::floor(global * fraction);
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

double parse_number(std::string_view name, std::string_view text, double lo, double hi) {
  double value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || ptr != end || !(value >= lo && value <= hi)) {
    fail("bad value for " + std::string(name) + ": '" + std::string(text) + "'");
  }
  return value;
}

/// "R1,R2,...": rates above 0, at most max_publish_steps of them.
std::vector<double> parse_rates(std::string_view name, std::string_view text) {
  std::vector<double> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    out.push_back(parse_number(name, text.substr(0, comma), 0.001, 1e8));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  if (out.empty() || out.size() > max_publish_steps) {
    fail(std::string(name) + " takes 1 to " + std::to_string(max_publish_steps) + " rates, comma separated");
  }
  return out;
}

in_addr parse_ipv4(std::string_view text) {
  in_addr a{};
  if (text == "localhost") text = "127.0.0.1";
  if (inet_pton(AF_INET, std::string(text).c_str(), &a) != 1) fail("not an IPv4 address: '" + std::string(text) + "'");
  return a;
}

/// HOST:PORT into an address; returns the rest of the URL after the authority.
std::string_view parse_authority(std::string_view rest, sockaddr_in& addr, std::string& host_header) {
  const auto slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  const auto colon = authority.rfind(':');
  if (colon == std::string_view::npos) fail("the URL needs an explicit port: '" + std::string(authority) + "'");
  const double port = parse_number("port", authority.substr(colon + 1), 1, 65535);
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr = parse_ipv4(authority.substr(0, colon));
  host_header = std::string(authority);
  return slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
}

scenario parse_scenario(std::string_view s) {
  if (s == "idle") return scenario::idle;
  if (s == "fanout") return scenario::fanout;
  if (s == "mailboxes") return scenario::mailboxes;
  if (s == "churn") return scenario::churn;
  if (s == "reconnect-storm") return scenario::reconnect_storm;
  if (s == "slow-consumers") return scenario::slow_consumers;
  fail("unknown scenario '" + std::string(s) + "'");
}

void apply_defaults(options& o, bool via_given) {
  if (o.url.empty()) fail("--url is required");
  if (o.procs == 0) o.procs = (o.connections + 9999) / 10000;
  if (o.procs > o.connections) o.procs = o.connections;
  if (!o.step_rates.empty()) {
    if (o.sc != scenario::mailboxes) fail("--publish-steps runs with the mailboxes scenario only");
    if (o.publish_rate > 0 || o.messages > 0) fail("--publish-steps replaces --publish-rate and --messages");
    for (std::size_t k = 0; k < o.step_rates.size(); ++k) {
      if (o.step_messages(k) == 0) fail("--publish-steps: a step of no message (raise its rate or --step-seconds)");
      o.messages += o.step_messages(k);
    }
  }
  if (o.messages == 0) o.messages = o.publish_rate > 0 ? std::llround(o.publish_rate * o.seconds) : 200;
  if (o.messages == 0) o.messages = 1;
  if (o.own_topics && o.sc != scenario::idle) fail("--own-topics runs with idle (mailboxes has them anyway)");
  if (!via_given) o.via = o.proto == protocol::broadcast ? publish_via::ws : publish_via::admin;
  const bool loopback = (ntohl(o.server.sin_addr.s_addr) >> 24) == 127;
  if (o.sources.empty() && loopback) o.sources = parse_sources("127.0.0.2-127.0.0.250");
  if (o.proto == protocol::broadcast) {
    if (o.sc == scenario::mailboxes || o.sc == scenario::reconnect_storm) {
      fail(std::string(scenario_name(o.sc)) + " needs topics and resume: it runs with --protocol pubsub only");
    }
    if (o.via == publish_via::admin) fail("--protocol broadcast publishes over WebSocket (--publish-via ws)");
  }
  if (o.proto == protocol::pubsub && o.via == publish_via::admin && o.publishes() && !o.admin_given) {
    fail("publishing through the admin API needs --admin http://HOST:PORT (or use --publish-via ws)");
  }
  if (o.transport == transport_kind::sse) {
    if (!o.url.starts_with("http")) fail("--transport sse opens event streams: --url http[s]://HOST:PORT/sse");
    if (o.proto != protocol::pubsub) fail("--transport sse needs topics: it runs with --protocol pubsub only");
    if (o.via == publish_via::ws && o.publishes())
      fail("--transport sse publishes through the admin API (--publish-via admin): a stream only reads");
    if (o.compression) fail("--compression is permessage-deflate, a WebSocket extension: not with --transport sse");
  } else if (o.url.starts_with("http")) {
    fail("an http:// URL is an event stream's: add --transport sse (or give the WebSocket's ws:// URL)");
  }
  if (o.publish_batch > 1 && o.via != publish_via::admin) fail("--publish-batch is for the admin API (--publish-via admin)");
  if (o.tls && o.via == publish_via::ws && o.publishes())
    fail("with a wss:// URL, publish through the admin API (--protocol pubsub --publish-via admin): the "
         "WebSocket publisher speaks ws:// only");
  if (o.size < 16) o.size = 16;
  if (o.hold < 0) o.hold = o.publishes() ? settle_seconds : 10;
}

}  // namespace

std::uint64_t options::step_messages(std::size_t k) const noexcept {
  return k < step_rates.size() ? static_cast<std::uint64_t>(std::llround(step_rates[k] * step_seconds)) : 0;
}

std::size_t options::step_of(std::uint64_t n) const noexcept {
  std::size_t k = 0;
  for (std::uint64_t end = step_messages(0); k + 1 < step_rates.size() && n >= end; end += step_messages(++k)) {
  }
  return k;
}

bool options::is_churner(std::uint32_t global) const noexcept {
  return sc == scenario::churn && picked(global, churn_fraction);
}

bool options::is_slow(std::uint32_t global) const noexcept {
  return sc == scenario::slow_consumers && picked(global, slow_fraction);
}

std::vector<in_addr> parse_sources(std::string_view text) {
  std::vector<in_addr> out;
  if (text == "none") return out;
  const auto dash = text.find('-');
  const in_addr first = parse_ipv4(text.substr(0, dash));
  const in_addr last = dash == std::string_view::npos ? first : parse_ipv4(text.substr(dash + 1));
  const std::uint32_t lo = ntohl(first.s_addr);
  const std::uint32_t hi = ntohl(last.s_addr);
  if (hi < lo || hi - lo > 65535) fail("bad --source range '" + std::string(text) + "'");
  for (std::uint32_t a = lo; a <= hi; ++a) out.push_back(in_addr{htonl(a)});
  return out;
}

options parse_options(int argc, char** argv) {
  if (argc < 2) fail("missing scenario");
  options o;
  o.sc = parse_scenario(argv[1]);
  bool via_given = false;
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
      if (i + 1 >= argc) fail(std::string(arg) + " needs a value");
      return argv[++i];
    };
    auto num = [&](double lo, double hi) { return parse_number(arg, take(), lo, hi); };
    if (arg == "--json") o.json = true;
    else if (arg == "--quiet") o.quiet = true;
    else if (arg == "--compression") o.compression = true;
    else if (arg == "--progress") o.progress = true;
    else if (arg == "--url") {
      const std::string_view url = take();
      const std::size_t scheme = url.find("://");
      const std::string_view name = url.substr(0, scheme);
      if (scheme == std::string_view::npos || (name != "ws" && name != "wss" && name != "http" && name != "https")) {
        fail("--url must start with ws:// or wss:// (or http:// or https:// with --transport sse)");
      }
      o.tls = name == "wss" || name == "https";
      const std::string_view path = parse_authority(url.substr(scheme + 3), o.server, o.host_header);
      o.path = path.empty() ? "/" : std::string(path);
      o.url = std::string(url);
    } else if (arg == "--admin") {
      std::string_view url = take();
      if (!url.starts_with("http://")) fail("--admin must start with http://");
      parse_authority(url.substr(7), o.admin, o.admin_host);
      o.admin_given = true;
    } else if (arg == "--protocol") {
      const std::string_view p = take();
      if (p == "pubsub") o.proto = protocol::pubsub;
      else if (p == "broadcast") o.proto = protocol::broadcast;
      else fail("--protocol is pubsub or broadcast");
    } else if (arg == "--publish-via") {
      const std::string_view p = take();
      if (p == "admin") o.via = publish_via::admin;
      else if (p == "ws") o.via = publish_via::ws;
      else fail("--publish-via is admin or ws");
      via_given = true;
    } else if (arg == "--transport") {
      const std::string_view p = take();
      if (p == "ws") o.transport = transport_kind::ws;
      else if (p == "sse") o.transport = transport_kind::sse;
      else fail("--transport is ws or sse");
    } else if (arg == "--storm") {
      const std::string_view p = take();
      if (p == "client") o.storm = storm_kind::client;
      else if (p == "server") o.storm = storm_kind::server;
      else fail("--storm is client or server");
    } else if (arg == "--api-key") o.api_key = take();
    else if (arg == "--jwt-secret") o.jwt_secret = take();
    else if (arg == "--token-ttl") o.token_ttl = num(1, 1e9);
    else if (arg == "--topic") o.topic = take();
    else if (arg == "--topic-prefix") o.topic_prefix = take();
    else if (arg == "--own-topics") o.own_topics = true;
    else if (arg == "--own-users") o.own_users = true;
    else if (arg == "--connections") o.connections = static_cast<std::uint32_t>(num(1, 1e7));
    else if (arg == "--procs") o.procs = static_cast<std::uint32_t>(num(1, 1024));
    else if (arg == "--rate") o.connect_rate = num(0, 1e7);
    else if (arg == "--inflight") o.inflight = static_cast<std::uint32_t>(num(1, 65536));
    else if (arg == "--source") o.sources = parse_sources(take());
    else if (arg == "--messages") o.messages = static_cast<std::uint64_t>(num(1, 1e10));
    else if (arg == "--publish-rate") o.publish_rate = num(0, 1e8);
    else if (arg == "--seconds") o.seconds = num(0.001, 1e6);
    else if (arg == "--publish-steps") o.step_rates = parse_rates(arg, take());
    else if (arg == "--step-seconds") o.step_seconds = num(0.001, 1e6);
    else if (arg == "--step-pause") o.step_pause = num(0, 1e6);
    else if (arg == "--size") o.size = static_cast<std::uint32_t>(num(16, 1 << 24));
    else if (arg == "--pipeline") o.pipeline = static_cast<std::uint32_t>(num(1, 4096));
    else if (arg == "--publish-batch") o.publish_batch = static_cast<std::uint32_t>(num(1, 1000));
    else if (arg == "--hold") o.hold = num(0, 1e7);
    else if (arg == "--churn-rate") o.churn_rate = num(0, 1e6);
    else if (arg == "--churn-fraction") o.churn_fraction = num(0, 1);
    else if (arg == "--slow-fraction") o.slow_fraction = num(0, 1);
    else if (arg == "--storm-at") o.storm_at = num(0, 1e6);
    else if (arg == "--connect-timeout") o.connect_timeout = num(0.001, 1e6);
    else if (arg == "--attempt-timeout") o.attempt_timeout = num(0.001, 1e6);
    else if (arg == "--timeout") o.timeout = num(0.001, 1e6);
    else if (arg == "--drain-timeout") o.drain_timeout = num(0.001, 1e6);
    else if (arg == "--sample-interval") o.sample_interval = num(0.05, 3600);
    else if (arg == "--server-pid") o.server_pid = static_cast<int>(num(1, 1 << 30));
    else if (arg == "--report") o.report = take();
    else fail("unknown option '" + std::string(arg) + "'");
  }
  apply_defaults(o, via_given);
  return o;
}

}  // namespace wspush::loadgen
