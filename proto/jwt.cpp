#include "proto/jwt.hpp"

// HMAC() and the EVP_MAC API fetch algorithms and allocate on every call in OpenSSL 3. The
// deprecated low-level SHA256_* functions allocate nothing, and their context is a plain
// struct: the key's inner and outer states are computed once and copied per token (RFC 2104
// §4 suggests exactly this precomputation).
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <simdjson.h>

#include <array>
#include <cmath>
#include <cstring>

namespace wspush::proto {

static_assert(sizeof(SHA256_CTX) <= 112, "jwt_verifier's opaque SHA-256 states are too small");
static_assert(alignof(SHA256_CTX) <= 8, "jwt_verifier's opaque SHA-256 states are under-aligned");

namespace {

namespace sj = simdjson::ondemand;

constexpr std::size_t max_header_b64 = 512;  // `{"alg":"HS256","typ":"JWT","kid":"..."}` is ~40-120
constexpr std::size_t max_header_bytes = max_header_b64 / 4 * 3;
constexpr std::size_t mac_b64_size = 43;     // 32 bytes, unpadded
constexpr std::string_view k_header_b64 = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9";  // {"alg":"HS256","typ":"JWT"}
constexpr std::string_view k_header_alg_only_b64 = "eyJhbGciOiJIUzI1NiJ9";        // {"alg":"HS256"}

constexpr char k_b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

constexpr std::array<std::uint8_t, 256> make_decode_table() noexcept {
  std::array<std::uint8_t, 256> t{};
  for (auto& v : t) v = 0xFF;
  for (std::uint8_t i = 0; i < 64; ++i) t[static_cast<unsigned char>(k_b64url[i])] = i;
  return t;
}
constexpr auto k_decode = make_decode_table();

constexpr std::size_t b64_size(std::size_t n) noexcept { return n / 3 * 4 + (n % 3 == 0 ? 0 : n % 3 + 1); }

/// Strict base64url without padding: only the alphabet, no `=`, and the unused low bits of the
/// last character zero, so every byte string has exactly one encoding (a flipped bit in a
/// signature can never decode to the same MAC). Returns the decoded size, or -1.
std::ptrdiff_t b64url_decode(std::string_view in, char* out) noexcept {
  if (in.size() % 4 == 1) return -1;
  std::uint32_t acc = 0;
  int bits = 0;
  std::size_t n = 0;
  for (const char c : in) {
    const std::uint8_t v = k_decode[static_cast<unsigned char>(c)];
    if (v == 0xFF) return -1;
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[n++] = static_cast<char>(acc >> bits);
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0) return -1;
  return static_cast<std::ptrdiff_t>(n);
}

std::size_t b64url_encode(std::string_view in, char* out) noexcept {
  std::size_t o = 0, i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  for (; i + 3 <= in.size(); i += 3) {
    const std::uint32_t v = std::uint32_t{p[i]} << 16 | std::uint32_t{p[i + 1]} << 8 | p[i + 2];
    out[o++] = k_b64url[v >> 18 & 63];
    out[o++] = k_b64url[v >> 12 & 63];
    out[o++] = k_b64url[v >> 6 & 63];
    out[o++] = k_b64url[v & 63];
  }
  if (const std::size_t rest = in.size() - i; rest != 0) {
    const std::uint32_t v = std::uint32_t{p[i]} << 16 | (rest == 2 ? std::uint32_t{p[i + 1]} << 8 : 0);
    out[o++] = k_b64url[v >> 18 & 63];
    out[o++] = k_b64url[v >> 12 & 63];
    if (rest == 2) out[o++] = k_b64url[v >> 6 & 63];
  }
  return o;
}

/// One simdjson parser per thread, sized once for the largest payload a token may carry, so
/// steady-state verification never grows it.
sj::parser& thread_parser() noexcept {
  thread_local sj::parser parser;
  thread_local bool sized = false;
  if (!sized) sized = parser.allocate(max_token_bytes) == simdjson::SUCCESS;
  return parser;
}

constexpr jwt_result fail(jwt_error e, std::string_view why) noexcept { return {e, why}; }

jwt_result check_header(std::string_view json, std::size_t capacity) noexcept {
  constexpr jwt_result not_object = fail(jwt_error::malformed, "token header is not a JSON object");
  sj::document doc;
  sj::object obj;
  if (thread_parser().iterate(json.data(), json.size(), capacity).get(doc) || doc.get_object().get(obj))
    return not_object;
  bool seen_alg = false;
  for (auto field : obj) {
    std::string_view key, alg;
    if (field.unescaped_key().get(key)) return not_object;
    if (key == "crit") return fail(jwt_error::unsupported_alg, "token header has a crit parameter");
    if (key != "alg") continue;  // typ, kid...: not ours to judge
    if (seen_alg) return fail(jwt_error::malformed, "token header repeats alg");
    seen_alg = true;
    if (field.value().get_string().get(alg) || alg != "HS256")
      return fail(jwt_error::unsupported_alg, "token alg is not HS256");
  }
  const char* rest = nullptr;
  if (doc.current_location().get(rest) != simdjson::OUT_OF_BOUNDS) return not_object;
  if (!seen_alg) return fail(jwt_error::unsupported_alg, "token header has no alg");
  return {jwt_error::ok, {}};
}

/// Bump writer into the caller's claims storage.
struct claims_store {
  std::span<char> buf;
  std::size_t used = 0;
  bool put(const void* p, std::size_t n) noexcept {
    if (n > buf.size() - used) return false;
    if (n != 0) std::memcpy(buf.data() + used, p, n);
    used += n;
    return true;
  }
  std::string_view since(std::size_t start) const noexcept { return {buf.data() + start, used - start}; }
};

constexpr jwt_result bad_claims_json = fail(jwt_error::bad_claims, "token claims are not a JSON object");

/// A NumericDate claim (`exp`, `nbf`, `iat`): seconds, a fraction rounded down.
jwt_result read_seconds(sj::value v, std::int64_t& out, jwt_result bad) noexcept {
  sj::number n;
  if (v.get_number().get(n)) return bad;
  switch (n.get_number_type()) {
    case sj::number_type::signed_integer: out = n.get_int64(); return {};
    case sj::number_type::unsigned_integer: return bad;  // past INT64_MAX
    case sj::number_type::floating_point_number: {
      const double d = std::floor(n.get_double());
      if (!(d >= -9.2e18 && d <= 9.2e18)) return bad;
      out = static_cast<std::int64_t>(d);
      return {};
    }
  }
  return bad;
}

jwt_result read_patterns(sj::value v, claims_store& store, grants_view& out) noexcept {
  constexpr jwt_result bad = fail(jwt_error::bad_claims, "token topics/pub is not an array of topic patterns");
  sj::array arr;
  if (v.get_array().get(arr)) return bad;
  const std::size_t start = store.used;
  for (auto element : arr) {
    std::string_view p;
    if (element.get_string().get(p) || !is_valid_pattern(p)) return bad;
    const auto n = static_cast<unsigned char>(p.size());
    if (!store.put(&n, 1) || !store.put(p.data(), p.size()))
      return fail(jwt_error::bad_claims, "token claims exceed the storage given");
  }
  out = grants_view(store.since(start));
  return {};
}

enum claim_bit : unsigned { c_exp = 1, c_sub = 2, c_topics = 4, c_pub = 8, c_nbf = 16, c_iat = 32 };

jwt_result read_claim(std::string_view key, sj::value v, claims_store& store, jwt_claims& out,
                      unsigned& seen) noexcept {
  const unsigned bit = key == "exp"      ? unsigned{c_exp}
                       : key == "sub"    ? unsigned{c_sub}
                       : key == "topics" ? unsigned{c_topics}
                       : key == "pub"    ? unsigned{c_pub}
                       : key == "nbf"    ? unsigned{c_nbf}
                       : key == "iat"    ? unsigned{c_iat}
                                         : 0u;
  if (bit == 0) return {};  // iss, aud...: skipped (the token is signed: its JSON is the minter's)
  if (seen & bit) return fail(jwt_error::bad_claims, "token repeats a claim");
  seen |= bit;
  switch (bit) {
    case c_exp: return read_seconds(v, out.exp, fail(jwt_error::bad_claims, "token exp is not a number of seconds"));
    case c_nbf: return read_seconds(v, out.nbf, fail(jwt_error::bad_claims, "token nbf is not a number of seconds"));
    case c_iat: return read_seconds(v, out.iat, fail(jwt_error::bad_claims, "token iat is not a number of seconds"));
    case c_topics: return read_patterns(v, store, out.topics);
    case c_pub: return read_patterns(v, store, out.pub);
    default: break;
  }
  std::string_view sub;
  if (v.get_string().get(sub)) return fail(jwt_error::bad_claims, "token sub is not a string");
  const std::size_t start = store.used;
  if (!store.put(sub.data(), sub.size())) return fail(jwt_error::bad_claims, "token claims exceed the storage given");
  out.sub = store.since(start);
  return {};
}

jwt_result read_claims(std::string_view json, std::size_t capacity, std::span<char> storage,
                       jwt_claims& out) noexcept {
  sj::document doc;
  sj::object obj;
  if (thread_parser().iterate(json.data(), json.size(), capacity).get(doc) || doc.get_object().get(obj))
    return bad_claims_json;
  out = jwt_claims{};
  claims_store store{storage};
  unsigned seen = 0;
  for (auto field : obj) {
    std::string_view key;
    sj::value v;
    if (field.unescaped_key().get(key) || field.value().get(v)) return bad_claims_json;
    if (const jwt_result r = read_claim(key, v, store, out, seen); !r.ok()) return r;
  }
  const char* rest = nullptr;
  if (doc.current_location().get(rest) != simdjson::OUT_OF_BOUNDS) return bad_claims_json;
  if (!(seen & c_exp)) return fail(jwt_error::bad_claims, "token has no exp");
  return {};
}

}  // namespace

bool grants_match(grants_view g, std::string_view topic) noexcept {
  for (const std::string_view p : g)
    if (pattern_matches(p, topic)) return true;
  return false;
}

std::size_t encode_grants(std::span<const std::string_view> patterns, std::span<char> out) noexcept {
  claims_store store{out};
  for (const std::string_view p : patterns) {
    const auto n = static_cast<unsigned char>(p.size());
    if (!is_valid_pattern(p) || !store.put(&n, 1) || !store.put(p.data(), p.size())) return 0;
  }
  return store.used;
}

jwt_verifier::jwt_verifier(std::string_view secret) noexcept {
  unsigned char key[SHA256_CBLOCK] = {};
  if (secret.size() > sizeof key) {
    SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), key);
  } else if (!secret.empty()) {
    std::memcpy(key, secret.data(), secret.size());
  }
  unsigned char pad[SHA256_CBLOCK];
  SHA256_CTX ctx;
  for (std::size_t i = 0; i < sizeof pad; ++i) pad[i] = key[i] ^ 0x36;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, sizeof pad);
  std::memcpy(_inner, &ctx, sizeof ctx);
  for (std::size_t i = 0; i < sizeof pad; ++i) pad[i] = key[i] ^ 0x5c;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, sizeof pad);
  std::memcpy(_outer, &ctx, sizeof ctx);
  OPENSSL_cleanse(key, sizeof key);
  OPENSSL_cleanse(pad, sizeof pad);
  OPENSSL_cleanse(&ctx, sizeof ctx);
}

void jwt_verifier::sign(std::string_view signing_input, unsigned char (&mac)[32]) const noexcept {
  SHA256_CTX ctx;
  unsigned char inner[32];
  std::memcpy(&ctx, _inner, sizeof ctx);
  SHA256_Update(&ctx, signing_input.data(), signing_input.size());
  SHA256_Final(inner, &ctx);
  std::memcpy(&ctx, _outer, sizeof ctx);
  SHA256_Update(&ctx, inner, sizeof inner);
  SHA256_Final(mac, &ctx);
}

jwt_result jwt_verifier::verify(std::string_view token, std::int64_t now, std::span<char> storage,
                                jwt_claims& out) const noexcept {
  constexpr jwt_result malformed = fail(jwt_error::malformed, "token is not header.payload.signature in base64url");
  if (token.size() > max_token_bytes) return fail(jwt_error::malformed, "token too long");
  const std::size_t d1 = token.find('.');
  const std::size_t d2 = d1 == token.npos ? d1 : token.find('.', d1 + 1);
  if (d2 == token.npos || d1 == 0 || d2 == d1 + 1 || d1 > max_header_b64) return malformed;
  // Decoded parts with the padding simdjson reads past the end; 4 KiB of stack at most.
  char header[max_header_bytes + simdjson::SIMDJSON_PADDING];
  char payload[jwt_claims_storage_bytes + simdjson::SIMDJSON_PADDING];
  char mac_wire[jwt_claims_storage_bytes];
  const std::ptrdiff_t hn = b64url_decode(token.substr(0, d1), header);
  const std::ptrdiff_t pn = b64url_decode(token.substr(d1 + 1, d2 - d1 - 1), payload);
  const std::ptrdiff_t sn = b64url_decode(token.substr(d2 + 1), mac_wire);
  if (hn < 0 || pn < 0 || sn < 0) return malformed;

  // What stock JWT libraries send, `{"alg":"HS256","typ":"JWT"}` or `{"alg":"HS256"}`, is
  // recognised by its encoding; anything else is read as JSON.
  const std::string_view header_b64 = token.substr(0, d1);
  const bool usual = header_b64 == k_header_b64 || header_b64 == k_header_alg_only_b64;
  if (!usual) {
    if (const jwt_result r = check_header({header, std::size_t(hn)}, sizeof header); !r.ok()) return r;
  }
  unsigned char mac[32];
  sign(token.substr(0, d2), mac);
  const bool same = sn == sizeof mac && CRYPTO_memcmp(mac, mac_wire, sizeof mac) == 0;
  if (!same) return fail(jwt_error::bad_signature, "token signature does not match");
  if (const jwt_result r = read_claims({payload, std::size_t(pn)}, sizeof payload, storage, out); !r.ok())
    return r;
  if (now >= out.exp) return fail(jwt_error::expired, "token expired");
  if (now + jwt_nbf_leeway_seconds < out.nbf)
    return fail(jwt_error::not_yet_valid, "token not valid yet (nbf)");
  return {jwt_error::ok, {}};
}

std::size_t jwt_verifier::mint(std::string_view claims_json, std::span<char> out) const noexcept {
  const std::size_t payload_b64 = b64_size(claims_json.size());
  const std::size_t total = k_header_b64.size() + 1 + payload_b64 + 1 + mac_b64_size;
  if (total > out.size()) return 0;
  char* p = out.data();
  std::memcpy(p, k_header_b64.data(), k_header_b64.size());
  std::size_t n = k_header_b64.size();
  p[n++] = '.';
  n += b64url_encode(claims_json, p + n);
  unsigned char mac[32];
  sign({p, n}, mac);
  p[n++] = '.';
  n += b64url_encode({reinterpret_cast<const char*>(mac), sizeof mac}, p + n);
  return n;
}

std::size_t mint_hs256(std::string_view secret, std::string_view claims_json, std::span<char> out) noexcept {
  return jwt_verifier(secret).mint(claims_json, out);
}

}  // namespace wspush::proto
