// Fuzz target for the admin API's publish bodies (admin_api: /publish and /publish/batch). Input:
// the first byte picks the route (even: /publish, odd: /publish/batch), the rest is the body. The
// request is framed as a client would send it, parsed by the HTTP parser, screened and answered
// by admin_api with a sink that takes every publish. Checked: no crash; exactly one complete
// response, a status the API gives; what reaches the sink is a valid topic, `data` as valid JSON
// that lies inside the body, and an idempotency key that is empty or 1-128 bytes of printable
// ASCII; a 200 to /publish took exactly one publish.

#include <simdjson.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "proto/envelope.hpp"
#include "proto/http_request.hpp"
#include "proto/topic.hpp"
#include "server/admin/admin_api.hpp"

using namespace wspush;
using namespace wspush::server;

namespace {

struct taking_sink final : publish_sink {
  std::string_view body;
  std::size_t taken = 0;
  publish_outcome publish(std::string_view topic, std::string_view data, std::string_view key) noexcept override {
    WSPUSH_FUZZ_CHECK(proto::is_valid_topic(topic));
    WSPUSH_FUZZ_CHECK(key.empty() || proto::is_valid_idempotency_key(key));
    // `data` is the body's own bytes (the API copies nothing it hands on), and valid JSON.
    WSPUSH_FUZZ_CHECK(data.data() >= body.data() && data.data() + data.size() <= body.data() + body.size());
    static simdjson::dom::parser dom;
    const simdjson::padded_string padded(data);
    simdjson::dom::element root;
    const auto e = dom.parse(padded).get(root);
    WSPUSH_FUZZ_CHECK(e == simdjson::SUCCESS || e == simdjson::NUMBER_ERROR || e == simdjson::DEPTH_ERROR || e == simdjson::CAPACITY ||
                      e == simdjson::NUMBER_OUT_OF_RANGE);
    ++taken;
    return {publish_outcome::ok, "1-0"};
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* in, std::size_t n) {
  if (n < 1 || n > (1u << 16)) return 0;
  const bool batch = (in[0] & 1) != 0;
  const std::string_view body(reinterpret_cast<const char*>(in + 1), n - 1);
  std::string wire = std::string("POST ") + (batch ? "/publish/batch" : "/publish") +
                     " HTTP/1.1\r\nHost: admin\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  const std::size_t head = wire.size();
  wire.append(body);
  wire.append(64, '\0');  // the room simdjson may read past the body
  proto::http_request req;
  proto::http_request_parser parser;
  const auto r = parser.parse(std::string_view(wire.data(), head + body.size()), req);
  WSPUSH_FUZZ_CHECK(r.status == proto::parse_status::done);

  taking_sink sink;
  sink.body = req.body;
  std::atomic<bool> draining{false};
  admin_api api({}, sink, nullptr, draining);
  std::string out;
  WSPUSH_FUZZ_CHECK(api.screen(req, out) == admin_api::head_verdict::read_body);
  const auto result = api.respond(req, body.size() + 64, out, 1);
  WSPUSH_FUZZ_CHECK(result != admin_api::respond_result::pending);  // the sink answers at once
  WSPUSH_FUZZ_CHECK(out.rfind("HTTP/1.1 ", 0) == 0);
  const std::string_view status = std::string_view(out).substr(9, 3);
  WSPUSH_FUZZ_CHECK(status == "200" || status == "400" || status == "413" || status == "503");
  WSPUSH_FUZZ_CHECK(out.find("\r\n\r\n") != std::string::npos);
  if (!batch && status == "200") WSPUSH_FUZZ_CHECK(sink.taken == 1);
  if (!batch && status != "200") WSPUSH_FUZZ_CHECK(sink.taken == 0);
  return 0;
}
