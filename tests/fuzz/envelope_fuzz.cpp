// Fuzz target for proto::envelope_parser and the encoders. Input: a client message. It is
// parsed twice, in place with padding behind it and from an exactly sized copy (the parser's
// copying path); both must agree (on the code too, for valid JSON). simdjson's validating DOM parser is the oracle for "is this
// JSON" (numbers it cannot represent and nesting past its limit aside): a message it accepts
// is never bad_json, and one it refuses is never accepted (a refused message may be reported
// as bad_request when that problem comes first). On success: views lie inside the input (or, for a string
// written with escapes, the input has a backslash), topics are valid, `data` is itself valid
// JSON without surrounding whitespace, a pub's idempotency key (only a pub's) is 1-128 bytes of
// printable ASCII, and what the encoders make of the result parses back.

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/envelope.hpp"

using namespace wspush::proto;

namespace {

constexpr std::size_t k_max = 1 << 16;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// DOM verdict on `json`: SUCCESS, or the error; numbers it cannot represent do not count.
simdjson::error_code dom_verdict(std::string_view json) {
  static simdjson::dom::parser dom;
  const simdjson::padded_string padded(json);
  simdjson::dom::element root;
  return dom.parse(padded).get(root);
}

bool dom_unsure(simdjson::error_code e) {
  return e == simdjson::NUMBER_ERROR || e == simdjson::DEPTH_ERROR ||
         e == simdjson::CAPACITY || e == simdjson::NUMBER_OUT_OF_RANGE;
}

void check_view(std::string_view v, std::string_view input, bool input_has_escape) {
  const bool in = v.data() >= input.data() && v.data() + v.size() <= input.data() + input.size();
  WSPUSH_FUZZ_CHECK(in || input_has_escape);
}

std::string describe(const envelope& e) {
  std::string s = std::to_string(static_cast<int>(e.op)) + "|" + std::string(e.topic) + "|" + std::string(e.data) + "|" +
                  std::string(e.idempotency_key);
  for (auto t : e.topics()) s += "|t:" + std::string(t);
  for (auto x : e.since()) s += "|s:" + std::string(x.topic) + "=" + std::string(x.id);
  return s;
}

void check_success(const envelope& e, std::string_view input) {
  const bool escape = input.find('\\') != input.npos;
  WSPUSH_FUZZ_CHECK(e.topic_count <= max_topics_per_message && e.since_count <= e.topic_count);
  for (auto t : e.topics()) {
    WSPUSH_FUZZ_CHECK(is_valid_topic(t));
    check_view(t, input, escape);
  }
  for (auto s : e.since()) {
    WSPUSH_FUZZ_CHECK(is_valid_topic(s.topic));
    WSPUSH_FUZZ_CHECK(!s.id.empty() && s.id.size() <= max_id_bytes);
    check_view(s.topic, input, escape);
    check_view(s.id, input, escape);
  }
  std::vector<char> out(2 * input.size() + 8 * max_topics_per_message * (max_topic_bytes + 8) + 256);
  if (e.op == client_op::pub) {
    WSPUSH_FUZZ_CHECK(is_valid_topic(e.topic));
    check_view(e.topic, input, escape);
    WSPUSH_FUZZ_CHECK(!e.data.empty() && !is_ws(e.data.front()) && !is_ws(e.data.back()));
    check_view(e.data, input, false);  // data is never unescaped: always the input's bytes
    // A key, when there is one, is what publishes take (1-128 bytes of printable ASCII).
    WSPUSH_FUZZ_CHECK(e.idempotency_key.empty() || is_valid_idempotency_key(e.idempotency_key));
    if (!e.idempotency_key.empty()) check_view(e.idempotency_key, input, escape);
    const auto d = dom_verdict(e.data);
    WSPUSH_FUZZ_CHECK(d == simdjson::SUCCESS || dom_unsure(d));
    const std::size_t n = encode_event(e.topic, "id", e.data, {out.data(), out.size()});
    WSPUSH_FUZZ_CHECK(n > 0 && n <= event_size_bound(e.topic, "id", e.data));
    const auto ev = dom_verdict({out.data(), n});
    WSPUSH_FUZZ_CHECK(ev == simdjson::SUCCESS || dom_unsure(ev));
  } else if (!e.idempotency_key.empty()) {
    WSPUSH_FUZZ_CHECK(false);  // only a pub keeps one
  } else if (e.op == client_op::auth) {
    WSPUSH_FUZZ_CHECK(!e.token.empty() && e.token.size() <= max_auth_token_bytes);
    check_view(e.token, input, escape);
  } else if (e.op == client_op::pong) {
    WSPUSH_FUZZ_CHECK(e.topic_count == 0);
  } else {
    WSPUSH_FUZZ_CHECK(e.topic_count >= 1);
    std::vector<std::string_view> lost;
    for (auto s : e.since()) lost.push_back(s.topic);
    const std::size_t n = encode_subbed(e.topics(), lost, {out.data(), out.size()});
    WSPUSH_FUZZ_CHECK(n > 0 && dom_verdict({out.data(), n}) == simdjson::SUCCESS);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > k_max) return 0;
  static envelope_parser parser(k_max);
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  // In place: the message followed by padding (garbage that must not matter).
  std::vector<char> padded(size + envelope_padding, '"');
  if (size != 0) std::memcpy(padded.data(), data, size);
  const std::string_view in_place(padded.data(), size);
  envelope e1;
  const envelope_result r1 = parser.parse(in_place, padded.size(), e1);
  WSPUSH_FUZZ_CHECK(r1.ok() == r1.message.empty());
  WSPUSH_FUZZ_CHECK(r1.error != client_error::too_big);
  if (r1.ok()) check_success(e1, in_place);
  const std::string first = r1.ok() ? describe(e1) : std::string();

  // Copied: nothing readable past the end of `data` (libFuzzer's buffer is exactly sized).
  envelope e2;
  const envelope_result r2 = parser.parse(input, size, e2);
  const auto verdict = dom_verdict(input);
  // Which problem of a message that is not JSON shows first may depend on the byte after it
  // (simdjson checks an unbalanced document fully only when that byte is `}`): then both
  // readings must refuse it, for whichever reason.
  WSPUSH_FUZZ_CHECK(r1.ok() == r2.ok());
  if (r1.error != r2.error) WSPUSH_FUZZ_CHECK(verdict != simdjson::SUCCESS);
  if (r2.ok()) WSPUSH_FUZZ_CHECK(describe(e2) == first);

  if (verdict == simdjson::SUCCESS) WSPUSH_FUZZ_CHECK(r1.error != client_error::bad_json);
  if (!dom_unsure(verdict) && verdict != simdjson::SUCCESS) WSPUSH_FUZZ_CHECK(!r1.ok());
  return 0;
}
