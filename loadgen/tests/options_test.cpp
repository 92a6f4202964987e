#include "loadgen/options.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

using namespace wspush::loadgen;

namespace {

options parse(std::vector<std::string> args) {
  args.insert(args.begin(), {"wspush-loadgen"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

const std::vector<std::string> base = {"mailboxes", "--url", "ws://127.0.0.1:9000/ws", "--admin", "http://127.0.0.1:9001",
                                       "--connections", "10"};

std::vector<std::string> with(std::vector<std::string> more, const std::vector<std::string>& first = base) {
  std::vector<std::string> out = first;
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

}  // namespace

TEST_CASE("options: --publish-steps sets each step's messages and the total") {
  const options o = parse(with({"--publish-steps", "100,250.5", "--step-seconds", "2", "--step-pause", "0.5"}));
  REQUIRE(o.step_rates.size() == 2);
  CHECK(o.step_messages(0) == 200);
  CHECK(o.step_messages(1) == 501);
  CHECK(o.step_messages(2) == 0);
  CHECK(o.messages == 701);
  CHECK(o.step_pause == 0.5);
  // Message numbers count over all topics, in publishing order.
  CHECK(o.step_of(0) == 0);
  CHECK(o.step_of(199) == 0);
  CHECK(o.step_of(200) == 1);
  CHECK(o.step_of(700) == 1);
  CHECK(o.step_of(100'000) == 1);  // past the end: the last step
  // What each mailbox is owed of a step: message n goes to topic n % 10 (10 connections).
  CHECK(o.messages_for(3, 23) == 2);   // 3, 13
  CHECK(o.messages_for(3, 24) == 3);   // and 23
  CHECK(o.messages_for(3, 200) - o.messages_for(3, 0) == 20);
  CHECK(o.messages_for(9) == 70);      // 701 messages: 9, 19, ... 699
  CHECK(o.messages_for(0) == 71);
}

TEST_CASE("options: --publish-steps refuses what it cannot run") {
  CHECK_THROWS_AS(parse(with({"--publish-steps", "100", "--publish-rate", "5"})), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--publish-steps", "100", "--messages", "5"})), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--publish-steps", "0"})), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--publish-steps", "1,,2"})), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--publish-steps", "0.01"})), std::runtime_error);  // no message in 10 s
  std::vector<std::string> fanout = base;
  fanout[0] = "fanout";
  CHECK_THROWS_AS(parse(with({"--publish-steps", "100"}, fanout)), std::runtime_error);
}

TEST_CASE("options: without steps every message is step 0") {
  const options o = parse(with({"--messages", "50"}));
  CHECK(o.step_rates.empty());
  CHECK(o.messages == 50);
  CHECK(o.step_of(49) == 0);
}

TEST_CASE("options: --transport sse opens event streams at an http:// URL") {
  const options ws = parse(with({}));
  CHECK(ws.transport == transport_kind::ws);
  const std::vector<std::string> sse = {"mailboxes", "--transport", "sse", "--url", "http://127.0.0.1:9000/sse",
                                        "--admin", "http://127.0.0.1:9001", "--connections", "10"};
  const options o = parse(sse);
  CHECK(o.transport == transport_kind::sse);
  CHECK(o.path == "/sse");
  CHECK(o.host_header == "127.0.0.1:9000");
  CHECK_FALSE(o.tls);
  CHECK(o.via == publish_via::admin);
  std::vector<std::string> tls = sse;
  tls[4] = "https://127.0.0.1:9443/sse";
  CHECK(parse(tls).tls);
  // what a stream cannot do, and URLs of the other transport
  CHECK_THROWS_AS(parse(with({"--publish-via", "ws"}, sse)), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--compression"}, sse)), std::runtime_error);
  CHECK_THROWS_AS(parse(with({"--transport", "sse"})), std::runtime_error);   // a ws:// URL
  std::vector<std::string> http = base;
  http[2] = "http://127.0.0.1:9000/sse";
  CHECK_THROWS_AS(parse(http), std::runtime_error);                           // an http:// URL without sse
  CHECK_THROWS_AS(parse(with({"--transport", "udp"}, sse)), std::runtime_error);
  std::vector<std::string> broadcast = sse;
  broadcast[0] = "fanout";
  CHECK_THROWS_AS(parse(with({"--protocol", "broadcast"}, broadcast)), std::runtime_error);
}
