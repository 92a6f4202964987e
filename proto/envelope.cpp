#include "proto/envelope.hpp"

#include <simdjson.h>

#include <algorithm>

#include <cstdio>
#include <cstring>
#include <utility>

#include "proto/detail/fixed_writer.hpp"

namespace wspush::proto {

static_assert(envelope_padding >= simdjson::SIMDJSON_PADDING, "envelope_padding must cover simdjson's");

namespace {

namespace sj = simdjson::ondemand;

constexpr envelope_result fail(client_error e, std::string_view why) noexcept { return {e, why}; }
constexpr envelope_result k_ok{client_error::none, {}};
constexpr envelope_result k_bad_json = fail(client_error::bad_json, "message is not valid JSON");

constexpr bool is_ws(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim_right(std::string_view s) noexcept {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

/// RFC 8259 number grammar. simdjson's own number parsing refuses valid JSON it cannot
/// represent (1e400, 30-digit integers); `data` is forwarded, not computed with, so it is
/// checked here and left as it is.
bool is_json_number(std::string_view s) noexcept {
  std::size_t i = 0;
  const std::size_t n = s.size();
  auto digits = [&] {
    const std::size_t start = i;
    while (i < n && is_digit(s[i])) ++i;
    return i > start;
  };
  if (i < n && s[i] == '-') ++i;
  if (i < n && s[i] == '0') {
    ++i;
  } else if (!(i < n && s[i] >= '1' && s[i] <= '9') || !digits()) {
    return false;
  }
  if (i < n && s[i] == '.' && (++i, !digits())) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == n;
}

/// The bytes of a JSON string from just after its opening quote: a view of the raw content if
/// it holds no escape (stage 1 has checked that the string is closed, UTF-8 and free of raw
/// control bytes), else empty with `escaped` set.
std::string_view raw_string_content(const char* p, bool& escaped) noexcept {
  const char* q = p;
  while (*q != '"' && *q != '\\') ++q;
  escaped = *q == '\\';
  return escaped ? std::string_view{} : std::string_view(p, static_cast<std::size_t>(q - p));
}

/// A string value as a view (see envelope's lifetime note). bad_request if not a string.
client_error read_string(sj::value& v, std::string_view& out) noexcept {
  sj::json_type t;
  if (v.type().get(t)) return client_error::bad_json;
  if (t != sj::json_type::string) return client_error::bad_request;
  bool escaped = false;
  out = raw_string_content(v.raw_json_token().data() + 1, escaped);
  if (escaped) return v.get_string().get(out) ? client_error::bad_json : client_error::none;
  sj::raw_json_string consumed;
  return v.get_raw_json_string().get(consumed) ? client_error::bad_json : client_error::none;
}

client_error read_key(sj::field& f, std::string_view& out) noexcept {
  bool escaped = false;
  out = raw_string_content(f.key().raw(), escaped);
  if (escaped && f.unescaped_key().get(out)) return client_error::bad_json;
  return client_error::none;
}

/// Validates any value to the end (On Demand checks only what is read), refusing nesting
/// deeper than max_data_depth. Scalars are checked from their raw token and left unconsumed:
/// the enclosing iteration skips them.
client_error walk(sj::value v, std::size_t depth) noexcept {
  sj::json_type t;
  if (v.type().get(t)) return client_error::bad_json;
  switch (t) {
    case sj::json_type::object: {
      sj::object obj;
      if (depth >= max_data_depth) return client_error::bad_request;
      if (v.get_object().get(obj)) return client_error::bad_json;
      for (auto field : obj) {
        sj::field f;
        std::string_view key;
        if (std::move(field).get(f) || read_key(f, key) != client_error::none) return client_error::bad_json;
        if (const client_error e = walk(f.value(), depth + 1); e != client_error::none) return e;
      }
      return client_error::none;
    }
    case sj::json_type::array: {
      sj::array arr;
      if (depth >= max_data_depth) return client_error::bad_request;
      if (v.get_array().get(arr)) return client_error::bad_json;
      for (auto element : arr) {
        sj::value e;
        if (element.get(e)) return client_error::bad_json;
        if (const client_error r = walk(e, depth + 1); r != client_error::none) return r;
      }
      return client_error::none;
    }
    case sj::json_type::string: {
      std::string_view s;
      return v.get_string().get(s) ? client_error::bad_json : client_error::none;
    }
    case sj::json_type::number:
      return is_json_number(trim_right(v.raw_json_token())) ? client_error::none : client_error::bad_json;
    case sj::json_type::boolean: {
      const std::string_view s = trim_right(v.raw_json_token());
      return s == "true" || s == "false" ? client_error::none : client_error::bad_json;
    }
    case sj::json_type::null:
      return trim_right(v.raw_json_token()) == "null" ? client_error::none : client_error::bad_json;
  }
  return client_error::bad_json;
}

envelope_result as_result(client_error e, std::string_view why) noexcept {
  if (e == client_error::none) return k_ok;
  if (e == client_error::bad_json) return k_bad_json;
  return {e, why};
}

/// `data`: validated to its end, then its raw bytes from the first byte of its token to the
/// start of whatever follows it (the `,` or `}` after it), less trailing whitespace.
envelope_result read_data(sj::value v, sj::document& doc, std::string_view& out) noexcept {
  const char* start = v.raw_json_token().data();
  sj::json_type t;
  if (v.type().get(t)) return k_bad_json;
  const bool scalar = t != sj::json_type::object && t != sj::json_type::array;
  const std::string_view token = trim_right(v.raw_json_token());
  if (const client_error e = walk(v, 1); e != client_error::none) return as_result(e, "data nested too deep");
  if (scalar) {
    out = token;
    return k_ok;
  }
  const char* next = nullptr;
  if (doc.current_location().get(next)) return k_bad_json;  // the object's `}` at least must follow
  out = trim_right({start, static_cast<std::size_t>(next - start)});
  return k_ok;
}

envelope_result read_topics(sj::value v, envelope& out) noexcept {
  constexpr envelope_result not_array = fail(client_error::bad_request, "topics must be an array of topic names");
  sj::array arr;
  if (v.get_array().get(arr)) return not_array;
  std::size_t n = 0;
  for (auto element : arr) {
    sj::value e;
    std::string_view topic;
    if (element.get(e)) return k_bad_json;
    if (const client_error r = read_string(e, topic); r != client_error::none) return as_result(r, not_array.message);
    if (n == max_topics_per_message) return fail(client_error::too_many_topics, "too many topics in one message");
    if (!is_valid_topic(topic)) return fail(client_error::bad_request, "invalid topic name");
    out.topics_buf[n++] = topic;
  }
  if (n == 0) return fail(client_error::bad_request, "topics is empty");
  out.topic_count = static_cast<std::uint8_t>(n);
  return k_ok;
}

envelope_result read_since(sj::value v, envelope& out) noexcept {
  constexpr envelope_result bad = fail(client_error::bad_request, "since must map topic names to id strings");
  sj::object obj;
  if (v.get_object().get(obj)) return bad;
  std::size_t n = 0;
  for (auto field : obj) {
    sj::field f;
    since_entry s;
    if (std::move(field).get(f) || read_key(f, s.topic) != client_error::none) return k_bad_json;
    if (const client_error r = read_string(f.value(), s.id); r != client_error::none) return as_result(r, bad.message);
    if (n == max_topics_per_message) return fail(client_error::too_many_topics, "too many topics in since");
    if (!is_valid_topic(s.topic) || s.id.empty() || s.id.size() > max_id_bytes) return bad;
    out.since_buf[n++] = s;
  }
  out.since_count = static_cast<std::uint8_t>(n);
  return k_ok;
}

enum field_bit : unsigned { f_op = 1, f_topics = 2, f_since = 4, f_topic = 8, f_data = 16, f_token = 32, f_key = 64 };

unsigned field_bit_of(std::string_view key) noexcept {
  if (key == "op") return f_op;
  if (key == "topics") return f_topics;
  if (key == "since") return f_since;
  if (key == "topic") return f_topic;
  if (key == "data") return f_data;
  if (key == "token") return f_token;
  if (key == "idempotency_key") return f_key;
  return 0;
}

envelope_result read_field(std::string_view key, sj::value v, sj::document& doc, envelope& out,
                           std::string_view& op, unsigned& seen) noexcept {
  const unsigned bit = field_bit_of(key);
  if (bit == 0) return as_result(walk(v, 1), "unknown field nested too deep");
  if (seen & bit) return fail(client_error::bad_request, "a field appears twice");
  seen |= bit;
  switch (bit) {
    case f_op: return as_result(read_string(v, op), "op must be a string");
    case f_topics: return read_topics(v, out);
    case f_since: return read_since(v, out);
    case f_data: return read_data(v, doc, out.data);
    case f_token: {
      constexpr envelope_result bad = fail(client_error::bad_request, "token must be a non-empty string of at most 4096 bytes");
      const client_error e = read_string(v, out.token);
      if (e != client_error::none) return as_result(e, bad.message);
      return out.token.empty() || out.token.size() > max_auth_token_bytes ? bad : k_ok;
    }
    case f_key: {
      constexpr envelope_result bad =
          fail(client_error::bad_request, "idempotency_key must be a string of 1 to 128 bytes of printable ASCII");
      const client_error e = read_string(v, out.idempotency_key);
      if (e != client_error::none) return as_result(e, bad.message);
      return is_valid_idempotency_key(out.idempotency_key) ? k_ok : bad;
    }
    default: break;
  }
  const client_error e = read_string(v, out.topic);
  if (e != client_error::none) return as_result(e, "topic must be a topic name");
  return is_valid_topic(out.topic) ? k_ok : fail(client_error::bad_request, "invalid topic name");
}

bool has_topic(const envelope& e, std::string_view topic) noexcept {
  for (const std::string_view t : e.topics())
    if (t == topic) return true;
  return false;
}

/// What each op needs, once every field has been read.
envelope_result check_op(std::string_view op, unsigned seen, envelope& out) noexcept {
  if (!(seen & f_op)) return fail(client_error::bad_request, "op missing");
  if (op == "pub") {
    out.op = client_op::pub;
    out.topic_count = out.since_count = 0;  // fields of other ops: checked, then ignored
    const bool complete = (seen & (f_topic | f_data)) == (f_topic | f_data);
    return complete ? k_ok : fail(client_error::bad_request, "pub needs topic and data");
  }
  if (op == "presence" || op == "presence_count") {
    out.op = op == "presence" ? client_op::presence : client_op::presence_count;
    out.topic_count = out.since_count = 0;  // fields of other ops: checked, then ignored
    out.data = out.idempotency_key = {};
    return (seen & f_topic) ? k_ok : fail(client_error::bad_request, "presence needs topic");
  }
  if (op == "auth" || op == "pong") {
    out.op = op == "auth" ? client_op::auth : client_op::pong;
    out.topic_count = out.since_count = 0;  // fields of other ops: checked, then ignored
    out.topic = out.data = out.idempotency_key = {};
    if (out.op == client_op::pong) return k_ok;
    return (seen & f_token) ? k_ok : fail(client_error::bad_request, "auth needs token");
  }
  if (op != "sub" && op != "unsub") return fail(client_error::unknown_op, "unknown op");
  out.op = op == "sub" ? client_op::sub : client_op::unsub;
  out.topic = out.data = out.idempotency_key = {};
  if (!(seen & f_topics)) return fail(client_error::bad_request, "topics missing");
  if (out.op == client_op::unsub) out.since_count = 0;  // meaningless there: ignored
  for (std::size_t i = 0; i < out.since_count; ++i) {
    const std::string_view t = out.since_buf[i].topic;
    if (!has_topic(out, t)) return fail(client_error::bad_request, "since names a topic not in topics");
    for (std::size_t j = 0; j < i; ++j)
      if (out.since_buf[j].topic == t) return fail(client_error::bad_request, "since names a topic twice");
  }
  return k_ok;
}

/// A message that is not an object: bad_request if it is valid JSON, else bad_json.
envelope_result not_an_object(sj::document& doc, std::string_view message) noexcept {
  constexpr envelope_result not_object = fail(client_error::bad_request, "message is not a JSON object");
  sj::json_type t;
  if (doc.type().get(t) || t == sj::json_type::object) return k_bad_json;  // an object get_object refused
  if (t == sj::json_type::array) {
    sj::array arr;
    if (doc.get_array().get(arr)) return k_bad_json;
    for (auto element : arr) {
      sj::value e;
      if (element.get(e) || walk(e, 1) == client_error::bad_json) return k_bad_json;
    }
    const char* rest = nullptr;
    return doc.current_location().get(rest) == simdjson::OUT_OF_BOUNDS ? not_object : k_bad_json;
  }
  std::string_view token;
  if (doc.raw_json_token().get(token)) return k_bad_json;
  if (token.data() + token.size() != message.data() + message.size()) return k_bad_json;  // `1 2`
  token = trim_right(token);
  bool valid = t == sj::json_type::number ? is_json_number(token)
             : t == sj::json_type::boolean ? token == "true" || token == "false"
             : t == sj::json_type::null ? token == "null"
             : true;
  if (t == sj::json_type::string) {
    std::string_view s;
    valid = !doc.get_string().get(s);
  }
  return valid ? not_object : k_bad_json;
}

// ---- encoders --------------------------------------------------------------------------------

/// JSON onto a fixed buffer (detail::fixed_writer: an overflow is remembered, size() is then 0).
class json_writer {
 public:
  explicit json_writer(std::span<char> out) noexcept : _w(out) {}

  json_writer& raw(std::string_view s) noexcept {
    _w << s;
    return *this;
  }

  /// `"s"` with JSON escapes. Runs of plain bytes are copied whole; topics have none to escape.
  json_writer& string(std::string_view s) noexcept {
    raw("\"");
    std::size_t run = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      raw(s.substr(run, i - run));
      escape(c);
      run = i + 1;
    }
    raw(s.substr(run));
    return raw("\"");
  }

  json_writer& string_array(std::span<const std::string_view> items) noexcept {
    raw("[");
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i != 0) raw(",");
      string(items[i]);
    }
    return raw("]");
  }

  std::size_t size() const noexcept { return _w.size(); }

 private:
  void escape(unsigned char c) noexcept {
    constexpr char hex[] = "0123456789abcdef";
    switch (c) {
      case '"': raw("\\\""); return;
      case '\\': raw("\\\\"); return;
      case '\n': raw("\\n"); return;
      case '\r': raw("\\r"); return;
      case '\t': raw("\\t"); return;
      case '\b': raw("\\b"); return;
      case '\f': raw("\\f"); return;
      default: {
        const char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        raw({u, sizeof u});
      }
    }
  }

  detail::fixed_writer _w;
};

}  // namespace

std::size_t encode_event(std::string_view topic, std::string_view id, std::string_view data_raw,
                         std::span<char> out) noexcept {
  json_writer w(out);
  w.raw("{\"topic\":").string(topic).raw(",\"id\":").string(id).raw(",\"data\":").raw(data_raw).raw("}");
  return w.size();
}

std::size_t encode_subbed(std::span<const std::string_view> topics, std::span<const std::string_view> lost,
                          std::span<char> out, std::span<const std::string_view> at) noexcept {
  json_writer w(out);
  w.raw("{\"op\":\"subbed\",\"topics\":").string_array(topics).raw(",\"lost\":").string_array(lost);
  bool any = false;
  for (std::size_t k = 0; k < std::min(topics.size(), at.size()); ++k) {
    if (at[k].empty()) continue;
    w.raw(any ? "," : ",\"at\":{").string(topics[k]).raw(":").string(at[k]);
    any = true;
  }
  if (any) w.raw("}");
  return w.raw("}").size();
}

std::size_t encode_unsubbed(std::span<const std::string_view> topics, std::span<char> out) noexcept {
  json_writer w(out);
  w.raw("{\"op\":\"unsubbed\",\"topics\":").string_array(topics).raw("}");
  return w.size();
}

std::size_t encode_authed(std::int64_t exp, std::span<const std::string_view> unsubbed, std::span<char> out) noexcept {
  char digits[24];
  const int n = std::snprintf(digits, sizeof digits, "%lld", static_cast<long long>(exp));
  json_writer w(out);
  w.raw("{\"op\":\"authed\",\"exp\":").raw({digits, std::size_t(n)}).raw(",\"unsubbed\":").string_array(unsubbed).raw("}");
  return w.size();
}

std::size_t encode_error(client_error code, std::string_view topic, std::span<char> out,
                         std::string_view of) noexcept {
  json_writer w(out);
  w.raw("{\"op\":\"error\",\"code\":").string(client_error_name(code));
  if (!topic.empty()) w.raw(",\"topic\":").string(topic);
  if (!of.empty()) w.raw(",\"of\":").string(of);
  w.raw("}");
  return w.size();
}

std::size_t encode_presence(std::string_view op, std::string_view topic, const std::span<const presence_user>* users,
                            std::uint64_t user_count, std::uint64_t connections, bool truncated,
                            std::span<char> out) noexcept {
  json_writer w(out);
  char digits[24];
  const auto number = [&](std::uint64_t v) -> std::string_view {
    return {digits, std::size_t(std::snprintf(digits, sizeof digits, "%llu", static_cast<unsigned long long>(v)))};
  };
  w.raw("{");
  if (!op.empty()) w.raw("\"op\":").string(op).raw(",");
  w.raw("\"topic\":").string(topic);
  if (users) {
    w.raw(",\"users\":{");
    for (std::size_t i = 0; i < users->size(); ++i) {
      if (i != 0) w.raw(",");
      w.string((*users)[i].user).raw(":").raw(number((*users)[i].connections));
    }
    w.raw("}");
    if (truncated) w.raw(",\"truncated\":true");
  }
  w.raw(",\"user_count\":").raw(number(user_count));
  w.raw(",\"connections\":").raw(number(connections)).raw("}");
  return w.size();
}

std::size_t encode_join_leave(bool join, std::string_view topic, std::string_view user, std::span<char> out) noexcept {
  json_writer w(out);
  w.raw(join ? "{\"op\":\"join\",\"topic\":" : "{\"op\":\"leave\",\"topic\":").string(topic);
  w.raw(",\"user\":").string(user).raw("}");
  return w.size();
}

std::size_t encode_published(std::string_view id, std::span<char> out) noexcept {
  json_writer w(out);
  w.raw("{\"id\":").string(id).raw("}");
  return w.size();
}

struct envelope_parser::impl {
  sj::parser parser;
  std::unique_ptr<char[]> copy;  // max_message_bytes + padding, for callers without padding
};

envelope_parser::envelope_parser(std::size_t max_message_bytes)
    : _impl(std::make_unique<impl>()), _max(max_message_bytes) {
  _impl->copy = std::make_unique<char[]>(max_message_bytes + simdjson::SIMDJSON_PADDING);
  // Depth: the message object, `data`'s own limit, and room so simdjson is never the one to refuse.
  // Failure leaves the parser empty: iterate() then tries again (and reports MEMALLOC if it must).
  if (_impl->parser.allocate(max_message_bytes, max_data_depth + 8) != simdjson::SUCCESS) return;
}

envelope_parser::~envelope_parser() = default;
envelope_parser::envelope_parser(envelope_parser&&) noexcept = default;
envelope_parser& envelope_parser::operator=(envelope_parser&&) noexcept = default;

envelope_result envelope_parser::parse(std::string_view message, std::size_t readable, envelope& out) noexcept {
  if (message.size() > _max) return fail(client_error::too_big, "message too big");
  std::size_t capacity = readable;
  if (readable < message.size() + simdjson::SIMDJSON_PADDING) {
    if (!message.empty()) std::memcpy(_impl->copy.get(), message.data(), message.size());
    // simdjson looks at the first padding byte (a `}` there makes it check bracket balance):
    // not a stale byte of an earlier message, so the same message always gets the same answer.
    _impl->copy[message.size()] = ' ';
    message = {_impl->copy.get(), message.size()};
    capacity = _max + simdjson::SIMDJSON_PADDING;
  }
  out.topic_count = out.since_count = 0;
  out.topic = out.data = out.token = out.idempotency_key = {};
  sj::document doc;
  sj::object obj;
  if (_impl->parser.iterate(message.data(), message.size(), capacity).get(doc)) return k_bad_json;
  if (doc.get_object().get(obj)) return not_an_object(doc, message);
  std::string_view op;
  unsigned seen = 0;
  for (auto field : obj) {
    sj::field f;
    std::string_view key;
    if (std::move(field).get(f) || read_key(f, key) != client_error::none) return k_bad_json;
    if (const envelope_result r = read_field(key, f.value(), doc, out, op, seen); !r.ok()) return r;
  }
  const char* rest = nullptr;
  if (doc.current_location().get(rest) != simdjson::OUT_OF_BOUNDS) return k_bad_json;
  return check_op(op, seen, out);
}

}  // namespace wspush::proto
