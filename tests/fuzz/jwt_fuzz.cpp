// Fuzz target for proto::jwt_verifier. Input: one control byte, then either a token (control
// bit 0 clear) or claims JSON that is first minted into a correctly signed token (bit 0 set),
// so the fuzzer reaches the claims parser behind the signature check. Invariants: no crash;
// the error is one of the enum; a signed token is never refused as malformed, unsupported or
// badly signed unless it is over the size bound; on success every view lies in the storage,
// every grant is a valid pattern that grants itself, re-encoding the grants gives the same
// bytes, and the token has not expired and is valid already (nbf, with its leeway).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/jwt.hpp"

using namespace wspush::proto;

namespace {

bool inside(std::string_view v, std::span<const char> storage) {
  return v.empty() || (v.data() >= storage.data() && v.data() + v.size() <= storage.data() + storage.size());
}

void check_grants(grants_view g, std::span<const char> storage) {
  WSPUSH_FUZZ_CHECK(inside(g.bytes(), storage));
  std::vector<std::string_view> list;
  for (const std::string_view p : g) {
    WSPUSH_FUZZ_CHECK(is_valid_pattern(p));
    WSPUSH_FUZZ_CHECK(p.data() + p.size() <= g.bytes().data() + g.bytes().size());
    // an exact pattern grants itself; a prefix grants itself with one more topic byte
    const std::string topic = p.back() == '*' ? std::string(p.substr(0, p.size() - 1)) + "x" : std::string(p);
    if (topic.size() <= max_topic_bytes) WSPUSH_FUZZ_CHECK(grants_match(g, topic));
    list.push_back(p);
  }
  std::array<char, jwt_claims_storage_bytes> again{};
  const std::size_t n = encode_grants(list, again);
  WSPUSH_FUZZ_CHECK(std::string_view(again.data(), n) == g.bytes());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t control = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  static const jwt_verifier verifier("fuzz-secret");
  const std::int64_t now = (control & 0x02) ? 0 : 1700000000;

  std::string token(input);
  const bool signed_token = (control & 0x01) != 0;
  if (signed_token) {
    token.assign(input.size() * 2 + 100, '\0');
    token.resize(verifier.mint(input, {token.data(), token.size()}));
    WSPUSH_FUZZ_CHECK(!token.empty());
  }
  std::array<char, jwt_claims_storage_bytes> storage;
  // Small storage now and then, so the "exceeds the storage" path is reached too.
  const std::size_t storage_size = (control & 0x04) ? 16 : storage.size();
  const std::span<char> store(storage.data(), storage_size);
  jwt_claims claims;
  const jwt_result r = verifier.verify(token, now, store, claims);
  WSPUSH_FUZZ_CHECK(r.error <= jwt_error::not_yet_valid);
  WSPUSH_FUZZ_CHECK(r.ok() == r.message.empty());
  if (signed_token && token.size() <= max_token_bytes && !input.empty()) {
    WSPUSH_FUZZ_CHECK(r.error != jwt_error::malformed);
    WSPUSH_FUZZ_CHECK(r.error != jwt_error::unsupported_alg);
    WSPUSH_FUZZ_CHECK(r.error != jwt_error::bad_signature);
  }
  if (!r.ok()) return 0;
  WSPUSH_FUZZ_CHECK(claims.exp > now);
  WSPUSH_FUZZ_CHECK(claims.nbf <= now + jwt_nbf_leeway_seconds);
  WSPUSH_FUZZ_CHECK(inside(claims.sub, store));
  check_grants(claims.topics, store);
  check_grants(claims.pub, store);
  // the same token with any one signature character changed is refused
  std::string changed = token;
  changed.back() = changed.back() == 'A' ? 'B' : 'A';
  jwt_claims other;
  WSPUSH_FUZZ_CHECK(!verifier.verify(changed, now, storage, other).ok());
  return 0;
}
