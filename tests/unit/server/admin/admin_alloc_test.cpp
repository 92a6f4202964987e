// Proves the paths that run per request or per update allocate nothing once warm: the
// request parser, metric updates from worker threads, and a publish through admin_api (its
// parsers and response strings keep their capacity). This binary replaces the global operator
// new with a counting one; each test counts around the calls alone.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "proto/http_request.hpp"
#include "server/admin/admin_api.hpp"
#include "server/admin/metrics.hpp"
#include "tests/support/counting_alloc.hpp"

using namespace wspush;
using namespace wspush::server;

TEST_CASE("admin alloc: the counter counts", "[admin_alloc]") {
  const std::size_t before = wspush::test::thread_allocation_count();
  void* volatile p = ::operator new(16);
  ::operator delete(p);
  CHECK(wspush::test::thread_allocation_count() - before == 1);
}

TEST_CASE("admin alloc: request parser, whole and byte by byte", "[admin_alloc]") {
  const std::string request =
      "POST /publish HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer k\r\nContent-Length: 31\r\n\r\n"
      "{\"topic\":\"mailbox:1\",\"data\":{}}";
  proto::http_request req;
  const std::size_t before = wspush::test::thread_allocation_count();
  proto::http_request_parser whole;
  const auto r = whole.parse(request, req);
  proto::http_request_parser bytewise;
  for (std::size_t i = 1; i <= request.size(); ++i) bytewise.parse(std::string_view(request).substr(0, i), req);
  proto::http_request_parser bad;
  bad.parse("GET / HTTP/1.1\r\nHost h\r\n\r\n", req);
  const std::size_t during = wspush::test::thread_allocation_count() - before;
  CHECK(r.status == proto::parse_status::done);
  CHECK(during == 0);
}

TEST_CASE("admin alloc: counter, gauge and histogram updates", "[admin_alloc]") {
  metrics_registry reg;
  counter& c = reg.add_counter("c_total", "c");
  gauge& g = reg.add_gauge("g", "g");
  const double bounds[] = {0.001, 0.01, 0.1};
  histogram& h = reg.add_histogram("h", bounds, "h");
  const std::size_t before = wspush::test::thread_allocation_count();
  for (int i = 0; i < 1000; ++i) {
    c.inc();
    g.add(1);
    h.observe(i * 1e-4);
  }
  CHECK(wspush::test::thread_allocation_count() - before == 0);
  CHECK(c.value() == 1000);
}

namespace {
/// Records nothing that allocates: the count of calls and the size of the last data.
struct quiet_sink : publish_sink {
  int calls = 0;
  std::size_t last_data = 0;
  publish_outcome publish(std::string_view, std::string_view data, std::string_view) noexcept override {
    ++calls;
    last_data = data.size();
    return {publish_outcome::ok, "k3f9:123456"};
  }
};
}  // namespace

TEST_CASE("admin alloc: a warm publish through admin_api", "[admin_alloc]") {
  quiet_sink sink;
  std::atomic<bool> draining{false};
  admin_api_options o;
  o.api_key = "k";
  admin_api api(o, sink, nullptr, draining);
  std::string text = "POST /publish HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer k\r\nContent-Length: 46\r\n\r\n"
                     "{\"topic\":\"mailbox:42\",\"data\":{\"subject\":\"hi\"}}";
  text.reserve(text.size() + 64);  // simdjson's padding is readable
  proto::http_request req;
  proto::http_request_parser parser;
  REQUIRE(parser.parse(text, req).status == proto::parse_status::done);
  const std::size_t readable = text.capacity() - static_cast<std::size_t>(req.body.data() - text.data());
  std::string out;
  out.reserve(4096);
  for (int i = 0; i < 3; ++i) api.respond(req, readable, out), out.clear();  // warm up the parsers
  const std::size_t before = wspush::test::thread_allocation_count();
  for (int i = 0; i < 10; ++i) {
    api.respond(req, readable, out);
    out.clear();
  }
  const std::size_t during = wspush::test::thread_allocation_count() - before;
  CHECK(during == 0);
  CHECK(sink.calls == 13);
  CHECK(sink.last_data == 16);
}
