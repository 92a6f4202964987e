#pragma once
/// \file jwt.hpp
/// JWT HS256 verification (RFC 7519 with the JWS compact form of RFC 7515) and the token's
/// grants in a compact form a connection can keep for its whole life.
///
/// A token is `header.payload.signature`, each part base64url without padding. The header must
/// say `"alg":"HS256"`; the signature is HMAC-SHA256 over `header.payload` with the shared
/// secret, compared in constant time. Claims: `exp` (unix seconds, required), `sub` (string,
/// optional), `iat` (unix seconds, optional: a revoked user's tokens issued before the revoke are
/// refused, server/base/revocation_list.hpp), `topics` and `pub` (arrays of grant patterns, see topic.hpp; optional, absent
/// means nothing granted). Other claims are ignored.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>

#include "proto/topic.hpp"

namespace wspush::proto {

/// Longer tokens are `malformed` without being decoded (cookies and query strings stay far
/// below; a token with a few dozen grants is ~2 KiB).
inline constexpr std::size_t max_token_bytes = 4096;
/// Storage that always holds a verified token's `sub` and grants: they come from the decoded
/// payload (3/4 of the token at most) and each string takes no more room than it took there.
inline constexpr std::size_t jwt_claims_storage_bytes = max_token_bytes / 4 * 3;

enum class jwt_error : std::uint8_t {
  ok,
  malformed,        // not three base64url parts, over max_token_bytes, header not a JSON object
  unsupported_alg,  // alg missing or not HS256 (`none`, HS512, RS256...), or a `crit` header
  bad_signature,    // the HMAC does not match (or the signature is not 32 bytes)
  bad_claims,       // payload not a JSON object, `exp` missing, a claim of the wrong type, a bad pattern
  expired,          // now >= exp
  not_yet_valid,    // now + jwt_nbf_leeway_seconds < nbf
};

/// Clock skew allowed for `nbf` (RFC 7519 §4.1.5 "some small leeway"): a token minted by a
/// backend whose clock runs up to this far ahead of ours is accepted at once.
inline constexpr std::int64_t jwt_nbf_leeway_seconds = 30;

/// Outcome of a verification: `message` is a short static text for logs.
struct jwt_result {
  jwt_error error;
  std::string_view message;
  constexpr bool ok() const noexcept { return error == jwt_error::ok; }
};

/// Grant patterns in their compact form: a sequence of entries `[1 byte: n][n bytes: pattern]`,
/// 1 <= n <= max_pattern_bytes, each pattern valid (topic.hpp). This is what a connection keeps
/// (copy `bytes()`); a view borrows whatever holds those bytes.
class grants_view {
 public:
  constexpr grants_view() noexcept = default;
  /// `bytes` must be in the compact form (what verify and encode_grants write).
  constexpr explicit grants_view(std::string_view bytes) noexcept : _bytes(bytes) {}

  constexpr std::string_view bytes() const noexcept { return _bytes; }
  constexpr bool empty() const noexcept { return _bytes.empty(); }

  /// Forward iteration over the patterns.
  class iterator {
   public:
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    constexpr iterator() noexcept = default;
    constexpr explicit iterator(std::string_view rest) noexcept : _rest(rest) {}
    constexpr std::string_view operator*() const noexcept {
      return _rest.substr(1, static_cast<unsigned char>(_rest[0]));
    }
    constexpr iterator& operator++() noexcept {
      _rest.remove_prefix(1 + static_cast<std::size_t>(static_cast<unsigned char>(_rest[0])));
      return *this;
    }
    constexpr iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    constexpr bool operator==(const iterator& o) const noexcept { return _rest.size() == o._rest.size(); }

   private:
    std::string_view _rest;
  };
  constexpr iterator begin() const noexcept { return iterator(_bytes); }
  constexpr iterator end() const noexcept { return iterator(_bytes.substr(_bytes.size())); }

 private:
  std::string_view _bytes;
};

/// The compact form of the single pattern `*`: every topic (`--auth=none` subscriptions).
inline constexpr grants_view grants_all{std::string_view("\x01*", 2)};

/// Whether any pattern in `g` grants `topic` (exact, or prefix for a `*` pattern). Linear in
/// the number of patterns; a token holds a handful.
bool grants_match(grants_view g, std::string_view topic) noexcept;

/// Writes `patterns` in the compact form; returns bytes written, 0 if one is not a valid
/// pattern or `out` is too small (an empty list writes 0 bytes too: nothing granted).
std::size_t encode_grants(std::span<const std::string_view> patterns, std::span<char> out) noexcept;

/// A verified token's claims. The views point into the storage given to verify.
struct jwt_claims {
  std::string_view sub;    // empty when the token has none
  std::int64_t exp = 0;    // unix seconds; a fractional exp is rounded down
  std::int64_t nbf = 0;    // unix seconds, 0 without the claim
  std::int64_t iat = 0;    // unix seconds, 0 without the claim (what a revoke is compared with)
  grants_view topics;      // may subscribe to
  grants_view pub;         // may publish to
};

/// Verifies HS256 tokens with one secret. Construction precomputes the HMAC key's inner and
/// outer SHA-256 states, so a verification hashes only the token (two SHA-256 passes over it
/// plus two blocks) and allocates nothing.
///
/// Thread safety: after construction the object is immutable; verify() and mint() are const
/// and may run on any number of threads at once. The claims JSON is parsed with one simdjson
/// parser per calling thread (thread_local, sized for max_token_bytes on the thread's first
/// call and kept: the only allocation, once per thread).
class jwt_verifier {
 public:
  /// Any secret length (RFC 2104: a key longer than the 64-byte block is hashed first). The
  /// secret is not kept, only the two derived states.
  explicit jwt_verifier(std::string_view secret) noexcept;

  /// Checks, in order: shape and size (malformed), header (malformed / unsupported_alg),
  /// signature (bad_signature), then claims (bad_claims), expiry against `now` (expired:
  /// now >= exp, RFC 7519 §4.1.4) and not-before (not_yet_valid: now + jwt_nbf_leeway_seconds
  /// < nbf, §4.1.5). Claims are read only from a token whose signature matched.
  /// On success `out` is filled with views into `storage`, which needs at most
  /// jwt_claims_storage_bytes (smaller storage that turns out too small → bad_claims). On
  /// failure `out` is left in an unspecified state.
  jwt_result verify(std::string_view token, std::int64_t now, std::span<char> storage,
                    jwt_claims& out) const noexcept;

  /// Writes the token `{"alg":"HS256","typ":"JWT"}`.`claims_json`.signature into `out`; returns
  /// bytes written, 0 if `out` is too small. `claims_json` is used as given (not validated), so
  /// tests can mint tokens with broken claims. For tests and the load generator.
  std::size_t mint(std::string_view claims_json, std::span<char> out) const noexcept;

 private:
  void sign(std::string_view signing_input, unsigned char (&mac)[32]) const noexcept;

  // SHA256_CTX after absorbing (key ^ ipad) and (key ^ opad); opaque here so OpenSSL stays
  // out of this header (its size is checked in jwt.cpp).
  alignas(8) unsigned char _inner[112];
  alignas(8) unsigned char _outer[112];
};

/// mint() with a verifier made on the spot: `mint_hs256(secret, R"({"sub":"u","exp":1})", out)`.
std::size_t mint_hs256(std::string_view secret, std::string_view claims_json, std::span<char> out) noexcept;

/// Short name of an error (`bad_signature`...), for logs and metrics labels.
constexpr std::string_view jwt_error_name(jwt_error e) noexcept {
  switch (e) {
    case jwt_error::ok: return "ok";
    case jwt_error::malformed: return "malformed";
    case jwt_error::unsupported_alg: return "unsupported_alg";
    case jwt_error::bad_signature: return "bad_signature";
    case jwt_error::bad_claims: return "bad_claims";
    case jwt_error::expired: return "expired";
    case jwt_error::not_yet_valid: return "not_yet_valid";
  }
  return "unknown";
}

}  // namespace wspush::proto
