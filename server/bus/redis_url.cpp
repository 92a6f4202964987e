#include "server/bus/redis_url.hpp"

#include <cctype>
#include <stdexcept>

namespace wspush::server::bus {

namespace {

[[noreturn]] void bad(std::string_view url, const std::string& why) {
  throw std::invalid_argument("--bus " + std::string(url) + ": " + why +
                              " (expected redis[s]://[[user]:password@]host:port[/db], e.g. redis://127.0.0.1:6379/0)");
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// A user name or password as the URL writes it: %XX stands for a byte (so that ':', '@' and
/// '/' can be in a password).
std::string unescape(std::string_view url, std::string_view s) {
  std::string out;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '%') {
      out += s[k];
      continue;
    }
    const int hi = k + 2 < s.size() ? hex_digit(s[k + 1]) : -1, lo = k + 2 < s.size() ? hex_digit(s[k + 2]) : -1;
    if (hi < 0 || lo < 0) bad(url, "a '%' in the credentials must be followed by two hex digits");
    out += char(hi * 16 + lo);
    k += 2;
  }
  return out;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::string redis_target::describe() const {
  if (host.empty()) return std::string(tls ? "rediss://" : "redis://") + "(the master the Sentinels name)";
  const bool v6 = host.find(':') != std::string::npos;
  const std::string creds = password.empty() ? (user.empty() ? "" : user + "@") : user + ":***@";
  return (tls ? "rediss://" : "redis://") + creds + (v6 ? "[" + host + "]" : host) + ":" +
         std::to_string(port) + "/" + std::to_string(db);
}

std::string_view refusal_hint(std::string_view e) noexcept {
  if (e.starts_with("NOAUTH") || e.find("unauthenticated") != std::string_view::npos)
    return "; Redis wants a password: give it in the URL (redis://[user]:password@host:port) or with "
           "--redis-password-file";
  if (e.starts_with("WRONGPASS"))
    return "; the user name or password is wrong, or the ACL user is off";
  if (e.starts_with("NOPERM"))
    return "; the ACL user lacks a right the node needs (docs/REDIS.md lists the rule)";
  return {};
}

redis_target parse_redis_url(std::string_view url, std::uint16_t default_port) {
  redis_target t;
  t.port = default_port;
  std::string_view rest;
  if (url.substr(0, 8) == "redis://") {
    rest = url.substr(8);
  } else if (url.substr(0, 9) == "rediss://") {
    rest = url.substr(9);
    t.tls = true;
  } else {
    bad(url, "the scheme must be redis:// (or rediss://, over TLS)");
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auth.empty()) bad(url, "nothing before '@': give user:password, :password or user");
    const auto colon = auth.find(':');
    t.user = unescape(url, auth.substr(0, colon));
    if (colon != std::string_view::npos) {
      t.password = unescape(url, auth.substr(colon + 1));
      if (t.password.empty()) bad(url, "the password after ':' is empty");
    }
  }
  std::string_view hostport = rest, db;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (!all_digits(db) || db.size() > 2 || std::stoul(std::string(db)) > 15) bad(url, "the database must be 0..15");
      t.db = unsigned(std::stoul(std::string(db)));
    }
  }
  std::string_view host, port;
  if (!hostport.empty() && hostport.front() == '[') {
    const auto close = hostport.find(']');
    if (close == std::string_view::npos) bad(url, "an IPv6 address needs its closing ]");
    host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size()) {
      if (hostport[close + 1] != ':') bad(url, "a port must follow ]:");
      port = hostport.substr(close + 2);
    }
  } else {
    const auto colon = hostport.rfind(':');
    host = colon == std::string_view::npos ? hostport : hostport.substr(0, colon);
    if (colon != std::string_view::npos) port = hostport.substr(colon + 1);
  }
  if (host.empty()) bad(url, "the host is missing");
  for (char c : host)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '?' || c == '#') bad(url, "the host is malformed");
  t.host = std::string(host);
  if (!port.empty()) {
    if (!all_digits(port) || port.size() > 5 || std::stoul(std::string(port)) == 0 || std::stoul(std::string(port)) > 65535)
      bad(url, "the port must be 1..65535");
    t.port = std::uint16_t(std::stoul(std::string(port)));
  }
  return t;
}

bus_spec parse_bus_spec(std::string_view value) {
  bus_spec spec;
  for (const std::string_view scheme : {"redis-sentinel://", "rediss-sentinel://"}) {
    if (value.substr(0, scheme.size()) != scheme) continue;
    const bool tls = scheme[5] == 's';
    spec.kind = bus_spec::sentinel;
    std::string_view rest = value.substr(scheme.size());
    // The master's name is after the last '/' (a '/' in a password is written %2F).
    const auto slash = rest.rfind('/');
    if (slash == std::string_view::npos || slash + 1 == rest.size())
      throw std::invalid_argument("--bus " + std::string(value) + ": name the master after the Sentinels: " +
                                  std::string(scheme) + "host:port[,host:port...]/MASTER_NAME");
    spec.master_name = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    std::string auth;
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
      auth = std::string(rest.substr(0, at + 1));
      rest = rest.substr(at + 1);
    }
    if (rest.find('/') != std::string_view::npos)
      throw std::invalid_argument("--bus " + std::string(value) + ": a Sentinel has no database (no /db before /MASTER_NAME)");
    if (rest.empty()) throw std::invalid_argument("--bus " + std::string(value) + ": name at least one Sentinel host:port");
    for (std::size_t from = 0; from <= rest.size();) {
      const auto comma = rest.find(',', from);
      const std::string_view one = rest.substr(from, comma == std::string_view::npos ? std::string_view::npos : comma - from);
      if (one.empty()) throw std::invalid_argument("--bus " + std::string(value) + ": an empty Sentinel in the list (a comma too many)");
      redis_target t = parse_redis_url((tls ? "rediss://" : "redis://") + std::string(one), 26379);  // Sentinel's port
      spec.sentinels.push_back(std::move(t));
      if (comma == std::string_view::npos) break;
      from = comma + 1;
    }
    // The master: its credentials and TLS; its address comes from the Sentinels.
    redis_target m = parse_redis_url((tls ? "rediss://" : "redis://") + auth + "sentinel-master");
    m.host.clear();
    m.port = 0;
    spec.targets.push_back(std::move(m));
    return spec;
  }
  constexpr std::string_view cluster = "redis-cluster://", tls_cluster = "rediss-cluster://";
  const bool over_tls = value.substr(0, tls_cluster.size()) == tls_cluster;
  if (over_tls || value.substr(0, cluster.size()) == cluster) {
    spec.kind = bus_spec::cluster;
    std::string_view rest = value.substr(over_tls ? tls_cluster.size() : cluster.size());
    std::string auth;
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
      auth = std::string(rest.substr(0, at + 1));
      rest = rest.substr(at + 1);
    }
    if (rest.empty()) throw std::invalid_argument("--bus " + std::string(value) + ": name at least one seed node host:port");
    for (std::size_t from = 0; from <= rest.size();) {
      const auto comma = rest.find(',', from);
      const std::string_view seed = rest.substr(from, comma == std::string_view::npos ? std::string_view::npos : comma - from);
      if (seed.empty())
        throw std::invalid_argument("--bus " + std::string(value) + ": an empty seed in the list (a comma too many)");
      if (seed.find('/') != std::string_view::npos)
        throw std::invalid_argument("--bus " + std::string(value) + ": a cluster has no databases (no /db on a seed)");
      spec.targets.push_back(parse_redis_url((over_tls ? "rediss://" : "redis://") + auth + std::string(seed)));
      if (comma == std::string_view::npos) break;
      from = comma + 1;
    }
  } else {
    for (std::size_t from = 0; from <= value.size();) {
      const auto comma = value.find(',', from);
      const std::string_view url = value.substr(from, comma == std::string_view::npos ? std::string_view::npos : comma - from);
      if (url.empty() && !value.empty())
        throw std::invalid_argument("--bus " + std::string(value) + ": an empty element in the list (a comma too many)");
      spec.targets.push_back(parse_redis_url(url));
      if (comma == std::string_view::npos) break;
      from = comma + 1;
    }
    spec.kind = spec.targets.size() > 1 ? bus_spec::shards : bus_spec::single;
  }
  for (std::size_t a = 0; a < spec.targets.size(); ++a)
    for (std::size_t b = a + 1; b < spec.targets.size(); ++b)
      if (spec.targets[a].host == spec.targets[b].host && spec.targets[a].port == spec.targets[b].port &&
          spec.targets[a].db == spec.targets[b].db)
        throw std::invalid_argument("--bus " + std::string(value) + ": " + spec.targets[a].describe() +
                                    " is named twice (each shard is its own Redis)");
  return spec;
}

}  // namespace wspush::server::bus
