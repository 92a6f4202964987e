// Tests for proto/envelope: every op and every error of the client messages, `data` byte for
// byte, where the views point, the server messages round-tripped through simdjson's DOM
// parser, and a counting-allocator proof (operator new is counted by no_alloc_test.cpp).

#include <catch2/catch.hpp>

#include <simdjson.h>

#include <array>
#include <string>
#include <vector>

#include "proto/envelope.hpp"
#include "test_support.hpp"

using namespace wspush::proto;

namespace {

/// A parser and the padded buffer a message is parsed from, as a shard would hold them.
struct fixture {
  envelope_parser parser{4096};
  std::string buf;
  envelope env;

  envelope_result parse(std::string_view message) {
    buf.assign(message);
    buf.append(envelope_padding, '\xFF');  // what lies behind the message must not matter
    return parser.parse({buf.data(), message.size()}, buf.size(), env);
  }
  client_error error_of(std::string_view message) { return parse(message).error; }
  bool inside(std::string_view v) const {
    return v.data() >= buf.data() && v.data() + v.size() <= buf.data() + buf.size() - envelope_padding;
  }
  std::vector<std::string> topics() const { return {env.topics().begin(), env.topics().end()}; }
};

std::string topic_list(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += (i ? ",\"t" : "\"t") + std::to_string(i) + "\"";
  return s;
}

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

TEST_CASE("envelope: sub with since", "[envelope]") {
  fixture f;
  const auto r = f.parse(R"({"op":"sub","topics":["mailbox:42","news:sport"],"since":{"mailbox:42":"k3f9:17"}})");
  REQUIRE(r.ok());
  CHECK(r.message.empty());
  CHECK(f.env.op == client_op::sub);
  CHECK(f.topics() == std::vector<std::string>{"mailbox:42", "news:sport"});
  REQUIRE(f.env.since().size() == 1);
  CHECK(f.env.since()[0].topic == "mailbox:42");
  CHECK(f.env.since()[0].id == "k3f9:17");
  for (const std::string_view v : {f.env.topics()[0], f.env.topics()[1], f.env.since()[0].topic, f.env.since()[0].id})
    CHECK(f.inside(v));
}

TEST_CASE("envelope: sub without since, fields in any order, whitespace, unknown fields", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(" {\n\t\"topics\" : [ \"a\" , \"b\" ] , \"req\":{\"n\":[1,2.5e3,true,null,\"x\"]}, \"op\":\"sub\" } \r\n")
              .ok());
  CHECK(f.env.op == client_op::sub);
  CHECK(f.topics() == std::vector<std::string>{"a", "b"});
  CHECK(f.env.since().empty());
  REQUIRE(f.parse(R"({"op":"sub","topics":["a"],"since":{}})").ok());
  CHECK(f.env.since().empty());
  // duplicates within topics are the hub's business, not the parser's
  REQUIRE(f.parse(R"({"op":"sub","topics":["a","a"]})").ok());
  CHECK(f.topics().size() == 2);
}

TEST_CASE("envelope: unsub", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(R"({"op":"unsub","topics":["mailbox:42"]})").ok());
  CHECK(f.env.op == client_op::unsub);
  CHECK(f.topics() == std::vector<std::string>{"mailbox:42"});
  REQUIRE(f.parse(R"({"op":"unsub","topics":["a"],"since":{"a":"1"}})").ok());  // since ignored
  CHECK(f.env.since().empty());
}

TEST_CASE("envelope: pub data byte for byte", "[envelope]") {
  fixture f;
  for (const std::string data : {
           R"({"subject":"hi","n":1})",
           "{ \"a\" : [ 1 , { \"b\" : null } ] ,\n \"c\":\"\\u00e9\\n\\\"\" }",
           R"([])", R"({})", R"([[],[{}]])",
           R"("caf\u00e9 \ud83d\ude00")", "\"caf\xC3\xA9\"",
           "0", "-0.5e+3", "1E400", "123456789012345678901234567890", "true", "false", "null",
       }) {
    for (const std::string& after : {std::string(), std::string(" \n"), std::string(",\"x\":1")}) {
      for (const bool data_first : {false, true}) {
        const std::string msg = data_first ? "{\"data\":" + data + after + ",\"op\":\"pub\",\"topic\":\"t\"}"
                                           : "{\"op\":\"pub\",\"topic\":\"t\",\"data\":" + data + after + "}";
        CAPTURE(msg);
        REQUIRE(f.parse(msg).ok());
        CHECK(f.env.op == client_op::pub);
        CHECK(f.env.topic == "t");
        CHECK(f.env.data == data);
        CHECK(f.inside(f.env.data));
      }
    }
  }
}

TEST_CASE("envelope: fields of another op are checked, then ignored", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(R"({"op":"pub","topic":"t","data":1,"topics":["a"],"since":{"a":"1"}})").ok());
  CHECK(f.env.topics().empty());
  CHECK(f.env.since().empty());
  REQUIRE(f.parse(R"({"op":"sub","topics":["a"],"topic":"t","data":{"x":1}})").ok());
  CHECK(f.env.topic.empty());
  CHECK(f.env.data.empty());
  CHECK(f.error_of(R"({"op":"pub","topic":"t","data":1,"since":{"a":1}})") == client_error::bad_request);
}

TEST_CASE("envelope: a pub's idempotency key", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(R"({"op":"pub","topic":"t","data":1,"idempotency_key":"order-17 retry"})").ok());
  CHECK(f.env.idempotency_key == "order-17 retry");
  CHECK(f.inside(f.env.idempotency_key));
  REQUIRE(f.parse(R"({"op":"pub","topic":"t","data":1})").ok());
  CHECK(f.env.idempotency_key.empty());  // none: the previous message's is not kept
  const std::string longest(max_idempotency_key_bytes, 'k');
  REQUIRE(f.parse(R"({"op":"pub","topic":"t","data":1,"idempotency_key":")" + longest + "\"}").ok());
  CHECK(f.env.idempotency_key == longest);
  const auto r = f.parse(R"({"op":"pub","topic":"t","data":1,"idempotency_key":")" + longest + "k\"}");
  CHECK(r.error == client_error::bad_request);
  CHECK(r.message.find("idempotency_key") != std::string_view::npos);
  for (const char* bad : {R"({"op":"pub","topic":"t","data":1,"idempotency_key":""})",
                          R"({"op":"pub","topic":"t","data":1,"idempotency_key":17})",
                          R"({"op":"pub","topic":"t","data":1,"idempotency_key":"\u00e9"})",
                          R"({"op":"pub","topic":"t","data":1,"idempotency_key":"a\nb"})",
                          R"({"op":"pub","topic":"t","data":1,"idempotency_key":"a","idempotency_key":"b"})"})
    CHECK(f.error_of(bad) == client_error::bad_request);
  // Written with escapes: unescaped, then checked.
  REQUIRE(f.parse(R"({"op":"pub","topic":"t","data":1,"idempotency_key":"\u0041b"})").ok());
  CHECK(f.env.idempotency_key == "Ab");
  // Another op's: checked, then ignored.
  REQUIRE(f.parse(R"({"op":"sub","topics":["a"],"idempotency_key":"k"})").ok());
  CHECK(f.env.idempotency_key.empty());
}

TEST_CASE("envelope: strings written with escapes are unescaped", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(R"({"\u006fp":"s\u0075b","topics":["mailbox:\u0034\u0032"],"since":{"mailbox:\u00342":"a\"b"}})").ok());
  CHECK(f.env.op == client_op::sub);
  CHECK(f.topics() == std::vector<std::string>{"mailbox:42"});
  CHECK(f.env.since()[0].topic == "mailbox:42");
  CHECK(f.env.since()[0].id == "a\"b");
  CHECK_FALSE(f.inside(f.env.topics()[0]));  // the parser's unescaped copy
  CHECK(f.error_of(R"({"op":"sub","topics":["a\\b"]})") == client_error::bad_request);  // `\` is no topic byte
  CHECK(f.error_of(R"({"op":"sub","topics":["a\"b"]})") == client_error::bad_request);
}

TEST_CASE("envelope: limits on topics, ids and nesting", "[envelope]") {
  fixture f;
  CHECK(f.error_of(R"({"op":"sub","topics":[)" + topic_list(max_topics_per_message) + "]}") == client_error::none);
  CHECK(f.topics().size() == max_topics_per_message);
  CHECK(f.error_of(R"({"op":"sub","topics":[)" + topic_list(max_topics_per_message + 1) + "]}") ==
        client_error::too_many_topics);
  std::string since;
  for (std::size_t i = 0; i <= max_topics_per_message; ++i) since += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":\"1\"";
  CHECK(f.error_of(R"({"op":"sub","topics":["t0"],"since":{)" + since + "}}") == client_error::too_many_topics);

  const std::string longest(max_topic_bytes, 'x');
  CHECK(f.error_of(R"({"op":"sub","topics":[")" + longest + "\"]}") == client_error::none);
  CHECK(f.error_of(R"({"op":"sub","topics":[")" + longest + "x\"]}") == client_error::bad_request);
  const std::string id(max_id_bytes, '7');
  CHECK(f.error_of(R"({"op":"sub","topics":["a"],"since":{"a":")" + id + "\"}}") == client_error::none);
  CHECK(f.error_of(R"({"op":"sub","topics":["a"],"since":{"a":")" + id + "7\"}}") == client_error::bad_request);

  CHECK(f.error_of(R"({"op":"pub","topic":"t","data":)" + nested(max_data_depth - 1) + "}") == client_error::none);
  CHECK(f.error_of(R"({"op":"pub","topic":"t","data":)" + nested(max_data_depth) + "}") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"pub","topic":"t","data":1,"x":)" + nested(max_data_depth) + "}") ==
        client_error::bad_request);
  CHECK(f.error_of(R"({"op":"pub","topic":"t","data":)" + nested(1500) + "}") != client_error::none);

  envelope_parser small(64);
  envelope e;
  const std::string big = R"({"op":"pub","topic":"t","data":")" + std::string(64, 'x') + "\"}";
  CHECK(small.parse(big, big.size(), e).error == client_error::too_big);
}

TEST_CASE("envelope: bad_json", "[envelope]") {
  fixture f;
  for (const std::string_view m : {
           "", "   ", "{", "}", "nul", "tru", "{\"op\":\"sub\",}", "{\"op\" \"sub\"}", "{\"op\":\"sub\" \"topics\":[\"a\"]}",
           R"({"op":"sub","topics":["a"]} x)", R"({"op":"sub","topics":["a"]}{})", R"({"op":"sub","topics":["a",]})",
           R"({"op":"pub","topic":"t","data":tru})", R"({"op":"pub","topic":"t","data":nulll})",
           R"({"op":"pub","topic":"t","data":01})", R"({"op":"pub","topic":"t","data":1.})",
           R"({"op":"pub","topic":"t","data":-})", R"({"op":"pub","topic":"t","data":+1})",
           R"({"op":"pub","topic":"t","data":[1,]})", R"({"op":"pub","topic":"t","data":{"a"}})",
           R"({"op":"pub","topic":"t","data":"\x"})", R"({"op":"pub","topic":"t","data":"\ud800"})",
           R"({"op":"pub","topic":"t","data":[1 2]})", R"({"op":"pub","topic":"t","data":{"a":1,}})",
           R"({"op":"sub","topics":["a"],"x":[tru]})", R"({"op":"sub","topics":["a"],"x":{"k":1e}})",
           "{\"op\":\"pub\",\"topic\":\"t\",\"data\":\"\x01\"}",   // raw control byte in a string
           "{\"op\":\"pub\",\"topic\":\"t\",\"data\":\"\xC3\"}",   // invalid UTF-8
           "{\"op\":\"pub\",\"topic\":\"t\",\"data\":\"abc}",       // unclosed string
           "[1,2", "[1,]", "1 2", "\"a\" 1",
       }) {
    CAPTURE(m);
    const auto r = f.parse(m);
    CHECK(r.error == client_error::bad_json);
    CHECK_FALSE(r.message.empty());
  }
}

TEST_CASE("envelope: unknown_op", "[envelope]") {
  fixture f;
  CHECK(f.error_of(R"({"op":"subscribe","topics":["a"]})") == client_error::unknown_op);
  CHECK(f.error_of(R"({"op":""})") == client_error::unknown_op);
  CHECK(f.error_of(R"({"op":"SUB","topics":["a"]})") == client_error::unknown_op);
}

TEST_CASE("envelope: bad_request", "[envelope]") {
  fixture f;
  for (const std::string_view m : {
           "[1]", "\"sub\"", "42", "null", "true", R"({})", R"({"topics":["a"]})",                 // no object, no op
           R"({"op":1,"topics":["a"]})", R"({"op":["sub"]})", R"({"op":null})",                 // op not a string
           R"({"op":"sub"})", R"({"op":"sub","topics":"a"})", R"({"op":"sub","topics":[]})",     // topics
           R"({"op":"sub","topics":[1]})", R"({"op":"sub","topics":[""]})", R"({"op":"sub","topics":["a b"]})",
           R"({"op":"sub","topics":["a*"]})", R"({"op":"sub","topics":["caf\u00e9"]})", R"({"op":"sub","topics":[null]})",
           R"({"op":"sub","topics":["a"],"since":["a","1"]})", R"({"op":"sub","topics":["a"],"since":{"a":1}})",
           R"({"op":"sub","topics":["a"],"since":{"a":""}})", R"({"op":"sub","topics":["a"],"since":{"b":"1"}})",
           R"({"op":"sub","topics":["a"],"since":{"a":"1","a":"2"}})", R"({"op":"sub","topics":["a"],"since":{"*":"1"}})",
           R"({"op":"pub","data":1})", R"({"op":"pub","topic":"t"})", R"({"op":"pub","topic":"","data":1})",
           R"({"op":"pub","topic":5,"data":1})", R"({"op":"pub","topic":"a*","data":1})",
           R"({"op":"pub","topic":"t","data":1,"topics":5})",                                    // known field, wrong type
           R"({"op":"sub","op":"sub","topics":["a"]})", R"({"op":"pub","topic":"t","data":1,"data":2})",
           R"({"op":"sub","topics":["a"],"topics":["b"]})",
       }) {
    CAPTURE(m);
    const auto r = f.parse(m);
    CHECK(r.error == client_error::bad_request);
    CHECK_FALSE(r.message.empty());
  }
}

TEST_CASE("envelope: a message without padding behind it is copied, and parsed the same", "[envelope]") {
  envelope_parser parser(1024);
  envelope e;
  const std::string msg = R"({"op":"pub","topic":"mailbox:42","data":{"x":[1,2,3]}})";
  std::vector<char> exact(msg.begin(), msg.end());  // nothing readable past the end (ASan checks)
  REQUIRE(parser.parse({exact.data(), exact.size()}, exact.size(), e).ok());
  CHECK(e.topic == "mailbox:42");
  CHECK(e.data == R"({"x":[1,2,3]})");
  CHECK((e.data.data() < exact.data() || e.data.data() >= exact.data() + exact.size()));
  // the parser is reusable: the next message replaces the views
  const std::string second = R"({"op":"unsub","topics":["b"]})";
  REQUIRE(parser.parse(second, second.size(), e).ok());
  CHECK(e.op == client_op::unsub);
  CHECK(e.topic.empty());
  CHECK(e.data.empty());
}

// ---- server → client ------------------------------------------------------------------------

namespace {

simdjson::dom::element reparse(simdjson::dom::parser& p, std::string_view json) {
  simdjson::dom::element root;
  REQUIRE(p.parse(json.data(), json.size(), true).get(root) == simdjson::SUCCESS);
  return root;
}

std::string_view str(simdjson::dom::element e, std::string_view key) {
  std::string_view s;
  REQUIRE(e[key].get(s) == simdjson::SUCCESS);
  return s;
}

std::vector<std::string> strs(simdjson::dom::element e, std::string_view key) {
  simdjson::dom::array a;
  REQUIRE(e[key].get(a) == simdjson::SUCCESS);
  std::vector<std::string> out;
  for (auto x : a) out.emplace_back(std::string_view(x));
  return out;
}

/// Every buffer shorter than the encoding gets 0; the exact size gets the whole encoding.
template <class Encode>
std::string check_sizes(Encode encode) {
  std::string out(4096, '\0');
  const std::size_t n = encode(std::span<char>(out.data(), out.size()));
  REQUIRE(n > 0);
  out.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    std::string small(k, '\0');
    CAPTURE(k);
    CHECK(encode(std::span<char>(small.data(), small.size())) == 0);
  }
  std::string exact(n, '\0');
  CHECK(encode(std::span<char>(exact.data(), exact.size())) == n);
  CHECK(exact == out);
  return out;
}

}  // namespace

TEST_CASE("envelope: encode_event round-trips, data byte for byte", "[envelope][encode]") {
  simdjson::dom::parser p;
  const std::string data = "{ \"subject\" : \"caf\\u00e9\",\n \"n\": 1E400 }";
  const std::string out = check_sizes([&](std::span<char> b) { return encode_event("mailbox:42", "k3f9:18", data, b); });
  CHECK(out == R"({"topic":"mailbox:42","id":"k3f9:18","data":)" + data + "}");
  CHECK(out.size() <= event_size_bound("mailbox:42", "k3f9:18", data));
  CHECK(out.substr(event_topic_offset, 10) == "mailbox:42");  // where the hub's events point
  // ids are opaque: anything is escaped correctly
  const std::string odd_id = std::string("a\"b\\c\nd\x01\x1f\t\r\b\f") + "\xC3\xA9";
  std::string buf(event_size_bound("t", odd_id, "1"), '\0');
  const std::size_t n = encode_event("t", odd_id, "1", buf);
  REQUIRE(n > 0);
  CHECK(str(reparse(p, {buf.data(), n}), "id") == odd_id);
  // the full path: a client's pub, parsed, becomes an event carrying the same bytes
  fixture f;
  REQUIRE(f.parse(R"({"op":"pub","topic":"mailbox:42","data":)" + data + "}").ok());
  std::string ev(event_size_bound(f.env.topic, "1", f.env.data), '\0');
  ev.resize(encode_event(f.env.topic, "1", f.env.data, ev));
  CHECK(ev.find(data) != std::string::npos);
}

TEST_CASE("envelope: encode_subbed, encode_unsubbed, encode_error, encode_published", "[envelope][encode]") {
  simdjson::dom::parser p;
  const std::array<std::string_view, 2> topics = {"mailbox:42", "news:sport"};
  const std::array<std::string_view, 1> lost = {"news:sport"};
  auto subbed = check_sizes([&](std::span<char> b) { return encode_subbed(topics, lost, b); });
  CHECK(subbed == R"({"op":"subbed","topics":["mailbox:42","news:sport"],"lost":["news:sport"]})");
  auto root = reparse(p, subbed);
  CHECK(str(root, "op") == "subbed");
  CHECK(strs(root, "topics") == std::vector<std::string>{"mailbox:42", "news:sport"});
  CHECK(strs(root, "lost") == std::vector<std::string>{"news:sport"});
  CHECK(check_sizes([&](std::span<char> b) { return encode_subbed(topics, {}, b); }) ==
        R"({"op":"subbed","topics":["mailbox:42","news:sport"],"lost":[]})");
  // Positions beside the topics: only the non-empty ones are written.
  const std::array<std::string_view, 2> at = {"", "k3f9:17"};
  const auto positioned = check_sizes([&](std::span<char> b) { return encode_subbed(topics, {}, b, at); });
  CHECK(positioned == R"({"op":"subbed","topics":["mailbox:42","news:sport"],"lost":[],"at":{"news:sport":"k3f9:17"}})");
  simdjson::dom::element at_object;
  REQUIRE(reparse(p, positioned)["at"].get(at_object) == simdjson::SUCCESS);
  CHECK(str(at_object, "news:sport") == "k3f9:17");
  const std::array<std::string_view, 2> both = {"e:1", "e:2-0"};
  CHECK(check_sizes([&](std::span<char> b) { return encode_subbed(topics, lost, b, both); }) ==
        R"({"op":"subbed","topics":["mailbox:42","news:sport"],"lost":["news:sport"],"at":{"mailbox:42":"e:1","news:sport":"e:2-0"}})");
  const std::array<std::string_view, 2> none = {"", ""};
  CHECK(check_sizes([&](std::span<char> b) { return encode_subbed(topics, {}, b, none); }) ==
        R"({"op":"subbed","topics":["mailbox:42","news:sport"],"lost":[]})");

  const auto unsubbed = check_sizes([&](std::span<char> b) { return encode_unsubbed(lost, b); });
  CHECK(unsubbed == R"({"op":"unsubbed","topics":["news:sport"]})");
  CHECK(strs(reparse(p, unsubbed), "topics") == std::vector<std::string>{"news:sport"});

  const auto forbidden = check_sizes([&](std::span<char> b) { return encode_error(client_error::forbidden, "a", b); });
  CHECK(forbidden == R"({"op":"error","code":"forbidden","topic":"a"})");
  const auto bad = check_sizes([&](std::span<char> b) { return encode_error(client_error::bad_json, {}, b); });
  CHECK(bad == R"({"op":"error","code":"bad_json"})");
  CHECK(reparse(p, bad)["topic"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(reparse(p, bad)["of"].error() == simdjson::NO_SUCH_FIELD);
  const auto pub = check_sizes([&](std::span<char> b) { return encode_error(client_error::timeout, "a", b, "pub"); });
  CHECK(pub == R"({"op":"error","code":"timeout","topic":"a","of":"pub"})");
  CHECK(str(reparse(p, pub), "of") == "pub");

  const auto published = check_sizes([&](std::span<char> b) { return encode_published("18", b); });
  CHECK(published == R"({"id":"18"})");
  CHECK(str(reparse(p, published), "id") == "18");
}

TEST_CASE("envelope: auth carries a token and pong carries nothing", "[envelope]") {
  fixture f;
  f.parser = envelope_parser(64 * 1024);  // the pub/sub default: room for the longest token
  REQUIRE(f.parse(R"({"op":"auth","token":"aaa.bbb.ccc"})").ok());
  CHECK(f.env.op == client_op::auth);
  CHECK(f.env.token == "aaa.bbb.ccc");
  CHECK(f.env.topic_count == 0);
  REQUIRE(f.parse(R"({"token":"t\u0031","op":"auth","topics":["x"]})").ok());  // escaped, other fields ignored
  CHECK(f.env.token == "t1");
  CHECK(f.env.topic_count == 0);
  REQUIRE(f.parse(R"({"op":"pong"})").ok());
  CHECK(f.env.op == client_op::pong);
  CHECK(f.env.token.empty());  // nothing left over from the previous message
  CHECK(f.error_of(R"({"op":"auth"})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"auth","token":""})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"auth","token":5})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"auth","token":")" + std::string(4097, 't') + "\"}") == client_error::bad_request);
  CHECK(f.parse(R"({"op":"auth","token":")" + std::string(4096, 't') + "\"}").ok());
  CHECK(f.error_of(R"({"op":"auth","token":"a","token":"b"})") == client_error::bad_request);
}

TEST_CASE("envelope: encode_authed", "[envelope][encode]") {
  simdjson::dom::parser p;
  const std::array<std::string_view, 2> gone = {"mailbox:42", "team:a"};
  const auto authed = check_sizes([&](std::span<char> b) { return encode_authed(1735689600, gone, b); });
  CHECK(authed == R"({"op":"authed","exp":1735689600,"unsubbed":["mailbox:42","team:a"]})");
  CHECK(strs(reparse(p, authed), "unsubbed") == std::vector<std::string>{"mailbox:42", "team:a"});
  CHECK(check_sizes([&](std::span<char> b) { return encode_authed(0, {}, b); }) == R"({"op":"authed","exp":0,"unsubbed":[]})");
}

TEST_CASE("envelope: error names", "[envelope]") {
  CHECK(client_error_name(client_error::forbidden) == "forbidden");
  CHECK(client_error_name(client_error::too_many_topics) == "too_many_topics");
  CHECK(client_error_name(client_error::unknown_op) == "unknown_op");
  CHECK(client_error_name(client_error::unauthorized) == "unauthorized");
  CHECK(client_error_name(client_error::unavailable) == "unavailable");
  CHECK(client_error_name(client_error::timeout) == "timeout");  // the admin API's word for it (504)
}

TEST_CASE("no allocation: envelope parse and encoders once warm", "[alloc][envelope]") {
  envelope_parser parser(4096);  // allocates here, once
  envelope e;
  auto padded = [](std::string_view m) { return std::string(m) + std::string(envelope_padding, ' '); };
  const std::string sub = padded(R"({"op":"sub","topics":["mailbox:42"],"since":{"mailbox:42":"k3f9:17"}})");
  const std::string pub = padded(R"({"op":"pub","topic":"mailbox:42","data":{"subject":"hi","to":["a","b"],"n":1.5}})");
  const std::string bad = padded(R"({"op":"pub","topic":"t","data":[1,]})");
  const std::string esc = padded(R"({"op":"sub","topics":["mailbox:\u0034\u0032"]})");
  const std::string unpadded = R"({"op":"unsub","topics":["mailbox:42"]})";
  auto run = [&](const std::string& m, std::size_t len) { return parser.parse({m.data(), len}, m.size(), e).error; };
  auto len = [&](const std::string& m) { return m.size() - envelope_padding; };
  run(sub, len(sub));  // warm: simdjson picks its implementation on first use
  std::array<char, 512> out{};
  const std::array<std::string_view, 1> topics = {"mailbox:42"};

  const std::size_t before = wspush::test::allocation_count();
  const client_error r1 = run(sub, len(sub));
  const client_error r2 = run(pub, len(pub));
  const client_error r3 = run(bad, len(bad));
  const client_error r4 = run(esc, len(esc));
  const client_error r5 = parser.parse(unpadded, unpadded.size(), e).error;  // the copying path
  const std::size_t n1 = encode_event("mailbox:42", "k3f9:18", R"({"subject":"hi"})", out);
  const std::size_t n2 = encode_subbed(topics, topics, out);
  const std::size_t n3 = encode_error(client_error::forbidden, "mailbox:42", out);
  const std::size_t n4 = encode_error(client_error::timeout, "mailbox:42", out, "pub");
  const std::size_t during = wspush::test::allocation_count() - before;

  CHECK(r1 == client_error::none);
  CHECK(r2 == client_error::none);
  CHECK(r3 == client_error::bad_json);
  CHECK(r4 == client_error::none);
  CHECK(r5 == client_error::none);
  CHECK((n1 > 0 && n2 > 0 && n3 > 0 && n4 > 0));
  CHECK(during == 0);
}

TEST_CASE("envelope: presence and presence_count name one topic", "[envelope]") {
  fixture f;
  REQUIRE(f.parse(R"({"op":"presence","topic":"room:1"})").ok());
  CHECK(f.env.op == client_op::presence);
  CHECK(f.env.topic == "room:1");
  REQUIRE(f.parse(R"({"topic":"room:2","op":"presence_count","topics":["x"],"data":1})").ok());
  CHECK(f.env.op == client_op::presence_count);
  CHECK(f.env.topic == "room:2");
  CHECK(f.env.topic_count == 0);
  CHECK(f.env.data.empty());
  CHECK(f.error_of(R"({"op":"presence"})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"presence","topic":"bad topic"})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"presence","topic":5})") == client_error::bad_request);
  CHECK(f.error_of(R"({"op":"presences","topic":"room:1"})") == client_error::unknown_op);
}

TEST_CASE("envelope: encode_presence and encode_join_leave", "[envelope][encode]") {
  simdjson::dom::parser p;
  const std::array<presence_user, 2> users = {presence_user{"u42", 2}, presence_user{"a\"b", 1}};
  const std::span<const presence_user> span(users);
  const auto listed = check_sizes([&](std::span<char> b) { return encode_presence("presence", "room:1", &span, 2, 3, false, b); });
  CHECK(listed == R"({"op":"presence","topic":"room:1","users":{"u42":2,"a\"b":1},"user_count":2,"connections":3})");
  CHECK(str(reparse(p, listed), "topic") == "room:1");
  const auto cut = check_sizes([&](std::span<char> b) { return encode_presence("presence", "room:1", &span, 9, 12, true, b); });
  CHECK(cut == R"({"op":"presence","topic":"room:1","users":{"u42":2,"a\"b":1},"truncated":true,"user_count":9,"connections":12})");
  const auto counts = check_sizes([&](std::span<char> b) { return encode_presence("presence_count", "room:1", nullptr, 2, 3, false, b); });
  CHECK(counts == R"({"op":"presence_count","topic":"room:1","user_count":2,"connections":3})");
  const auto admin = check_sizes([&](std::span<char> b) { return encode_presence({}, "room:1", nullptr, 0, 0, false, b); });
  CHECK(admin == R"({"topic":"room:1","user_count":0,"connections":0})");
  const auto join = check_sizes([&](std::span<char> b) { return encode_join_leave(true, "room:1", "u\n1", b); });
  CHECK(join == R"({"op":"join","topic":"room:1","user":"u\n1"})");
  CHECK(join.substr(22, 6) == "room:1");  // where the frame's topic is found (presence.cpp)
  const auto leave = check_sizes([&](std::span<char> b) { return encode_join_leave(false, "room:1", "u", b); });
  CHECK(leave == R"({"op":"leave","topic":"room:1","user":"u"})");
  CHECK(leave.substr(23, 6) == "room:1");
}
