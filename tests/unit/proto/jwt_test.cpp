// Tests for proto/jwt: fixed vectors (RFC 7515 A.1, and tokens minted with Python's hmac,
// hashlib and base64 when this file was written), every kind of refusal, grants, and a
// counting-allocator proof (operator new from no_alloc_test.cpp, OpenSSL's allocator here).

#include <catch2/catch.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "proto/jwt.hpp"
#include "test_support.hpp"

using namespace wspush::proto;

namespace {

// OpenSSL allocates with malloc, not operator new: count its allocations through its own hook,
// installed before main (it must come before OpenSSL's first allocation).
std::atomic<std::size_t> g_openssl_allocations{0};
void* counting_malloc(std::size_t n, const char*, int) {
  ++g_openssl_allocations;
  return std::malloc(n);
}
void* counting_realloc(void* p, std::size_t n, const char*, int) {
  ++g_openssl_allocations;
  return std::realloc(p, n);
}
void counting_free(void* p, const char*, int) { std::free(p); }
const bool g_openssl_hooked = CRYPTO_set_mem_functions(counting_malloc, counting_realloc, counting_free) == 1;

constexpr std::string_view k_secret = "wspush-test-secret";
constexpr std::int64_t k_now = 1700000000;

// {"sub":"user-42","exp":2000000000,"topics":["mailbox:42","news:*"],"pub":["mailbox:42"]}
// signed with k_secret (Python: hmac.new(secret, h + "." + p, hashlib.sha256)).
constexpr std::string_view k_python_token =
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiJ1c2VyLTQyIiwiZXhwIjoyMDAwMDAwMDAwLCJ0b3BpY3MiOlsibWFpbGJveDo0MiIsIm5ld3M6KiJdLCJwdWIiOlsibWFpbGJveDo0MiJdfQ."
    "WiY27yoHNzMQpJ4-JH5ePRX_Yh8EdYzRia_OGFMBKFw";

std::string b64url(std::string_view in) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    acc = (acc << 8) | static_cast<unsigned char>(c);
    bits += 8;
    while (bits >= 6) out += alphabet[(acc >> (bits -= 6)) & 63];
  }
  if (bits > 0) out += alphabet[(acc << (6 - bits)) & 63];
  return out;
}

/// A reference HMAC-SHA256 (OpenSSL's HMAC(), independent of jwt_verifier's precomputed states).
std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char mac[32];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &n);
  return {reinterpret_cast<const char*>(mac), n};
}

/// A token with any header, signed with the reference HMAC.
std::string sign_token(std::string_view header_json, std::string_view claims_json, std::string_view secret = k_secret) {
  const std::string input = b64url(header_json) + "." + b64url(claims_json);
  return input + "." + b64url(hmac_sha256(secret, input));
}

std::string mint(std::string_view claims_json, std::string_view secret = k_secret) {
  std::string out(max_token_bytes + 100, '\0');
  out.resize(mint_hs256(secret, claims_json, {out.data(), out.size()}));
  return out;
}

struct verified {
  jwt_result result;
  jwt_claims claims;
  std::array<char, jwt_claims_storage_bytes> storage;
};

std::unique_ptr<verified> verify(std::string_view token, std::string_view secret = k_secret,
                                 std::int64_t now = k_now) {
  auto v = std::make_unique<verified>();
  v->result = jwt_verifier(secret).verify(token, now, v->storage, v->claims);
  return v;
}

jwt_error error_of(std::string_view token, std::string_view secret = k_secret, std::int64_t now = k_now) {
  return verify(token, secret, now)->result.error;
}

std::vector<std::string> patterns(grants_view g) { return {g.begin(), g.end()}; }

}  // namespace

TEST_CASE("jwt: RFC 7515 A.1 HS256 example", "[jwt]") {
  // The JWK `k` of the RFC's example, base64url-decoded: 64 bytes.
  const std::string key(
      "\x03\x23\x35\x4b\x2b\x0f\xa5\xbc\x83\x7e\x06\x65\x77\x7b\xa6\x8f\x5a\xb3\x28\xe6\xf0\x54\xc9\x28\xa9\x0f\x84\xb2\xd2\x50\x2e\xbf"
      "\xd3\xfb\x5a\x92\xd2\x06\x47\xef\x96\x8a\xb4\xc3\x77\x62\x3d\x22\x3d\x2e\x21\x72\x05\x2e\x4f\x08\xc0\xcd\x9a\xf5\x67\xd0\x80\xa3",
      64);
  REQUIRE(key.size() == 64);
  const std::string token =
      "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9."
      "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ."
      "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
  const auto ok = verify(token, key, 1300819379);
  CHECK(ok->result.ok());
  CHECK(ok->claims.exp == 1300819380);
  CHECK(ok->claims.sub.empty());
  CHECK(ok->claims.topics.empty());
  CHECK(ok->claims.pub.empty());
  CHECK(error_of(token, key, 1300819380) == jwt_error::expired);  // exp is the first instant it is not valid
}

TEST_CASE("jwt: a token minted with Python verifies, with its claims and grants", "[jwt]") {
  const auto v = verify(k_python_token);
  REQUIRE(v->result.ok());
  CHECK(v->result.message.empty());
  CHECK(v->claims.sub == "user-42");
  CHECK(v->claims.exp == 2000000000);
  CHECK(patterns(v->claims.topics) == std::vector<std::string>{"mailbox:42", "news:*"});
  CHECK(patterns(v->claims.pub) == std::vector<std::string>{"mailbox:42"});
  CHECK(v->claims.topics.bytes() == std::string_view("\x0amailbox:42\x06news:*", 18));
  // the views live in the storage
  const auto* lo = v->storage.data();
  const auto* hi = lo + v->storage.size();
  for (const std::string_view s : {v->claims.sub, v->claims.topics.bytes(), v->claims.pub.bytes()})
    CHECK((s.data() >= lo && s.data() + s.size() <= hi));
}

TEST_CASE("jwt: mint reproduces the Python token byte for byte", "[jwt]") {
  CHECK(mint(R"({"sub":"user-42","exp":2000000000,"topics":["mailbox:42","news:*"],"pub":["mailbox:42"]})") ==
        k_python_token);
  // A key longer than SHA-256's block is hashed first (RFC 2104); Python-minted with b"k" * 100.
  const std::string long_key(100, 'k');
  const std::string expected =
      "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1IiwiZXhwIjoxfQ.6CtSM38BO3fjwOazsPKb96tWir-8Odu7DTD0Mz3ABvk";
  CHECK(mint(R"({"sub":"u","exp":1})", long_key) == expected);
  CHECK(error_of(expected, long_key, 0) == jwt_error::ok);
  std::array<char, 40> small{};
  CHECK(mint_hs256(k_secret, R"({"exp":1})", small) == 0);
}

TEST_CASE("jwt: the precomputed HMAC equals OpenSSL's HMAC for keys of every size class", "[jwt]") {
  for (const std::size_t key_len : {0, 1, 32, 63, 64, 65, 128, 300}) {
    std::string key(key_len, '\0');
    for (std::size_t i = 0; i < key_len; ++i) key[i] = static_cast<char>(i * 37 + 11);
    for (const std::size_t claims_len : {0, 1, 2, 3, 55, 56, 64, 200}) {
      const std::string claims = R"({"exp":9,"x":")" + std::string(claims_len, 'c') + "\"}";
      const std::string token = mint(claims, key);
      CAPTURE(key_len, claims_len);
      CHECK(token == sign_token(R"({"alg":"HS256","typ":"JWT"})", claims, key));
      CHECK(error_of(token, key, 0) == jwt_error::ok);
    }
  }
}

TEST_CASE("jwt: a changed signature, payload or secret is refused", "[jwt]") {
  const std::string token(k_python_token);
  const std::size_t sig = token.rfind('.') + 1;
  for (std::size_t i = sig; i < token.size(); ++i) {
    for (const char c : {'A', 'B', 'Q', 'g', 'w', '_'}) {
      if (token[i] == c) continue;
      std::string t = token;
      t[i] = c;
      const jwt_error e = error_of(t);
      CAPTURE(i, c);
      // the last character carries 2 unused bits: a change there that sets them is malformed
      CHECK((e == jwt_error::bad_signature || (i == token.size() - 1 && e == jwt_error::malformed)));
    }
  }
  std::string payload_changed = token;
  payload_changed[token.find('.') + 5] ^= 1;  // still base64url, different claims
  CHECK(error_of(payload_changed) == jwt_error::bad_signature);
  CHECK(error_of(token, "another-secret") == jwt_error::bad_signature);
  // signatures of the wrong length, well encoded
  CHECK(error_of(token.substr(0, sig) + b64url(std::string(31, 'x'))) == jwt_error::bad_signature);
  CHECK(error_of(token.substr(0, sig) + b64url(std::string(33, 'x'))) == jwt_error::bad_signature);
  CHECK(error_of(token.substr(0, sig)) == jwt_error::bad_signature);  // none at all
}

TEST_CASE("jwt: expiry against the caller's clock, fractional exp rounded down", "[jwt]") {
  CHECK(error_of(mint(R"({"exp":1700000001})")) == jwt_error::ok);
  CHECK(error_of(mint(R"({"exp":1700000000})")) == jwt_error::expired);
  CHECK(error_of(mint(R"({"exp":1699999999})")) == jwt_error::expired);
  CHECK(error_of(mint(R"({"exp":-5})")) == jwt_error::expired);
  const auto frac = verify(mint(R"({"exp":1700000000.9})"));
  CHECK(frac->result.error == jwt_error::expired);
  CHECK(frac->claims.exp == 1700000000);
  const auto sci = verify(mint(R"({"exp":2e9})"));
  CHECK(sci->result.ok());
  CHECK(sci->claims.exp == 2000000000);
  CHECK(verify(mint(R"({"exp":9223372036854775807})"))->result.ok());
}

TEST_CASE("jwt: nbf in the future is refused, with a small leeway for clock skew", "[jwt]") {
  // The tests' clock is 1700000000 (error_of / verify).
  const auto ahead = [](std::int64_t s) {
    return mint(R"({"exp":2000000000,"nbf":)" + std::to_string(1700000000 + s) + "}");
  };
  CHECK(error_of(ahead(500)) == jwt_error::not_yet_valid);
  CHECK(error_of(ahead(jwt_nbf_leeway_seconds + 1)) == jwt_error::not_yet_valid);
  CHECK(error_of(ahead(jwt_nbf_leeway_seconds)) == jwt_error::ok);  // within the leeway
  CHECK(error_of(ahead(0)) == jwt_error::ok);
  CHECK(error_of(ahead(-3600)) == jwt_error::ok);
  const auto frac = verify(mint(R"({"exp":2000000000,"nbf":1700000600.5})"));
  CHECK(frac->result.error == jwt_error::not_yet_valid);
  CHECK(frac->claims.nbf == 1700000600);
  CHECK(error_of(mint(R"({"exp":2000000000,"nbf":"soon"})")) == jwt_error::bad_claims);
  CHECK(error_of(mint(R"({"exp":2000000000,"nbf":1,"nbf":1})")) == jwt_error::bad_claims);
  // exp is checked first: an expired token that is also not yet valid says expired.
  CHECK(error_of(mint(R"({"exp":1,"nbf":1800000000})")) == jwt_error::expired);
}

TEST_CASE("jwt: iat is read (what a revoke is compared with), 0 without it", "[jwt]") {
  const auto with = verify(mint(R"({"exp":2000000000,"iat":1699999000.7})"));
  REQUIRE(with->result.ok());
  CHECK(with->claims.iat == 1699999000);
  const auto without = verify(mint(R"({"exp":2000000000})"));
  REQUIRE(without->result.ok());
  CHECK(without->claims.iat == 0);
  CHECK(error_of(mint(R"({"exp":2000000000,"iat":"yesterday"})")) == jwt_error::bad_claims);
  CHECK(error_of(mint(R"({"exp":2000000000,"iat":1,"iat":2})")) == jwt_error::bad_claims);
}

TEST_CASE("jwt: only HS256 is accepted", "[jwt]") {
  const std::string claims = R"({"exp":2000000000})";
  // alg none: the classic forgery, with and without a signature
  CHECK(error_of(b64url(R"({"alg":"none"})") + "." + b64url(claims) + ".") == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":"none","typ":"JWT"})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":"HS512","typ":"JWT"})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":"RS256"})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":"hs256"})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":256})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"typ":"JWT"})", claims)) == jwt_error::unsupported_alg);
  CHECK(error_of(sign_token(R"({"alg":"HS256","crit":["exp"]})", claims)) == jwt_error::unsupported_alg);
  // header variations that are fine: other order, extra fields, whitespace, an escaped name
  CHECK(error_of(sign_token(R"({"typ":"JWT","kid":"k1","alg":"HS256"})", claims)) == jwt_error::ok);
  CHECK(error_of(sign_token("{ \"alg\" : \"HS256\" }\n", claims)) == jwt_error::ok);
  CHECK(error_of(sign_token(R"({"\u0061lg":"HS\u00325\u0036"})", claims)) == jwt_error::ok);
  // header JSON that is broken is malformed, whatever the signature
  CHECK(error_of(sign_token(R"({"alg":"HS256","alg":"HS256"})", claims)) == jwt_error::malformed);
  CHECK(error_of(sign_token(R"(["alg","HS256"])", claims)) == jwt_error::malformed);
  CHECK(error_of(sign_token(R"({"alg":"HS256"} x)", claims)) == jwt_error::malformed);
  CHECK(error_of(sign_token(R"({"alg":"HS256")", claims)) == jwt_error::malformed);
  CHECK(error_of(sign_token("", claims)) == jwt_error::malformed);
}

TEST_CASE("jwt: malformed shapes and encodings", "[jwt]") {
  const std::string token(k_python_token);
  const std::size_t d1 = token.find('.');
  const std::size_t d2 = token.rfind('.');
  std::string five_mod_four = token.substr(0, d2);
  while ((five_mod_four.size() - d1 - 1) % 4 != 1) five_mod_four += 'A';
  five_mod_four += token.substr(d2);
  for (const std::string& t : std::vector<std::string>{
           "", ".", "..", "abc", "abc.def", token.substr(d1),               // no header
           token.substr(0, d1) + ".." + token.substr(token.rfind('.') + 1),  // no payload
           token + ".x",                                                     // four parts
           token.substr(0, d1) + "=" + token.substr(d1),                     // padding
           "eyJhbGciOiJIUzI1NiJ9+." + token.substr(d1 + 1),                  // base64, not base64url
           five_mod_four,                                                    // payload length % 4 == 1
           token.substr(0, d1) + "." + "eyJ\x01" + token.substr(d1 + 5),     // a control byte
           "eyJhbGciOiJIUzI1NiJ9 ." + token.substr(d1 + 1),                  // a space
       }) {
    CAPTURE(t);
    CHECK(error_of(t) == jwt_error::malformed);
  }
  // Non-canonical base64url: the signature's last character carries 2 unused bits (43 × 6 =
  // 258 bits for 256). Setting one decodes to the same MAC in a lenient decoder; here it is
  // malformed, so no second spelling of a valid token exists.
  static constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string twin = token;
  twin.back() = alphabet[alphabet.find(twin.back()) ^ 1];
  CHECK(error_of(twin) == jwt_error::malformed);
  CHECK(error_of(mint("")) == jwt_error::malformed);  // an empty payload part
  // size bound
  const std::string big = mint(R"({"exp":2000000000,"x":")" + std::string(3000, 'x') + "\"}");
  REQUIRE(big.size() > max_token_bytes);
  CHECK(error_of(big) == jwt_error::malformed);
}

TEST_CASE("jwt: claims of the wrong type or shape", "[jwt]") {
  for (const std::string_view claims : {
           R"({"sub":"u"})",                              // no exp
           R"({"exp":"2000000000"})",                     // exp a string
           R"({"exp":null})", R"({"exp":true})", R"({"exp":[1]})",
           R"({"exp":18446744073709551615})",             // past int64
           R"({"exp":1e300})",
           R"({"exp":2000000000,"exp":2000000000})",      // repeated
           R"({"exp":2000000000,"sub":42})",              // sub a number
           R"({"exp":2000000000,"topics":"mailbox:42"})", // topics not an array
           R"({"exp":2000000000,"topics":[42]})",
           R"({"exp":2000000000,"topics":[""]})",
           R"({"exp":2000000000,"topics":["has space"]})",
           R"({"exp":2000000000,"topics":["a*b"]})",
           R"({"exp":2000000000,"topics":["**"]})",
           R"({"exp":2000000000,"topics":["quote\"d"]})",
           R"({"exp":2000000000,"pub":{"a":1}})",
           R"({"exp":2000000000,"pub":["ok","caf\u00e9"]})",
           R"([{"exp":2000000000}])",                     // not an object
           R"({"exp":2000000000)",                        // not JSON
           R"({"exp":2000000000} {})",
           " ",
       }) {
    CAPTURE(claims);
    CHECK(error_of(mint(claims)) == jwt_error::bad_claims);
  }
  const std::string long_topic(max_topic_bytes + 1, 't');
  CHECK(error_of(mint(R"({"exp":2000000000,"topics":[")" + long_topic + "\"]}")) == jwt_error::bad_claims);
  CHECK(error_of(mint(R"({"exp":2000000000,"topics":[")" + long_topic.substr(1) + "*\"]}")) == jwt_error::ok);
}

TEST_CASE("jwt: claims with escapes, unknown claims, empty grants", "[jwt]") {
  const auto v = verify(mint(
      R"({"iss":"x","sub":"caf\u00e9 \"q\"","nbf":1,"exp":2000000000,"topics":["mailbox:\u0034\u0032","*"],"pub":[],"extra":{"a":[1,2,{"b":null}]}})"));
  REQUIRE(v->result.ok());
  CHECK(v->claims.sub == "caf\xC3\xA9 \"q\"");
  CHECK(patterns(v->claims.topics) == std::vector<std::string>{"mailbox:42", "*"});
  CHECK(v->claims.pub.empty());
  CHECK(grants_match(v->claims.topics, "anything"));
  CHECK_FALSE(grants_match(v->claims.pub, "mailbox:42"));
}

TEST_CASE("jwt: grants match exact names and prefixes", "[jwt][grants]") {
  const std::array<std::string_view, 3> p = {"mailbox:42", "news:*", "room.lobby"};
  std::array<char, 64> buf{};
  const std::size_t n = encode_grants(p, buf);
  REQUIRE(n == 1 + 10 + 1 + 6 + 1 + 10);
  const grants_view g(std::string_view(buf.data(), n));
  CHECK(patterns(g) == std::vector<std::string>{"mailbox:42", "news:*", "room.lobby"});
  CHECK(grants_match(g, "mailbox:42"));
  CHECK_FALSE(grants_match(g, "mailbox:4"));
  CHECK_FALSE(grants_match(g, "mailbox:421"));
  CHECK(grants_match(g, "news:"));
  CHECK(grants_match(g, "news:sport"));
  CHECK_FALSE(grants_match(g, "news"));
  CHECK_FALSE(grants_match(g, "xnews:sport"));
  CHECK(grants_match(g, "room.lobby"));
  CHECK_FALSE(grants_match(grants_view{}, "mailbox:42"));
  CHECK(grants_match(grants_all, "mailbox:42"));
  CHECK(patterns(grants_all) == std::vector<std::string>{"*"});

  CHECK(encode_grants(p, std::span<char>(buf.data(), n - 1)) == 0);  // too small
  const std::array<std::string_view, 2> bad = {"ok", "no good"};
  CHECK(encode_grants(bad, buf) == 0);
  CHECK(encode_grants({}, buf) == 0);
  const std::string longest(max_topic_bytes, 'p');
  const std::array<std::string_view, 1> one = {longest};
  CHECK(encode_grants(one, buf) == 0);  // 129 bytes do not fit 64
  std::array<char, 200> big{};
  REQUIRE(encode_grants(one, big) == 129);
  CHECK(grants_match(grants_view({big.data(), 129}), longest));
}

TEST_CASE("jwt: claims storage always suffices at its documented size, and too small is refused", "[jwt]") {
  // Fill a token to the size limit with as many short grants as fit.
  std::string claims = R"({"exp":2000000000,"topics":[)";
  for (int i = 0; claims.size() < 2900; ++i) claims += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  claims += "]}";
  const std::string token = mint(claims);
  REQUIRE(token.size() <= max_token_bytes);
  const auto v = verify(token);
  CHECK(v->result.ok());
  CHECK(v->claims.topics.bytes().size() > 1000);
  std::array<char, 64> small{};
  jwt_claims c;
  CHECK(jwt_verifier(k_secret).verify(token, k_now, small, c).error == jwt_error::bad_claims);
}

TEST_CASE("jwt: one verifier used from several threads at once", "[jwt]") {
  const jwt_verifier verifier(k_secret);
  const std::string good(k_python_token);
  const std::string bad = mint(R"({"exp":1})");
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::array<char, jwt_claims_storage_bytes> storage;
      jwt_claims c;
      for (int i = 0; i < 500; ++i) {
        if (!verifier.verify(good, k_now, storage, c).ok() || c.sub != "user-42") ++wrong;
        if (verifier.verify(bad, k_now, storage, c).error != jwt_error::expired) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
}

TEST_CASE("no allocation: jwt verify once warm (operator new and OpenSSL)", "[alloc][jwt]") {
  REQUIRE(g_openssl_hooked);  // else OpenSSL allocated before main and its count would prove nothing
  const std::size_t control = g_openssl_allocations;
  hmac_sha256("key", "data");  // OpenSSL 3's one-shot HMAC() allocates: the hook does count
  REQUIRE(g_openssl_allocations > control);
  const jwt_verifier verifier(k_secret);
  const std::string good(k_python_token);
  const std::string expired = mint(R"({"exp":1,"topics":["a"]})");
  const std::string bad_claims = mint(R"({"exp":"soon"})");
  std::string bad_sig = good;
  bad_sig[bad_sig.size() - 3] = bad_sig[bad_sig.size() - 3] == 'A' ? 'B' : 'A';
  std::array<char, jwt_claims_storage_bytes> storage;
  jwt_claims c;
  std::array<char, 512> minted{};
  REQUIRE(verifier.verify(good, k_now, storage, c).ok());  // warm: this thread's parser

  const std::size_t before = wspush::test::allocation_count();
  const std::size_t openssl_before = g_openssl_allocations;
  const jwt_result r1 = verifier.verify(good, k_now, storage, c);
  const jwt_result r2 = verifier.verify(expired, k_now, storage, c);
  const jwt_result r3 = verifier.verify(bad_claims, k_now, storage, c);
  const jwt_result r4 = verifier.verify(bad_sig, k_now, storage, c);
  const bool match = grants_match(c.topics, "a");
  const std::size_t n = verifier.mint(R"({"exp":1})", minted);
  const jwt_verifier another("another secret");
  const std::size_t during = wspush::test::allocation_count() - before;
  const std::size_t openssl_during = g_openssl_allocations - openssl_before;

  CHECK(r1.ok());
  CHECK(r2.error == jwt_error::expired);
  CHECK(r3.error == jwt_error::bad_claims);
  CHECK(r4.error == jwt_error::bad_signature);
  CHECK(n > 0);
  CHECK_FALSE(match);  // c is unspecified after a failure; the call itself must not allocate
  CHECK(during == 0);
  CHECK(openssl_during == 0);
  (void)another;
}
