#pragma once
/// \file envelope.hpp
/// Client→server messages (one JSON object per text message) and the server→client messages
/// of the wire protocol (DESIGN.md "Wire protocol"):
///
///   {"op":"sub","topics":["mailbox:42"],"since":{"mailbox:42":"17"}}
///   {"op":"unsub","topics":["mailbox:42"]}
///   {"op":"pub","topic":"mailbox:42","data":<any JSON>}
///   {"op":"pub","topic":"mailbox:42","data":<any JSON>,"idempotency_key":"order-17"}
///   {"op":"auth","token":"<JWT>"}      in-band token refresh
///   {"op":"pong"}                       the answer to a heartbeat `{"op":"ping"}`
///
/// Parsing is simdjson On Demand with one parser reused for every message: no allocation per
/// message. The result is views, never copies; `data` is the value's raw bytes as sent.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "proto/topic.hpp"

namespace wspush::proto {

/// Topics (and `since` entries) one `sub` or `unsub` may name.
inline constexpr std::size_t max_topics_per_message = 32;
/// Longest token an `auth` may carry (what jwt_verifier accepts).
inline constexpr std::size_t max_auth_token_bytes = 4096;
/// Longest idempotency key of a `pub` (and of an admin publish): 1 to this many bytes of
/// printable ASCII (space to `~`).
inline constexpr std::size_t max_idempotency_key_bytes = 128;

/// An idempotency key as publishes take it: 1-128 bytes of printable ASCII.
constexpr bool is_valid_idempotency_key(std::string_view k) noexcept {
  if (k.empty() || k.size() > max_idempotency_key_bytes) return false;
  for (char c : k)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

/// Longest `since` id. Ids are the server's (`k3f9:18`, a Redis stream id); a longer one was
/// never issued by it.
inline constexpr std::size_t max_id_bytes = 64;
/// Nesting allowed inside `data` (and unknown fields): deeper is bad_request.
inline constexpr std::size_t max_data_depth = 64;
/// Bytes after the end of a message that parse() may read (simdjson's SIMDJSON_PADDING; their
/// content does not matter). The caller owns them: a message received into a block with this
/// much room behind it is parsed where it lies.
inline constexpr std::size_t envelope_padding = 64;

enum class client_op : std::uint8_t { sub, unsub, pub, auth, pong, presence, presence_count };

/// Error codes of the protocol: what a client is told in `{"op":"error","code":...}`. parse()
/// produces the first five; the others are the server's decisions.
enum class client_error : std::uint8_t {
  none,
  bad_json,         // not JSON (or not UTF-8, or trailing bytes after the object)
  unknown_op,       // `op` is a string but not one of the ops
  bad_request,      // not an object, `op` missing, a field of the wrong type, a bad topic or id
  too_many_topics,  // over max_topics_per_message in `topics` or `since`
  too_big,          // over the parser's max_message_bytes
  forbidden,        // the token does not grant the topic
  too_many_subscriptions,  // over the connection's limit
  unavailable,      // the server cannot take it now (bus down, draining); a `pub`: it was not published
  unauthorized,     // an `auth` token that is malformed, forged, expired or not yet valid
  timeout,          // a `pub` sent to Redis when the link broke, unanswered: it may have been published
  rate_limited,     // past the connection's message rate (--client-message-rate): not handled
  not_enabled,      // `presence` of a topic whose namespace keeps none (--presence)
};

constexpr std::string_view client_error_name(client_error e) noexcept {
  switch (e) {
    case client_error::none: return "none";
    case client_error::bad_json: return "bad_json";
    case client_error::unknown_op: return "unknown_op";
    case client_error::bad_request: return "bad_request";
    case client_error::too_many_topics: return "too_many_topics";
    case client_error::too_big: return "too_big";
    case client_error::forbidden: return "forbidden";
    case client_error::too_many_subscriptions: return "too_many_subscriptions";
    case client_error::unavailable: return "unavailable";
    case client_error::unauthorized: return "unauthorized";
    case client_error::timeout: return "timeout";
    case client_error::rate_limited: return "rate_limited";
    case client_error::not_enabled: return "not_enabled";
  }
  return "unknown";
}

struct since_entry {
  std::string_view topic;
  std::string_view id;
};

/// A parsed client message. Views are valid until the next parse() on the same parser and as
/// long as the message bytes are; they point into the message, except a string written with
/// escapes (`"mailbox:\u0034\u0032"`), which points into the parser's unescaped copy.
/// Topics are valid topic names (topic.hpp); duplicates are kept as sent.
struct envelope {
  client_op op = client_op::sub;
  std::uint8_t topic_count = 0;   // sub, unsub: >= 1
  std::uint8_t since_count = 0;   // sub: each names one of `topics`, at most once
  std::string_view topic;         // pub, presence, presence_count
  std::string_view data;          // pub: the raw JSON value, first to last byte, never empty
  std::string_view idempotency_key;  // pub: empty when none (is_valid_idempotency_key otherwise)
  std::string_view token;         // auth: the token as sent (not checked here: jwt_verifier does)
  std::array<std::string_view, max_topics_per_message> topics_buf;
  std::array<since_entry, max_topics_per_message> since_buf;

  std::span<const std::string_view> topics() const noexcept { return {topics_buf.data(), topic_count}; }
  std::span<const since_entry> since() const noexcept { return {since_buf.data(), since_count}; }
};

struct envelope_result {
  client_error error;      // none on success
  std::string_view message;  // short static text for logs; empty on success
  constexpr bool ok() const noexcept { return error == client_error::none; }
};

/// Parses client messages. One per thread that parses (a shard, a worker): it is not
/// thread-safe, and its views live until its next parse. Construction allocates the simdjson
/// buffers for max_message_bytes once; parse() never allocates.
class envelope_parser {
 public:
  explicit envelope_parser(std::size_t max_message_bytes = 64 * 1024);
  ~envelope_parser();
  envelope_parser(envelope_parser&&) noexcept;
  envelope_parser& operator=(envelope_parser&&) noexcept;

  /// `readable` is how many bytes from message.data() may be read: at least message.size() +
  /// envelope_padding lets simdjson work in place. With less, the message is first copied into
  /// the parser's own padded buffer (a memcpy, still no allocation) and views point there.
  /// Rules: a JSON object; `op` one of sub/unsub/pub/auth/pong/presence/presence_count (the
  /// presence ops need `topic`); sub and unsub need `topics`, a non-empty
  /// array of topic names (≤ max_topics_per_message); sub may have `since`, an object of
  /// topic → id string (1..max_id_bytes) whose topics are among `topics`; pub needs `topic` and
  /// `data` (any JSON value, nested at most max_data_depth) and may have `idempotency_key`
  /// (is_valid_idempotency_key). Known fields must have the right
  /// type whatever the op (a pub with `"topics":5` is bad_request) and appear once; unknown
  /// fields are ignored but must be valid JSON. auth needs `token`, a non-empty string of at
  /// most max_auth_token_bytes; pong needs nothing. The first problem met reading front to back is
  /// the one reported: a message that is not JSON is refused, as bad_json or, when a problem
  /// of the request shows before the JSON breaks, as that problem (which one can depend on the
  /// byte after the message: simdjson checks bracket balance up front only when it is `}`).
  envelope_result parse(std::string_view message, std::size_t readable, envelope& out) noexcept;

  std::size_t max_message_bytes() const noexcept { return _max; }

 private:
  struct impl;
  std::unique_ptr<impl> _impl;
  std::size_t _max;
};

// ---- server → client ------------------------------------------------------------------------
// Each writes one complete JSON text into `out` and returns the bytes written, or 0 if `out`
// is too small (then `out` holds garbage). Strings are escaped as JSON requires (`"`, `\`,
// control bytes); other bytes are copied as they are (the caller gives UTF-8).

/// Room encode_event needs at most (every string byte escaped as \u00XX).
constexpr std::size_t event_size_bound(std::string_view topic, std::string_view id, std::string_view data) noexcept {
  return 32 + 6 * (topic.size() + id.size()) + data.size();
}

/// `{"topic":"...","id":"...","data":<data_raw>}`; `data_raw` is copied byte for byte.
/// A valid topic (topic.hpp) needs no escaping, so it lies verbatim at event_topic_offset of
/// the output: whoever keeps the encoded event can point at its topic without parsing.
std::size_t encode_event(std::string_view topic, std::string_view id, std::string_view data_raw,
                         std::span<char> out) noexcept;
inline constexpr std::size_t event_topic_offset = 10;  // after {"topic":"
/// `{"op":"subbed","topics":[...],"lost":[...]}`; `lost` is always present. `at`, when given,
/// runs beside `topics`: each non-empty one is that topic's position, written as
/// `,"at":{"topic":"position",...}` (none non-empty: no `at`).
std::size_t encode_subbed(std::span<const std::string_view> topics, std::span<const std::string_view> lost,
                          std::span<char> out, std::span<const std::string_view> at = {}) noexcept;
/// `{"op":"unsubbed","topics":[...]}`.
std::size_t encode_unsubbed(std::span<const std::string_view> topics, std::span<char> out) noexcept;
/// `{"op":"error","code":"forbidden","topic":"..."}`; without `topic` when it is empty. `of`:
/// the op the error answers, `"of":"pub"` when set (a `pub` is answered only when it fails, so
/// a client that pairs answers with its requests in order must tell those apart).
std::size_t encode_error(client_error code, std::string_view topic, std::span<char> out,
                         std::string_view of = {}) noexcept;
/// `{"op":"authed","exp":1735689600,"unsubbed":[...]}`: a refreshed token's expiry and the
/// subscriptions its grants no longer allow (removed).
std::size_t encode_authed(std::int64_t exp, std::span<const std::string_view> unsubbed, std::span<char> out) noexcept;
/// `{"op":"ping"}`: the heartbeat a client that asked for one (`?heartbeat=1`) answers with a pong.
inline constexpr std::string_view heartbeat_ping = R"({"op":"ping"})";
/// One user in a presence answer: its `sub` and how many of its connections are subscribed.
struct presence_user {
  std::string_view user;
  std::uint32_t connections = 0;
};
/// Room encode_presence needs at most.
constexpr std::size_t presence_size_bound(std::string_view topic, std::span<const presence_user> users) noexcept {
  std::size_t n = 128 + 6 * topic.size();
  for (const presence_user& u : users) n += 6 * u.user.size() + 16;
  return n;
}
/// `{"op":"presence","topic":"...","users":{"u42":2,...},"user_count":1,"connections":2}`, or
/// with `users` null (presence_count) `{"op":"presence_count","topic":"...","user_count":..,
/// "connections":..}`. `truncated`: `users` lists only some (`"truncated":true`). Without `op`
/// (the admin API's answer) the same object without its "op" member.
std::size_t encode_presence(std::string_view op, std::string_view topic, const std::span<const presence_user>* users,
                            std::uint64_t user_count, std::uint64_t connections, bool truncated,
                            std::span<char> out) noexcept;
/// `{"op":"join","topic":"...","user":"..."}` (`join` false: `"leave"`): a user's first
/// connection subscribed to the topic, or its last one left it.
std::size_t encode_join_leave(bool join, std::string_view topic, std::string_view user, std::span<char> out) noexcept;
/// `{"id":"18"}`: the answer to a publish.
std::size_t encode_published(std::string_view id, std::span<char> out) noexcept;

}  // namespace wspush::proto
