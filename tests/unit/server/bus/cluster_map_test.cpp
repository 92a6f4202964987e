#include "server/bus/cluster_map.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace wspush::server::bus;

namespace {

/// Parses one whole RESP reply; the parser must outlive what the reply points to.
const resp::reply& parse(resp::parser& p, std::string_view bytes) {
  const resp::result r = p.parse(bytes);
  REQUIRE(r.st == resp::status::done);
  REQUIRE(r.consumed == bytes.size());
  return p.root();
}

// What a 3-master redis-server 7.0 cluster (redis-cli --cluster create) answered, 2026-11-27.
constexpr std::string_view three_masters =
    "*3\r\n"
    "*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7391\r\n$40\r\na15e10586c907f14845c6d12941b522a402feae3\r\n*0\r\n"
    "*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:7392\r\n$40\r\n8124860931343b0a90b967d1f02c3e41c606baff\r\n*0\r\n"
    "*3\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7393\r\n$40\r\nc22a2c0800215a107ca395243d7cb95fc7f704f1\r\n*0\r\n";

}  // namespace

TEST_CASE("cluster: CLUSTER SLOTS of a real cluster gives each slot its master", "[cluster]") {
  resp::parser p(resp::limits{});
  cluster_map m;
  std::string why;
  REQUIRE(m.load(parse(p, three_masters), why));
  CHECK(m.covered());
  REQUIRE(m.masters().size() == 3);
  CHECK(m.master_of(0)->port == 7391);
  CHECK(m.master_of(5460)->port == 7391);
  CHECK(m.master_of(5461)->port == 7392);
  CHECK(m.master_of(16383)->port == 7393);
  CHECK(m.master_of(16384) == nullptr);
  CHECK(m.master_of(topic_slot("mailbox:42"))->port == 7392);  // the cluster said MOVED 5893 ...:7392
  CHECK(m.master_of(key_slot("foo"))->port == 7393);           // and MOVED 12182 ...:7393
  CHECK(m.masters()[0].id == "a15e10586c907f14845c6d12941b522a402feae3");
  CHECK(m.masters()[2].host == "127.0.0.1");
}

TEST_CASE("cluster: a master with several ranges is one master, and uncovered slots have none", "[cluster]") {
  resp::parser p(resp::limits{});
  cluster_map m;
  std::string why;
  REQUIRE(m.load(parse(p, "*2\r\n*3\r\n:0\r\n:99\r\n*2\r\n$1\r\nh\r\n:7000\r\n"
                          "*3\r\n:200\r\n:299\r\n*3\r\n$1\r\nh\r\n:7000\r\n$2\r\nid\r\n"),
                 why));
  CHECK(m.masters().size() == 1);
  CHECK_FALSE(m.covered());
  CHECK(m.master_of(150) == nullptr);
  CHECK(m.master_of(250)->port == 7000);
  // "?" is an endpoint the cluster does not know: the host the reply came from.
  REQUIRE(m.load(parse(p, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$1\r\n?\r\n:7001\r\n"), why));
  CHECK(m.covered());
  CHECK(m.master_of(7)->host.empty());
}

TEST_CASE("cluster: a reply that is not a slot map leaves the map as it was", "[cluster]") {
  resp::parser p(resp::limits{});
  cluster_map m;
  std::string why;
  REQUIRE(m.load(parse(p, three_masters), why));
  for (std::string_view bad : {
           std::string_view("+OK\r\n"),
           std::string_view("*1\r\n*2\r\n:0\r\n:5\r\n"),                                    // no master
           std::string_view("*1\r\n*3\r\n:9\r\n:5\r\n*2\r\n$1\r\nh\r\n:1\r\n"),             // end before start
           std::string_view("*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n"),         // past 16383
           std::string_view("*1\r\n*3\r\n:0\r\n:5\r\n*2\r\n$1\r\nh\r\n:0\r\n"),             // port 0
           std::string_view("*2\r\n*3\r\n:0\r\n:5\r\n*2\r\n$1\r\nh\r\n:1\r\n*3\r\n:5\r\n:6\r\n*2\r\n$1\r\ng\r\n:1\r\n"),  // slot 5 twice
       }) {
    INFO(bad);
    CHECK_FALSE(m.load(parse(p, bad), why));
    CHECK_FALSE(why.empty());
    CHECK(m.master_of(0)->port == 7391);  // unchanged
    CHECK(m.covered());
  }
}

TEST_CASE("cluster: MOVED and ASK as Redis writes them", "[cluster]") {
  redirect r = parse_redirect("MOVED 12182 127.0.0.1:7393");  // what the cluster above answered to SET foo
  CHECK(r.kind == redirect::moved);
  CHECK(r.slot == 12182);
  CHECK(r.host == "127.0.0.1");
  CHECK(r.port == 7393);
  r = parse_redirect("ASK 5893 10.0.0.2:7001");
  CHECK(r.kind == redirect::ask);
  CHECK(r.slot == 5893);
  r = parse_redirect("MOVED 1 ::1:6381");
  CHECK(r.host == "::1");
  CHECK(r.port == 6381);
  r = parse_redirect("MOVED 1 :6381");  // an unknown endpoint: the same host
  CHECK(r.kind == redirect::moved);
  CHECK(r.host.empty());
  for (const char* other : {"ERR unknown command", "MOVED", "MOVED 16384 h:1", "MOVED x h:1", "ASK 1 h", "ASK 1 h:0",
                            "MOVED 1 h:70000", "CROSSSLOT Keys in request don't hash to the same slot"}) {
    INFO(other);
    CHECK(parse_redirect(other).kind == redirect::none);
  }
}
