// Micro-benchmarks for the pub/sub protocol pieces of proto/: token verification (done once
// per upgrade, on a pool worker), client-message parsing (once per message received) and the
// event encoder (once per publish, shared by every subscriber). Each reports heap allocations
// per operation inside the measured call (alloc_counter.hpp); all should be 0.

#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <string>

#include "proto/envelope.hpp"
#include "proto/jwt.hpp"
#include "tests/bench/alloc_counter.hpp"

using namespace wspush::proto;

namespace {

constexpr std::string_view k_secret = "a-32-byte-secret-for-benchmarks!";
constexpr std::int64_t k_now = 1700000000;

// A webmail tab's token: subject, expiry, its mailbox and a prefix grant, one publish grant
// (~200 bytes, what a backend's stock JWT library mints).
std::string typical_token() {
  std::string out(1024, '\0');
  out.resize(mint_hs256(k_secret,
                        R"({"sub":"user-4242","iat":1699990000,"exp":1700086400,)"
                        R"("topics":["mailbox:4242","notifications:4242:*"],"pub":["presence:4242"]})",
                        {out.data(), out.size()}));
  return out;
}

/// The message followed by the padding the parser may read: what a shard's receive block holds.
std::string padded(std::string_view message) {
  return std::string(message) + std::string(envelope_padding, '\0');
}

// ~100 bytes of `data`: what a storage backend says about a new letter.
constexpr std::string_view k_data_100 =
    R"({"uid":18342,"from":"alice@example.com","subject":"Lunch on Friday?","size":4311,"flags":[]})";

void bm_jwt_verify(benchmark::State& state) {
  const jwt_verifier verifier(k_secret);
  const std::string token = typical_token();
  std::array<char, jwt_claims_storage_bytes> storage;
  jwt_claims claims;
  if (!verifier.verify(token, k_now, storage, claims).ok()) return state.SkipWithError("token refused");
  wspush::bench::alloc_probe allocs;
  for (auto _ : state) {
    allocs.begin();
    jwt_result r = verifier.verify(token, k_now, storage, claims);
    allocs.end();
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(claims);
  }
  state.counters["token_bytes"] = static_cast<double>(token.size());
  state.counters["allocs_per_op"] = allocs.per(state.iterations());
}
BENCHMARK(bm_jwt_verify);

// What a refused token costs: an attacker's flood of badly signed tokens stops at the HMAC.
void bm_jwt_verify_bad_signature(benchmark::State& state) {
  const jwt_verifier verifier(k_secret);
  std::string token = typical_token();
  token[token.size() - 5] = token[token.size() - 5] == 'A' ? 'B' : 'A';
  std::array<char, jwt_claims_storage_bytes> storage;
  jwt_claims claims;
  for (auto _ : state) {
    jwt_result r = verifier.verify(token, k_now, storage, claims);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(bm_jwt_verify_bad_signature);

void bm_grants_match(benchmark::State& state) {
  const jwt_verifier verifier(k_secret);
  const std::string token = typical_token();
  std::array<char, jwt_claims_storage_bytes> storage;
  jwt_claims claims;
  if (!verifier.verify(token, k_now, storage, claims).ok()) return state.SkipWithError("token refused");
  for (auto _ : state) {
    bool a = grants_match(claims.topics, "notifications:4242:calendar");
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(bm_grants_match);

void parse_bench(benchmark::State& state, std::string_view message) {
  envelope_parser parser(64 * 1024);
  const std::string buf = padded(message);
  envelope env;
  if (!parser.parse({buf.data(), message.size()}, buf.size(), env).ok()) return state.SkipWithError("refused");
  wspush::bench::alloc_probe allocs;
  for (auto _ : state) {
    allocs.begin();
    envelope_result r = parser.parse({buf.data(), message.size()}, buf.size(), env);
    allocs.end();
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(env);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * message.size()));
  state.counters["message_bytes"] = static_cast<double>(message.size());
  state.counters["allocs_per_op"] = allocs.per(state.iterations());
}

void bm_parse_sub_1_topic(benchmark::State& state) {
  parse_bench(state, R"({"op":"sub","topics":["mailbox:4242"]})");
}
BENCHMARK(bm_parse_sub_1_topic);

void bm_parse_sub_since(benchmark::State& state) {
  parse_bench(state, R"({"op":"sub","topics":["mailbox:4242"],"since":{"mailbox:4242":"k3f9:18"}})");
}
BENCHMARK(bm_parse_sub_since);

void bm_parse_pub_100b(benchmark::State& state) {
  static const std::string message = std::string(R"({"op":"pub","topic":"mailbox:4242","data":)") +
                                     std::string(k_data_100) + "}";
  parse_bench(state, message);
}
BENCHMARK(bm_parse_pub_100b);

void bm_encode_event_100b(benchmark::State& state) {
  std::array<char, 512> out;
  for (auto _ : state) {
    std::size_t n = encode_event("mailbox:4242", "k3f9:18", k_data_100, out);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(bm_encode_event_100b);

void bm_encode_subbed(benchmark::State& state) {
  std::array<char, 512> out;
  const std::array<std::string_view, 1> topics = {"mailbox:4242"};
  for (auto _ : state) {
    std::size_t n = encode_subbed(topics, {}, out);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(bm_encode_subbed);

}  // namespace
