#include "proto/ws_deflate.hpp"

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string_view>
#include <vector>

using namespace wspush::proto;

namespace {

deflate_offer offer(std::initializer_list<std::string_view> headers) {
  const std::vector<std::string_view> v(headers);
  return negotiate_deflate(v);
}

}  // namespace

TEST_CASE("deflate: what browsers and libraries offer is accepted", "[deflate]") {
  CHECK(offer({"permessage-deflate; client_max_window_bits"}) == deflate_offer::accepted);  // Chromium, websockets, ws
  CHECK(offer({"permessage-deflate"}) == deflate_offer::accepted);                          // Firefox
  CHECK(offer({"permessage-deflate; client_no_context_takeover; server_no_context_takeover"}) ==
        deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=15; client_max_window_bits=15"}) ==
        deflate_offer::accepted);
  CHECK(offer({"PerMessage-Deflate; Client_Max_Window_Bits"}) == deflate_offer::accepted);
  CHECK(offer({"  permessage-deflate ;\tclient_max_window_bits = 12 , "}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=\"15\""}) == deflate_offer::accepted);
}

TEST_CASE("deflate: no offer of it", "[deflate]") {
  CHECK(offer({}) == deflate_offer::none);
  CHECK(offer({""}) == deflate_offer::none);
  CHECK(offer({" , ,"}) == deflate_offer::none);
  CHECK(offer({"x-webkit-deflate-frame"}) == deflate_offer::none);
  CHECK(offer({"foo; bar=baz; qux=\"a b\""}) == deflate_offer::none);
  CHECK(offer({"permessage-deflatex"}) == deflate_offer::none);
}

TEST_CASE("deflate: window bits", "[deflate]") {
  for (int bits = 8; bits <= 15; ++bits) {
    const std::string client = "permessage-deflate; client_max_window_bits=" + std::to_string(bits);
    CHECK(offer({client}) == deflate_offer::accepted);
    const std::string server = "permessage-deflate; server_max_window_bits=" + std::to_string(bits);
    // The shared frames are made with the full window: a smaller one cannot be honoured.
    CHECK(offer({server}) == (bits == 15 ? deflate_offer::accepted : deflate_offer::declined));
  }
  for (std::string_view bad : {"0", "7", "16", "015", "08", "1", "150", "-9", "9a", "\"1\\6\"", "\"\\1\\5\\ \""}) {
    const std::string client = "permessage-deflate; client_max_window_bits=" + std::string(bad);
    CHECK(offer({client}) == deflate_offer::declined);
    const std::string server = "permessage-deflate; server_max_window_bits=" + std::string(bad);
    CHECK(offer({server}) == deflate_offer::declined);
  }
  CHECK(offer({"permessage-deflate; server_max_window_bits"}) == deflate_offer::declined);  // a value is required
  // A quoted value counts as it reads unescaped (RFC 6455 §9.1).
  CHECK(offer({"permessage-deflate; server_max_window_bits=\"1\\5\""}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; client_max_window_bits=\"\\9\""}) == deflate_offer::accepted);
}

TEST_CASE("deflate: invalid parameters decline the offer", "[deflate]") {
  CHECK(offer({"permessage-deflate; server_no_context_takeover; server_no_context_takeover"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_no_context_takeover; client_no_context_takeover"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_max_window_bits; client_max_window_bits=10"}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; server_max_window_bits=15; server_max_window_bits=15"}) ==
        deflate_offer::declined);
  CHECK(offer({"permessage-deflate; server_no_context_takeover=1"}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; client_no_context_takeover=\"\""}) == deflate_offer::declined);
  CHECK(offer({"permessage-deflate; mystery"}) == deflate_offer::declined);
}

TEST_CASE("deflate: the first offer that can be taken is", "[deflate]") {
  CHECK(offer({"permessage-deflate; server_max_window_bits=10, permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"foo; bar, permessage-deflate; client_max_window_bits"}) == deflate_offer::accepted);
  CHECK(offer({"foo; a=\"x, permessage-deflate; y\""}) == deflate_offer::none);  // a comma inside a quoted value
  CHECK(offer({"foo; a=\"x, y\", permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=10, permessage-deflate; server_max_window_bits=9"}) ==
        deflate_offer::declined);
  // The header repeated: its values are one list.
  CHECK(offer({"foo", "permessage-deflate"}) == deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; server_max_window_bits=9", "permessage-deflate; client_no_context_takeover"}) ==
        deflate_offer::accepted);
  CHECK(offer({"permessage-deflate; mystery", ""}) == deflate_offer::declined);
}

TEST_CASE("deflate: a list that does not parse takes nothing", "[deflate]") {
  for (std::string_view bad : {"permessage-deflate;", "permessage-deflate; =1", "permessage-deflate; a=",
                               "permessage-deflate; a=\"unterminated", "permessage-deflate x",
                               "; permessage-deflate", "permessage-deflate; a=\"x\\", "permessage-deflate; a=b c",
                               "permessage-deflate; a=\"\x01\"", "per message-deflate", "foo, ; bar",
                               "foo; a=\"x\", permessage-deflate;;"}) {
    INFO(bad);
    CHECK(offer({bad}) == deflate_offer::malformed);
  }
  // Up to the offer taken only: what follows it is not read.
  CHECK(offer({"permessage-deflate, foo;"}) == deflate_offer::accepted);
  CHECK(offer({"foo;", "permessage-deflate"}) == deflate_offer::malformed);
}

TEST_CASE("deflate: the answer names what the server keeps to", "[deflate]") {
  CHECK(deflate_response == "permessage-deflate; server_no_context_takeover; client_no_context_takeover");
}
