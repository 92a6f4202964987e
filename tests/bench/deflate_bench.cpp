// permessage-deflate's compressor, chosen by measurement: zlib or libdeflate, each compressing
// one whole message with no context kept between messages (as a frame shared by every
// subscriber must be), and inflating a client's message the same way. Typical mailbox
// notifications of about 100 B, 300 B and 1 KiB of JSON, and a 16 KiB one.
//
//   build/tests/bench/deflate_bench
//
// Per message both reset their match finder's hash table, which costs more than compressing
// 100 bytes: zlib's is sized by memLevel (2^(memLevel + 7) entries), libdeflate's is fixed.
//
// Counters: out_bytes is the compressed size of the message (the frame's payload, RFC 7692
// §7.2.1: what the library wrote, its sync-flush tail or final block as the RFC asks).

#include <benchmark/benchmark.h>
#include <libdeflate.h>
#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

std::string mailbox_event(std::size_t size) {
  std::string s = R"({"type":"new_mail","mailbox":"mailbox:4242","id":"01HZX3Q5W8M2K9V7T4R6P1N0B","from":)"
                  R"({"name":"Alice Example","address":"alice@example.com"},"subject":"Quarterly report, )"
                  R"(draft 3","unread":12)";
  int n = 0;
  while (s.size() + 2 < size) {
    s += R"(,"label)" + std::to_string(n) + R"(":"inbox/projects/report-)" + std::to_string(n * 7 % 100) + R"(")";
    ++n;
  }
  s.resize(size - 1);
  s += '}';
  return s;
}

const std::size_t k_sizes[] = {100, 300, 1024, 16384};

void zlib_compress(benchmark::State& state) {
  const std::string msg = mailbox_event(k_sizes[state.range(0)]);
  z_stream z{};
  // memLevel sizes the hash table that deflateReset clears for every message.
  deflateInit2(&z, int(state.range(1)), Z_DEFLATED, -15, int(state.range(2)), Z_DEFAULT_STRATEGY);
  std::vector<unsigned char> out(deflateBound(&z, msg.size()) + 16);
  std::size_t n = 0;
  for (auto _ : state) {
    deflateReset(&z);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(msg.data()));
    z.avail_in = uInt(msg.size());
    z.next_out = out.data();
    z.avail_out = uInt(out.size());
    deflate(&z, Z_SYNC_FLUSH);
    n = out.size() - z.avail_out - 4;  // the sync flush's 00 00 ff ff comes off
    benchmark::DoNotOptimize(out.data());
  }
  deflateEnd(&z);
  state.counters["in_bytes"] = double(msg.size());
  state.counters["out_bytes"] = double(n);
}

void libdeflate_compress(benchmark::State& state) {
  const std::string msg = mailbox_event(k_sizes[state.range(0)]);
  libdeflate_compressor* c = libdeflate_alloc_compressor(int(state.range(1)));
  std::vector<unsigned char> out(libdeflate_deflate_compress_bound(c, msg.size()) + 1);
  std::size_t n = 0;
  for (auto _ : state) {
    n = libdeflate_deflate_compress(c, msg.data(), msg.size(), out.data(), out.size() - 1);
    out[n++] = 0;  // a final block: one empty stored block's first byte stays (RFC 7692 §7.2.3.4)
    benchmark::DoNotOptimize(out.data());
  }
  libdeflate_free_compressor(c);
  state.counters["in_bytes"] = double(msg.size());
  state.counters["out_bytes"] = double(n);
}

/// A message as a browser sends it (RFC 7692 §7.2.1): sync-flushed, its 00 00 ff ff taken off.
std::vector<unsigned char> client_message(const std::string& msg) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  std::vector<unsigned char> out(deflateBound(&z, msg.size()) + 16);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(msg.data()));
  z.avail_in = uInt(msg.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  deflate(&z, Z_SYNC_FLUSH);
  out.resize(out.size() - z.avail_out - 4);
  deflateEnd(&z);
  return out;
}

// The receiver puts the 00 00 ff ff back (§7.2.2); zlib inflates up to it.
void zlib_inflate(benchmark::State& state) {
  const std::string msg = mailbox_event(k_sizes[state.range(0)]);
  std::vector<unsigned char> in = client_message(msg);
  in.insert(in.end(), {0x00, 0x00, 0xff, 0xff});
  z_stream z{};
  inflateInit2(&z, -15);
  std::vector<unsigned char> out(msg.size() + 64);
  for (auto _ : state) {
    inflateReset(&z);
    z.next_in = const_cast<Bytef*>(in.data());
    z.avail_in = uInt(in.size());
    z.next_out = out.data();
    z.avail_out = uInt(out.size());
    benchmark::DoNotOptimize(inflate(&z, Z_SYNC_FLUSH));
  }
  inflateEnd(&z);
  if (out.size() - z.avail_out != msg.size()) state.SkipWithError("zlib did not inflate the message");
  state.counters["out_bytes"] = double(out.size() - z.avail_out);
}

// libdeflate reads whole streams, which end with a final block: after the 00 00 ff ff, an empty
// final stored block (01 00 00 ff ff).
void libdeflate_inflate(benchmark::State& state) {
  const std::string msg = mailbox_event(k_sizes[state.range(0)]);
  std::vector<unsigned char> in = client_message(msg);
  in.insert(in.end(), {0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff});
  libdeflate_decompressor* d = libdeflate_alloc_decompressor();
  std::vector<unsigned char> out(msg.size() + 64);
  std::size_t n = 0;
  libdeflate_result r = LIBDEFLATE_SUCCESS;
  for (auto _ : state) {
    r = libdeflate_deflate_decompress(d, in.data(), in.size(), out.data(), out.size(), &n);
    benchmark::DoNotOptimize(r);
  }
  libdeflate_free_decompressor(d);
  if (r != LIBDEFLATE_SUCCESS || n != msg.size()) state.SkipWithError("libdeflate did not inflate the message");
  state.counters["out_bytes"] = double(n);
}

// (size index, level[, zlib's memLevel])
BENCHMARK(zlib_compress)->ArgsProduct({{0, 1, 2, 3}, {1, 6}, {8, 4, 1}});
BENCHMARK(libdeflate_compress)->ArgsProduct({{0, 1, 2, 3}, {1, 6}});
BENCHMARK(zlib_inflate)->DenseRange(0, 3);
BENCHMARK(libdeflate_inflate)->DenseRange(0, 3);

}  // namespace
