#pragma once
// Helpers for the admin tests: a publish sink that records its calls, and a blocking HTTP
// client over a real loopback socket that reads responses one at a time.

#include <atomic>
#include <cctype>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/admin/admin_api.hpp"

namespace wspush::test {

/// Topics starting "down" answer unavailable, "deny" answer bad_request "forbidden"; others
/// get ids 1, 2, 3...
struct recording_sink : server::publish_sink {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> calls;
  std::vector<std::string> keys;  // each call's idempotency key ("": none)
  int batches = 0;
  int next_id = 0;
  std::string id;

  server::publish_outcome publish(std::string_view topic, std::string_view data, std::string_view key) noexcept override {
    std::lock_guard lock(mu);
    calls.emplace_back(topic, data);
    keys.emplace_back(key);
    if (topic.substr(0, 4) == "down") return {server::publish_outcome::unavailable, {}};
    if (topic.substr(0, 4) == "deny") return {server::publish_outcome::bad_request, "forbidden"};
    id = "k3f9:" + std::to_string(++next_id);
    return {server::publish_outcome::ok, id};
  }
  void end_batch() noexcept override {
    std::lock_guard lock(mu);
    ++batches;
  }
  int batch_count() {
    std::lock_guard lock(mu);
    return batches;
  }
  std::vector<std::pair<std::string, std::string>> snapshot() {
    std::lock_guard lock(mu);
    return calls;
  }
};

/// A sink that answers later, as the Redis bus does: topics starting "now" are answered ok at
/// once, others `pending` until the test settles them (from its own thread, as the bus thread
/// would). A pending publish the admin API gives up on is timeout, or unavailable for topics
/// starting "unsent" (it never left).
struct deferred_sink : server::publish_sink {
  std::mutex mu;
  struct entry {
    std::uint64_t ticket;
    std::string topic;
    bool settled = false, collected = false;
    server::publish_outcome::kind_t kind = server::publish_outcome::ok;
  };
  std::vector<entry> entries;
  server::publish_notify notify;
  std::string text;
  std::atomic<bool> is_stalled{false};

  server::publish_outcome publish(std::string_view topic, std::string_view, std::string_view) noexcept override {
    std::lock_guard lock(mu);
    if (topic.substr(0, 3) == "now") return {server::publish_outcome::ok, "k3f9:now"};
    entries.push_back({entries.size() + 1, std::string(topic)});
    return {server::publish_outcome::pending, {}, entries.size()};
  }
  void set_notify(server::publish_notify n) noexcept override {
    std::lock_guard lock(mu);
    notify = std::move(n);
  }
  server::publish_outcome collect(std::uint64_t ticket) noexcept override {
    std::lock_guard lock(mu);
    entry& e = entries.at(ticket - 1);
    e.collected = true;
    if (!e.settled) return {e.topic.substr(0, 6) == "unsent" ? server::publish_outcome::unavailable
                                                              : server::publish_outcome::timeout, {}};
    text = "k3f9:" + std::to_string(ticket);
    return {e.kind, e.kind == server::publish_outcome::ok ? std::string_view(text) : std::string_view{}};
  }
  bool stalled() const noexcept override { return is_stalled.load(); }

  /// Settles every pending publish not settled yet, as `kind`, and tells the admin thread.
  void settle_all(server::publish_outcome::kind_t kind = server::publish_outcome::ok) {
    std::vector<std::uint64_t> done;
    server::publish_notify n;
    {
      std::lock_guard lock(mu);
      for (entry& e : entries)
        if (!e.settled) e.settled = true, e.kind = kind, done.push_back(e.ticket);
      n = notify;
    }
    n(done);
  }
  /// Settles one pending publish (tickets count from 1 in the order the sink saw them).
  void settle(std::uint64_t ticket, server::publish_outcome::kind_t kind = server::publish_outcome::ok) {
    server::publish_notify n;
    {
      std::lock_guard lock(mu);
      entry& e = entries.at(ticket - 1);
      e.settled = true;
      e.kind = kind;
      n = notify;
    }
    n(std::span<const std::uint64_t>(&ticket, 1));
  }
  std::size_t published_count() {
    std::lock_guard lock(mu);
    return entries.size();
  }
  std::size_t pending_count() {
    std::lock_guard lock(mu);
    std::size_t k = 0;
    for (const entry& e : entries) k += !e.settled && !e.collected;
    return k;
  }
  std::size_t collected_count() {
    std::lock_guard lock(mu);
    std::size_t k = 0;
    for (const entry& e : entries) k += e.collected;
    return k;
  }
};

/// Spins (yielding) until `cond` holds, for at most a 10 s safety timeout: false if it never did.
/// For what another thread does on its own time (the admin thread taking a request).
template <class F>
bool eventually(F cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

struct http_response {
  int status = 0;  // 0: no complete response (closed or timed out)
  std::map<std::string, std::string> headers;  // names lower case
  std::string body;
};

/// A blocking client. Every read has a 10 s safety timeout: a test that hits it fails, it
/// never waits on time to synchronise.
struct http_client {
  int fd = -1;
  std::string in;
  bool timed_out = false;  // a send or receive gave up after the safety timeout

  explicit http_client(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~http_client() {
    if (fd >= 0) ::close(fd);
  }
  http_client(const http_client&) = delete;

  bool send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return timed_out |= n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), false;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  /// Reads more bytes; false at EOF, error or timeout.
  bool fill() {
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return timed_out |= n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), false;
    in.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  http_response read_response() {
    http_response r;
    std::size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return r;
    const std::string head = in.substr(0, end + 2);
    std::size_t at = head.find("\r\n");
    const int status = std::stoi(head.substr(9, 3));
    while (at + 2 < head.size()) {
      const std::size_t next = head.find("\r\n", at + 2);
      const std::string line = head.substr(at + 2, next - at - 2);
      const std::size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = line.substr(colon + 2);
      at = next;
    }
    const std::size_t len = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    while (in.size() < end + 4 + len)
      if (!fill()) return r;
    r.body = in.substr(end + 4, len);
    in.erase(0, end + 4 + len);
    r.status = status;
    return r;
  }

  /// True when the server closed the connection (EOF or reset) with nothing more to read.
  bool closed_by_peer() {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  http_response request(std::string_view method, std::string_view path, std::string_view body = {},
                        std::string_view headers = {}) {
    std::string req = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    req += headers;
    if (method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    req += "\r\n";
    req += body;
    if (!send(req)) return {};
    return read_response();
  }
};

}  // namespace wspush::test
