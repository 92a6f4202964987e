// Proves the hot protocol paths allocate nothing: this binary links the counting global
// operator new (tests/support/counting_alloc), and each test counts around the calls alone.

#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <new>
#include <string>

#include "proto/http_upgrade.hpp"
#include "proto/utf8.hpp"
#include "proto/ws_close.hpp"
#include "proto/ws_deflate.hpp"

#include <libdeflate.h>

#include <cstdlib>
#include "proto/ws_frame.hpp"
#include "proto/ws_handshake.hpp"
#include "proto/ws_reader.hpp"
#include "test_support.hpp"

using namespace wspush::proto;
using wspush::test::allocation_count;

namespace {

struct null_handler {
  std::size_t bytes = 0;
  bool on_data(opcode, std::span<std::uint8_t> piece, bool, bool) noexcept {
    bytes += piece.size();
    return true;
  }
  bool on_control(opcode, std::span<std::uint8_t> payload) noexcept {
    bytes += payload.size();
    return true;
  }
};

}  // namespace

TEST_CASE("no allocation: the counter counts", "[alloc]") {
  const std::size_t before = allocation_count();
  // Direct operator calls through a volatile pointer: a new-expression could be elided.
  void* volatile p = ::operator new(16);
  ::operator delete(p);
  CHECK(allocation_count() - before == 1);
}

TEST_CASE("no allocation: upgrade parse, whole and byte by byte", "[alloc]") {
  const std::string request =
      "GET /ws?token=abc HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
      "Cookie: a=b; wspush_token=t\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      "Sec-WebSocket-Version: 13\r\nOrigin: http://h\r\n\r\n";
  upgrade_request req{};
  const std::size_t before = allocation_count();
  upgrade_parser whole;
  const upgrade_result r = whole.parse(request, req);
  upgrade_parser bytewise;
  for (std::size_t i = 1; i <= request.size(); ++i) bytewise.parse(std::string_view(request).substr(0, i), req);
  upgrade_parser bad;
  bad.parse("GET / HTTP/1.1\r\nHost h\r\n\r\n", req);
  const std::size_t during = allocation_count() - before;
  CHECK(r.outcome == upgrade_outcome::websocket);
  CHECK(during == 0);
}

TEST_CASE("no allocation: frame reader, frame codec, close, UTF-8", "[alloc]") {
  // a fragmented text message with a ping in between, and a close
  std::vector<std::uint8_t> wire;
  auto add = [&](opcode op, bool fin, std::string_view payload) {
    std::array<std::uint8_t, max_frame_header_size> h{};
    const std::size_t n = encode_masked_frame_header(h, op, fin, payload.size(), {1, 2, 3, 4});
    wire.insert(wire.end(), h.begin(), h.begin() + static_cast<std::ptrdiff_t>(n));
    const std::size_t at = wire.size();
    wire.insert(wire.end(), payload.begin(), payload.end());
    apply_mask({wire.data() + at, payload.size()}, {1, 2, 3, 4}, 0);
  };
  add(opcode::text, false, "h\xC3\xA9llo ");
  add(opcode::ping, true, "p");
  add(opcode::continuation, true, std::string(300, 'w'));
  add(opcode::close, true, std::string("\x03\xE8" "bye", 5));
  std::vector<std::uint8_t> copy = wire;
  const std::string text = "mixed \xE2\x82\xAC text " + std::string(200, 'a');
  std::array<std::uint8_t, 125> close_out{};
  std::array<std::uint8_t, max_server_header_size> header{};

  const std::size_t before = allocation_count();
  ws_reader reader;
  null_handler handler;
  const read_result r = reader.consume(wire, {}, handler);
  ws_reader split;  // in two calls, the second presenting the tail again
  const read_result r1 = split.consume({copy.data(), 10}, {}, handler);
  split.consume({copy.data() + r1.consumed, copy.size() - r1.consumed}, {}, handler);
  const bool valid = is_valid_utf8({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  const std::size_t close_n = encode_close_payload(close_code::going_away, "shutdown", close_out);
  const close_parse cp = parse_close_payload({close_out.data(), close_n});
  const std::size_t header_n = encode_frame_header(header, opcode::binary, true, 70000);
  const header_result hr = parse_frame_header({header.data(), header_n});
  const std::size_t during = allocation_count() - before;

  CHECK(r.status == parse_status::done);
  CHECK(r.consumed == wire.size());
  CHECK(valid);
  CHECK(cp.ok);
  CHECK(hr.header.payload_len == 70000);
  CHECK(during == 0);
}

TEST_CASE("no allocation: responses", "[alloc]") {
  std::array<char, 512> out{};
  const std::size_t before = allocation_count();
  const std::size_t a = encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", out);
  const std::size_t b = encode_http_response(426, out, "use version 13");
  const std::size_t during = allocation_count() - before;
  CHECK(during == 0);  // operator new only; the SHA-1 context lives on the stack (see ws_handshake.cpp)
  CHECK(a > 0);
  CHECK(b > 0);
}

TEST_CASE("no allocation: permessage-deflate negotiation", "[alloc]") {
  const std::array<std::string_view, 2> headers = {
      "foo; bar=\"a \\\" b\", permessage-deflate; server_max_window_bits=10",
      "permessage-deflate; client_max_window_bits; server_no_context_takeover"};
  const std::size_t before = allocation_count();
  const deflate_offer r = negotiate_deflate(headers);
  const std::size_t during = allocation_count() - before;
  CHECK(r == deflate_offer::accepted);
  CHECK(during == 0);
}

namespace {
// libdeflate allocates through malloc, not operator new: count its calls here.
std::size_t libdeflate_allocs = 0;
void* counted_malloc(std::size_t n) { return ++libdeflate_allocs, std::malloc(n); }
}  // namespace

TEST_CASE("no allocation: a message deflated and inflated (only making the (de)compressor allocates)", "[alloc]") {
  libdeflate_set_memory_allocator(counted_malloc, std::free);
  message_deflater d;
  message_inflater i;
  CHECK(libdeflate_allocs == 2);
  std::array<std::uint8_t, 300> msg{};
  for (std::size_t k = 0; k < msg.size(); ++k) msg[k] = std::uint8_t("{\"topic\":\"mailbox:42\"}"[k % 22]);
  std::array<std::uint8_t, 1024> packed{}, out{};
  const std::size_t before = allocation_count();
  const std::size_t n = d.deflate(msg, packed);
  std::size_t got = 0;
  const inflate_status st = i.inflate(packed, n, out, got);
  const std::size_t during = allocation_count() - before;
  CHECK(n > 0);
  CHECK(st == inflate_status::ok);
  CHECK(got == msg.size());
  CHECK(during == 0);
  CHECK(libdeflate_allocs == 2);
  libdeflate_set_memory_allocator(std::malloc, std::free);
}
