// Micro-benchmarks for the protocol module (Google Benchmark; main comes from benchmark_main).
// Targets from DESIGN.md: upgrade parse ≤ 200 ns without SHA-1, 0 allocations.

#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/http_upgrade.hpp"
#include "proto/utf8.hpp"
#include "proto/ws_frame.hpp"
#include "proto/ws_handshake.hpp"
#include "proto/ws_reader.hpp"
#include "tests/bench/alloc_counter.hpp"

using namespace wspush::proto;

namespace {

// What a current Chrome sends to open a WebSocket: 12 headers, ~550 bytes, the token in the
// query (the wspush client's way).
const std::string k_browser_request =
    "GET /ws?token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl HTTP/1.1\r\n"
    "Host: push.example.com\r\n"
    "Connection: Upgrade\r\n"
    "Pragma: no-cache\r\n"
    "Cache-Control: no-cache\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 "
    "Safari/537.36\r\n"
    "Upgrade: websocket\r\n"
    "Origin: https://mail.example.com\r\n"
    "Sec-WebSocket-Version: 13\r\n"
    "Accept-Encoding: gzip, deflate, br\r\n"
    "Accept-Language: en-US,en;q=0.9\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    "\r\n";

// The same with the site's cookies and the token among them (13 headers, ~680 bytes).
const std::string k_browser_request_cookie = [] {
  std::string r = k_browser_request;
  r.replace(r.find("?token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl"), 57, "");
  r.insert(r.size() - 2,
           "Cookie: _ga=GA1.2.1234567890.1700000000; theme=dark; lang=en; "
           "wspush_token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl; session=abc123def456\r\n");
  return r;
}();

void bm_upgrade_parse(benchmark::State& state) {
  upgrade_request req{};
  wspush::bench::alloc_probe allocs;
  for (auto _ : state) {
    allocs.begin();
    upgrade_parser parser;
    upgrade_result r = parser.parse(k_browser_request, req);
    allocs.end();
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(req);
  }
  if (req.token.empty()) state.SkipWithError("no token found");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * k_browser_request.size()));
  state.counters["request_bytes"] = static_cast<double>(k_browser_request.size());
  state.counters["allocs_per_op"] = allocs.per(state.iterations());
}
BENCHMARK(bm_upgrade_parse);

void bm_upgrade_parse_cookie(benchmark::State& state) {
  upgrade_request req{};
  for (auto _ : state) {
    upgrade_parser parser;
    upgrade_result r = parser.parse(k_browser_request_cookie, req);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(req);
  }
  if (req.token.empty()) state.SkipWithError("no token found");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * k_browser_request_cookie.size()));
  state.counters["request_bytes"] = static_cast<double>(k_browser_request_cookie.size());
}
BENCHMARK(bm_upgrade_parse_cookie);

// The same request arriving one byte per read: shows the resumed scan stays linear.
void bm_upgrade_parse_bytewise(benchmark::State& state) {
  upgrade_request req{};
  const std::string_view text = k_browser_request;
  for (auto _ : state) {
    upgrade_parser parser;
    upgrade_result r{};
    for (std::size_t n = 1; n <= text.size(); ++n) r = parser.parse(text.substr(0, n), req);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK(bm_upgrade_parse_bytewise);

void bm_accept_key(benchmark::State& state) {
  std::array<char, accept_key_size> out{};
  for (auto _ : state) {
    compute_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(bm_accept_key);

void bm_switching_protocols(benchmark::State& state) {
  std::array<char, 256> out{};
  for (auto _ : state) {
    std::size_t n = encode_switching_protocols("dGhlIHNhbXBsZSBub25jZQ==", out);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(bm_switching_protocols);

void bm_frame_header_encode(benchmark::State& state) {
  std::array<std::uint8_t, max_server_header_size> out{};
  std::uint64_t len = static_cast<std::uint64_t>(state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(len);
    std::size_t n = encode_frame_header(out, opcode::text, true, len);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(bm_frame_header_encode)->Arg(64)->Arg(1000)->Arg(100000);

void bm_frame_header_decode(benchmark::State& state) {
  std::array<std::uint8_t, max_frame_header_size> wire{};
  const std::size_t n =
      encode_masked_frame_header(wire, opcode::binary, true, static_cast<std::uint64_t>(state.range(0)), {1, 2, 3, 4});
  for (auto _ : state) {
    benchmark::DoNotOptimize(wire);
    header_result r = parse_frame_header({wire.data(), n});
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(bm_frame_header_decode)->Arg(64)->Arg(1000)->Arg(100000);

void bm_unmask(benchmark::State& state) {
  std::vector<std::uint8_t> data(static_cast<std::size_t>(state.range(0)), 0x5A);
  std::uint8_t offset = 0;
  for (auto _ : state) {
    offset = apply_mask(data, {0x12, 0x34, 0x56, 0x78}, offset);
    benchmark::DoNotOptimize(data.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(bm_unmask)->Arg(64)->Arg(1024)->Arg(64 << 10);

std::string make_text(std::size_t size, bool mixed) {
  // mixed: roughly a European-language mail body with some symbols and an emoji now and then
  const std::string ascii = "The quick brown fox jumps over the lazy dog. ";
  const std::string mixed_piece = "Gr\xC3\xBC\xC3\x9F" "e aus K\xC3\xB6ln \xE2\x82\xAC" "5 \xF0\x9F\x98\x80 ok. ";
  std::string out;
  while (out.size() < size) out += mixed ? mixed_piece : ascii;
  // cut back to a character boundary at or below size
  out.resize(size);
  while (!out.empty() && !is_valid_utf8({reinterpret_cast<const std::uint8_t*>(out.data()), out.size()}))
    out.pop_back();
  return out;
}

void bm_utf8(benchmark::State& state, bool mixed) {
  const std::string text = make_text(static_cast<std::size_t>(state.range(0)), mixed);
  const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  for (auto _ : state) {
    bool ok = is_valid_utf8(bytes);
    benchmark::DoNotOptimize(ok);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK_CAPTURE(bm_utf8, ascii, false)->Arg(1024)->Arg(64 << 10);
BENCHMARK_CAPTURE(bm_utf8, mixed, true)->Arg(1024)->Arg(64 << 10);

struct sink_handler {
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

// One masked text frame through the reader: header, unmask in place, UTF-8 check, event.
void bm_reader_text_frame(benchmark::State& state) {
  const std::string text = make_text(static_cast<std::size_t>(state.range(0)), false);
  std::vector<std::uint8_t> wire(max_frame_header_size + text.size());
  const std::size_t h = encode_masked_frame_header(
      std::span<std::uint8_t, max_frame_header_size>(wire.data(), max_frame_header_size), opcode::text, true,
      text.size(), {0, 0, 0, 0});  // a zero mask keeps the payload valid across iterations
  std::copy(text.begin(), text.end(), wire.begin() + static_cast<std::ptrdiff_t>(h));
  wire.resize(h + text.size());
  sink_handler sink;
  const ws_limits limits;
  for (auto _ : state) {
    ws_reader reader;
    read_result r = reader.consume(wire, limits, sink);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * wire.size()));
}
BENCHMARK(bm_reader_text_frame)->Arg(64)->Arg(1024);

}  // namespace
