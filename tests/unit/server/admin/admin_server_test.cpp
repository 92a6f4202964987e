// The admin listener in-process on 127.0.0.1:0, driven over real sockets: every endpoint, the
// API key, errors, NDJSON batches, keep-alive, pipelining, timeouts, limits and garbage.

#include "server/admin/admin_server.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "admin_test_support.hpp"
#include "prom_check.hpp"
#include "server/admin/metrics.hpp"

using namespace wspush::server;
using wspush::test::check_prometheus_text;
using wspush::test::http_client;
using wspush::test::http_response;
using wspush::test::recording_sink;

namespace {

struct fixture {
  recording_sink sink;
  metrics_registry metrics;
  std::unique_ptr<admin_server> server;

  explicit fixture(admin_options o = {}) {
    o.listen = "127.0.0.1:0";
    server = std::make_unique<admin_server>(std::move(o), sink, &metrics);
    server->start();
  }
  std::uint16_t port() const { return server->port(); }
};

admin_options with_key(std::string key) {
  admin_options o;
  o.api_key = std::move(key);
  return o;
}

std::string publish_body(std::string_view topic, std::string_view data) {
  return "{\"topic\":\"" + std::string(topic) + "\",\"data\":" + std::string(data) + "}";
}

}  // namespace

TEST_CASE("admin server: healthz, readyz while draining, metrics", "[admin]") {
  fixture f;
  http_client c(f.port());
  http_response r = c.request("GET", "/healthz");
  CHECK(r.status == 200);
  CHECK(r.headers["content-type"] == "application/json");
  CHECK(r.body == R"({"status":"ok"})");
  CHECK(c.request("GET", "/readyz").status == 200);
  f.server->set_draining(true);
  r = c.request("GET", "/readyz");
  CHECK(r.status == 503);
  CHECK(r.body == R"({"status":"draining"})");
  CHECK(check_prometheus_text(c.request("GET", "/metrics").body).samples.at("wspush_draining") == 1);
  CHECK(c.request("GET", "/healthz").status == 200);  // alive while draining
  f.server->set_draining(false);
  CHECK(c.request("GET", "/readyz").status == 200);
  r = c.request("GET", "/metrics");
  CHECK(r.status == 200);
  CHECK(r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8");
  const auto p = check_prometheus_text(r.body);
  INFO(r.body);
  CHECK(p.error.empty());
  CHECK(p.samples.at("wspush_admin_connections") == 1);
  CHECK(p.samples.at("wspush_draining") == 0);
  CHECK(p.samples.at("wspush_admin_requests_total{code=\"2xx\"}") == 5);  // this scrape not yet counted
  CHECK(p.samples.at("wspush_admin_requests_total{code=\"5xx\"}") == 1);
}

TEST_CASE("admin server: publish hands over the topic and the raw data bytes", "[admin]") {
  fixture f;
  http_client c(f.port());
  const std::string data = "{\"a\" : [1, 2.50, \"\\u00e9\\\"\", {\"b\":null}],\n \"c\":true}";
  http_response r = c.request("POST", "/publish", "{ \"topic\" : \"mailbox:42\", \"data\" : " + data + " }");
  CHECK(r.status == 200);
  CHECK(r.body == R"({"id":"k3f9:1"})");
  // scalars, arrays, unknown fields ignored, field order free
  CHECK(c.request("POST", "/publish", R"({"data":"text \"q\"" ,"topic":"t"})").body == R"({"id":"k3f9:2"})");
  CHECK(c.request("POST", "/publish", R"({"topic":"t","extra":{"x":1},"data":-1.5e3})").status == 200);
  CHECK(c.request("POST", "/publish", R"({"topic":"t","data":[ ]})").status == 200);
  CHECK(c.request("POST", "/publish", "{\"topic\":\"t\",\"data\":null}\n").status == 200);
  const auto calls = f.sink.snapshot();
  REQUIRE(calls.size() == 5);
  CHECK(calls[0].first == "mailbox:42");
  CHECK(calls[0].second == data);
  CHECK(calls[1].second == R"("text \"q\"")");
  CHECK(calls[2].second == "-1.5e3");
  CHECK(calls[3].second == "[ ]");
  CHECK(calls[4].second == "null");
  CHECK(f.sink.batch_count() == 5);
}

TEST_CASE("admin server: bad publishes get 400 with a JSON error and never reach the sink", "[admin]") {
  fixture f;
  http_client c(f.port());
  for (std::string_view body : {"", "{", "not json", "[1,2]", "\"x\"", R"({"topic":"t"})", R"({"data":{}})",
                                R"({"topic":"a b","data":1})", R"({"topic":"mail*","data":1})", R"({"topic":"a\"b","data":1})",
                                R"({"topic":"","data":1})", R"({"topic":7,"data":1})", R"({"topic":"t","data":tru})",
                                R"({"topic":"t","data":{"a":1,}})", R"({"topic":"t","data":1} x)",
                                R"({"topic":"t","topic":"u","data":1})", R"({"topic":"t","data":1,"data":2})",
                                "{\"topic\":\"t\",\"data\":\"\xff\"}"}) {
    INFO(body);
    http_response r = c.request("POST", "/publish", body);
    CHECK(r.status == 400);
    CHECK(r.headers["content-type"] == "application/json");
    CHECK(r.body.rfind("{\"error\":\"bad_request\"", 0) == 0);
  }
  CHECK(f.sink.snapshot().empty());
  const std::string long_topic(129, 't');
  CHECK(c.request("POST", "/publish", publish_body(long_topic, "1")).status == 400);
  CHECK(c.request("POST", "/publish", publish_body(long_topic.substr(1), "1")).status == 200);
}

TEST_CASE("admin server: an idempotency key reaches the sink and a bad one is 400 with a reason", "[admin]") {
  fixture f;
  http_client c(f.port());
  CHECK(c.request("POST", "/publish", R"({"topic":"t","data":1,"idempotency_key":"order-17"})").status == 200);
  CHECK(c.request("POST", "/publish", R"({"idempotency_key":"\u0041b","topic":"t","data":2})").status == 200);
  CHECK(c.request("POST", "/publish", R"({"topic":"t","data":3})").status == 200);
  const std::string longest(128, 'k');
  CHECK(c.request("POST", "/publish", R"({"topic":"t","data":4,"idempotency_key":")" + longest + "\"}").status == 200);
  const auto keys = [&] {
    std::lock_guard lock(f.sink.mu);
    return f.sink.keys;
  }();
  CHECK(keys == std::vector<std::string>{"order-17", "Ab", "", longest});
  for (const std::string& body :
       {R"({"topic":"t","data":1,"idempotency_key":")" + longest + "k\"}", std::string(R"({"topic":"t","data":1,"idempotency_key":""})"),
        std::string(R"({"topic":"t","data":1,"idempotency_key":7})"),
        std::string(R"({"topic":"t","data":1,"idempotency_key":"\u00e9"})"),
        std::string(R"({"topic":"t","data":1,"idempotency_key":"a","idempotency_key":"b"})")}) {
    INFO(body);
    const http_response r = c.request("POST", "/publish", body);
    CHECK(r.status == 400);
    CHECK(r.body.find("idempotency_key") != std::string::npos);
  }
  // Each line of a batch has its own.
  const http_response r = c.request("POST", "/publish/batch",
                                    R"({"topic":"a","data":1,"idempotency_key":"k1"})" "\n"
                                    R"({"topic":"a","data":1,"idempotency_key":")" + longest + "k\"}\n" +
                                    R"({"topic":"b","data":1})");
  CHECK(r.body == R"({"results":[{"id":"k3f9:5"},{"error":"bad_request"},{"id":"k3f9:6"}]})");
  std::lock_guard lock(f.sink.mu);
  CHECK(f.sink.keys.size() == 6);
  CHECK(f.sink.keys[4] == "k1");
  CHECK(f.sink.keys[5].empty());
}

TEST_CASE("admin server: the sink's refusals map to 400 and 503", "[admin]") {
  fixture f;
  http_client c(f.port());
  http_response r = c.request("POST", "/publish", publish_body("deny:1", "{}"));
  CHECK(r.status == 400);
  CHECK(r.body == R"({"error":"forbidden"})");
  r = c.request("POST", "/publish", publish_body("down:1", "{}"));
  CHECK(r.status == 503);
  CHECK(r.body == R"({"error":"unavailable"})");
  CHECK(r.headers["retry-after"] == "1");
}

TEST_CASE("admin server: the API key guards the publish endpoints only", "[admin]") {
  fixture f(with_key("s3cr3t-key"));
  http_client c(f.port());
  const std::string body = publish_body("t", "1");
  for (std::string_view auth : {"", "Authorization: Bearer wrong-key\r\n", "Authorization: Basic s3cr3t-key\r\n",
                                "Authorization: Bearer s3cr3t-ke\r\n", "Authorization: Bearer s3cr3t-key2\r\n"}) {
    INFO(auth);
    for (std::string_view path : {"/publish", "/publish/batch"}) {
      http_client keyless(f.port());  // a 401 ends its connection: no second try on it
      http_response r = keyless.request("POST", path, body, auth);
      CHECK(r.status == 401);
      CHECK(r.headers["www-authenticate"].rfind("Bearer", 0) == 0);
      CHECK(r.headers["connection"] == "close");
      CHECK(r.body == R"({"error":"unauthorized"})");
      CHECK(keyless.closed_by_peer());
    }
  }
  CHECK(f.sink.snapshot().empty());
  CHECK(c.request("POST", "/publish", body, "Authorization: Bearer s3cr3t-key\r\n").status == 200);
  CHECK(c.request("POST", "/publish", body, "authorization: bearer s3cr3t-key\r\n").status == 200);
  for (std::string_view path : {"/metrics", "/healthz", "/readyz"}) CHECK(c.request("GET", path).status == 200);
}

TEST_CASE("admin server: 404, 405, 411, 413, 501", "[admin]") {
  admin_options o;
  o.max_body_bytes = 1024;
  fixture f(o);
  http_client c(f.port());
  http_response r = c.request("GET", "/nope");
  CHECK(r.status == 404);
  CHECK(r.body == R"({"error":"not_found"})");
  r = c.request("GET", "/publish");
  CHECK(r.status == 405);
  CHECK(r.headers["allow"] == "POST");
  {
    // Refused at its head with a body announced: the body is never read, so the connection ends.
    http_client with_body(f.port());
    r = with_body.request("POST", "/metrics", "x");
    CHECK(r.status == 405);
    CHECK(r.headers["allow"] == "GET");
    CHECK(r.headers["connection"] == "close");
    CHECK(r.body == R"({"error":"method_not_allowed"})");
    CHECK(with_body.closed_by_peer());
  }
  REQUIRE(c.send("POST /publish HTTP/1.1\r\nHost: h\r\n\r\n"));
  CHECK(c.read_response().status == 411);
  CHECK(c.request("POST", "/publish", publish_body("t", "\"" + std::string(1000, 'x') + "\"")).status == 200);
  // too large: answered at once, then the connection ends
  r = c.request("POST", "/publish", publish_body("t", "\"" + std::string(1100, 'x') + "\""));
  CHECK(r.status == 413);
  CHECK(r.headers["connection"] == "close");
  CHECK(r.body.rfind(R"({"error":"too_large")", 0) == 0);
  CHECK(c.closed_by_peer());
  http_client chunked(f.port());
  REQUIRE(chunked.send("POST /publish HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"));
  CHECK(chunked.read_response().status == 501);
  CHECK(chunked.closed_by_peer());
}

TEST_CASE("admin server: Expect: 100-continue", "[admin]") {
  admin_options o;
  o.max_body_bytes = 1024;
  fixture f(o);
  const std::string body = publish_body("t", "1");
  http_client c(f.port());
  REQUIRE(c.send("POST /publish HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n"));
  CHECK(c.read_response().status == 100);
  REQUIRE(c.send(body));
  CHECK(c.read_response().status == 200);
  // too large: 413 before the body is sent
  http_client big(f.port());
  REQUIRE(big.send("POST /publish HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"));
  CHECK(big.read_response().status == 413);
  CHECK(big.closed_by_peer());
}

TEST_CASE("admin server: NDJSON batch answers every line in order", "[admin]") {
  fixture f;
  http_client c(f.port());
  const std::string batch = publish_body("a", "{\"n\":1}") + "\n" + "not json\n" + "\n" + "  \r\n" +
                            publish_body("b", "[2]") + "\r\n" + publish_body("deny:x", "3") + "\n" +
                            publish_body("down:x", "4") + "\n" + publish_body("bad topic", "5") + "\n" +
                            publish_body("c", "\"last, no newline\"");
  const http_response r = c.request("POST", "/publish/batch", batch);
  CHECK(r.status == 200);
  CHECK(r.body == R"({"results":[{"id":"k3f9:1"},{"error":"bad_request"},{"id":"k3f9:2"},{"error":"forbidden"},)"
                  R"({"error":"unavailable"},{"error":"bad_request"},{"id":"k3f9:3"}]})");
  const auto calls = f.sink.snapshot();
  REQUIRE(calls.size() == 5);
  CHECK(calls[0] == std::pair<std::string, std::string>{"a", "{\"n\":1}"});
  CHECK(calls[1] == std::pair<std::string, std::string>{"b", "[2]"});
  CHECK(calls[4] == std::pair<std::string, std::string>{"c", "\"last, no newline\""});
  CHECK(f.sink.batch_count() == 1);
  // every line unavailable: the whole batch may be retried
  http_response down = c.request("POST", "/publish/batch", publish_body("down:1", "1") + "\n" +
                                                                     publish_body("down:2", "1") + "\n");
  CHECK(down.status == 503);
  CHECK(down.body == R"({"results":[{"error":"unavailable"},{"error":"unavailable"}]})");
  CHECK(c.request("POST", "/publish/batch", "").body == R"({"results":[]})");
}

TEST_CASE("admin server: keep-alive and pipelining", "[admin]") {
  fixture f;
  http_client c(f.port());
  for (int i = 0; i < 5; ++i) CHECK(c.request("POST", "/publish", publish_body("t", std::to_string(i))).status == 200);
  // three requests in one write, answered in order; a Connection: close ends the run
  const std::string b1 = publish_body("t", "100");
  const std::string p1 =
      "POST /publish HTTP/1.1\r\nHost: h\r\nContent-Length: " + std::to_string(b1.size()) + "\r\n\r\n" + b1;
  const std::string pipelined = p1 + "GET /nope HTTP/1.1\r\nHost: h\r\n\r\n" + p1 +
                                "GET /healthz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + p1;
  REQUIRE(c.send(pipelined));
  CHECK(c.read_response().body == R"({"id":"k3f9:6"})");
  CHECK(c.read_response().status == 404);
  CHECK(c.read_response().body == R"({"id":"k3f9:7"})");
  http_response last = c.read_response();
  CHECK(last.status == 200);
  CHECK(last.headers["connection"] == "close");
  CHECK(c.closed_by_peer());
  CHECK(f.sink.snapshot().size() == 7);  // the request after the close was not run
  // HTTP/1.0 closes after one answer
  http_client old(f.port());
  REQUIRE(old.send("GET /healthz HTTP/1.0\r\n\r\n"));
  CHECK(old.read_response().status == 200);
  CHECK(old.closed_by_peer());
}

TEST_CASE("admin server: slow and idle clients time out", "[admin]") {
  admin_options o;
  o.request_timeout = 0.3;
  o.idle_timeout = 0.3;
  fixture f(o);
  http_client slow(f.port());
  REQUIRE(slow.send("POST /publish HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n{\"topic\""));
  const http_response r = slow.read_response();
  CHECK(r.status == 408);
  CHECK(r.body.rfind(R"({"error":"timeout")", 0) == 0);
  CHECK(slow.closed_by_peer());
  http_client idle(f.port());
  CHECK(idle.request("GET", "/healthz").status == 200);
  CHECK(idle.closed_by_peer());  // closed quietly once idle
  CHECK(f.sink.snapshot().empty());
}

TEST_CASE("admin server: garbage gets a 400 and a close, the server lives on", "[admin]") {
  fixture f;
  for (std::string_view junk : {std::string_view("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),
                                std::string_view("GET / HTTP/1.1\nHost: h\n\n"), std::string_view("\r\n\r\n\r\n\x01"),
                                std::string_view("GET /healthz HTTP/1.1\r\nHost: h\r\nBad Header\r\n\r\n"),
                                std::string_view("GET /healthz HTTP/3.0\r\nHost: h\r\n\r\n")}) {
    http_client c(f.port());
    REQUIRE(c.send(junk));
    const http_response r = c.read_response();
    CHECK((r.status == 400 || r.status == 505));
    CHECK(c.closed_by_peer());
  }
  http_client big(f.port());
  REQUIRE(big.send("GET /healthz HTTP/1.1\r\nHost: h\r\nX: " + std::string(9000, 'a')));
  CHECK(big.read_response().status == 431);
  http_client c(f.port());
  CHECK(c.request("GET", "/healthz").status == 200);
}

TEST_CASE("admin server: a new connection takes the slot of the quietest keyless one and keyed ones stay", "[admin]") {
  admin_options o = with_key("k");
  o.max_connections = 2;
  fixture f(o);
  const std::string auth = "Authorization: Bearer k\r\n";
  http_client keyed(f.port()), keyless(f.port());
  CHECK(keyed.request("POST", "/publish", publish_body("t", "1"), auth).status == 200);
  CHECK(keyless.request("GET", "/healthz").status == 200);
  // The table is full: a new connection still gets in, in the slot of the keyless one.
  http_client probe(f.port());
  CHECK(probe.request("GET", "/healthz").status == 200);
  CHECK(keyless.closed_by_peer());
  CHECK(keyed.request("GET", "/readyz").status == 200);  // the keyed connection was left alone
  // Only when every slot is keyed is a new connection refused, with 503.
  CHECK(probe.request("POST", "/publish", publish_body("t", "2"), auth).status == 200);
  http_client late(f.port());
  http_response r = late.read_response();  // answered without asking
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "1");
  CHECK(late.closed_by_peer());
  // A slot is free again once the server has seen a close: wait for that through /metrics.
  ::close(probe.fd);
  probe.fd = -1;
  double open = 2;
  while (open != 1) {
    const http_response m = keyed.request("GET", "/metrics");
    REQUIRE(m.status == 200);
    open = check_prometheus_text(m.body).samples.at("wspush_admin_connections");
  }
  http_client d(f.port());
  CHECK(d.request("GET", "/healthz").status == 200);
  http_client scrape(f.port());
  const http_response m = scrape.request("GET", "/metrics");
  CHECK(check_prometheus_text(m.body).samples.at("wspush_admin_connections_evicted_total") >= 1);
}

TEST_CASE("admin server: /metrics counts what the API did", "[admin]") {
  fixture f(with_key("k"));
  http_client c(f.port());
  const std::string auth = "Authorization: Bearer k\r\n";
  for (int i = 0; i < 3; ++i) c.request("POST", "/publish", publish_body("t", "1"), auth);
  c.request("POST", "/publish", "nope", auth);
  c.request("POST", "/publish", publish_body("down", "1"), auth);
  c.request("POST", "/publish/batch", publish_body("t", "1") + "\nx\n", auth);
  c.request("POST", "/publish", publish_body("t", "1"));  // 401, and the connection ends
  http_client scrape(f.port());
  const http_response r = scrape.request("GET", "/metrics");
  const auto p = check_prometheus_text(r.body);
  INFO(r.body);
  REQUIRE(p.error.empty());
  CHECK(p.samples.at("wspush_publishes_total{source=\"admin\",result=\"ok\"}") == 4);
  CHECK(p.samples.at("wspush_publishes_total{source=\"admin\",result=\"bad_request\"}") == 2);
  CHECK(p.samples.at("wspush_publishes_total{source=\"admin\",result=\"unavailable\"}") == 1);
  CHECK(p.samples.at("wspush_admin_requests_total{code=\"2xx\"}") == 4);
  CHECK(p.samples.at("wspush_admin_requests_total{code=\"4xx\"}") == 2);
  CHECK(p.samples.at("wspush_admin_requests_total{code=\"5xx\"}") == 1);
}

TEST_CASE("admin server: start fails loudly on a taken port, stop is idempotent", "[admin]") {
  fixture f;
  recording_sink sink;
  admin_options o;
  o.listen = "127.0.0.1:" + std::to_string(f.port());
  admin_server other(o, sink, nullptr);
  CHECK_THROWS(other.start());
  f.server->stop();
  f.server->stop();
  CHECK(http_client(f.port()).fd < 0);  // nothing listens any more
}

TEST_CASE("admin server: a client that pipelines and never reads is cut off", "[admin]") {
  admin_options o;
  o.max_body_bytes = 1024;
  o.request_timeout = 0.5;
  fixture f(o);
  http_client c(f.port());
  timeval tv{10, 0};
  ::setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  // ~4 MB of requests whose answers (~1 KB of metrics each) the client does not read: the
  // server stops reading past 256 KiB of waiting output, then closes when its input bound
  // (head + body limits + 64 KiB) is passed or the output stalls for request_timeout.
  const std::string one = "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n";
  std::string many;
  for (int i = 0; i < 4000; ++i) many += one;
  int sent = 0;
  while (sent < 1000 && c.send(many)) ++sent;
  CHECK(sent < 1000);
  int answered = 0;
  while (c.read_response().status == 200) ++answered;
  CHECK(answered < sent * 4000 + 4000);
  CHECK_FALSE(c.timed_out);  // the server closed the connection: nothing waited for the safety timeout
  http_client other(f.port());
  CHECK(other.request("GET", "/healthz").status == 200);
}

// ---- a sink that answers later (the Redis bus) ------------------------------------------------

namespace {

struct deferred_fixture {
  wspush::test::deferred_sink sink;
  metrics_registry metrics;
  std::unique_ptr<admin_server> server;

  explicit deferred_fixture(admin_options o = {}) {
    o.listen = "127.0.0.1:0";
    server = std::make_unique<admin_server>(std::move(o), sink, &metrics);
    server->start();
  }
  std::uint16_t port() const { return server->port(); }
};

std::string post(std::string_view path, std::string_view body, std::string_view headers = {}) {
  return "POST " + std::string(path) + " HTTP/1.1\r\nHost: h\r\n" + std::string(headers) +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

/// Nothing to read on `c` right now (the server answered nothing yet).
bool nothing_to_read(http_client& c) {
  char b;
  return ::recv(c.fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

TEST_CASE("admin server: a publish waiting for the bus holds up nobody else", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;  // only settle_all answers it
  deferred_fixture f(o);
  http_client a(f.port());
  // A publish and a probe pipelined behind it: the probe is answered only after the publish.
  REQUIRE(a.send(post("/publish", publish_body("t", "1")) + "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 1; }));
  http_client b(f.port());
  CHECK(b.request("GET", "/healthz").status == 200);
  CHECK(b.request("GET", "/readyz").status == 200);
  const auto m = check_prometheus_text(b.request("GET", "/metrics").body);
  CHECK(m.samples.at("wspush_admin_publishes_waiting") == 1);
  CHECK(nothing_to_read(a));
  f.sink.settle_all();
  http_response r = a.read_response();
  CHECK(r.status == 200);
  CHECK(r.body == R"({"id":"k3f9:1"})");
  CHECK(a.read_response().body == R"({"status":"ok"})");
  CHECK(check_prometheus_text(b.request("GET", "/metrics").body).samples.at(
            "wspush_publishes_total{source=\"admin\",result=\"ok\"}") == 1);
}

TEST_CASE("admin server: a batch waiting for the bus is answered in order once all is in", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  deferred_fixture f(o);
  http_client c(f.port());
  const std::string batch = publish_body("now:1", "1") + "\nnot json\n" + publish_body("t", "2") + "\n" +
                            publish_body("now:2", "3") + "\n" + publish_body("u", "4") + "\n";
  REQUIRE(c.send(post("/publish/batch", batch)));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  CHECK(nothing_to_read(c));
  f.sink.settle_all();
  const http_response r = c.read_response();
  CHECK(r.status == 200);
  CHECK(r.body == R"({"results":[{"id":"k3f9:now"},{"error":"bad_request"},{"id":"k3f9:1"},{"id":"k3f9:now"},)"
                  R"({"id":"k3f9:2"}]})");
  // Every line unavailable after the wait: the whole batch may be retried.
  REQUIRE(c.send(post("/publish/batch", publish_body("x", "1") + "\n" + publish_body("y", "2"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  f.sink.settle_all(publish_outcome::unavailable);
  const http_response down = c.read_response();
  CHECK(down.status == 503);
  CHECK(down.body == R"({"results":[{"error":"unavailable"},{"error":"unavailable"}]})");
}

TEST_CASE("admin server: the wait for the bus has a deadline: 504 if sent, 503 if not", "[admin]") {
  admin_options o;
  o.publish_timeout = 0.2;
  deferred_fixture f(o);
  http_client c(f.port());
  http_response r = c.request("POST", "/publish", publish_body("t", "1"));
  CHECK(r.status == 504);
  CHECK(r.body.rfind(R"({"error":"timeout")", 0) == 0);
  r = c.request("POST", "/publish", publish_body("unsent", "1"));
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "1");
  r = c.request("POST", "/publish/batch", publish_body("t", "1") + "\n" + publish_body("now", "2"));
  CHECK(r.status == 200);
  CHECK(r.body == R"({"results":[{"error":"timeout"},{"id":"k3f9:now"}]})");
  CHECK(f.sink.collected_count() == 3);
  f.sink.settle_all();  // too late: nobody waits on these tickets any more
  CHECK(c.request("GET", "/healthz").status == 200);
  const auto m = check_prometheus_text(c.request("GET", "/metrics").body);
  CHECK(m.samples.at("wspush_publishes_total{source=\"admin\",result=\"timeout\"}") == 2);
  CHECK(m.samples.at("wspush_publishes_total{source=\"admin\",result=\"unavailable\"}") == 1);
  CHECK(m.samples.at("wspush_admin_publishes_waiting") == 0);
}

TEST_CASE("admin server: publishes waiting for the bus are bounded: past it 503", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  o.max_waiting_publishes = 3;
  deferred_fixture f(o);
  http_client a(f.port()), b(f.port());
  REQUIRE(a.send(post("/publish/batch", publish_body("t", "1") + "\n" + publish_body("t", "2"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  // Two lines would make four: refused at once, the sink never sees them.
  http_response r = b.request("POST", "/publish/batch", publish_body("t", "3") + "\n" + publish_body("t", "4"));
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "1");
  CHECK(f.sink.pending_count() == 2);
  REQUIRE(b.send(post("/publish", publish_body("t", "5"))));  // one fits
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 3; }));
  f.sink.settle_all();
  CHECK(a.read_response().status == 200);
  CHECK(b.read_response().status == 200);
  // None waits: a batch larger than the bound goes alone.
  REQUIRE(a.send(post("/publish/batch", "{\"topic\":\"t\",\"data\":1}\n{\"topic\":\"t\",\"data\":2}\n"
                                        "{\"topic\":\"t\",\"data\":3}\n{\"topic\":\"t\",\"data\":4}\n")));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 4; }));
  f.sink.settle_all();
  CHECK(a.read_response().status == 200);
}

TEST_CASE("admin server: a client gone while its publish waits, and /readyz says bus_stalled", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  deferred_fixture f(o);
  {
    http_client gone(f.port());
    REQUIRE(gone.send(post("/publish", publish_body("t", "1"))));
    REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 1; }));
  }
  // The close is seen (the EOF while the publish waits); the answer is still owed, then the close.
  http_client c(f.port());
  f.sink.settle_all();
  CHECK(wspush::test::eventually([&] {
    return check_prometheus_text(c.request("GET", "/metrics").body).samples.at("wspush_admin_connections") == 1;
  }));
  f.sink.is_stalled = true;
  http_response r = c.request("GET", "/readyz");
  CHECK(r.status == 503);
  CHECK(r.body == R"({"status":"bus_stalled"})");
  CHECK(r.headers["retry-after"] == "1");
  CHECK(c.request("GET", "/healthz").status == 200);
  f.sink.is_stalled = false;
  CHECK(c.request("GET", "/readyz").status == 200);
  // A connection closed (reset) while its publish waits: forgotten, its ticket spent.
  {
    http_client gone(f.port());
    REQUIRE(gone.send(post("/publish", publish_body("t", "2"))));
    REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 1; }));
    linger l{1, 0};
    ::setsockopt(gone.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  CHECK(wspush::test::eventually([&] { return f.sink.collected_count() == 2; }));
  f.sink.settle_all();
  CHECK(c.request("GET", "/healthz").status == 200);
}

namespace {

double admin_metric(http_client& c, const std::string& name) {
  return check_prometheus_text(c.request("GET", "/metrics").body).samples.at(name);
}

const std::string k_ok_total = "wspush_publishes_total{source=\"admin\",result=\"ok\"}";

}  // namespace

TEST_CASE("admin server: pipelined publishes wait together and are answered in order as outcomes arrive", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  deferred_fixture f(o);
  http_client a(f.port()), probe(f.port());
  // Three publishes and a probe in one write: all three reach the sink before any is answered.
  REQUIRE(a.send(post("/publish", publish_body("t", "1")) + post("/publish", publish_body("t", "2")) +
                 "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n" + post("/publish", publish_body("t", "3"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 3; }));
  // The last settles first: its answer waits for the two before it (and the probe's too).
  f.sink.settle(3);
  REQUIRE(wspush::test::eventually([&] { return admin_metric(probe, k_ok_total) == 1; }));
  CHECK(nothing_to_read(a));
  f.sink.settle(1);
  http_response r = a.read_response();
  CHECK(r.status == 200);
  CHECK(r.body == R"({"id":"k3f9:1"})");
  REQUIRE(wspush::test::eventually([&] { return admin_metric(probe, k_ok_total) == 2; }));
  CHECK(nothing_to_read(a));
  f.sink.settle(2);
  CHECK(a.read_response().body == R"({"id":"k3f9:2"})");
  CHECK(a.read_response().body == R"({"status":"ok"})");
  CHECK(a.read_response().body == R"({"id":"k3f9:3"})");
  // The connection goes on.
  REQUIRE(a.send(post("/publish", publish_body("t", "4"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 1; }));
  f.sink.settle(4);
  CHECK(a.read_response().body == R"({"id":"k3f9:4"})");
  CHECK(admin_metric(probe, "wspush_admin_publishes_waiting") == 0);
}

TEST_CASE("admin server: an oldest publish that times out goes first, a later settled one after it", "[admin]") {
  admin_options o;
  o.publish_timeout = 0.3;
  deferred_fixture f(o);
  http_client a(f.port());
  REQUIRE(a.send(post("/publish", publish_body("t", "1")) + post("/publish", publish_body("t", "2"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  f.sink.settle(2);
  http_response r = a.read_response();
  CHECK(r.status == 504);
  CHECK(r.body.rfind(R"({"error":"timeout")", 0) == 0);
  r = a.read_response();
  CHECK(r.status == 200);
  CHECK(r.body == R"({"id":"k3f9:2"})");
}

TEST_CASE("admin server: an error answer behind waiting publishes comes after theirs, and ends the connection", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  deferred_fixture f(o);
  http_client a(f.port());
  // Two publishes, garbage, and a publish that must never be handled.
  REQUIRE(a.send(post("/publish", publish_body("t", "1")) + post("/publish", publish_body("t", "2")) +
                 "garbage\r\n\r\n" + post("/publish", publish_body("t", "3"))));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  CHECK(nothing_to_read(a));
  f.sink.settle(2);
  f.sink.settle(1);
  CHECK(a.read_response().body == R"({"id":"k3f9:1"})");
  CHECK(a.read_response().body == R"({"id":"k3f9:2"})");
  http_response e = a.read_response();
  CHECK(e.status == 400);
  CHECK(e.headers["connection"] == "close");
  CHECK(a.closed_by_peer());
  CHECK(f.sink.published_count() == 2);
  // A publish asking to close: the requests after it are not handled either.
  http_client b(f.port());
  REQUIRE(b.send(post("/publish", publish_body("t", "4")) + post("/publish", publish_body("t", "5"), "Connection: close\r\n") +
                 "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"));
  REQUIRE(wspush::test::eventually([&] { return f.sink.pending_count() == 2; }));
  f.sink.settle_all();
  CHECK(b.read_response().body == R"({"id":"k3f9:3"})");
  http_response last = b.read_response();
  CHECK(last.body == R"({"id":"k3f9:4"})");
  CHECK(last.headers["connection"] == "close");
  CHECK(b.closed_by_peer());
}

TEST_CASE("admin server: at most 64 requests of a connection wait, the rest is read once answers went out", "[admin]") {
  admin_options o;
  o.publish_timeout = 60;
  deferred_fixture f(o);
  http_client a(f.port()), probe(f.port());
  std::string many;
  for (int k = 1; k <= 70; ++k) many += post("/publish", publish_body("t", std::to_string(k)));
  REQUIRE(a.send(many));
  REQUIRE(wspush::test::eventually([&] { return f.sink.published_count() == 64; }));
  CHECK(admin_metric(probe, "wspush_admin_publishes_waiting") == 64);
  CHECK(f.sink.published_count() == 64);
  f.sink.settle(1);
  CHECK(a.read_response().body == R"({"id":"k3f9:1"})");
  REQUIRE(wspush::test::eventually([&] { return f.sink.published_count() == 65; }));
  f.sink.settle_all();
  REQUIRE(wspush::test::eventually([&] { return f.sink.published_count() == 70; }));
  f.sink.settle_all();
  for (int k = 2; k <= 70; ++k) {
    const http_response r = a.read_response();
    CHECK(r.body == "{\"id\":\"k3f9:" + std::to_string(k) + "\"}");
  }
}
