#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "server/bus/resp.hpp"

using namespace wspush::server::bus;
using resp::reply_type;

namespace {

/// A reply as text: +status -error :integer $bulk nil [elements,...].
std::string show(const resp::reply& r) {
  switch (r.type) {
    case reply_type::status: return "+" + std::string(r.str, r.len);
    case reply_type::error: return "-" + std::string(r.str, r.len);
    case reply_type::integer: return ":" + std::to_string(r.integer);
    case reply_type::string: return "$" + std::string(r.str, r.len);
    case reply_type::nil: return "nil";
    case reply_type::array: {
      std::string s = "[";
      for (std::size_t k = 0; k < r.elements; ++k) s += (k ? "," : "") + show(*r.element[k]);
      return s + "]";
    }
  }
  return "?";
}

struct outcome {
  std::vector<std::string> replies;
  bool error = false;
  bool operator==(const outcome&) const = default;
};

/// Feeds `wire` in the pieces that `cuts` (ascending offsets) make; every reply and the error.
outcome feed(resp::parser& p, std::string_view wire, const std::vector<std::size_t>& cuts) {
  outcome o;
  std::size_t at = 0;
  std::vector<std::size_t> ends = cuts;
  ends.push_back(wire.size());
  for (std::size_t end : ends) {
    std::string_view piece = wire.substr(at, end - at);
    at = end;
    while (!piece.empty()) {
      const resp::result r = p.parse(piece);
      if (r.st == resp::status::error) {
        o.error = true;
        return o;
      }
      if (r.st == resp::status::need_more) {
        REQUIRE(r.consumed == piece.size());
        break;
      }
      REQUIRE(r.consumed > 0);
      REQUIRE(r.consumed <= piece.size());
      o.replies.push_back(show(p.root()));
      piece.remove_prefix(r.consumed);
    }
  }
  return o;
}

resp::limits small() { return {.max_bulk = 16, .max_elements = 8, .max_depth = 3, .max_total = 1024}; }

/// Whole, split once at every byte, and one byte at a time: all must agree. Returns the whole result.
outcome parse_all_ways(std::string_view wire, resp::limits l = {}) {
  resp::parser whole(l);
  const outcome expect = feed(whole, wire, {});
  for (std::size_t cut = 1; cut < wire.size(); ++cut) {
    resp::parser p(l);
    INFO("split at " << cut);
    CHECK(feed(p, wire, {cut}) == expect);
  }
  std::vector<std::size_t> every;
  for (std::size_t k = 1; k < wire.size(); ++k) every.push_back(k);
  resp::parser bytes(l);
  CHECK(feed(bytes, wire, every) == expect);
  return expect;
}

bool refused(std::string_view wire, resp::limits l = small()) { return parse_all_ways(wire, l).error; }

}  // namespace

TEST_CASE("resp: every type, whole, split at every byte and byte by byte") {
  const std::string wire =
      "+OK\r\n"
      "-ERR wspush: bad topic\r\n"
      ":0\r\n:-42\r\n:9223372036854775807\r\n:-9223372036854775808\r\n"
      "$5\r\nhello\r\n$0\r\n\r\n$-1\r\n$4\r\na\r\nb\r\n"
      "*-1\r\n*0\r\n"
      "*3\r\n$7\r\nmessage\r\n$4\r\nchan\r\n$2\r\n{}\r\n"
      "*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n+x\r\n"
      "*2\r\n*1\r\n*0\r\n:7\r\n";
  const outcome o = parse_all_ways(wire);
  CHECK_FALSE(o.error);
  CHECK(o.replies == std::vector<std::string>{"+OK", "-ERR wspush: bad topic", ":0", ":-42", ":9223372036854775807",
                                              ":-9223372036854775808", "$hello", "$", "nil", "$a\r\nb", "nil", "[]",
                                              "[$message,$chan,${}]", "[:1,[$a,nil],+x]", "[[[]],:7]"});
}

TEST_CASE("resp: a reply past a bound is an error before its storage is taken") {
  CHECK_FALSE(refused("$16\r\n0123456789abcdef\r\n"));
  CHECK(refused("$17\r\n0123456789abcdefg\r\n"));  // max_bulk
  CHECK_FALSE(refused("+0123456789abcdef\r\n"));
  CHECK(refused("+0123456789abcdefg\r\n"));        // a status line is bounded like a bulk
  CHECK(refused("-0123456789abcdefg\r\n"));
  CHECK_FALSE(refused("*8\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n:8\r\n"));
  CHECK(refused("*9\r\n"));                        // max_elements, at the header
  CHECK_FALSE(refused("*1\r\n*1\r\n*1\r\n:1\r\n"));
  CHECK(refused("*1\r\n*1\r\n*1\r\n*1\r\n"));      // max_depth 3, at the fourth header
  CHECK(refused("*16\r\n*16\r\n*16\r\n*16\r\n*16\r\n*16\r\n*16\r\n", {.max_depth = 4}));

  // max_total: string bytes plus sizeof(reply) per element.
  const std::size_t node = sizeof(resp::reply);
  resp::limits l{.max_bulk = 100, .max_elements = 100, .max_depth = 4, .max_total = 3 * node + 150};
  CHECK_FALSE(refused("*2\r\n$75\r\n" + std::string(75, 'a') + "\r\n$75\r\n" + std::string(75, 'b') + "\r\n", l));
  CHECK(refused("*2\r\n$75\r\n" + std::string(75, 'a') + "\r\n$76\r\n" + std::string(76, 'b') + "\r\n", l));
  CHECK(refused("*6\r\n", l));  // 7 elements' cost

  // What the node was sent to make it reserve gigabytes: refused at the header, nothing held.
  for (std::string wire : {"*2147483647\r\n", "$1073741824\r\n", "*9223372036854775807\r\n"}) {
    resp::parser p(resp::limits{});
    CHECK(p.parse(wire).st == resp::status::error);
    CHECK(p.held_bytes() < 4096);
  }
}

TEST_CASE("resp: what is not RESP is an error") {
  for (std::string wire : {"hello\r\n", "\r\n", "$abc\r\n", "$\r\n", ":\r\n", ":-\r\n", ":+1\r\n", ":1\n", ":1\rx",
                           "$3\r\nabcX\r\n", "$3\r\nabc\r\r", "*-2\r\n", "$-5\r\n", ":99999999999999999999\r\n",
                           ":123456789012345678901234567890\r\n", "+a\rb\r\n", "+a\nb\r\n", "* 1\r\n", "*1x\r\n"}) {
    INFO(wire);
    CHECK(refused(wire, {}));
  }
}

TEST_CASE("resp: an error stays until reset, and the storage of a big reply goes back") {
  resp::parser p(resp::limits{.max_bulk = 1 << 20, .max_elements = 16, .max_depth = 4, .max_total = 4 << 20});
  CHECK(p.parse("?").st == resp::status::error);
  CHECK_FALSE(p.error().empty());
  CHECK(p.parse("+OK\r\n").st == resp::status::error);
  p.reset();
  CHECK(p.parse("+OK\r\n").st == resp::status::done);
  CHECK(show(p.root()) == "+OK");

  const std::string big = "$1000000\r\n" + std::string(1000000, 'x') + "\r\n";
  REQUIRE(p.parse(big).st == resp::status::done);
  CHECK(p.root().len == 1000000);
  CHECK(p.held_bytes() >= 1000000);
  CHECK(p.parse(":1\r\n").st == resp::status::done);  // the next reply starts with little again
  CHECK(p.held_bytes() < 128 << 10);

  // A partial reply is forgotten by reset.
  CHECK(p.parse("*2\r\n:1\r\n").st == resp::status::need_more);
  p.reset();
  CHECK(p.parse(":5\r\n").st == resp::status::done);
  CHECK(show(p.root()) == ":5");
}
